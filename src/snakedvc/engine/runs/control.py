"""Cancelling, resuming and cleaning up runs."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from snakedvc import slurm
from snakedvc.engine.runs.owner import refuse_others_run
from snakedvc.engine.runs.record import ACTIVE_STATES, CANCEL_MARKER, FINISHED_STATES, Run, RunError
from snakedvc.engine.runs.state import controller_alive, current_state, list_runs, squeue_states, state_and_why
from snakedvc.engine.runs.submission import start_controller
from snakedvc.engine.runs.workspace import locked, remove_workspace
from snakedvc.slurm import SlurmUnavailable

# A cancelled run's controller gets this long without a line in its log before everything is
# stopped at once, and this long in all.
CANCEL_QUIET_S = 30.0
CANCEL_WAIT_S = 300.0

# --- controlling ------------------------------------------------------------------------------


def jobs_in_workspace(run: Run) -> list[str]:
    """Queued or running SLURM jobs whose working directory is the run's workspace (the rule
    jobs of any of its controllers), the controllers themselves left out. None for a run whose
    profile runs its jobs locally: SLURM is not asked, so a cancel does not depend on it."""
    if not run.slurm and not any(
        arg in ("--executor", "-e") or arg.startswith("--executor=") for arg in run.snakemake_args
    ):
        return []
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


def _log_size(run: Run) -> int:
    try:
        return run.log.stat().st_size
    except OSError:
        return 0


def cancel(run: Run, quiet_s: float = CANCEL_QUIET_S, wait_s: float = CANCEL_WAIT_S) -> Run:
    """Stop the run: its controller (no experiment is saved) and every SLURM job it submitted."""
    refuse_others_run(run.dir, run.id, "cancel")
    state, why = state_and_why(run)
    if state in FINISHED_STATES:
        raise RunError(f"run {run.id} has already {'ended as ' + state if state != 'done' else 'finished'}")
    if state == "unknown":
        raise RunError(f"run {run.id} not cancelled: {why}. Try again when SLURM answers.")
    (run.dir / CANCEL_MARKER).write_text(f"{time.time()}\n")
    try:
        # Why: the controller alone is told first; its Snakemake then cancels the run's jobs itself
        # and stops without an "Error in rule" block for each job that the cancel killed (as when
        # every process and job was signalled at once). Its local jobs (tracking) still finish, one
        # after another, which on a busy host takes longer than any fixed grace: everything is
        # stopped only once the controller's log has been quiet for ``quiet_s`` (or after ``wait_s``);
        # a SLURM run's controller says every 10 s which local rules are still running.
        told_controller = _tell_controller_to_cancel(run)
        started = time.monotonic()
        last_size, last_change = _log_size(run), started
        forced = not told_controller
        if forced:
            _stop_everything(run)
        while time.monotonic() - started < wait_s:
            if not controller_alive(run) and not jobs_in_workspace(run):
                break
            size = _log_size(run)
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            if not forced and time.monotonic() - last_change > quiet_s:
                forced = True
                _stop_everything(run)
            time.sleep(0.5)
        else:
            _stop_everything(run)
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
    refuse_others_run(run.dir, run.id, "resume")
    with locked(run.dir / "resume.lock"):  # two resumes at once: the second sees the first's controller
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


def clean(root: Path) -> list[Run]:
    """Remove the workspaces of finished runs (their results are in DVC); keep records and logs."""
    removed = []
    for run in list_runs(root):
        if current_state(run) in FINISHED_STATES and run.workspace.exists():
            remove_workspace(run)
            removed.append(run)
    return removed
