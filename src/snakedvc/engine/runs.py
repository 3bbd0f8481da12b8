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
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from snakedvc import slurm
from snakedvc.engine import settings
from snakedvc.engine.config import ConfigError
from snakedvc.engine.names import validate_experiment_name
from snakedvc.engine.records import ignore_kit_folder, read_record, snakemake_outputs
from snakedvc.engine.settings import ControllerSettings
from snakedvc.io import atomic_path
from snakedvc.live import METRICS_FILE, Progress, find_logs, read_progress
from snakedvc.slurm import SlurmUnavailable, SubmissionFailed, submit_once

RUNS_DIR = Path(".snakedvc") / "runs"
RUN_REF_PREFIX = "refs/snakedvc/runs/"
RUN_RECORD = "run.json"
CONTROLLER_LOG = "controller.log"
CANCEL_MARKER = "cancel-requested"
# Executors whose profile makes the controller a SLURM job.
SLURM_EXECUTORS = frozenset({"slurm", "snakedvc-slurm"})
# The profile file that says how the controller job is submitted (cluster details stay in profiles).
CONTROLLER_SETTINGS = "controller.yaml"
ACTIVE_STATES = frozenset({"queued", "running"})
FINISHED_STATES = frozenset({"done", "failed", "cancelled"})
_RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$")
_PROGRESS = re.compile(r"(\d+) of (\d+) steps \(")
# Snakemake's SLURM executor: "Job 3 has been submitted with SLURM jobid 1234 (log: .../rule_<name>/<wildcards>/1234.log)."
_SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+)(?: \(log: ([^)]*)\))?")


class RunError(RuntimeError):
    """A run cannot be submitted, found or controlled; the message says which and why."""


def git(root: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env, input=stdin)
    if proc.returncode != 0:
        raise RunError(f"git {' '.join(args)} failed in {root}:\n{proc.stderr.strip()}")
    return proc.stdout.strip()


def repository_root(path: Path | str = ".") -> Path:
    """The top level of the git working tree that holds ``path``."""
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RunError(f"{Path(path).resolve()} is not in a git repository: snakedvc submit freezes code with git")
    return Path(proc.stdout.strip())


def validate_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise RunError(f"{run_id!r} is not a run id (YYYYMMDD-HHMMSS-xxxx; `snakedvc runs` lists them)")
    return run_id


@dataclass
class Run:
    """One submitted run, as recorded in .snakedvc/runs/<id>/run.json."""

    id: str
    name: str
    root: str  # the user's repository
    commit: str  # the frozen code (a commit on top of ``baseline``)
    baseline: str  # the user's HEAD at submit
    profile: str
    snakemake_args: list[str]
    slurm: bool
    created: float
    state: str = "queued"
    attempt: int = 0  # controllers started so far
    controller_jobs: list[str] = field(default_factory=list)  # SLURM job ids, oldest first
    controller_host: str = ""
    controller_pid: int = 0
    experiments: list[str] = field(default_factory=list)
    exit_code: int | None = None
    ended: float | None = None
    note: str = ""  # what a finished run did not do: "nothing to be done" (no new experiment)
    reason: dict[str, Any] = field(default_factory=dict)  # a failed run's step, command, log and its last lines
    environment: dict[str, str] = field(default_factory=dict)  # for the controller: PYTHONPATH

    @property
    def dir(self) -> Path:
        return Path(self.root) / RUNS_DIR / self.id

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    @property
    def log(self) -> Path:
        return self.dir / CONTROLLER_LOG

    @property
    def cancel_requested(self) -> bool:
        return (self.dir / CANCEL_MARKER).exists()

    def save(self) -> None:
        with atomic_path(self.dir / RUN_RECORD) as tmp:
            tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, run_dir: Path | str) -> Run:
        path = Path(run_dir) / RUN_RECORD
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RunError(f"cannot read run record {path}: {e}") from e
        return cls(**data)

    def update(self, **changes: Any) -> Run:
        """Re-read the record, apply ``changes``, write it back (the controller and commands share it)."""
        fresh = Run.load(self.dir)
        for key, value in changes.items():
            setattr(fresh, key, value)
        fresh.save()
        return fresh


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
    file the kit wrote for the last run, and the untracked files a step wrote beside its declared
    outputs (in a folder, other than the project's own, that holds one; DVC's .gitignore files stay)."""
    record = read_record(root) or {}
    params = [record["params"]] if record.get("params") and (root / record["params"]).is_file() else []
    outputs = {*snakemake_outputs(root), *params}
    folders = {str(Path(path).parent) for path in outputs} - {"."}
    untracked = git(root, "ls-files", "-z", "--others", "--exclude-standard").split("\0")
    beside = {path for path in untracked if str(Path(path).parent) in folders and Path(path).name != ".gitignore"}
    return sorted(outputs | beside)


def check_workflow_loads(root: Path, profile: str, snakemake_args: Sequence[str]) -> None:
    """Load the workflow as the run will (profile, config files, --config: the Snakefile's config
    checks and schemas), listing its rules only, before anything is frozen or started: a missing
    --configfile or a bad key fails here with Snakemake's own message, not in the controller later."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", profile, "--list-rules", *snakemake_args],
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
        [sys.executable, "-m", "dvc", *args],
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


