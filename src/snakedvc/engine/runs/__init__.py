"""Detached runs: `snakedvc submit` and the commands that watch and control what it started.

A submitted run is pinned to the code and params of the working tree at that moment:

- **Freeze**: the working tree, uncommitted and untracked (not ignored) files included, is
  written as a commit object through a scratch index, on top of HEAD. The user's branch,
  index and files are untouched; `refs/snakedvc/runs/<id>` keeps the commit.
- **Workspace**: a git worktree of the repository at HEAD whose files are the frozen tree
  (`.snakedvc/runs/<id>/workspace`). So `dvc exp save` there makes an experiment whose
  baseline is the user's HEAD, visible to `dvc exp show` where the user works, and whose
  commit holds the code as submitted. Its DVC cache is the user's (links, no copies);
  DVC remotes given as relative paths are made absolute; the project's ignored Python
  environments (top-level folders with `pyvenv.cfg` or `conda-meta`) are linked in.
- **Controller**: `snakedvc controller` (the `controller` module) runs Snakemake in the
  workspace, as a small SLURM job of its own when the profile's executor is a SLURM one,
  else as a background process in its own session. It is the run's submit host: the DVC
  hook runs there. The run's state lives in `.snakedvc/runs/<id>/run.json`.

Everything reaches git, sbatch and Snakemake as argument lists; run ids and names are
validated (a name becomes the DVC experiment's name, a git ref).


The package: ``record`` (the run's record, paths, git), ``workspace`` (freezing the code, the
worktree, profiles), ``submission`` (submit, starting a controller), ``state`` (what a run is
doing and why) and ``control`` (cancel, resume, clean). Below: what the command line uses.
"""

from snakedvc.engine.runs.control import cancel, clean, resume
from snakedvc.engine.runs.record import Run, RunError, repository_root
from snakedvc.engine.runs.state import describe, find_run, follow, format_runs, list_runs
from snakedvc.engine.runs.submission import submit

__all__ = [
    "Run",
    "RunError",
    "cancel",
    "clean",
    "describe",
    "find_run",
    "follow",
    "format_runs",
    "list_runs",
    "repository_root",
    "resume",
    "submit",
]
