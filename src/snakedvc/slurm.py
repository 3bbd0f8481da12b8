"""The kit's one room for SLURM: every SLURM command it runs (sbatch, squeue, sacct, scancel,
scontrol, sinfo, srun's command line), the parsing of their output, the job-state sets and the
``SLURM_*`` variables a job reads. Host side (runs, controller, report, the kit's executor) and job
side (launch, the checkpoint lease, progress) both ask it; nothing else names a SLURM command.
Standard library only: the steps' environments import it too."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

# States of a job that is still queued or running (SLURM's job state codes).
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SUSPENDED",
        "CONFIGURING",
        "COMPLETING",
        "STAGE_OUT",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "POWER_UP_NODE",
    }
)

# States in which no process of the job runs (pending: not started yet, or requeued after a kill; or ended).
NOT_RUNNING_STATES = frozenset(
    {
        "PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
        "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED",
    }
)  # fmt: skip

# How long one squeue/sinfo call may take before SLURM counts as not answering. squeue gives up on
# its own after slurm.conf's MessageTimeout (10 s by default); a stalled slurmctld must not stall us.
QUERY_TIMEOUT_S = 15

# sbatch errors after which the job may exist all the same: slurmctld got the request but its
# answer never came (a stalled or overloaded controller processes the request later).
AMBIGUOUS_SBATCH_ERRORS = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Zero Bytes were transmitted or received",
    "Connection reset",
    "Connection refused",
    "Transport endpoint",
    "timed out",  # our own timeout (subprocess)
)

# Pending reasons that SLURM will not clear for the job as it was submitted: it would wait forever.
# (From squeue(1) "JOB REASON CODES"; what to change, for the error message.) Reasons that clear by
# themselves (Resources, Priority, ReqNodeNotAvail for a node that is down, ...) are not here.
NEVER_CLEARS = {
    "PartitionTimeLimit": "its time limit is above the partition's MaxTime: lower the rule's runtime or use a "
    "partition that allows it",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows: lower nodes or change partition",
    "PartitionConfig": "the partition cannot give what it asks for (GPUs, tasks per GPU, CPUs): change the rule's "
    "resources or the partition",
    "BadConstraints": "no node has the features (constraint) it asks for",
    "InvalidAccount": "its account is not valid: set resources slurm_account",
    "InvalidQOS": "its QOS is not valid",
    "DependencyNeverSatisfied": "a job it depends on failed",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above its QOS's maximum: lower runtime or change QOS",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than its QOS allows",
    "QOSMaxGRESPerJob": "it asks for more GPUs/GRES than its QOS allows",
    "QOSMaxMemoryPerJob": "it asks for more memory than its QOS allows",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than its QOS allows",
    "QOSMinGRES": "it asks for fewer GPUs/GRES than its QOS requires",
    "AssocMaxWallDurationPerJobLimit": "its time limit is above its account's maximum",
    "AssocMaxCpuPerJobLimit": "it asks for more CPUs than its account allows",
    "AssocMaxGRESPerJob": "it asks for more GPUs/GRES than its account allows",
    "AssocMaxNodePerJobLimit": "it asks for more nodes than its account allows",
    "AssocMaxMemPerJob": "it asks for more memory than its account allows",
}


class SlurmUnavailable(RuntimeError):
    """SLURM did not answer a query (slurmctld stalled, restarting or unreachable)."""


def query(command: Sequence[str], timeout: float = QUERY_TIMEOUT_S) -> str:
    """stdout of a SLURM client command; SlurmUnavailable when it fails or takes longer than ``timeout``."""
    try:
        proc = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"SLURM did not answer within {timeout:g} s ({shlex.join(command)})") from None
    except OSError as e:
        raise SlurmUnavailable(f"{shlex.join(command)}: {e}") from None
    if proc.returncode != 0:
        said = proc.stderr.strip() or f"exit {proc.returncode}"
        raise SlurmUnavailable(f"SLURM did not answer: {shlex.join(command)}: {said}")
    return proc.stdout


def queued(jobids: Sequence[str], timeout: float = QUERY_TIMEOUT_S) -> dict[str, str]:
    """Job id -> state for those of ``jobids`` still queued or running; SlurmUnavailable when squeue
    fails. A job that SLURM no longer knows is simply absent."""
    return {jobid: state for jobid, state in job_states(jobids, timeout).items() if state in ACTIVE_STATES}


def job_states(jobids: Sequence[str], timeout: float = QUERY_TIMEOUT_S) -> dict[str, str]:
    """Job id -> state (any state, while SLURM remembers the job: MinJobAge) from squeue. squeue exits 1
    for a list of jobs it has all forgotten: then {}."""
    if not jobids:
        return {}
    try:
        out = query(["squeue", "-h", "-t", "all", "-j", ",".join(jobids), "-o", "%i %T"], timeout)
    except SlurmUnavailable as e:
        if "Invalid job id specified" in str(e):
            return {}
        raise
    return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)


# sbatch errors of a submit limit (sacctmgr's MaxSubmitJobs / GrpSubmitJobs of the association, a
# QOS's MaxSubmitJobsPerUser / PerAccount): they clear as the user's queued jobs end.
SUBMIT_LIMIT_ERRORS = (
    "AssocMaxSubmitJobLimit",
    "AssocGrpSubmitJobsLimit",
    "QOSMaxSubmitJobPerUserLimit",
    "QOSMaxSubmitJobPerAccountLimit",
    "QOSGrpSubmitJobsLimit",
    "job submit limit",  # "Job violates accounting/QOS policy (job submit limit, ...)"
)


def is_submit_limit(sbatch_error: str) -> bool:
    """Whether sbatch refused a job because the user (or account) has as many queued as allowed."""
    return any(fragment in sbatch_error for fragment in SUBMIT_LIMIT_ERRORS)


@dataclass(frozen=True)
class SubmitRoom:
    """How many more jobs may be queued before sbatch refuses one (``free``), and the limit that says so."""

    free: int
    limit: str  # e.g. "MaxSubmitJobs=5 of user ana in account lab"


def default_account(user: str) -> str | None:
    """The user's default SLURM account (sacctmgr), None where accounting does not say."""
    out = query(["sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount"]).strip()
    return out.splitlines()[0].strip() or None if out else None


