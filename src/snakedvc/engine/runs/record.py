"""A detached run's record (.snakedvc/runs/<id>/run.json), its paths and the git calls every part shares."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from snakedvc.io import atomic_path

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
        if "dubious ownership" in proc.stderr:  # a project another user owns, shared with us to write in
            raise RunError(
                f"git refuses {Path(path).resolve()}: another user owns it. If your lab shares it on purpose, "
                f"tell git so: git config --global --add safe.directory {Path(path).resolve()}"
            )
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
    # A DVC pipeline's run (no Snakefile): `snakedvc exp run`'s -S, --resources and targets. None:
    # a Snakemake workflow.
    exp_run_args: list[str] | None = None
    replace: bool = False  # submit --replace: the run may replace an experiment of its name
    queued: bool = False  # an experiment of DVC's queue (exp run --queue): started by the queue (runs/queue.py)

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


def this_host() -> str:
    import socket

    return socket.gethostname()
