"""Recording results in DVC: `dvc add` after each tracked rule, `dvc exp save` at the end of a run.

Runs only on the submit host (the workflow calls it from local rules and its
`onsuccess` handler, never inside a SLURM job), and one DVC command at a time:
DVC's repo lock gives up after about 3 s and `dvc exp save` has a lock of its
own, so every call here holds an exclusive file lock in `.dvc/tmp` first.
All commands are argument lists: nothing from config or the command line
reaches a shell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from snakedvc.engine.aside import untracked_kept
from snakedvc.engine.config import KEY
from snakedvc.engine.env import python_module
from snakedvc.engine.names import (
    EXPERIMENT_NAME_ENV,
    EXPERIMENT_REPLACE_ENV,
    SKIP_SAVE_ENV,
    experiment_ref,
    validate_experiment_name,
)
from snakedvc.engine.records import dvc_root, git_prefix, record_paths, snakemake_outputs, within
from snakedvc.engine.settings import Experiment, Settings
from snakedvc.engine.settings import settings as kit_settings
from snakedvc.io import atomic_path

log = logging.getLogger(__name__)

LOCK_FILE = Path(".dvc") / "tmp" / "snakedvc.lock"
# Set by a submitted run's controller (snakedvc.controller).
EXPERIMENTS_FILE_ENV = "SNAKEDVC_EXPERIMENTS_FILE"


class TrackingError(RuntimeError):
    """A DVC command failed or the lock could not be had. ``saved``: the experiment was saved before
    the failure (a push that failed after it)."""

    def __init__(self, message: str, saved: str = "") -> None:
        super().__init__(message)
        self.saved = saved


def is_dvc_repo(root: Path | str = ".") -> bool:
    """Whether ``root`` lies in a DVC repository (at or below its top, as `dvc` finds it)."""
    return dvc_root(root) is not None


def lock_path(root: Path | str = ".") -> Path:
    """The lock file: in git's common directory when there is one, so that every worktree of the
    repository (each detached run's workspace, the user's own) takes the same lock; their
    experiment refs live there too. Otherwise in DVC's scratch folder."""
    proc = subprocess.run(
        ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=root, capture_output=True, text=True
    )
    if proc.returncode == 0 and proc.stdout.strip():
        return Path(proc.stdout.strip()) / "snakedvc-dvc.lock"
    return Path(root) / LOCK_FILE


@contextlib.contextmanager
def repo_lock(root: Path | str = ".", timeout: float = 900.0) -> Iterator[None]:
    """Exclusive lock serialising our DVC commands across processes and worktrees."""
    path = lock_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingError(f"timed out after {timeout:.0f}s waiting for {path}") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def dvc_command() -> list[str]:
    """DVC from the running interpreter's environment."""
    exe = Path(sys.executable).parent / "dvc"
    return [str(exe)] if exe.exists() else [*python_module("dvc")]


def run_dvc(args: Sequence[str], root: Path | str = ".") -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    cmd = [*dvc_command(), "--wait-for-lock", *args]
    log.info("running: dvc %s", " ".join(args))
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        # DVC writes some errors to stdout: show both, so its own message always arrives.
        said = "\n".join(part.strip() for part in (proc.stderr, proc.stdout) if part.strip())
        said = "\n".join(line for line in said.splitlines() if not line.startswith("Having any troubles?")).strip()
        raise TrackingError(f"dvc {' '.join(args)} failed (exit {proc.returncode}) in {Path(root).resolve()}:\n{said}")
    return proc.stdout


def track(paths: Sequence[str | Path], root: Path | str = ".") -> None:
    """`dvc add` finished outputs, files or directories (copies into the cache; the workspace is untouched)."""
    missing = [str(p) for p in paths if not (Path(root) / p).exists()]
    if missing:
        raise TrackingError(f"cannot track missing output(s): {', '.join(missing)}")
    with repo_lock(root):
        run_dvc(["add", *map(str, paths)], root)


# Set by a run submitted from another machine (snakedvc submit --remote): its experiment is
# pushed at the end, the data to the DVC remote and, where the project has a git origin, the refs.
EXPERIMENT_PUSH_ENV = "SNAKEDVC_EXPERIMENT_PUSH"


