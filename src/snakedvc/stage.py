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


# Seconds a stage's job waits for the word whether to run. It comes within seconds of the
# upstream stages' end; none after this long means the run that started the job is gone.
DECISION_WAIT_S = 600


def wait_for_decision(path: Path, wait_s: float = DECISION_WAIT_S) -> str:
    """The word the submit host wrote to ``path`` (engine/dvcpipeline/commit.py), once it is there."""
    deadline = time.monotonic() + wait_s
    while not path.is_file():
        if time.monotonic() > deadline:
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
) -> int:
    """Remove ``remove`` (paths under ``root``) and make their folders, then run ``commands`` in
    ``wdir``; the first failing command's exit status, or 0. With a ``layout`` each command runs
    through `snakedvc launch` (N processes, N nodes, a job step of its own). With a ``decision``
    file, first wait for the submit host's word: run, skip (nothing removed, nothing run) or stop."""
    root = Path(root).resolve()
    if decision is not None:
        word, _, why = wait_for_decision(root / decision).partition(" ")
        if word == "skip":
            log.info("Stage '%s' didn't change, skipping", name)
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
    for command in commands:
        log.info("stage %s: > %s", name, command)
        argv = shell_command(command)
        if layout:
            argv = launch.here(layout, argv)
            log.info("stage %s: launch: %s", name, shlex.join(argv))
        code = subprocess.run(argv, cwd=root / wdir, env=env).returncode
        if code != 0:
            log.error("stage %s: the command exited with status %d: %s", name, code, command)
            return code
    return 0