def submit_room(user: str, account: str) -> SubmitRoom | None:
    """The room slurmctld leaves ``user`` in ``account`` under the association's submit limits
    (MaxSubmitJobs of the user's association, GrpSubmitJobs of it and of the account), as slurmctld
    counts them now (`scontrol show assoc_mgr`: "MaxSubmitJobs=5(3)" is a limit of 5, 3 used);
    None where no such limit is set. SlurmUnavailable when scontrol fails."""
    out = query(["scontrol", "show", "assoc_mgr", f"users={user}", f"accounts={account}", "flags=assoc"])
    rooms: list[SubmitRoom] = []
    owner = ""
    for line in out.splitlines():
        record = re.match(r"ClusterName=\S+ Account=(\S+) UserName=(\S*)", line)
        if record:
            name = record.group(2).split("(")[0]
            owner = f"user {name} in account {record.group(1)}" if name else f"account {record.group(1)}"
            continue
        for key, limit, used in re.findall(r"\b(MaxSubmitJobs|GrpSubmitJobs)=(\d+)\((\d+)\)", line):
            rooms.append(SubmitRoom(int(limit) - int(used), f"{key}={limit} of {owner}"))
    return min(rooms, key=lambda room: room.free) if rooms else None


def user_queued_jobs() -> int:
    """How many jobs of this user SLURM holds queued or running (squeue --me)."""
    return len(query(["squeue", "--me", "-h", "-o", "%i"]).split())


def is_ambiguous(sbatch_error: str) -> bool:
    """Whether an sbatch failure may have created the job all the same (see AMBIGUOUS_SBATCH_ERRORS)."""
    return any(fragment in sbatch_error for fragment in AMBIGUOUS_SBATCH_ERRORS)


def find_submitted(
    name: str, comment: str, known: Collection[str] = (), wait_s: float = 300, settle_s: float = 2.0
) -> str | None:
    """The id of a job named ``name`` with ``comment`` that is not among ``known``: the job that an
    sbatch which failed with an ambiguous error (is_ambiguous) made after all. None when there is none.

    Waits up to ``wait_s`` for SLURM to answer (a stalled slurmctld processes the pending request
    when it resumes), then asks once more after ``settle_s``, since the request may be handled just
    after the first answer. SlurmUnavailable when SLURM stays silent: submitting again then could
    make a second job.
    """
    command = ["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i|%k"]
    deadline = time.monotonic() + wait_s
    while True:
        try:
            query(command)
            break
        except SlurmUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    time.sleep(settle_s)
    found = []
    for line in query(command).splitlines():
        jobid, _, job_comment = line.partition("|")
        if job_comment.strip() == comment and jobid.strip() not in known:
            found.append(jobid.strip())
    return found[0] if found else None


def pending_reasons(jobids: Sequence[str]) -> dict[str, tuple[str, str, str]]:
    """Job id -> (reason, partition, time limit) for those of ``jobids`` that are pending."""
    if not jobids:
        return {}
    out = query(["squeue", "-h", "-t", "PD", "-j", ",".join(jobids), "-o", "%i|%r|%P|%l"])
    found = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 4:
            found[parts[0]] = (parts[1], parts[2], parts[3])
    return found