def profile_dir(root: Path, profile: str) -> Path:
    path = Path(profile)
    path = path if path.is_absolute() else root / path
    if not (path / "config.yaml").is_file() and not (path / "profile.yaml").is_file():
        raise RunError(f"profile {profile}: no config.yaml in {path}")
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


# --- starting a controller --------------------------------------------------------------------


def controller_command(run: Run) -> list[str]:
    return [sys.executable, "-m", "snakedvc", "controller", str(run.dir)]


def controller_job_name(run: Run) -> str:
    return f"snakedvc-{run.name}"


def controller_job_comment(run: Run) -> str:
    """Unique to one controller attempt: how a submission whose sbatch timed out is found (submit_once)."""
    return f"snakedvc-run-{run.id}-attempt-{run.attempt}"


def sbatch_command(run: Run, job: ControllerSettings, script: Path) -> list[str]:
    """The controller job's sbatch call (an argument list)."""
    command = [f"--job-name={controller_job_name(run)}", f"--output={run.log}"]
    command += ["--open-mode=append", f"--comment={controller_job_comment(run)}"]
    command += [f"--chdir={run.workspace}", f"--cpus-per-task={job.cpus}", f"--mem={job.mem_mb}"]
    command += [f"--time={job.runtime}"]
    if job.partition:
        command.append(f"--partition={job.partition}")
    if job.account:
        command.append(f"--account={job.account}")
    return slurm.batch_command([*command, *job.sbatch_extra], str(script))


def start_controller(run: Run, job: ControllerSettings | None = None) -> Run:
    """Start the run's next controller: a SLURM job (``job``: its profile's controller.yaml, read
    here when not given), or a process in its own session."""
    before = {"attempt": run.attempt, "state": run.state}
    if run.slurm and job is None:
        job = controller_settings(profile_dir(run.workspace, run.profile))
    run = run.update(attempt=run.attempt + 1, state="queued")
    if run.slurm:
        assert job is not None
        script = run.dir / "controller.sh"
        # The only shell involved: a fixed line whose values are quoted.
        script.write_text("#!/bin/sh\nexec " + " ".join(map(_quote, controller_command(run))) + "\n")
        script.chmod(0o755)
        try:
            jobid = submit_once(
                sbatch_command(run, job, script),
                controller_job_name(run),
                controller_job_comment(run),
                known=run.controller_jobs,
            )
        except (SubmissionFailed, SlurmUnavailable) as e:
            run.update(**before)
            raise RunError(f"sbatch of the controller of run {run.id} failed: {e}") from None
        return run.update(controller_jobs=[*run.controller_jobs, jobid])
    with open(run.log, "ab") as log:
        proc_local = subprocess.Popen(
            controller_command(run),
            cwd=run.workspace,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no terminal, no SIGHUP when the submitting shell goes
            env=slurm.without_job_environment(os.environ),
        )
    return run.update(controller_pid=proc_local.pid, controller_host=_hostname())


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


