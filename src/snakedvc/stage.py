"""A DVC stage's commands run as `dvc repro` runs them, inside a job: no DVC command, no lock.

DVC runs each command line by the user's shell (``$SHELL --noprofile --norc -c`` for bash and
zsh) in the stage's wdir, with ``DVC_ROOT`` and ``DVC_STAGE`` set (and, under `dvc exp run`,
``DVC_EXP_NAME`` and ``DVC_EXP_BASELINE_REV``, which `snakedvc exp run` puts in the jobs'
environment), one after another, stopping at the first that fails; before that it removes the
stage's outputs and makes their folders. So does this. The command gets the environment `dvc
repro` would give it: Snakemake's thread limits (OMP_NUM_THREADS=<threads> and the like) are put
back as they were where `snakedvc exp run` started, unless the stage asked for cpus.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from snakedvc import launch
from snakedvc.launch import Layout

log = logging.getLogger(__name__)

# The variables Snakemake sets to a job's threads (snakemake.shell); `dvc repro` sets none.
THREAD_LIMITS = (
    "OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)  # fmt: skip
# Their values where `snakedvc exp run` started (JSON: name -> value or null), for the jobs.
SUBMIT_THREAD_ENV = "SNAKEDVC_SUBMIT_THREAD_ENV"


def submit_thread_env(environ: Mapping[str, str] = os.environ) -> str:
    return json.dumps({name: environ.get(name) for name in THREAD_LIMITS})


def without_thread_limits(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the thread variables as they were at the submit (where it says so)."""
    recorded = environ.get(SUBMIT_THREAD_ENV)
    if recorded is None:
        return environ
    env = dict(environ)
    for name, value in json.loads(recorded).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


# Seconds a stage's job waits for the word whether to run where its run keeps no heartbeat (a run
# of an older kit). The word comes within seconds of the upstream stages' end.
DECISION_WAIT_S = 600
# The file in the decisions' folder whose mtime the run that writes them moves every few seconds
# (engine/dvcpipeline/run.py), and how long a job waits with it unmoved before it gives up: the run
# is gone (its host lost, killed). Unmoved, not old: the job's clock and the filesystem's need not agree.
HEARTBEAT = ".alive"
HEARTBEAT_STALE_S = 90.0


def wait_for_decision(path: Path, wait_s: float = DECISION_WAIT_S, stale_s: float = HEARTBEAT_STALE_S) -> str:
    """The word the submit host wrote to ``path`` (engine/dvcpipeline/commit.py), once it is there;
    a stop where the run that would write it is gone (its heartbeat unmoved for ``stale_s``)."""
    deadline = time.monotonic() + wait_s
    beat, beat_seen = None, time.monotonic()
    while not path.is_file():
        now = time.monotonic()
        try:
            moved = (path.parent / HEARTBEAT).stat().st_mtime_ns
        except OSError:
            moved = None
        if moved is not None and moved != beat:
            beat, beat_seen, deadline = moved, now, float("inf")  # a heartbeat: it decides, not the deadline
        if beat is not None and now - beat_seen > stale_s:
            return (f"stop no word in {path}: the snakedvc exp run that started this job stopped beating "
                    f"{now - beat_seen:.0f} s ago ({path.parent / HEARTBEAT} unmoved): it is gone")  # fmt: skip
        if now > deadline:
            return f"stop no word in {path} after {wait_s:.0f} s: the snakedvc exp run that started this job is gone"
        time.sleep(0.1)
    return path.read_text().strip()


# Options DVC passes to these shells so that no start-up file changes the command's environment.
QUIET_SHELL_OPTIONS = {"bash": ["--noprofile", "--norc"], "zsh": ["--no-rcs"]}


def shell_command(command: str, shell: str | None = None) -> list[str]:
    shell = shell or os.environ.get("SHELL") or "/bin/sh"
    return [shell, *QUIET_SHELL_OPTIONS.get(Path(shell).name, []), "-c", command]