def pending_named(name: str) -> list[str]:
    """The user's pending jobs named ``name`` (a Snakemake run's jobs carry its run id as their name)."""
    out = query(["squeue", "--me", "-h", "-t", "PD", "--name", name, "-o", "%i"])
    return [line.strip() for line in out.splitlines() if line.strip()]


def partition_limits() -> dict[str, str]:
    """Partition -> MaxTime as sinfo writes it ("infinite", "1-00:00:00", "10:00"); the default
    partition's name keeps no "*"."""
    limits = {}
    for line in query(["sinfo", "-h", "-o", "%P|%l"]).splitlines():
        partition, _, limit = line.partition("|")
        limits[partition.strip().rstrip("*")] = limit.strip()
    return limits


def default_partition() -> str | None:
    for line in query(["sinfo", "-h", "-o", "%P"]).splitlines():
        if line.strip().endswith("*"):
            return line.strip().rstrip("*")
    return None


def minutes(limit: str) -> float | None:
    """SLURM's time format (minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds) in minutes;
    None for "infinite"/"UNLIMITED"/"NOT_SET"."""
    text = limit.strip()
    if not text or not text[0].isdigit():
        return None
    days = 0
    if "-" in text:
        day_part, text = text.split("-", 1)
        days = int(day_part)
    parts = [int(p) for p in text.split(":")]
    if days or "-" in limit:  # days-hours[:minutes[:seconds]]
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, (m, s) = 0, parts
    else:
        h, m, s = 0, parts[0], 0
    return days * 1440 + h * 60 + m + s / 60


def explain_never_starts(jobid: str, reason: str, partition: str, time_limit: str, limits: dict[str, str]) -> str:
    """The error for a job pending for a reason in NEVER_CLEARS."""
    said = f"SLURM job {jobid} would wait forever: pending with reason {reason}, {NEVER_CLEARS[reason]}"
    if reason == "PartitionTimeLimit":
        said += (
            f" (partition {partition}: MaxTime {limits.get(partition, '?')}; the job asks for {time_limit},"
            " from the rule's runtime resource)"
        )
    return said + ". The job was cancelled."


# How long one sbatch may take; beyond it the submission counts as ambiguous (find_submitted).
SBATCH_TIMEOUT_S = 60


class SubmissionFailed(RuntimeError):
    pass


# A job refused for a submit limit: the user's queue is looked at this often, and the job is
# submitted again after this long in any case (an account's limit counts other users' jobs too).
QUEUE_ROOM_POLL_S = 3.0
QUEUE_ROOM_RETRY_S = 60.0


def wait_for_queue_room(refusal: str) -> None:
    """Returns when one of the user's jobs has left the queue, or after QUEUE_ROOM_RETRY_S.
    SubmissionFailed when the user has no job queued: no job of theirs will end to make room."""
    queued = user_queued_jobs()
    if queued == 0:
        raise SubmissionFailed(
            f"{refusal} (you have no job queued, so waiting makes no room: the limit lets you queue none; "
            "ask your cluster's admins, `sacctmgr show assoc user=$USER` shows it)"
        )
    deadline = time.monotonic() + QUEUE_ROOM_RETRY_S
    while time.monotonic() < deadline:
        time.sleep(QUEUE_ROOM_POLL_S)
        if user_queued_jobs() < queued:
            return


def submit_once(
    command: Sequence[str],
    name: str,
    comment: str,
    known: Collection[str] = (),
    attempts: int = 3,
    on_submit_limit: Callable[[str], None] | None = None,
) -> str:
    """Run ``command`` (an sbatch call with --parsable, --job-name=``name`` and --comment=``comment``,
    unique to this submission) and return the job id. When sbatch fails in a way that may have made
    the job anyway (a timeout), the job is looked for and adopted (find_submitted); only when there
    is none is it submitted again. ``known``: job ids that an earlier submission already owns.
    ``on_submit_limit``: called with sbatch's error each time it refuses the job for a submit limit;
    given, the job is submitted again when there is room (wait_for_queue_room), else it fails."""
    error = ""
    tries = 0
    while tries < attempts:
        try:
            proc = subprocess.run(list(command), capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            error = f"sbatch timed out after {SBATCH_TIMEOUT_S} s"
        else:
            if proc.returncode == 0:
                return proc.stdout.strip().split(";")[0]
            error = proc.stderr.strip() or f"exit {proc.returncode}"
        if on_submit_limit is not None and is_submit_limit(error):
            on_submit_limit(error)
            wait_for_queue_room(error)
            continue
        tries += 1
        if not is_ambiguous(error):
            raise SubmissionFailed(error)
        adopted = find_submitted(name, comment, known)
        if adopted is not None:
            return adopted
    raise SubmissionFailed(f"{error} ({attempts} tries; no job named {name} with comment {comment} was made)")


# --- inside a job: what SLURM tells a process through its environment ---------------------------


def job_id(env: Mapping[str, str] = os.environ) -> str | None:
    """The SLURM job this process runs in, None outside SLURM."""
    return env.get("SLURM_JOB_ID") or None


def array_task(env: Mapping[str, str] = os.environ) -> str | None:
    """ "<array job>_<task>" for an array task, else None."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else None


def cpus_per_task(env: Mapping[str, str] = os.environ) -> int | None:
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    return int(cpus) if cpus.isdigit() else None


def in_allocation_outside_steps(env: Mapping[str, str] = os.environ) -> bool:
    """A batch script or an salloc shell: a SLURM job, but no job step yet."""
    return "SLURM_JOB_ID" in env and "SLURM_STEP_ID" not in env


def first_host(env: Mapping[str, str] = os.environ) -> str:
    """The first node of this job's allocation (scontrol show hostnames)."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
    )
    return out.stdout.split()[0]


