"""`snakedvc controller RUN_DIR`: the process that runs a submitted run's workflow (see snakedvc.engine.runs).

It runs Snakemake in the run's workspace and records the outcome in run.json. It is the run's
submit host: Snakemake's local rules and `onsuccess` (the DVC hook) run here, one DVC command
at a time through the lock all workspaces of the repository share.

When a controller is lost (SLURM job scancel'd, time limit, preemption: SIGTERM), it submits
its successor (bounded by the profile's controller `retries`), unless the stop was a
`snakedvc cancel`. A new controller first waits for its predecessor to be gone, then stops the
rule jobs the predecessor left running (a training job checkpoints on the SIGTERM), so no two
trainers of one run ever run side by side; then Snakemake picks up where the run was:
finished steps are kept, training resumes from its checkpoint.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from snakedvc import slurm
from snakedvc.engine.env import python_module
from snakedvc.engine.foreground import descendants
from snakedvc.engine.names import EXPERIMENT_NAME_ENV, EXPERIMENT_REPLACE_ENV
from snakedvc.engine.runs.control import jobs_in_workspace
from snakedvc.engine.runs.record import CANCEL_MARKER, Run, RunError
from snakedvc.engine.runs.state import NOTHING_TO_BE_DONE, describe_failure, failure_reason, squeue_states
from snakedvc.engine.runs.submission import start_controller
from snakedvc.engine.runs.workspace import controller_settings, profile_dir
from snakedvc.engine.tracking import EXPERIMENTS_FILE_ENV
from snakedvc.slurm import SlurmUnavailable

EXPERIMENTS_FILE = "experiments.txt"
# How long a new controller waits for the previous one's jobs to go (SLURM's KillWait is 30 s
# by default; a training job writes its checkpoint within it).
LEFTOVER_WAIT_S = 300
# While a cancelled SLURM run's Snakemake lets its local rules (tracking) finish, the controller
# says so this often: `snakedvc cancel` stops everything only once the log has been quiet for longer
# (control.CANCEL_QUIET_S), so steps that wait their turn for the DVC lock are not killed.
CANCEL_HEARTBEAT_S = 10.0


def say(message: str) -> None:
    print(f"[snakedvc controller {time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", flush=True)


# What sshd sets for its session (bash reads them to decide whether to source ~/.bashrc).
SSH_SESSION_VARIABLES = ("SSH_CLIENT", "SSH2_CLIENT", "SSH_CONNECTION", "SSH_TTY")


class Controller:
    def __init__(self, run_dir: Path) -> None:
        self.run = Run.load(run_dir)
        self.snakemake: subprocess.Popen[bytes] | None = None
        self.lost = False  # SIGTERM that was not a cancel: a successor takes over
        self.jobid = slurm.job_id() or ""
        # Read once, here: the SIGTERM handler starts the successor with it.
        self.job = controller_settings(profile_dir(self.run.workspace, self.run.profile)) if self.run.slurm else None

    def main(self) -> int:
        run = self.run
        say(f"run {run.id} ({run.name}), attempt {run.attempt}, in {run.workspace}")
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        if run.cancel_requested:
            return self._finish("cancelled", None)
        self.run = run = run.update(state="running", controller_host=socket.gethostname(), controller_pid=os.getpid())
        if run.slurm:
            self._wait_for_predecessor()
            self._stop_leftover_jobs()
        env = self._environment()
        if run.exp_run_args is None:
            self._unlock(env)
            command = [*python_module("snakemake"), "--profile", run.profile, *run.snakemake_args]
        else:  # a DVC pipeline; exp run takes DVC's lock and its own, and leaves Snakemake's alone
            command = [
                # -v: Snakemake's lines in the run's log, which this controller reads
                *python_module("snakedvc"), "exp", "run", "-v", "--profile", run.profile, "-n", run.name,
                *run.exp_run_args, "--", *run.snakemake_args,
            ]  # fmt: skip
        say("running: " + " ".join(command))
        start = run.log.stat().st_size if run.log.is_file() else 0
        self.snakemake = subprocess.Popen(command, cwd=run.workspace, env=env)
        code = self._wait_for_snakemake()
        say(f"snakemake exited with {code}")
        if self.lost:
            return code or 1  # the successor (if any) records the outcome
        if Run.load(run.dir).cancel_requested:
            return self._finish("cancelled", code)
        with open(run.log, errors="replace") as handle:  # what Snakemake said in this attempt
            handle.seek(start)
            said = handle.read()
        if code != 0:
            return self._finish("failed", code, reason=failure_reason(said, run.workspace))
        note = ""
        if NOTHING_TO_BE_DONE in said:
            note = ("nothing to be done: every output was already up to date for this code and config; "
                    "no job ran and no new experiment was saved (the results are those of earlier runs)")  # fmt: skip
        return self._finish("done", code, note=note)

    def _wait_for_snakemake(self) -> int:
        assert self.snakemake is not None
        while True:
            try:
                return self.snakemake.wait(timeout=CANCEL_HEARTBEAT_S)
            except subprocess.TimeoutExpired:
                # Under SLURM, what runs below Snakemake here is its local rules (tracking): let
                # them finish. A local run's steps (training too) are stopped with it instead.
                if not self.run.slurm or self.lost or not (self.run.dir / CANCEL_MARKER).exists():
                    continue
                steps = running_descendants(self.snakemake.pid)
                if steps:  # a Snakemake with nothing running stays quiet: cancel then stops it
                    say("cancelling: local steps still running, let finish: " + "; ".join(steps)[:300])

    def _finish(self, state: str, code: int | None, note: str = "", reason: dict[str, Any] | None = None) -> int:
        experiments_file = self.run.dir / EXPERIMENTS_FILE
        saved = experiments_file.read_text().split() if experiments_file.is_file() else []
        self.run = self.run.update(
            state=state, exit_code=code, ended=time.time(), experiments=saved, note=note, reason=reason or {}
        )
        say(
            f"run {self.run.id} {state}"
            + (f"; experiments: {', '.join(saved)}" if saved else "")
            + (f"; {note}" if note else "")
        )
        for line in describe_failure(self.run.reason):
            say(line.strip())
        if self.run.queued:  # its slot is free: the queue's next experiment starts
            self._start_next_queued()
        return 0 if state == "done" else 1

    def _start_next_queued(self) -> None:
        from snakedvc.engine.runs.queue import start_next

        # The next controller is a new job, not a step of this one (SLURM's variables of this job out).
        clean = slurm.without_job_environment(os.environ)
        os.environ.clear()
        os.environ.update(clean)
        try:
            for run in start_next(Path(self.run.root)):
                say(f"queue: started {run.name} (run {run.id})")
        except (RunError, OSError) as error:  # the queue waits for `snakedvc queue start`
            say(f"queue: the next experiment could not start: {error}")

    def _environment(self) -> dict[str, str]:
        env = slurm.without_job_environment(os.environ)
        # A run submitted over SSH is no SSH session: with SSH_CLIENT set, bash sources ~/.bashrc in
        # every rule's shell (it takes itself for sshd's), and a .bashrc that sets up pyenv or conda
        # puts its python before the run's environment.
        for key in SSH_SESSION_VARIABLES:
            env.pop(key, None)
        for key, value in self.run.environment.items():
            env[key] = value + (os.pathsep + env[key] if env.get(key) else "")
        env[EXPERIMENT_NAME_ENV] = self.run.name
        if self.run.replace:
            env[EXPERIMENT_REPLACE_ENV] = "1"
        env[EXPERIMENTS_FILE_ENV] = str(self.run.dir / EXPERIMENTS_FILE)
        env.setdefault("DVC_NO_ANALYTICS", "1")
        return env

    def _unlock(self, env: dict[str, str]) -> None:
        # A lost controller's Snakemake left its lock behind; only one controller runs per workspace.
        locks = self.run.workspace / ".snakemake" / "locks"
        if locks.is_dir() and any(locks.iterdir()):
            command = [
                *python_module("snakemake"),
                "--profile",
                self.run.profile,
                "--unlock",
                *self.run.snakemake_args,
            ]
            subprocess.run(command, cwd=self.run.workspace, env=env, check=False, capture_output=True)

    def _wait_for_predecessor(self) -> None:
        previous = [j for j in self.run.controller_jobs if j != self.jobid]
        if previous and not self._wait_gone(lambda: squeue_states(previous)):
            raise RunError(f"the previous controller job(s) {', '.join(previous)} of run {self.run.id} did not end")

    def _stop_leftover_jobs(self) -> None:
        leftover: list[str] = []

        def find_leftover() -> list[str]:  # [] once SLURM has answered
            leftover[:] = [j for j in jobs_in_workspace(self.run) if j != self.jobid]
            return []

        if not self._wait_gone(find_leftover):
            raise RunError(
                f"SLURM did not answer for {LEFTOVER_WAIT_S} s: cannot tell which jobs of run {self.run.id} still run"
            )
        if not leftover:
            return
        say(f"stopping jobs left by the previous controller: {', '.join(leftover)} (a training job checkpoints)")
        slurm.cancel(leftover)
        if not self._wait_gone(lambda: squeue_states(leftover)):
            raise RunError(f"jobs {', '.join(leftover)} of run {self.run.id} did not stop: scancel them and resume")

    @staticmethod
    def _wait_gone(jobs: Callable[[], Any], wait_s: float = LEFTOVER_WAIT_S) -> bool:
        """Wait until ``jobs()`` is empty; False after ``wait_s``. While SLURM does not answer the jobs
        count as still there: two controllers, or two trainers, must never overlap."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if not jobs():
                    return True
            except SlurmUnavailable as e:
                say(f"waiting for SLURM to answer: {e}")
            if time.monotonic() > deadline:
                return False
            time.sleep(2)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        run = Run.load(self.run.dir)
        if (run.dir / CANCEL_MARKER).exists() or not run.slurm:
            # A cancel (or a local stop): Snakemake cancels its jobs on SIGINT.
            say(f"signal {signal.Signals(signum).name}: stopping snakemake")
            if self.snakemake is not None and self.snakemake.poll() is None:
                self.snakemake.send_signal(signal.SIGINT)
            if not (run.dir / CANCEL_MARKER).exists():
                (run.dir / CANCEL_MARKER).write_text(f"{time.time()} signal {signum}\n")
            return
        if self.lost:
            return
        self.lost = True
        retries = self.job.retries if self.job else 0
        if run.attempt > retries:
            say(f"controller lost (signal {signum}); no retries left ({retries}): `snakedvc resume {run.id}` continues")
            run.update(state="failed", ended=time.time())
            return
        try:
            successor = start_controller(run, self.job)
        except RunError as e:
            say(f"controller lost (signal {signum}) and its successor could not start: {e}")
            run.update(state="failed", ended=time.time())
            return
        say(f"controller lost (signal {signum}): controller job {successor.controller_jobs[-1]} takes over")
        # SLURM's SIGTERM left Snakemake waiting for its running jobs until the SIGKILL (KillWait):
        # end it now, so the successor (which waits for this job to end) takes over sooner.
        if self.snakemake is not None and self.snakemake.poll() is None:
            self.snakemake.kill()


def running_descendants(pid: int) -> list[str]:
    """The command lines of the processes below ``pid`` (from /proc), a Snakemake among them left out."""
    found = []
    for child in descendants(pid):
        try:
            argv = (Path("/proc") / str(child) / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile
            continue
        if "snakemake" not in argv[1:3]:  # Snakemake itself (under `snakedvc exp run`) is no step
            found.append(" ".join(argv).strip())
    return found


def main(run_dir: str) -> int:
    return Controller(Path(run_dir)).main()