def run_stage(
    name: str,
    commands: Sequence[str],
    wdir: str | Path,
    remove: Sequence[str],
    root: str | Path = ".",
    layout: Layout | None = None,
    keep_thread_limits: bool = False,
    decision: str | Path | None = None,
    plan: str | Path | None = None,
) -> int:
    """Remove ``remove`` (paths under ``root``) and make their folders, then run ``commands`` in
        ``wdir``; the first failing command's exit status, or 0. With a ``layout`` each command runs
        through `snakedvc launch` (N processes, N nodes, a job step of its own). With a ``decision``
        file, first wait for the submit host's word: run, skip (nothing removed, nothing run), defer (the
    same, and it runs in the run's next pass) or stop. With a ``plan`` (the run's plan.json, relative
    to ``root``) its Python processes' reads are audited (ReadAudit)."""
    root = Path(root).resolve()
    if decision is not None:
        word, _, why = wait_for_decision(root / decision).partition(" ")
        if word == "skip":  # DVC's line, plain: `snakedvc exp run` shows the job's log as DVC's console
            print(f"Stage '{name}' didn't change, skipping", flush=True)
            return 0
        if word == "defer":  # a stage it needs runs again: so does it, after that one
            log.info("stage %s: %s", name, why)
            return 0
        if word != "run":
            log.error("stage %s: not run: %s", name, why or word)
            return 1
    for path in remove:
        target = root / path
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ) if keep_thread_limits else without_thread_limits(dict(os.environ))
    env = {**env, "DVC_ROOT": str(root), "DVC_STAGE": name}
    audit = ReadAudit(root, root / plan, name) if plan is not None else None
    if audit is not None:
        env = audit.environment(env)
    code = 0
    print(f"Running stage '{name}':", flush=True)
    for command in commands:
        print(f"> {command}", flush=True)
        argv = shell_command(command)
        if layout:
            argv = launch.here(layout, argv)
            log.info("stage %s: launch: %s", name, shlex.join(argv))
        code = subprocess.run(argv, cwd=root / wdir, env=env).returncode
        if code != 0:
            log.error("stage %s: the command exited with status %d: %s", name, code, command)
            break
    if audit is not None and audit.deferred():
        return 0  # it runs again once the stages whose files it read are done: not a failure
    return code


# Where a stage's job notes what it read that another stage writes (engine/dvcpipeline/commit.py reads them).
DEFERRED_FOLDER, UNDECLARED_FOLDER = "deferred", "undeclared"


class ReadAudit:
    """The files a stage's Python processes read (snakedvc/reads), judged against the run's plan
    once its commands are done: a file another stage of the run writes, read before that stage
    finished, defers the stage (it runs again after that one, on the submit host's word)."""

    def __init__(self, root: Path, plan_file: Path, name: str) -> None:
        from snakedvc.engine.dvcpipeline.plan import Plan

        self.root, self.name = root, name
        self.plan = Plan.load(plan_file)
        self.rule = self.plan.stage(name).rule
        self.log = root / self.plan.folder / "reads" / f"{self.rule}.jsonl"

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        from snakedvc import reads

        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.unlink(missing_ok=True)
        return reads.environment(self.log, self.root, env)

    def deferred(self) -> bool:
        """Judge the reads; note what was read undeclared; whether the stage must run again."""
        from snakedvc import reads

        plan, root = self.plan, self.root
        outs = {s: [str(root / out) for out in plan.stage(s).outs] for s in plan.run}
        upstream = {s: list(plan.stage(s).upstream) for s in plan.run}
        finished: dict[str, float | None] = {}
        for stage in plan.run:
            marker = root / plan.ran(stage)
            finished[stage] = marker.stat().st_mtime if marker.exists() else None
        real_root = os.path.realpath(root)
        seen = [(os.path.join(str(root), os.path.relpath(p, real_root)), t) for p, t in reads.read_log(self.log)]
        premature, undeclared = reads.judge(self.name, seen, list(plan.run), outs, upstream, finished)
        for folder, found in ((DEFERRED_FOLDER, premature), (UNDECLARED_FOLDER, undeclared)):
            if found:
                note = root / plan.folder / folder / self.rule
                note.parent.mkdir(parents=True, exist_ok=True)
                relative = {os.path.relpath(path, root): stage for path, stage in found.items()}
                note.write_text(json.dumps(relative, indent=1) + "\n")
        for path, stage in premature.items():
            log.warning(
                "stage %s read %s before stage %s, which writes it, finished (not in its deps): it runs again after it",
                self.name, os.path.relpath(path, root), stage,
            )  # fmt: skip
        return bool(premature)