def without_job_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the SLURM job's own variables: the jobs a controller submits are new jobs."""
    return {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}


def step_command(nodes: int, cpus: int | None) -> list[str]:
    """srun for one task per node (torchrun's agent, or the command itself); a failed task ends the step.

    A one-node step overlaps: the jobs of a pack (or a group) each start theirs in one allocation,
    side by side on its CPUs, as Snakemake schedules them there; a step that asked for the CPUs
    alone would wait for the one before it to end (SLURM gives steps their CPUs exclusively)."""
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", *([f"--cpus-per-task={cpus}"] if cpus else []),
            *(["--overlap"] if nodes == 1 else []), "--kill-on-bad-exit=1"]  # fmt: skip


# --- on the submit host -----------------------------------------------------------------------


def installed(*commands: str) -> bool:
    """Whether this host has SLURM's client ``commands`` (default: sbatch and squeue); a laptop has none."""
    return all(shutil.which(command) is not None for command in commands or ("sbatch", "squeue"))


def has_accounting() -> bool:
    """Whether sacct is there to ask."""
    return installed("sacct")


def can_query() -> bool:
    """Whether squeue is there to ask."""
    return installed("squeue")


def batch_command(options: Sequence[str], script: str) -> list[str]:
    """The sbatch call for ``script`` with ``options``; --parsable prints the job id alone."""
    return ["sbatch", "--parsable", *options, script]


def cancel(jobids: Sequence[str], signal: str | None = None, batch_shell_only: bool = False) -> bool:
    """scancel ``jobids`` (with ``signal``: signal them instead; ``batch_shell_only``: only the batch
    script's own process). False when scancel failed."""
    if not jobids:
        return True
    options = [*([f"--signal={signal}"] if signal else []), *(["--batch"] if batch_shell_only else [])]
    return subprocess.run(["scancel", *options, *jobids], capture_output=True, text=True).returncode == 0


def jobs_by_workdir() -> dict[str, str]:
    """Every queued or running job -> its working directory; SlurmUnavailable when squeue cannot say."""
    if shutil.which("squeue") is None:
        return {}
    found = {}
    for line in query(["squeue", "-h", "-o", "%i %Z"]).splitlines():
        jobid, _, workdir = line.partition(" ")
        found[jobid.strip()] = workdir.strip()
    return found


def why_not_running(job: str, timeout: float = QUERY_TIMEOUT_S) -> str | None:
    """Why squeue says ``job`` runs no more, or None while it runs or when squeue cannot tell."""
    if shutil.which("squeue") is None:
        return None
    try:
        states = set(query(["squeue", "-h", "-j", job, "-o", "%T"], timeout).split())
    except SlurmUnavailable as e:
        if "invalid job id" in str(e).lower():
            return "squeue no longer knows it"
        raise
    if not states:
        return "squeue no longer lists it"
    if states <= NOT_RUNNING_STATES:
        return f"squeue says {', '.join(sorted(states))}"
    return None


def accounting(jobids: Sequence[str], fields: Sequence[str]) -> list[dict[str, str]]:
    """sacct's rows (jobs and their steps) for ``jobids``, each a dict of ``fields``; [] without
    accounting (no sacct, or it failed)."""
    if not jobids or shutil.which("sacct") is None:
        return []
    proc = subprocess.run(
        ["sacct", "-n", "-P", "--format", ",".join(fields), "-j", ",".join(jobids)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return []
    return [dict(zip(fields, line.split("|"), strict=False)) for line in proc.stdout.splitlines()]


def config_value(key: str) -> str | None:
    """One setting of the cluster's configuration (`scontrol show config`), None when unknown."""
    if shutil.which("scontrol") is None:
        return None
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = re.search(rf"^{re.escape(key)}\s*=\s*(\S+)", out, re.MULTILINE)
    return found.group(1) if found else None
