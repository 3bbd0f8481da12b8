"""`snakedvc submit`: a run frozen, its workspace made, its controller started (a SLURM job or a process)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from snakedvc import slurm
from snakedvc.engine.dvcpipeline import ExpRunOptions, dry_run
from snakedvc.engine.env import python_module
from snakedvc.engine.names import NameTaken, check_name_is_free, validate_experiment_name
from snakedvc.engine.records import ignore_kit_folder
from snakedvc.engine.runs.record import FINISHED_STATES, RUN_REF_PREFIX, Run, RunError, git, repository_root, this_host
from snakedvc.engine.runs.state import list_runs
from snakedvc.engine.runs.workspace import (
    check_workflow_loads,
    controller_settings,
    earlier_outputs,
    freeze,
    head_commit,
    locked,
    make_workspace,
    profile_dir,
    profile_is_slurm,
    project_profile,
    python_environments,
    remove_workspace,
    source_paths,
)
from snakedvc.engine.settings import ControllerSettings
from snakedvc.engine.stamps import new_run_id
from snakedvc.engine.tracking import EXPERIMENT_PUSH_ENV
from snakedvc.slurm import SlurmUnavailable, SubmissionFailed, submit_once

# --- starting a controller --------------------------------------------------------------------


def controller_command(run: Run) -> list[str]:
    return [*python_module("snakedvc"), "controller", str(run.dir)]


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
                on_submit_limit=_SubmitLimitNotice(run),
            )
        except (SubmissionFailed, SlurmUnavailable) as e:
            run.update(**before)
            raise RunError(f"sbatch of the controller of run {run.id} failed: {e}") from None
        except KeyboardInterrupt:  # while it waited for room in the queue: nothing was submitted
            run.update(**before)
            raise
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
    _DETACHED.append(proc_local)  # it outlives this process on purpose: never reaped here, never warned of
    return run.update(controller_pid=proc_local.pid, controller_host=this_host())


class _SubmitLimitNotice:
    """Says once that sbatch refused the controller for a submit limit and that it is waiting."""

    def __init__(self, run: Run) -> None:
        self.run, self.said = run, False

    def __call__(self, refusal: str) -> None:
        if not self.said:
            self.said = True
            print(
                f"snakedvc: SLURM refused the controller of run {self.run.name} for a submit limit ({refusal}). "
                "Waiting for one of your jobs to leave the queue, then submitting it again (Ctrl-C: submit nothing).",
                file=sys.stderr,
                flush=True,
            )


# The local controllers this process started (kept, so that no "still running" warning comes of
# their Popen objects being collected while they run, as they should).
_DETACHED: list[subprocess.Popen[bytes]] = []


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


# --- submit ---------------------------------------------------------------------------------


# Where a submission from another machine holds its run id's lock while it is made.
SENT_LOCKS = Path(".snakedvc") / "sent"


@dataclass(frozen=True)
class SentCode:
    """A submission from another machine: the frozen commit it pushed here and its run id."""

    commit: str
    run_id: str


def adopt(root: Path, run_id: str) -> Run | None:
    """A submission sent again (its SSH connection dropped before the answer came back): the run
    of that id, its controller started where the first try stopped before that; None where the
    first try made nothing that lasts (what it left half-made is removed)."""
    runs = [run for run in list_runs(root) if run.id == run_id]
    if not runs:
        left = Run(id=run_id, name="", root=str(root), commit="", baseline="", profile="", snakemake_args=[],
                   slurm=False, created=0.0)  # fmt: skip
        if left.dir.exists():
            remove_workspace(left)
            shutil.rmtree(left.dir, ignore_errors=True)
        return None
    run = runs[0]
    if run.controller_jobs or run.controller_pid:
        return run
    if run.slurm and run.attempt:  # stopped after its sbatch, before the job id was kept
        found = slurm.find_submitted(controller_job_name(run), controller_job_comment(run), (), wait_s=10)
        if found is not None:
            return run.update(controller_jobs=[found])
    return start_controller(run)


def check_out_outputs(workspace: Path) -> None:
    """The workspace gets the outputs dvc.lock names from the shared cache (linked), so DVC finds
    up to date there what is up to date at submit; one not in the cache runs again."""
    from snakedvc.engine.tracking import repo_lock

    with repo_lock(workspace):
        proc = subprocess.run(
            [*python_module("dvc"), "checkout", "--quiet"],
            cwd=workspace, capture_output=True, text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"},
        )  # fmt: skip
    said = proc.stderr.strip() or proc.stdout.strip()
    if proc.returncode != 0 and said:  # outputs missing from the cache: their stages run again
        print(f"snakedvc submit: note: {said}", file=sys.stderr)


def check_run_name(name: str, root: Path, replace: bool) -> None:
    """A run's name: no active run's, and no experiment's unless ``replace`` (names never overwrite)."""
    taken = [r.id for r in list_runs(root) if r.name == name and r.state not in FINISHED_STATES]
    if taken:
        raise RunError(f"run name {name!r} is in use by active run {taken[0]}: choose another --name")
    try:
        check_name_is_free(name, root, replace, how="replace it on purpose with snakedvc submit --replace")
    except NameTaken as error:
        raise RunError(str(error)) from None