def _hostname() -> str:
    import socket

    return socket.gethostname()


# --- submit ---------------------------------------------------------------------------------


def new_run_id(now: float | None = None) -> str:
    stamp = dt.datetime.fromtimestamp(now or time.time()).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(2)}"


def submit(
    profile: str,
    snakemake_args: Sequence[str] = (),
    name: str = "",
    share: Sequence[str] = (),
    cwd: Path | str = ".",
) -> Run:
    """Freeze the working tree, make the run's workspace and start its controller; returns the run."""
    root = repository_root(cwd)
    baseline = head_commit(root)
    run_id = new_run_id()
    name = validate_experiment_name(name) if name else run_id
    taken = [r.id for r in list_runs(root) if r.name == name and r.state not in FINISHED_STATES]
    if taken:
        raise RunError(f"run name {name!r} is in use by active run {taken[0]}: choose another --name")
    folder = profile_dir(root, profile)
    on_slurm = profile_is_slurm(folder)
    job = controller_settings(folder) if on_slurm else None  # bad settings fail here, before anything is made
    if on_slurm and not slurm.installed():
        raise RunError(f"profile {profile} submits to SLURM, but sbatch or squeue is not on PATH")
    check_workflow_loads(root, profile, snakemake_args)
    outputs = earlier_outputs(root)
    commit, tree = freeze(root, f"snakedvc run {run_id} ({name}): the code as submitted", outputs)
    git(root, "update-ref", RUN_REF_PREFIX + run_id, commit)
    ignore_kit_folder(root)
    run = Run(
        id=run_id,
        name=name,
        root=str(root),
        commit=commit,
        baseline=baseline,
        profile=profile,
        snakemake_args=list(snakemake_args),
        slurm=on_slurm,
        created=time.time(),
    )
    run.dir.mkdir(parents=True)
    try:
        make_workspace(root, run.workspace, baseline, tree, [*python_environments(root), *share], outputs)
        paths = source_paths(root, run.workspace)
        if paths:
            run.environment = {"PYTHONPATH": os.pathsep.join(paths)}
        run.save()
        return start_controller(run, job)
    except BaseException:
        remove_workspace(run)
        shutil.rmtree(run.dir, ignore_errors=True)
        with contextlib.suppress(RunError):
            git(root, "update-ref", "-d", RUN_REF_PREFIX + run_id)
        raise


# --- watching -------------------------------------------------------------------------------


def list_runs(root: Path) -> list[Run]:
    folder = root / RUNS_DIR
    if not folder.is_dir():
        return []
    runs = []
    for record in sorted(folder.glob(f"*/{RUN_RECORD}")):
        with contextlib.suppress(RunError):
            runs.append(Run.load(record.parent))
    return runs


def find_run(root: Path, key: str) -> Run:
    """A run by id, id prefix or name."""
    if not key.strip():
        raise RunError("give a run: its id, an id prefix or its name (`snakedvc runs` lists them)")
    runs = list_runs(root)
    matches = [r for r in runs if r.id == key or r.name == key] or [r for r in runs if r.id.startswith(key)]
    if not matches:
        raise RunError(f"no run {key!r} in {root / RUNS_DIR} (`snakedvc runs` lists them)")
    if len(matches) > 1:
        raise RunError(f"{key!r} names several runs ({', '.join(r.id for r in matches)}): give the full id")
    return matches[0]


def squeue_states(jobids: Sequence[str]) -> dict[str, str]:
    """SLURM job id -> state, for those of ``jobids`` still queued or running; SlurmUnavailable
    when SLURM does not answer (within QUERY_TIMEOUT_S): a silent SLURM is not an empty queue."""
    if not jobids or not slurm.can_query():
        return {}
    return slurm.queued(jobids)


