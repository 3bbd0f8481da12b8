"""Freezing the code of a run and the git worktree it runs in, with the user's DVC cache and environments."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from snakedvc import slurm
from snakedvc.engine import settings
from snakedvc.engine.config import ConfigError
from snakedvc.engine.env import python_module
from snakedvc.engine.records import read_record, snakemake_outputs
from snakedvc.engine.runs.record import SLURM_EXECUTORS, Run, RunError, git
from snakedvc.engine.settings import ControllerSettings

# --- freezing the code ----------------------------------------------------------------------


def freeze(root: Path, message: str, leave_out: Sequence[str] = ()) -> tuple[str, str]:
    """Commit the working tree as it is (tracked changes and untracked, non-ignored files) on
    top of HEAD without touching the branch, the index or the files. Returns (commit, tree).

    ``leave_out``: untracked paths that are not code (earlier runs' outputs): they stay out of the
    frozen tree, so no experiment of the run can carry them as if the run had written them.
    """
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        git(root, "read-tree", "HEAD", env=env)
        git(root, "add", "--all", "--", ".", env=env)
        tracked = set(git(root, "ls-files", "-z").split("\0"))  # the user's index: HEAD and what they staged
        untracked = [path for path in leave_out if path not in tracked]
        if untracked:
            git(root, "--literal-pathspecs", "rm", "-r", "--cached", "--quiet", "--ignore-unmatch",
                "--pathspec-from-file=-", "--pathspec-file-nul", env=env, stdin="\0".join(untracked))  # fmt: skip
        tree = git(root, "write-tree", env=env)
    commit = git(root, "commit-tree", tree, "-p", "HEAD", "-m", message)
    return commit, tree


def earlier_outputs(root: Path) -> list[str]:
    """What earlier runs left in the repository: every output Snakemake has a record of, the params
    file the kit wrote for the last run, the untracked files a step wrote beside its declared
    outputs (in a folder, other than the project's own, that holds one), and the .gitignore files
    DVC wrote for those outputs alone (an earlier sweep's results/sweeps/<name>/.gitignore). A
    .gitignore that lists anything else stays: it is the user's."""
    record = read_record(root) or {}
    params = [record["params"]] if record.get("params") and (root / record["params"]).is_file() else []
    outputs = {*snakemake_outputs(root), *params}
    folders = {str(Path(path).parent) for path in outputs} - {"."}
    untracked = git(root, "ls-files", "-z", "--others", "--exclude-standard").split("\0")
    beside = {path for path in untracked if str(Path(path).parent) in folders and Path(path).name != ".gitignore"}
    dvc_ignores = {
        path
        for path in untracked
        if Path(path).name == ".gitignore" and _lists_only_tracked_outputs(root, Path(path), outputs)
    }
    return sorted(outputs | beside | dvc_ignores)


def _lists_only_tracked_outputs(root: Path, gitignore: Path, outputs: set[str]) -> bool:
    """Whether every line of ``gitignore`` is one DVC writes ('/<name>') for an output whose
    <name>.dvc is among ``outputs`` (an earlier run's tracking)."""
    try:
        lines = [line.strip() for line in (root / gitignore).read_text().splitlines()]
    except (OSError, UnicodeDecodeError):
        return False
    names = [line for line in lines if line and not line.startswith("#")]
    return bool(names) and all(
        name.startswith("/") and (gitignore.parent / name[1:]).as_posix() + ".dvc" in outputs for name in names
    )


def check_workflow_loads(root: Path, profile: str, snakemake_args: Sequence[str]) -> None:
    """Load the workflow as the run will (profile, config files, --config: the Snakefile's config
    checks and schemas), listing its rules only, before anything is frozen or started: a missing
    --configfile or a bad key fails here with Snakemake's own message, not in the controller later."""
    proc = subprocess.run(
        [*python_module("snakemake"), "--profile", profile, "--list-rules", *snakemake_args],
        cwd=root,
        capture_output=True,
        text=True,
        env=slurm.without_job_environment(os.environ),
    )
    if proc.returncode != 0:
        said = [
            line.rstrip()
            for line in (proc.stderr + proc.stdout).splitlines()
            # Snakemake's own messages start at the margin; the traceback's code lines are indented.
            if line.strip() and not line.startswith((" ", "\t", "Traceback", "Using profile"))
        ]
        raise RunError("the run's workflow does not load, nothing was submitted:\n  " + "\n  ".join(said[-6:]))


def head_commit(root: Path) -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "HEAD^{commit}"], cwd=root, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RunError(f"{root} has no commit yet: commit once, then submit (runs are experiments on a commit)")
    return proc.stdout.strip()


# --- the workspace ----------------------------------------------------------------------------


def python_environments(root: Path) -> list[str]:
    """Top-level folders of the repository that are Python environments git ignores."""
    found = []
    for entry in sorted(root.iterdir()):
        environment = entry.is_dir() and ((entry / "pyvenv.cfg").is_file() or (entry / "conda-meta").is_dir())
        if environment and subprocess.run(["git", "check-ignore", "-q", entry.name], cwd=root).returncode == 0:
            found.append(entry.name)
    return found


def make_workspace(
    root: Path, workspace: Path, baseline: str, tree: str, share: Sequence[str], outputs: Sequence[str] = ()
) -> None:
    """A worktree at ``baseline`` holding the files of ``tree``, sharing the user's DVC cache, with
    the earlier runs' ``outputs`` and Snakemake's records of them (see link_outputs)."""
    git(root, "worktree", "add", "--quiet", "--detach", "--no-checkout", str(workspace), baseline)
    git(workspace, "read-tree", "--reset", "-u", tree)
    if (root / ".dvc").is_dir():
        configure_dvc(root, workspace)
    link_outputs(root, workspace, outputs)
    for name in share:
        source = (root / name).resolve()
        target = workspace / name
        if not source.is_relative_to(root.resolve()) or not target.resolve().is_relative_to(workspace.resolve()):
            raise RunError(f"--share {name}: only paths inside the project can be shared ({source} is outside {root})")
        if not source.exists():
            raise RunError(f"--share {name}: {source} does not exist")
        if target.exists() or target.is_symlink():
            raise RunError(f"--share {name}: the submitted code already has {name}; share only what git ignores")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)


def link_outputs(root: Path, workspace: Path, outputs: Sequence[str]) -> None:
    """Give the workspace what the repository's Snakemake sees: the outputs earlier runs left (hard
    links, mtimes kept; a copy across file systems) and Snakemake's records of them (.snakemake's
    metadata: params, code, inputs of the job that made each; its incomplete markers). So the run
    plans exactly the jobs the same command would plan in the repository: a changed param reruns
    what it feeds, and nothing else. Snakemake deletes a job's outputs before it runs, so a rerun
    never writes through a link into the user's files.
    """
    for name in outputs:
        source, target = root / name, workspace / name
        if target.exists() or target.is_symlink() or not source.exists():
            continue  # the frozen code has it (tracked by git)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, copy_function=_link_or_copy, symlinks=True)
        else:
            _link_or_copy(source, target)
    for folder in ("metadata", "incomplete"):
        records = root / ".snakemake" / folder
        if records.is_dir():
            shutil.copytree(records, workspace / ".snakemake" / folder, dirs_exist_ok=True)


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def configure_dvc(root: Path, workspace: Path) -> None:
    """The workspace's DVC uses the user's cache (linked, not copied) and reaches the same remotes."""
    local = root / ".dvc" / "config.local"
    if local.is_file():
        shutil.copy2(local, workspace / ".dvc" / "config.local")

    def run_dvc(*args: str) -> str:
        return run_dvc_in(workspace, *args)

    cache = run_dvc_in(root, "cache", "dir").strip() or str(root / ".dvc" / "cache")
    run_dvc("config", "--local", "cache.dir", str(Path(root, cache).resolve()))
    # Links into the shared cache: a run adds no copy of the data it reads or records.
    run_dvc("config", "--local", "cache.type", "reflink,hardlink,symlink,copy")
    for line in run_dvc("remote", "list").splitlines():
        name, _, url = line.partition("\t")
        url = url.strip()
        if url and "://" not in url and not Path(url).is_absolute():
            # DVC reads a relative remote path from the config file's folder: the user's .dvc/.
            run_dvc("remote", "modify", "--local", name.strip(), "url", str((root / ".dvc" / url).resolve()))


def run_dvc_in(root: Path, *args: str) -> str:
    proc = subprocess.run(
        [*python_module("dvc"), *args],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    if proc.returncode != 0:
        raise RunError(f"dvc {' '.join(args)} failed in {root}:\n{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def source_paths(root: Path, workspace: Path) -> list[str]:
    """Import roots in the workspace for the packages this environment installs editable from the
    repository, so the run imports the submitted code, not the code being edited."""
    import importlib.metadata
    from urllib.parse import unquote, urlparse

    paths = []
    for dist in importlib.metadata.distributions():
        text = dist.read_text("direct_url.json")
        if not text:
            continue
        info = json.loads(text)
        if not info.get("dir_info", {}).get("editable"):
            continue
        project = Path(unquote(urlparse(info["url"]).path))
        try:
            relative = project.resolve().relative_to(root.resolve())
        except ValueError:
            continue  # installed from elsewhere
        for candidate in (workspace / relative / "src", workspace / relative):
            if candidate.is_dir():
                paths.append(str(candidate))
                break
    return sorted(set(paths))


# --- profiles ---------------------------------------------------------------------------------


def has_profile(path: Path) -> bool:
    return (path / "config.yaml").is_file() or (path / "profile.yaml").is_file()


def project_profile(root: Path, profile: str) -> str:
    """The profile as a run names it: a folder (relative to the project) that holds a config.yaml, or
    a bare name found under profiles/ (``slurm``: profiles/slurm), as `snakedvc submit --remote` reads it."""
    if not has_profile(root / profile) and "/" not in profile and has_profile(root / "profiles" / profile):
        return f"profiles/{profile}"
    return profile


def profile_dir(root: Path, profile: str) -> Path:
    path = Path(profile)
    path = path if path.is_absolute() else root / path
    if not has_profile(path):
        raise RunError(
            f"profile {profile}: no config.yaml in {path} (`snakedvc init` writes profiles/local and profiles/slurm; "
            "or give --profile FOLDER)"
        )
    return path


def profile_is_slurm(folder: Path) -> bool:
    name = "config.yaml" if (folder / "config.yaml").is_file() else "profile.yaml"
    profile = yaml.safe_load((folder / name).read_text()) or {}
    return str(profile.get("executor", "")) in SLURM_EXECUTORS


def controller_settings(folder: Path) -> ControllerSettings:
    """The profile's controller.yaml, validated against its schema (defaults filled), frozen."""
    try:
        return settings.controller_settings(folder)
    except ConfigError as error:
        raise RunError(str(error)) from None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_worktree(root: Path | str, workspace: Path) -> None:
    if not workspace.exists():
        return
    proc = subprocess.run(
        ["git", "worktree", "remove", "--force", "--force", str(workspace)], cwd=root, capture_output=True, text=True
    )
    if proc.returncode != 0:
        shutil.rmtree(workspace, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)


def remove_workspace(run: Run) -> None:
    remove_worktree(run.root, run.workspace)