def run_settings(config: Mapping[str, Any]) -> Settings:
    """The kit's settings as a run records with them, made once where the run's end begins and
    passed down to the save and the sweep: the config's `snakedvc` key, with what a submitted run's
    controller gave it in the environment (its experiment's name and replace; push, for a run
    submitted from another machine)."""
    kit = kit_settings(config)
    found = kit.experiment
    # A submitted run (snakedvc submit) names its experiment after the run.
    if os.environ.get(EXPERIMENT_NAME_ENV):
        found = dataclasses.replace(
            found, name=os.environ[EXPERIMENT_NAME_ENV], replace=os.environ.get(EXPERIMENT_REPLACE_ENV) == "1"
        )
    if os.environ.get(EXPERIMENT_PUSH_ENV) == "1":
        found = dataclasses.replace(found, push=True)
    return dataclasses.replace(kit, experiment=found)


def effective_params(config: dict[str, Any]) -> dict[str, Any]:
    """The run's config as the experiment records it: everything but the kit's own settings."""
    return {key: value for key, value in config.items() if key != KEY}


def write_effective_params(config: dict[str, Any], path: str | Path, root: Path | str = ".") -> Path:
    """The config the run really used (config files plus --config overrides), for `dvc exp show`."""
    target = Path(root) / path
    with atomic_path(target) as tmp:
        tmp.write_text(
            "# Written by snakedvc at the end of a run: the config it really used.\n"
            + yaml.safe_dump(effective_params(config), sort_keys=True)
        )
    return target