def code_of_run(
    root: Path,
    run_id: str,
    name: str,
    profile: str,
    snakemake_args: Sequence[str],
    pipeline: ExpRunOptions | None,
    sent: SentCode | None,
) -> tuple[str, str, list[str]]:
    """The run's code (commit, tree) and the earlier runs' outputs its workspace gets: the working
    tree frozen, once the workflow is seen to load; or the commit sent from another machine (checked
    there; this clone's files are the baseline's, and no earlier outputs of theirs apply)."""
    if sent is not None:
        return sent.commit, git(root, "rev-parse", "--verify", sent.commit + "^{tree}"), []
    if pipeline is None:
        check_workflow_loads(root, profile, snakemake_args)
    else:  # read as the run will read it, changing nothing: one that cannot run fails here
        dry_run(pipeline.overrides, root, pipeline.resources_file, pipeline.selection())
    outputs = earlier_outputs(root)
    commit, tree = freeze(root, f"snakedvc run {run_id} ({name}): the code as submitted", outputs)
    return commit, tree, outputs


def submit(
    profile: str,
    snakemake_args: Sequence[str] = (),
    name: str = "",
    share: Sequence[str] = (),
    cwd: Path | str = ".",
    pipeline: ExpRunOptions | None = None,
    replace: bool = False,
    sent: SentCode | None = None,
    queued: bool = False,
) -> Run:
    """Freeze the working tree, make the run's workspace and start its controller; returns the run.
    ``queued``: an experiment of DVC's queue: its controller is started by the queue (runs/queue.py).
    ``pipeline``: a DVC pipeline's run (`snakedvc exp run` in the workspace, with these -S,
    --resources and targets); None: a Snakemake workflow's. ``sent``: code submitted from
    another machine (`submit --remote` there): its frozen commit instead of this working tree, its
    run id (a run of that id here already is the same submission, sent again: adopted), and the
    experiment pushed to the remotes at the end."""
    root = repository_root(cwd)
    if sent is None:
        return _submit(root, profile, snakemake_args, name, share, pipeline, replace, None, queued)
    # The first try of a submission sent again can still be running here: sshd does not stop a
    # command when its client's connection drops. One try of a run id at a time: the second
    # waits for the first, then adopts what it made.
    ignore_kit_folder(root)
    (root / SENT_LOCKS).mkdir(parents=True, exist_ok=True)
    with locked(root / SENT_LOCKS / f"{sent.run_id}.lock"):
        if (adopted := adopt(root, sent.run_id)) is not None:
            return adopted
        return _submit(root, profile, snakemake_args, name, share, pipeline, replace, sent, queued)


def _submit(
    root: Path,
    profile: str,
    snakemake_args: Sequence[str],
    name: str,
    share: Sequence[str],
    pipeline: ExpRunOptions | None,
    replace: bool,
    sent: SentCode | None,
    queued: bool = False,
) -> Run:
    baseline = head_commit(root) if sent is None else git(root, "rev-parse", "--verify", sent.commit + "^")
    run_id = new_run_id() if sent is None else sent.run_id
    name = validate_experiment_name(name) if name else run_id
    check_run_name(name, root, replace)
    profile = project_profile(root, profile)
    folder = profile_dir(root, profile)
    on_slurm = profile_is_slurm(folder)
    job = controller_settings(folder) if on_slurm else None  # bad settings fail here, before anything is made
    if on_slurm and not slurm.installed():
        raise RunError(f"profile {profile} submits to SLURM, but sbatch or squeue is not on PATH")
    commit, tree, outputs = code_of_run(root, run_id, name, profile, snakemake_args, pipeline, sent)
    git(root, "update-ref", RUN_REF_PREFIX + run_id, commit)
    ignore_kit_folder(root)
    run = Run(
        id=run_id, name=name, root=str(root), commit=commit, baseline=baseline, profile=profile,
        snakemake_args=list(snakemake_args), slurm=on_slurm, created=time.time(),
        exp_run_args=None if pipeline is None else pipeline.args(), replace=replace, queued=queued,
    )  # fmt: skip
    run.dir.mkdir(parents=True)
    try:
        make_workspace(root, run.workspace, baseline, tree, [*python_environments(root), *share], outputs)
        if pipeline is not None:
            check_out_outputs(run.workspace)
        paths = source_paths(root, run.workspace)
        if paths:
            run.environment = {"PYTHONPATH": os.pathsep.join(paths)}
        if sent is not None:  # its results go home through the remotes (snakedvc pull --remote)
            run.environment = {**run.environment, EXPERIMENT_PUSH_ENV: "1"}
        run.save()
        return run if queued else start_controller(run, job)
    except BaseException:
        remove_workspace(run)
        shutil.rmtree(run.dir, ignore_errors=True)
        with contextlib.suppress(RunError):
            git(root, "update-ref", "-d", RUN_REF_PREFIX + run_id)
        raise