def controller_alive(run: Run) -> bool:
    """Whether the run's controller is queued or running; SlurmUnavailable when SLURM cannot say."""
    if run.slurm:
        return bool(run.controller_jobs) and bool(squeue_states(run.controller_jobs[-1:]))
    if not run.controller_pid or run.controller_host != _hostname():
        return False
    try:
        os.kill(run.controller_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current_state(run: Run) -> str:
    """The recorded state; "lost" for an active run whose controller is gone; "unknown" for an
    active run whose controller SLURM cannot tell about now (see state_and_why)."""
    return state_and_why(run)[0]


# SLURM's silence is learnt once per half minute: `snakedvc runs` with ten runs waits one timeout,
# not ten. (monotonic time, what SLURM said)
_silent_slurm: list[tuple[float, str]] = []
SILENCE_REMEMBERED_S = 30


def state_and_why(run: Run) -> tuple[str, str]:
    """(state, why): why says what "unknown" rests on (SLURM's error), "" otherwise."""
    if run.state not in ACTIVE_STATES:
        return run.state, ""
    if run.slurm and _silent_slurm and time.monotonic() - _silent_slurm[-1][0] < SILENCE_REMEMBERED_S:
        said = _silent_slurm[-1][1]
    else:
        try:
            alive = controller_alive(run)
        except SlurmUnavailable as e:
            said = str(e)
            _silent_slurm.append((time.monotonic(), said))
        else:
            said = ""
    if said:
        return "unknown", f"{said}; its controller job {run.controller_jobs[-1]} may be alive"
    if alive:
        return run.state, ""
    # The record may have changed since it was read (the controller just finished).
    fresh = Run.load(run.dir)
    if fresh.state in ACTIVE_STATES:
        return "lost", ""
    return fresh.state, ""


def progress(run: Run) -> tuple[int, int] | None:
    """(steps done, steps total) from Snakemake's last progress line in the controller log."""
    text = _read(run.log)
    found = _PROGRESS.findall(text)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def slurm_jobs(run: Run) -> list[str]:
    """SLURM job ids the run's controllers submitted (from their log)."""
    return list(submitted_slurm_jobs(_read(run.log)))


def submitted_slurm_jobs(log_text: str) -> dict[str, str]:
    """SLURM job id -> its job log's path ("" where the line names none), in order of submission,
    from the SLURM executor's lines in a Snakemake log."""
    return dict(_SUBMITTED.findall(log_text))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


NOTHING_TO_BE_DONE = "Nothing to be done"
_RULE_ERROR = re.compile(r"^Error in rule (\S+?):\n((?:    .*\n?)*)", re.MULTILINE)
_HOOK_ERROR = re.compile(
    r"^(\w+) in file \"[^\"]*\", line \d+:\n((?:(?!  File ).*\n)+)\s+File [^\n]*, in __on(success|error)",
    re.MULTILINE,
)


def failure_reason(log_text: str, workspace: Path, lines: int = 10) -> dict[str, Any]:
    """Why a run failed, from Snakemake's output: the failing step (a rule, or the end-of-run hook
    that saves the experiment), its command and log, and the log's last ``lines`` lines."""
    rules = list(_RULE_ERROR.finditer(log_text))
    if rules:
        found = rules[-1]
        block = found.group(2)
        logs = re.search(r"^    log: (.*?)(?: \(check log file\(s\) for error details\))?$", block, re.MULTILINE)
        paths = [p.strip() for p in logs.group(1).split(",")] if logs else []
        shell = re.search(r"^    shell:\n((?:        .*\n?)*)", block, re.MULTILINE)
        command = [line.strip() for line in (shell.group(1) if shell else "").splitlines()]
        message = re.search(r"^    message: (.*)$", block, re.MULTILINE)
        tail = _read(workspace / paths[0]).splitlines()[-lines:] if paths else []
        return {
            "step": f"rule {found.group(1)}",
            "message": message.group(1) if message and message.group(1) != "None" else "",
            "command": " ".join(line for line in command if line and not line.startswith("(")),
            "log": paths[0] if paths else "",
            "tail": tail,
        }
    hooks = list(_HOOK_ERROR.finditer(log_text))
    if hooks:
        found = hooks[-1]
        first, *rest = found.group(2).strip().splitlines()
        return {"step": f"end of run (on{found.group(3)}: saving the experiment)", "message": f"{found.group(1)}: {first}",
                "command": "", "log": "", "tail": rest[-lines:]}  # fmt: skip
    return {"step": "", "message": "", "command": "", "log": "", "tail": log_text.strip().splitlines()[-lines:]}


def training_progress(run: Run, limit: int = 5) -> list[Progress]:
    """The run's trainings as their dvclive folders say (snakedvc.live), most recently written first."""
    if not run.workspace.is_dir():
        return []
    # Folders written since the run started: those linked in from earlier runs are not live.
    found = (read_progress(folder) for folder in find_logs(run.workspace) if _written_since(folder, run.created))
    return [p for p in found if p is not None][:limit]


def _written_since(folder: Path, moment: float) -> bool:
    try:
        return (folder / METRICS_FILE).stat().st_mtime >= moment
    except OSError:
        return False


def describe(run: Run) -> dict[str, Any]:
    done = progress(run)
    state, why = state_and_why(run)
    training = training_progress(run) if state in ACTIVE_STATES else []
    return {
        "id": run.id,
        "name": run.name,
        "state": state,
        "jobs": f"{done[0]}/{done[1]}" if done else "-",
        "slurm_jobs": slurm_jobs(run),
        "controller": (
            ",".join(run.controller_jobs) if run.slurm else (f"pid {run.controller_pid}" if run.controller_pid else "-")
        ),
        "started": dt.datetime.fromtimestamp(run.created).strftime("%Y-%m-%d %H:%M:%S"),
        "experiments": run.experiments,
        "note": why or run.note,
        "reason": run.reason if state == "failed" else {},
        # Live progress of a running run's trainings: folder (in its workspace), epoch, latest metrics.
        "training": [
            {
                "log": str(p.directory.relative_to(run.workspace)),
                "epoch": p.epoch,
                "metrics": p.metrics,
                "updated": p.updated,
                "summary": p.describe(),
            }
            for p in training
        ],
    }


def format_runs(runs: Sequence[Run]) -> str:
    header = ("RUN", "NAME", "STATE", "JOBS", "STARTED", "CONTROLLER", "SLURM JOBS", "EXPERIMENT")
    rows = [header]
    described = [describe(run) for run in runs]
    for d in described:
        rows.append((
            d["id"], d["name"], d["state"], d["jobs"], d["started"], d["controller"],
            ",".join(d["slurm_jobs"][-5:]) or "-", ",".join(d["experiments"]) or "-",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(rows[0], widths, strict=True)).rstrip()]
    for row, d in zip(rows[1:], described, strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        # Under a running run: each training's latest epoch, read from its dvclive folder.
        lines += [f"    {t['log']}: {t['summary']}" for t in d["training"]]
        if d["note"]:
            lines.append(f"    {d['note']}")
        lines += describe_failure(d["reason"])
    return "\n".join(lines)


def describe_failure(reason: dict[str, Any]) -> list[str]:
    """A failed run's reason as indented lines under its row."""
    if not reason:
        return []
    said = [f"    failed in {reason['step'] or 'snakemake'}" + (f": {reason['message']}" if reason["message"] else "")]
    if reason["command"]:
        said.append(f"    command: {reason['command']}")
    if reason["log"]:
        said.append(f"    log: {reason['log']} (in the run's workspace), last lines:")
    said += [f"      | {line}" for line in reason["tail"]]
    return said


def follow(path: Path, run: Run, poll: float = 1.0) -> Iterator[str]:
    """The log's text as it grows, until the run has finished."""
    position = 0
    while True:
        text = _read(path)
        if len(text) > position:
            yield text[position:]
            position = len(text)
        if current_state(run) not in {*ACTIVE_STATES, "unknown"}:
            rest = _read(path)[position:]
            if rest:
                yield rest
            return
        time.sleep(poll)


# --- controlling ------------------------------------------------------------------------------


def jobs_in_workspace(run: Run) -> list[str]:
    """Queued or running SLURM jobs whose working directory is the run's workspace (the rule
    jobs of any of its controllers), the controllers themselves left out."""
    workdirs = slurm.jobs_by_workdir()  # SlurmUnavailable: cannot tell
    workspace = str(run.workspace)
    return [jobid for jobid, workdir in workdirs.items() if workdir == workspace and jobid not in run.controller_jobs]


def _tell_controller_to_cancel(run: Run) -> bool:
    """SIGTERM to the run's controller process only (it sees the cancel marker); False when there is
    no running controller to tell."""
    if run.slurm:
        controller = run.controller_jobs[-1:]
        if not controller or squeue_states(controller).get(controller[0]) != "RUNNING":
            return False
        # Only the batch script's process, which is the controller (controller.sh execs it).
        return slurm.cancel(controller, signal="TERM", batch_shell_only=True)
    if run.controller_pid and controller_alive(run):
        with contextlib.suppress(ProcessLookupError):
            os.kill(run.controller_pid, signal.SIGTERM)
            return True
    return False


def _stop_everything(run: Run) -> None:
    """The controller, its Snakemake and steps, and every SLURM job of the run, at once."""
    if run.slurm:
        targets = [*run.controller_jobs[-1:], *jobs_in_workspace(run)]
        slurm.cancel(targets)
    elif run.controller_pid and controller_alive(run):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.controller_pid, signal.SIGTERM)


def cancel(run: Run, wait_s: float = 60) -> Run:
    """Stop the run: its controller (no experiment is saved) and every SLURM job it submitted."""
    state, why = state_and_why(run)
    if state in FINISHED_STATES:
        raise RunError(f"run {run.id} has already {'ended as ' + state if state != 'done' else 'finished'}")
    if state == "unknown":
        raise RunError(f"run {run.id} not cancelled: {why}. Try again when SLURM answers.")
    (run.dir / CANCEL_MARKER).write_text(f"{time.time()}\n")
    try:
        # Why: the controller alone is told first; its Snakemake then cancels the run's jobs itself
        # and stops without an "Error in rule" block for each job that the cancel killed (as when
        # every process and job was signalled at once). What is left after half the wait is stopped.
        told_controller = _tell_controller_to_cancel(run)
        deadline = time.monotonic() + wait_s
        forced = False
        while time.monotonic() < deadline:
            if not controller_alive(run) and not jobs_in_workspace(run):
                break
            if not forced and (not told_controller or time.monotonic() > deadline - wait_s / 2):
                forced = True
                _stop_everything(run)
            time.sleep(0.5)
        left = jobs_in_workspace(run)
    except SlurmUnavailable as e:
        raise RunError(f"run {run.id}: cancel asked, but {e}. `snakedvc cancel {run.id}` again finishes it.") from None
    if left:
        slurm.cancel(left, signal="KILL")
    return run.update(state="cancelled", ended=time.time())


def resume(run: Run) -> tuple[Run, bool]:
    """Start a new controller for a run whose controller was lost (or that failed): finished
    steps are kept, training resumes from its checkpoint. Returns (run, whether a controller was
    started): a run whose controller lives is left as it is, so resuming twice starts one."""
    with _locked(run.dir / "resume.lock"):  # two resumes at once: the second sees the first's controller
        run = Run.load(run.dir)
        state, why = state_and_why(run)
        if state == "unknown":
            raise RunError(
                f"run {run.id} not resumed: {why}. A second controller would run the workflow twice; "
                "resume when SLURM answers (`snakedvc runs` shows the run's state)."
            )
        if state in ACTIVE_STATES:
            return run, False
        if state == "done":
            raise RunError(f"run {run.id} has finished; submit a new run instead")
        if not run.workspace.is_dir():
            raise RunError(f"run {run.id}: its workspace {run.workspace} was removed (`snakedvc clean`)")
        (run.dir / CANCEL_MARKER).unlink(missing_ok=True)
        return start_controller(run.update(state="queued", exit_code=None, ended=None)), True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
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


def clean(root: Path) -> list[Run]:
    """Remove the workspaces of finished runs (their results are in DVC); keep records and logs."""
    removed = []
    for run in list_runs(root):
        if current_state(run) in FINISHED_STATES and run.workspace.exists():
            remove_workspace(run)
            removed.append(run)
    return removed