def changed_dvc_files(root: Path | str = ".") -> list[str]:
    """New or changed .dvc files and the .gitignore files DVC wrote beside them (DVC's own folder excluded)."""
    proc = subprocess.run(
        ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise TrackingError(f"git status failed in {Path(root).resolve()}:\n{proc.stderr.strip()}")
    found = set()
    prefix = git_prefix(root)  # porcelain paths are the repository's; the run's are its folder's
    entries = proc.stdout.split("\0")
    for entry in entries:
        path = entry[3:]
        if not path or not path.startswith(prefix) or entry[:2] == " D":
            continue
        path = path.removeprefix(prefix)
        if path.startswith(".dvc/"):
            continue
        if path.endswith(".dvc") or Path(path).name == ".gitignore":
            found.add(path)
    return sorted(found)


def experiment_files(settings: Experiment, own: Sequence[str], root: Path | str = ".") -> list[str]:
    """What the experiment commit holds beyond the code: the run's own new or changed .dvc files (and
    the .gitignore files DVC wrote beside them), the effective params, the configured results.

    ``own``: the run's manifest (records.dag_outputs). A configured metrics file or file (or folder)
    that the run did not produce, missing or left by another run, is an error, not a silent save.
    """
    wanted = [*settings.metrics, *settings.files]
    missing = [name for name in settings.metrics if not (Path(root) / name).is_file()]
    missing += [name for name in settings.files if not (Path(root) / name).exists()]
    if missing:
        raise TrackingError(
            f"experiment not saved: the run did not produce {', '.join(missing)} "
            "(named in snakedvc.experiment.metrics / files of the config)"
        )
    foreign = [name for name in wanted if not within(name, own)]
    if foreign:
        raise TrackingError(
            f"experiment not saved: {', '.join(foreign)} (snakedvc.experiment.metrics / files of the config) "
            "is not an output of any job of this run: name outputs of the rules the run's targets need"
        )
    dvc_files = [
        path
        for path in changed_dvc_files(root)
        if (path.endswith(".dvc") and within(path.removesuffix(".dvc"), own))
        or (
            Path(path).name == ".gitignore"
            and any(within(str(Path(path).parent / n), own) for n in _ignored(root, path))
        )
    ]
    return sorted({*dvc_files, settings.params, *wanted})


def _ignored(root: Path | str, gitignore: str) -> list[str]:
    """The names a .gitignore that DVC wrote lists (its lines are '/<name>')."""
    text = (Path(root) / gitignore).read_text() if (Path(root) / gitignore).is_file() else ""
    return [line.strip().lstrip("/") for line in text.splitlines() if line.strip() and not line.startswith("#")]


def save_experiment(
    config: dict[str, Any],
    own: Sequence[str],
    settings: Experiment,
    name: str = "",
    message: str = "",
    root: Path | str = ".",
    files: Sequence[str] | None = None,
    baseline: str = "",
) -> str:
    """`dvc exp save` the run with its effective params; returns the experiment's name.

    ``own``: the paths the run produced (its manifest); ``settings``: the run's experiment settings
    (run_settings()); ``files``: what the experiment commit adds (default: experiment_files()). The
    commit is then trimmed to the run's own results: a metrics or plots path of dvc.yaml outside
    ``own`` and ``files`` is left out, wherever it came from.
    """
    name = name or settings.name
    if name:
        validate_experiment_name(name)
    write_effective_params(config, settings.params, root)
    included = experiment_files(settings, own, root) if files is None else list(files)
    # --force only when asked by name (experiment.replace): a run never replaces a record by accident.
    args = ["exp", "save", "--force"] if name and settings.replace else ["exp", "save"]
    if name:
        args += ["--name", name]
    if message:
        args += ["--message", message]
    for path in included:
        args += ["--include-untracked", path]
    keep = [*own, *included, settings.params]
    with repo_lock(root), save_targets([*own, *included], root) as targets:
        wait_for_git_index(root)
        out = run_dvc([*args, "--", *targets], root)
        match = re.search(r"saved as:\s*(\S+)", out)
        saved = match.group(1) if match else name
        try:
            trim_experiment(saved, keep, record_paths(root), root, pointers=other_runs_pointers(own, root))
            if baseline:
                rebase_experiment(saved, baseline, root)
        except BaseException:  # an experiment holding other runs' files is no record: none, rather
            _drop_experiment(saved, root)
            raise
        if settings.push:
            push(saved, root)
    log.info("experiment saved: %s", saved)
    note_saved(saved)
    return saved


def other_runs_pointers(own: Sequence[str], root: Path | str = ".") -> list[str]:
    """The .dvc files of outputs earlier runs made (Snakemake keeps a record of each) that are not
    this run's: their data is another run's record. A .dvc file of the user's own (data they `dvc
    add`ed, an input of the run) is no output of Snakemake's and stays as the workspace has it."""
    outputs = {p.removesuffix(".dvc") for p in snakemake_outputs(root)}
    return sorted(f"{p}.dvc" for p in outputs if not within(p, own) and not within(f"{p}.dvc", own))


@contextlib.contextmanager
def save_targets(paths: Sequence[str], root: Path | str = ".") -> Iterator[list[str]]:
    """What `dvc exp save` commits: the .dvc files of the run's own outputs, and nothing else.

    Without targets `dvc exp save` commits every stage of every dvc.yaml in the repository, and
    fails on one that never ran (another pipeline in a subfolder, its outputs missing) or records
    it as up to date. A run with no .dvc file of its own gets a stage-less dvc.yaml as its target,
    which commits nothing: the project's own where it has no stages, else one made for the save
    and removed after it (DVC refuses a git-ignored one, so it cannot live in .snakedvc/).
    """
    base = Path(root)
    candidates = {p if p.endswith(".dvc") else f"{p}.dvc" for p in paths}
    own = sorted(c for c in candidates if (base / c).is_file())
    if own:
        yield own
        return
    project = base / "dvc.yaml"
    if project.is_file() and not (yaml.safe_load(project.read_text()) or {}).get("stages"):
        yield ["dvc.yaml"]
        return
    scratch = Path(tempfile.mkdtemp(prefix=".snakedvc-save-", dir=base))
    try:
        (scratch / "dvc.yaml").write_text("stages: {}\n")
        yield [str((scratch / "dvc.yaml").relative_to(base))]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


GIT_LOCK_WAIT_ENV = "SNAKEDVC_GIT_LOCK_WAIT_S"


def wait_for_git_index(root: Path | str = ".") -> None:
    """Wait (SNAKEDVC_GIT_LOCK_WAIT_S, default 60 s) while another git process holds the index's lock
    (the user's own git command, an editor's); then a TrackingError naming the lock and what to do,
    before DVC starts an experiment it could not finish."""
    found = subprocess.run(["git", "rev-parse", "--git-path", "index.lock"], cwd=root, capture_output=True, text=True)
    if found.returncode != 0:
        return
    lock = Path(root) / found.stdout.strip()
    deadline = time.monotonic() + float(os.environ.get(GIT_LOCK_WAIT_ENV, "60"))
    while lock.exists():
        if time.monotonic() > deadline:
            raise TrackingError(
                f"git's index is locked by another git process ({lock.resolve()} exists): let that git command "
                "finish, or remove the file if no git command is running"
            )
        time.sleep(0.2)


def _drop_experiment(name: str, root: Path | str) -> None:
    ref = experiment_ref(name, root)
    if ref is not None:
        subprocess.run(["git", "update-ref", "-d", ref], cwd=root, capture_output=True)


def note_saved(saved: str) -> None:
    """A submitted run's controller lists the experiments its run saved (snakedvc runs)."""
    if os.environ.get(EXPERIMENTS_FILE_ENV):
        with open(os.environ[EXPERIMENTS_FILE_ENV], "a") as handle:
            handle.write(saved + "\n")


def push(saved: str, root: Path | str = ".") -> None:
    """`dvc push` the data and `dvc exp push origin` the experiment; a failure keeps DVC's own reason
    and says which remote, that the experiment is saved, and how to push it again."""
    # A remote run's refs stay in the cluster's clone where the project has no git origin: `snakedvc
    # pull --remote` fetches them from there.
    refs = os.environ.get(EXPERIMENT_PUSH_ENV) != "1" or _has_origin(root)
    try:
        run_dvc(["push"], root)  # not --quiet: it hides DVC's reason along with its progress
        if refs:
            run_dvc(["exp", "push", "origin", saved], root)
    except TrackingError as error:
        listed = subprocess.run([*dvc_command(), "config", "--list"], cwd=root, capture_output=True, text=True)
        # remote.<name>.url=<url> lines (`dvc remote list` wraps its table to the terminal's width).
        urls = re.findall(r"^remote\.([^.\n]+)\.url=(.*)$", listed.stdout, re.MULTILINE)
        where = ", ".join(f"{name} {url}" for name, url in urls) or "no DVC remote configured"
        raise TrackingError(
            f"experiment {saved} is saved, but pushing it failed (DVC remotes: {where}).\n{error}\n"
            f"Fix the remote, then push it again: dvc push && dvc exp push origin {saved}",
            saved=saved,
        ) from None


def _has_origin(root: Path | str) -> bool:
    return subprocess.run(["git", "remote", "get-url", "origin"], cwd=root, capture_output=True).returncode == 0


def _git(root: Path | str, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env, input=stdin)
    if proc.returncode != 0:
        raise TrackingError(f"git {' '.join(args)} failed in {Path(root).resolve()}:\n{proc.stderr.strip()}")
    return proc.stdout.strip()


# Snakemake's marker in a directory() output: its bookkeeping, not a result of the run.
SNAKEMAKE_STAMP = ".snakemake_timestamp"


def _saved_ref(name: str, root: Path | str) -> str:
    ref = experiment_ref(name, root)
    if ref is None:
        raise TrackingError(f"experiment {name!r} was saved but no ref refs/exps/.../{name} exists")
    return ref


def trim_experiment(
    name: str,
    keep: Sequence[str],
    records: Sequence[str],
    root: Path | str = ".",
    as_baseline: bool = False,
    pointers: Sequence[str] = (),
) -> list[str]:
    """Rewrite an experiment's commit to hold only its own run's results; returns the paths left out.

    `dvc exp save` commits every untracked file that dvc.yaml names as metrics or plots, and git
    keeps tracked ones as the workspace has them, so another run's results ride along. Left out:
    every file under a record path (``records``: dvc.yaml's metrics and plots) that is not under
    ``keep``, and DVC's scratch files (3.x force-adds its packed arguments, .dvc/tmp/repro.dat).
    ``pointers``: .dvc files of other runs' outputs, kept as the baseline commit has them (a pointer
    a later run changed in the workspace is that run's record, not this one's).
    The new commit has the same parents, author and message; the experiment's ref points at it.
    """
    ref = _saved_ref(name, root)
    old = _git(root, "rev-parse", ref)
    # git names files from the repository's top; keep and records are the run's folder's.
    prefix = git_prefix(root)
    keep, records = [prefix + p for p in keep], [prefix + p for p in records]
    pointers = [prefix + p for p in pointers]
    # DVC's scratch folder is its repository's (the top of git, or the folder of a DVC subrepo),
    # wherever in it the run's folder lies.
    scratch_dir = [git_prefix(dvc_root(root) or root) + ".dvc/tmp"]
    root = _git(root, "rev-parse", "--show-toplevel")  # the paths below are the top's
    listed = _git(root, "ls-tree", "-r", "-z", "--name-only", old).split("\0")
    dropped = [
        p
        for p in listed
        if p
        and (within(p, scratch_dir) or Path(p).name == SNAKEMAKE_STAMP or (within(p, records) and not within(p, keep)))
    ]
    parents = _git(root, "rev-list", "--parents", "-n", "1", old).split()[1:]
    stale = [p for p in listed if p in pointers and not within(p, keep) and _differs(root, parents[:1], old, p)]
    if not dropped and not stale:
        return []
    # `exp run`: left out = as the run's baseline has it. A file the user committed there (an output
    # also in git) stays as committed, as in `dvc exp run`'s commit; one it lacks goes. A Snakefile
    # run's record holds only its own results: a committed older one is left out too. Another run's
    # .dvc pointer is, in both, as the baseline commit has it.
    removed, reset = ([], [*dropped, *stale]) if as_baseline else (dropped, stale)
    _recommit(root, ref, old, _tree_without(root, old, removed, reset, parents[:1]), parents)
    log.info(
        "experiment %s: left out what other runs wrote: %s",
        name,
        ", ".join(p for p in [*dropped, *stale] if not within(p, scratch_dir) and Path(p).name != SNAKEMAKE_STAMP)
        or "nothing",
    )
    return [*dropped, *stale]


def _recommit(root: str, ref: str, old: str, tree: str, parents: Sequence[str]) -> None:
    """Point ``ref`` at a commit of ``tree`` with ``old``'s parents, author, committer and message."""
    who = _git(root, "log", "-1", "--format=%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd", "--date=raw", old).split("\0")
    identity = dict(zip(
        ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE"),
        who,
        strict=True,
    ))  # fmt: skip
    # The message byte for byte (-m would end it with a newline DVC's own commit does not have).
    raw = subprocess.run(["git", "cat-file", "commit", old], cwd=root, capture_output=True, text=True, check=True)
    message = raw.stdout.split("\n\n", 1)[1] if "\n\n" in raw.stdout else ""
    args = ["commit-tree", tree, "-F", "-"]
    for parent in parents:
        args += ["-p", parent]
    new = _git(root, *args, env={**os.environ, **identity}, stdin=message)
    _git(root, "update-ref", ref, new, old)


def _differs(root: str, baseline: list[str], commit: str, path: str) -> bool:
    """Whether ``commit`` holds ``path`` otherwise than ``baseline`` (its parent, if any) does."""
    proc = subprocess.run(["git", "--literal-pathspecs", "diff", "--quiet", *baseline, commit, "--", path], cwd=root)
    return bool(baseline) and proc.returncode != 0


def _tree_without(root: str, commit: str, removed: Sequence[str], reset: Sequence[str], parent: list[str]) -> str:
    """``commit``'s tree with ``removed`` left out and ``reset`` as ``parent`` (the baseline) has them."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        _git(root, "read-tree", commit, env=env)
        if reset:  # (a path the parent lacks goes)
            _git(root, "--literal-pathspecs", "reset", "--quiet", *parent, "--pathspec-from-file=-",
                 "--pathspec-file-nul", env=env, stdin="\0".join(reset))  # fmt: skip
        if removed:
            _git(root, "--literal-pathspecs", "rm", "--cached", "--quiet", "--pathspec-from-file=-",
                 "--pathspec-file-nul", env=env, stdin="\0".join(removed))  # fmt: skip
        return _git(root, "write-tree", env=env)


def rebase_experiment(name: str, baseline: str, root: Path | str = ".") -> bool:
    """Put an experiment on ``baseline``, the commit its run started from, where the branch moved on
    during the run (the user committed meanwhile): `dvc exp save` builds on HEAD, and the record would
    say the run ran on code it never saw. The new commit is ``baseline``'s tree with the files the
    experiment's commit changed (the run's own), its parent ``baseline``; its ref is DVC's name for
    an experiment of ``baseline`` (refs/exps/<2>/<38>/<name>). Returns whether it moved."""
    ref = _saved_ref(name, root)
    old = _git(root, "rev-parse", ref)
    parent = _git(root, "rev-parse", f"{old}^")
    baseline = _git(root, "rev-parse", baseline)
    if parent == baseline:
        return False
    top = _git(root, "rev-parse", "--show-toplevel")
    changed = [p for p in _git(top, "diff", "--name-only", "-z", "--no-renames", parent, old).split("\0") if p]
    present = {
        line.split("\t", 1)[1]: line.split("\t", 1)[0]
        for line in _git(top, "ls-tree", "-r", "-z", old, "--", *changed).split("\0")
        if line
    }
    lines = [f"{present[p]}\t{p}" if p in present else f"0 {'0' * 40}\t{p}" for p in changed]
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        _git(top, "read-tree", baseline, env=env)
        _git(top, "update-index", "-z", "--index-info", env=env, stdin="\0".join(lines) + "\0")
        tree = _git(top, "write-tree", env=env)
    who = _git(top, "log", "-1", "--format=%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd", "--date=raw", old).split("\0")
    names = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL",
             "GIT_COMMITTER_DATE")  # fmt: skip
    message = _git(top, "log", "-1", "--format=%B", old)
    new = _git(
        top,
        "commit-tree",
        tree,
        "-p",
        baseline,
        "-m",
        message,
        env={**os.environ, **dict(zip(names, who, strict=True))},
    )
    _git(top, "update-ref", f"refs/exps/{baseline[:2]}/{baseline[2:]}/{name}", new)
    _git(top, "update-ref", "-d", ref, old)
    print(
        f"snakedvc: the branch moved on during the run: experiment {name} is put on {baseline[:12]}, the commit "
        "the run started from (its code), not on the new HEAD",
        file=sys.stderr,
        flush=True,
    )
    return True


def say_restore(line: str) -> None:
    """What restore changes, said as it does it (paths from the top of the git repository)."""
    print(f"snakedvc restore: {line}", file=sys.stderr, flush=True)


def restore(name: str, params_file: str = "results/params.yaml", root: Path | str = ".") -> str:
    """`dvc exp apply` an experiment, then make Snakemake see its outputs as up to date; what
    the restored workspace now is, in a few words.

    DVC restores files with fresh mtimes in no particular order, and Snakemake's
    metadata still holds the params of the last run: `snakemake --touch` with the
    experiment's own effective config re-stamps both in DAG order. A later
    `snakemake -n` then plans only what differs between params.yaml and that config.
    A sweep trial's experiment is not touched: its plain outputs are not the trial's (its
    model is in the sweep's report folder), and stamping them with its params would let a
    later run with those params take them for the trial's.
    """
    validate_experiment_name(name)
    ref = experiment_ref(name, root)
    if ref is None:
        raise TrackingError(f"no experiment named {name!r} (dvc exp show -A lists them)")
    top = _git(root, "rev-parse", "--show-toplevel")
    params_record = os.path.relpath(Path(root).resolve() / params_file, top)
    with repo_lock(root):
        stashed = _stash_edits(name, top, params_record)
        differing = _differing_from(ref, top)
        before = _contents(differing, top)
        targets = _pointers_held(ref, [p for p in differing if p.endswith(".dvc") and not p.startswith(".dvc/")], top)
        with untracked_kept(root) as kept:
            _apply_experiment(name, targets, root)
    # What changed, said once done: the files apply rewrote, removed or brought (uncommitted edits too).
    after = _contents(differing, top)
    changed = [p for p in differing if before.get(p) != after.get(p)]
    if stashed:
        say_restore(f"your uncommitted edits of {', '.join(stashed)} are kept in git's stash (`git stash list`; "
                    "`git stash pop` brings them back)")  # fmt: skip
    say_restore(f"{name} put back its files: {', '.join(p for p in changed if p in after) or 'none changed'}")
    removed = [p for p in changed if p not in after]
    if kept_committed := _keep_committed(removed, top, params_record):
        say_restore(f"kept your committed files that {name} has none of (added since): {', '.join(kept_committed)}")
    if removed := [p for p in removed if p not in kept_committed]:
        say_restore(f"and removed those it has none of: {', '.join(removed)}")
    outputs = [t.removesuffix(".dvc") for t in targets if t in changed]
    if outputs:
        say_restore(f"and the outputs they record: {', '.join(outputs)}")
    if kept:
        say_restore(f"left as they were: your untracked files that {name} holds no version of ({_summary(kept)})")
    if trial := _sweep_trial(ref, top):
        # Older than any input: the next run remakes the plain outputs apply changed.
        for output in outputs:
            if (Path(top) / output).is_file():
                os.utime(Path(top) / output, (0, 0))
        sweep_name, trial_id = trial
        return (
            f"{name} is trial {trial_id} of sweep {sweep_name}: its model and metrics are in the sweep's report "
            f"folder (trials/{trial_id}/); a plain run remakes the plain outputs"
        )
    _touch_outputs(params_file, root)
    log.info("restored experiment %s; outputs marked up to date", name)
    return (
        f"`snakemake -n` now plans only what your config differs from it in; with its own config, "
        f"`--configfile {params_file}`, it plans nothing"
    )


def _summary(paths: Sequence[str], each: int = 3) -> str:
    """Paths by name, but a top folder holding more than ``each`` of them as one entry
    ("logs/ (61 files)"): a user's notes stay in sight beside the logs of many runs."""
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        by_folder.setdefault(path.split("/", 1)[0] if "/" in path else "", []).append(path)
    named = [p for folder, inside in by_folder.items() if not folder or len(inside) <= each for p in inside]
    folders = [
        f"{folder}/ ({len(inside)} files)" for folder, inside in by_folder.items() if folder and len(inside) > each
    ]
    return ", ".join(sorted(named) + sorted(folders))


def _sweep_trial(ref: str, top: str) -> tuple[str, str] | None:
    """(sweep, trial) where the experiment is a sweep trial's (its message, from save_trials)."""
    found = re.match(r"sweep (\S+) trial (\S+): ", _git(top, "log", "-1", "--format=%s", ref))
    return (found[1], found[2]) if found else None


def _touch_outputs(params_file: str, root: Path | str) -> None:
    """Snakemake's --touch with the restored params, until nothing is planned."""
    base = [*python_module("snakemake"), "--cores", "1"]
    if (Path(root) / params_file).is_file():
        base += ["--configfile", str(params_file)]
    # One --touch pass decides up front what to touch, so leaves whose inputs it
    # re-stamps (the .dvc files) can be left behind: repeat until nothing is planned.
    env = {**os.environ, SKIP_SAVE_ENV: "1"}  # touching is not a run: save no experiment
    for _ in range(4):
        proc = subprocess.run([*base, "--touch", "--quiet"], cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise TrackingError(f"snakemake --touch failed:\n{proc.stderr[-2000:]}")
        plan = subprocess.run([*base, "--dry-run"], cwd=root, env=env, capture_output=True, text=True)
        if "Nothing to be done" in plan.stdout + plan.stderr:
            break


# `dvc exp apply NAME` checks out every output of every pipeline in the repository and fails on one
# that never ran (another dvc.yaml in a subfolder). DVC's public Repo.experiments.apply takes the
# checkout's targets: the .dvc files the experiment changed.
_APPLY = """
import sys
from dvc.repo import Repo
with Repo(sys.argv[1]) as repo:
    repo.experiments.apply(sys.argv[2], targets=sys.argv[3:] or None)
"""


# Files that runs write beside your code: .dvc pointers, DVC's .gitignore files, dvc.lock.
RUN_WRITTEN = (".dvc", ".gitignore", "dvc.lock")


def _stash_edits(name: str, top: str, params_record: str) -> list[str]:
    """The user's uncommitted edits of tracked files (code, config), which apply would overwrite,
    put in git's stash, named, before it: not the files runs write (.dvc pointers, DVC's
    .gitignore files, dvc.lock, ``params_record``: the run's params, from the top of git). The
    files stashed."""
    edited = [p for p in _git(top, "diff", "--name-only", "-z", "HEAD").split("\0")
              if p and not p.endswith(RUN_WRITTEN) and p != params_record]  # fmt: skip
    if edited:
        message = f"snakedvc restore {name}: your uncommitted edits before it"
        _git(top, "--literal-pathspecs", "stash", "push", "-q", "-m", message, "--", *edited)
    return edited


def _keep_committed(removed: Sequence[str], top: str, params_record: str) -> list[str]:
    """Of the files apply removed, those your last commit has (code, a sweep's config added after
    the experiment), put back from it: a restore brings an experiment's files back and deletes
    none of your committed work. Not the files runs write (as _stash_edits). Those put back."""
    mine = [p for p in removed if not p.endswith(RUN_WRITTEN) and p != params_record]
    if not mine:
        return []
    held = set(_git(top, "--literal-pathspecs", "ls-tree", "-r", "-z", "--name-only", "HEAD", "--", *mine).split("\0"))
    kept = [p for p in mine if p in held]
    if kept:
        _git(top, "--literal-pathspecs", "checkout", "HEAD", "--", *kept)
    return kept


def _differing_from(ref: str, top: str) -> list[str]:
    """The files (from the top of git) that apply may change: where the workspace, uncommitted edits
    included, differs from the experiment's commit, and the untracked files git does not ignore."""
    tracked = _git(top, "diff", "--name-only", "-z", ref).split("\0")
    others = _git(top, "ls-files", "--others", "--exclude-standard", "-z").split("\0")
    return sorted({p for p in [*tracked, *others] if p})


def _pointers_held(ref: str, pointers: Sequence[str], top: str) -> list[str]:
    """Those of ``pointers`` that the experiment's commit holds: apply's checkout targets. One it
    lacks (a later sweep's report.dvc, untracked) made DVC's checkout fail, apply half done."""
    if not pointers:
        return []
    held = _git(top, "--literal-pathspecs", "ls-tree", "-r", "-z", "--name-only", ref, "--", *pointers)
    return sorted(set(pointers) & set(held.split("\0")))


def _contents(paths: Sequence[str], top: str) -> dict[str, str]:
    """Each existing file's git blob id (missing ones absent)."""
    present = [p for p in paths if (Path(top) / p).is_file()]
    ids = _git(top, "hash-object", "--stdin-paths", stdin="\n".join(present)).split() if present else []
    return dict(zip(present, ids, strict=True))


def _apply_experiment(name: str, targets: Sequence[str], root: Path | str = ".") -> None:
    """`dvc exp apply NAME`, checking out ``targets`` (.dvc files, from the top of git)."""
    log.info("running: dvc exp apply %s (checking out %s)", name, ", ".join(targets) or "nothing")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    root_dir = str(dvc_root(root) or Path(root).resolve())
    proc = subprocess.run(
        [sys.executable, "-c", _APPLY, root_dir, name, *targets],
        cwd=top.stdout.strip() or root,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        said = proc.stderr.strip().splitlines()[-20:]
        raise TrackingError(f"dvc exp apply {name} failed in {root_dir}:\n" + "\n".join(said))
