"""What a run produced: the record an experiment and a report are built from.

A workspace holds the outputs of many runs: a plain run's metrics stay beside a later sweep's, and
DVC snapshots every untracked file that ``dvc.yaml`` names as params, metrics or plots. A record
built from "whatever is in the workspace" can therefore pair one run's params with another run's
metrics. So a record is built from the run's own **manifest**: every output of every job in the
run's DAG, the jobs that ran and the jobs Snakemake found up to date *for this run's config*
(Snakemake's own rerun triggers decide that), read from the workflow at the end of the run. A
path that ``dvc.yaml`` shows (a *record path*) and that is not in the manifest is left out of the
experiment's commit and of the report, even when the file lies in the workspace or is tracked by git.

The manifest is the DAG's own targets rather than a list written as jobs finish because up-to-date
jobs belong to the run too (an evaluation rerun after a change of its own params keeps the model it
evaluated), and rather than per-run output folders because users' paths stay their own.

The last run's record is kept in ``.snakedvc/last-run.json`` (git never sees it) for
``snakedvc report`` and for ``snakedvc submit``, which leaves that run's params file out of the frozen code.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from snakedvc.io import atomic_path

RECORD_FILE = Path(".snakedvc") / "last-run.json"
# When the run started: set by snakedvc.configure, which a Snakefile calls as it is read (this module
# may load only at the end of the run, in the end-of-run hook); its load time otherwise.
_started: dict[str, Any] = {"at": time.time(), "commit": ""}


def mark_started(root: Path | str = ".") -> None:
    """The run starts now (its Snakefile is being read): the record's and the report's start time,
    and the commit its code is at (the experiment's baseline, even if the branch moves meanwhile)."""
    head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True)
    _started.update(at=time.time(), commit=head.stdout.strip())


def started_commit() -> str:
    """The commit HEAD was at when the run started ('' outside git, or before mark_started)."""
    return str(_started["commit"])


def dvc_root(start: Path | str = ".") -> Path | None:
    """The DVC repository ``start`` lies in: the nearest folder at or above it with a ``.dvc`` folder,
    as `dvc` finds its root (a workflow in a subfolder of a monorepo is recorded there). None outside one."""
    here = Path(start).resolve()
    for folder in (here, *here.parents):
        if (folder / ".dvc").is_dir():
            return folder
    return None


def git_prefix(root: Path | str = ".") -> str:
    """``root``'s path inside its git repository ('' at the top, else 'sub/dir/'): git's own paths
    (status, ls-tree, diff) are relative to the top, the workflow's to its folder."""
    proc = subprocess.run(["git", "rev-parse", "--show-prefix"], cwd=root, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def dvc_yaml_entries(root: Path | str) -> dict[str, list[Any]]:
    """dvc.yaml's top-level ``params``, ``metrics`` and ``plots`` lists (empty without dvc.yaml)."""
    path = Path(root) / "dvc.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return {key: list((data or {}).get(key) or []) for key in ("params", "metrics", "plots")}


def _plot_files(entry: Any) -> list[str]:
    """The files a dvc.yaml plots entry reads: a path, ``{path: options}``, or ``{id: {y: {file: ...}}}``."""
    if isinstance(entry, str):
        return [entry]
    if not isinstance(entry, dict) or not entry:
        return []
    name, options = next(iter(entry.items()))
    y = options.get("y") if isinstance(options, dict) else None
    return [str(key) for key in y] if isinstance(y, dict) else [str(name)]


def record_paths(root: Path | str) -> list[str]:
    """Every file or folder whose content DVC shows as a run's result: dvc.yaml's metrics and plots (top
    level and each stage's). Params files are left out: besides the kit's own (rewritten by every run)
    they are the user's inputs, such as params.yaml."""
    path = Path(root) / "dvc.yaml"
    data = (yaml.safe_load(path.read_text()) if path.is_file() else {}) or {}
    found: set[str] = set()
    for section in [data, *(data.get("stages") or {}).values()]:
        for name in (section or {}).get("metrics") or []:
            found.update([name] if isinstance(name, str) else [str(key) for key in name])
        for entry in (section or {}).get("plots") or []:
            found.update(_plot_files(entry))
    return sorted(_normal(name) for name in found)


def _normal(path: str) -> str:
    return os.path.normpath(path).rstrip("/")


def within(path: str, folders: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``folders`` or lies under one of them (paths relative to the project)."""
    path = _normal(path)
    return any(path == f or path.startswith(f + "/") for f in map(_normal, folders) if f not in ("", "."))


def dag_outputs(workflow: Any) -> list[str]:
    """Every output path of the jobs in the run's DAG (those that ran and those up to date for it).

    ``workflow`` is Snakemake's, as a Snakefile sees it; its ``dag`` and each job's ``output`` are
    the public properties the DAG is read through.
    """
    dag = getattr(workflow, "dag", None)
    if dag is None:
        return []
    return sorted({_normal(os.fspath(path)) for job in dag.jobs for path in job.output})


def write_record(root: Path | str, record: dict[str, Any]) -> Path:
    """Keep the last run's record in .snakedvc/ (excluded from git through info/exclude), with when the
    run started and ended and the commit it ran on."""
    base = Path(root)
    ignore_kit_folder(base)
    head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=base, capture_output=True, text=True)
    commit = started_commit() or head.stdout.strip()  # the code the run ran on, not where HEAD is now
    record = {"started": _started["at"], "finished": time.time(), "commit": commit, **record}
    target = base / RECORD_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return target


def read_record(root: Path | str) -> dict[str, Any] | None:
    path = Path(root) / RECORD_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ignore_kit_folder(
    root: Path | str, folder: str = ".snakedvc", what: str = "run records, detached runs' workspaces"
) -> None:
    """Keep ``folder`` (.snakedvc/: run records, detached runs' workspaces) out of `git status`
    through the repository's info/exclude, not .gitignore, which is the user's. Nothing to do
    outside git or where git ignores it already."""
    checked = subprocess.run(["git", "check-ignore", "-q", folder], cwd=root, capture_output=True)
    if checked.returncode != 1:  # 0: ignored already; 128: not a git repository
        return
    common = subprocess.run(
        ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=root, capture_output=True, text=True
    )
    if common.returncode != 0:
        return
    exclude = Path(common.stdout.strip()) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a") as handle:
        handle.write(f"\n# snakedvc: {what}\n/{folder}/\n")


def snakemake_outputs(root: Path | str) -> list[str]:
    """Every path Snakemake keeps a record of in ``root`` (its file persistence: one file a job output,
    named by the output's path in URL-safe base64, split into '@'-prefixed folders where longer than a
    file name may be): the outputs of earlier runs, whichever run made them. Paths that no longer
    exist are left out. tests/test_records.py checks this reading against a real Snakemake run."""
    base = Path(root)
    metadata = base / ".snakemake" / "metadata"
    found = []
    for folder, _, files in os.walk(metadata):
        parts = Path(folder).relative_to(metadata).parts
        prefix = "".join(part.removeprefix("@") for part in parts)
        for name in files:
            try:
                path = base64.urlsafe_b64decode(prefix + name).decode()
            except (ValueError, UnicodeDecodeError):
                continue  # not a record (Snakemake's own scratch files)
            if not Path(path).is_absolute() and (base / path).exists():
                found.append(_normal(path))
    return sorted(found)
