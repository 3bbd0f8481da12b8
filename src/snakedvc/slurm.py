"""What the kit knows of SLURM itself, shared by the host side (runs, controller, report) and the
kit's SLURM executor: job states, bounded queries, and finding a job that a failed sbatch made."""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Collection, Sequence

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


def submit_once(command: Sequence[str], name: str, comment: str, known: Collection[str] = (), attempts: int = 3) -> str:
    """Run ``command`` (an sbatch call with --parsable, --job-name=``name`` and --comment=``comment``,
    unique to this submission) and return the job id. When sbatch fails in a way that may have made
    the job anyway (a timeout), the job is looked for and adopted (find_submitted); only when there
    is none is it submitted again. ``known``: job ids that an earlier submission already owns."""
    error = ""
    for _ in range(attempts):
        try:
            proc = subprocess.run(list(command), capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            error = f"sbatch timed out after {SBATCH_TIMEOUT_S} s"
        else:
            if proc.returncode == 0:
                return proc.stdout.strip().split(";")[0]
            error = proc.stderr.strip() or f"exit {proc.returncode}"
        if not is_ambiguous(error):
            raise SubmissionFailed(error)
        adopted = find_submitted(name, comment, known)
        if adopted is not None:
            return adopted
    raise SubmissionFailed(f"{error} ({attempts} tries; no job named {name} with comment {comment} was made)")
