"""The official SLURM executor with five fixes: `executor: snakedvc-slurm`.

Everything else (sbatch flags from resources, job scripts, failure reasons, log deletion,
retries, cancelling) is snakemake-executor-plugin-slurm's own. Written for plugin
>=2.7.1,<2.9 (checked at import). This subclass only overrides public methods of its
Executor, and each fix is also a ready upstream patch in docs/upstream/ (README.md there):

- Suffixed sacct states (docs/upstream/0001-read-suffixed-sacct-states.patch). sacct
  reports a scancel'd job as "CANCELLED by <uid>"; the plugin matches states whole, so it
  reports that job as running forever and the workflow hangs. Here a state is read by its
  first word.
- Bounded status back-off (docs/upstream/0002-bounded-status-backoff.patch). The plugin
  waits 10 s longer after every status round in which no job finished, up to 180 s, so a
  short job's successor may start minutes late. Here the wait restarts at
  `init-seconds-before-status-checks` after a job finishes or is submitted, grows by
  `status-backoff-factor` per quiet round and never exceeds
  `max-seconds-between-status-checks` (default 30 s: two queries a minute while only long
  jobs run). A round costs one sacct (or squeue) call; a round in which a job ended costs a
  second one, the plugin's own, which handles that job.
- Failed status queries (docs/upstream/0004-keep-jobs-when-status-query-fails.patch). When
  all of a round's status queries fail (slurmdbd busy or restarting), the plugin yields
  none of the active jobs: Snakemake forgets them and waits forever. Here they stay active
  and are queried again next round; three failures in a row are reported once.
- Account guessing (docs/upstream/0003-account-guess-without-shell-pipe.patch). Without a
  `slurm_account` resource the plugin runs `sacct ... | tail -1` as one argument list (the
  pipe goes to sacct as arguments), which always fails, and warns three times per run.
  Here the account of your recent jobs is read with a proper argument list, once, and
  logged in one line.
- Quoted commands (docs/upstream/0006-wrap-command-quoted-for-the-shell.patch). The plugin
  passes a job's command as `--wrap="..."` through a shell, so `$(...)` in a project's path
  ran on the submit host. Here the command goes to sbatch as a script on stdin, its paths
  quoted (get_python_executable, get_snakefile, get_job_args).

Two changes of behaviour besides. A job's end is seen without waiting for accounting: its batch
script leaves its exit code in a file (with_exit_code_file), which the status loop looks for every
0.25 s (a directory listing on the submit host, no SLURM call); exit 0 is reported as success at
once, anything else still waits for sacct's state and failure reason (Executor.sleep and
check_active_jobs). And a job runs in the Snakemake that its batch script starts (Snakemake's local
executor), not through the jobstep's `srun` step and a second Snakemake (see
Executor.format_job_exec). A command that needs a job step of its own (multi-node training, a
checkpointing trainer that must receive `--signal=TERM@...`) makes it: `snakedvc launch` does.
Jobs with the `mpi` resource and array jobs keep the jobstep (and sacct alone for their end).

One addition: short jobs are packed many to a SLURM job (settings pack-runtime, pack-size; see
packing.py). Snakemake still hands out, follows and retries each job on its own; only the sbatch
is shared (Executor.run_jobs, report_job_submission, _report_pack_member).

Snakemake names a plugin's settings after the plugin, so in a profile they are spelled
`snakedvc-slurm-<setting>` (e.g. `snakedvc-slurm-status-command`).
"""

# No `from __future__ import annotations`: Snakemake builds its command-line options from
# the settings' field types, which must be real types, not strings.

import asyncio
import contextlib
import getpass
import importlib.metadata
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from snakemake.jobs import GroupJob
from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings as SlurmExecutorSettings
from snakemake_executor_plugin_slurm import common_settings  # noqa: F401 - required by Snakemake
from snakemake_executor_plugin_slurm.accounts import validate_account
from snakemake_executor_plugin_slurm.job_status_query import (
    query_job_status,
    query_job_status_sacct,
    query_job_status_squeue,
)
from snakemake_executor_plugin_slurm.utils import get_job_wildcards
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.real import RealExecutor
from snakemake_interface_executor_plugins.settings import SharedFSUsage

from snakedvc import slurm
from snakedvc.logs import keep_earlier_attempt_logs

# States of a job that is still queued or running: such a job needs nothing from the plugin this round.
from snakedvc.slurm import ACTIVE_STATES

from . import packing

PLUGIN = "snakemake-executor-plugin-slurm"
# The releases whose check_active_jobs, get_account_arg, run_jobs and status-query helpers
# these overrides were read against (2.7.1 and 2.8.0 are identical there).
SUPPORTED_PLUGIN_VERSIONS = ">=2.7.1,<2.9"


class UnsupportedPluginVersion(ImportError):
    pass


def check_plugin_version(installed: str) -> None:
    """Raise unless ``installed`` is a plugin release these overrides were written for."""
    try:
        supported = SpecifierSet(SUPPORTED_PLUGIN_VERSIONS).contains(Version(installed), prereleases=True)
    except InvalidVersion:
        supported = False
    if not supported:
        raise UnsupportedPluginVersion(
            f"snakedvc-slurm supports {PLUGIN} {SUPPORTED_PLUGIN_VERSIONS}, but {installed} is installed. "
            f"Install a supported release (pip install '{PLUGIN}{SUPPORTED_PLUGIN_VERSIONS}'), or re-check the "
            "overrides in snakemake_executor_plugin_snakedvc_slurm against the new release (the patches in "
            "docs/upstream/ say what each one fixes) and widen SUPPORTED_PLUGIN_VERSIONS."
        )


check_plugin_version(importlib.metadata.version(PLUGIN))

# The plugin's fail_stati (check_active_jobs) less NODE_FAIL (Executor._requeued_after_node_failure).
FAIL_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "ERROR"})
# How the Snakemake inside a SLURM job runs its job, or a group job's jobs (see
# Executor.format_job_exec); its --cores (the job's CPUs) bounds how many run at once.
IN_JOB_EXECUTOR_ARGS = "--executor local"
# Failed status rounds in a row before the user hears of it (one blip is normal on a busy cluster).
STATUS_FAILURES_BEFORE_WARNING = 3
# What the command being built is for (format_job_exec): an array job's, or one run by the local
# executor in its job. Per thread (the plugin submits from two), and not per executor: upstream's
# tests build Executors without their constructor.
_BUILDING = threading.local()
# sbatch calls for one job attempt whose failures may have made no job (report_job_error).
SBATCH_TRIES = 3
# Seconds between looks at the user's queued jobs while a submit limit (MaxSubmitJobs) is reached.
SUBMIT_ROOM_POLL_S = 3.0
# Seconds a short job waits for others to share its SLURM job (Executor._gather).
PACK_GATHER_S = 1.0
# How often a status-check wait looks whether a submission shortened it or a job left its exit code.
SLEEP_SLICE_SECONDS = 0.25


@dataclass
class ExecutorSettings(SlurmExecutorSettings):
    max_seconds_between_status_checks: int = field(
        default=30,
        metadata={
            "help": "Upper bound on the seconds between two status queries (one sacct or squeue call for all "
            "active jobs; the official plugin grows the wait by 10 s per quiet round, up to 180 s). Also bounds "
            "init-seconds-before-status-checks.",
            "env_var": False,
            "required": False,
        },
    )

    status_backoff_factor: float = field(
        default=1.5,
        metadata={
            "help": "After a status round in which no job finished, the wait before the next one is multiplied "
            "by this (>= 1; 1 polls at a fixed rate). It restarts at init-seconds-before-status-checks when a job "
            "finishes or is submitted.",
            "env_var": False,
            "required": False,
        },
    )

    pack_runtime: int = field(
        default=5,
        metadata={
            "help": "Jobs that declare a runtime of at most this many minutes (a DVC foreach's short stages, short "
            "sweep trials, any rule you give a short runtime) share SLURM jobs: the ones ready at the same time that "
            "ask for the same partition, account and flags go to one sbatch, up to pack-size of them, each with its "
            "own log, outputs, failure and retry. 0: every job is a SLURM job of its own.",
            "env_var": False,
            "required": False,
        },
    )

    pack_size: int = field(
        default=50,
        metadata={
            "help": "At most this many short jobs (pack-runtime) to one SLURM job; 1: every job its own.",
            "env_var": False,
            "required": False,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("pack_runtime", "pack_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "pack_runtime" else 1):
                least = 0 if name == "pack_runtime" else 1
                raise WorkflowError(
                    f"snakedvc-slurm-{name.replace('_', '-')} must be an integer >= {least}, got {value!r}"
                )
        # Why: the plugin's default passes a job's command as sbatch --wrap="..." through a shell on
        # the submit host, where a `$(...)` or backquotes in a path (a project folder's name) run,
        # double quotes being no quoting for them. As a script on sbatch's stdin nothing is expanded
        # (arrays excepted: run_array_jobs).
        self.pass_command_as_script = True
        cap = self.max_seconds_between_status_checks
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise WorkflowError(
                f"snakedvc-slurm-max-seconds-between-status-checks must be an integer >= 1, got {cap!r}"
            )
        factor = self.status_backoff_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 <= factor < float("inf"):
            raise WorkflowError(f"snakedvc-slurm-status-backoff-factor must be a number >= 1, got {factor!r}")


def next_status_interval(previous: float, *, finished: bool, init: float, cap: float, factor: float) -> float:
    """Seconds until the next status query: ``init`` after a round in which a job finished,
    otherwise ``factor`` times longer than the last wait; never more than ``cap``."""
    return min(init if finished else previous * factor, cap)


def with_exit_code_file(command: str, folder: Path, *, wrapped: bool) -> str:
    """``command``, then its exit status written to ``folder``/$SLURM_JOB_ID (complete or not at all:
    written aside, then renamed), and the batch script's exit with that same status.
    ``wrapped``: the plugin passes the command as sbatch --wrap="..." through a shell on the submit
    host, which would expand a bare `$` there."""
    dollar = "\\$" if wrapped else "$"
    path = f"{shlex.quote(str(folder))}/{dollar}SLURM_JOB_ID"
    return (
        f"{command}; status={dollar}?; echo {dollar}status > {path}.part && mv {path}.part {path}; exit {dollar}status"
    )


def read_exit_codes(folder: Path, jobids: Iterable[str]) -> dict[str, int]:
    """The exit codes that these jobs' batch scripts left in ``folder`` (with_exit_code_file)."""
    try:
        names = set(os.listdir(folder))
    except OSError:  # not made yet: no job submitted
        return {}
    codes = {}
    for jobid in jobids:
        if jobid in names:
            try:
                codes[jobid] = int((folder / jobid).read_text())
            except (OSError, ValueError):  # not a file we wrote: sacct decides
                continue
    return codes


def requested_gpus(job: Any) -> int:
    """GPUs a job asks for (resources gpu, or gres/gpus naming gpu)."""
    gpu = job.resources.get("gpu") or 0
    if gpu:
        return int(gpu)
    for key in ("gres", "gpus"):
        value = str(job.resources.get(key) or "")
        if "gpu" in value or (key == "gpus" and value):
            count = value.rsplit(":", 1)[-1]
            return int(count) if count.isdigit() else 1
    return 0


def last_account(sacct_output: str) -> str | None:
    """The account of the newest job in `sacct -n -o Account` output, None when there is none."""
    lines = [line.strip() for line in sacct_output.splitlines() if line.strip()]
    account = lines[-1] if lines else ""
    return None if account.lower() in {"", "(null)", "none"} else account


class _DropMessages(logging.Filter):
    """Drops log records whose message contains any of ``fragments``."""

    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(fragment in record.getMessage() for fragment in self.fragments)


# Plugin 2.7-2.8 warns "MinJobAge ...s (>= ...s). 'squeue' should work reliably for status queries."
# at every start when the status command is sacct and MinJobAge is at least 3 init intervals, which
# is every run of profiles/slurm: advice against a choice made on purpose (sacct gives failure
# reasons), printed each time. Only that one start-up message is dropped.
SQUEUE_ADVICE = "'squeue' should work reliably"


class Executor(SlurmExecutor):
    # Class-level defaults: upstream's tests build Executors without __post_init__, around a workflow
    # stand-in without a working directory (then there are no exit code files: exit_code_folder None).
    _last_query_at = -math.inf  # time.monotonic() of the last status query
    # Jobs whose batch script left a non-zero exit code: sacct gives their state and reason; a wait
    # is not cut short for them again. Replaced, never changed in place.
    _exit_codes_read: frozenset[str] = frozenset()
    # SLURM job ids this run owns (submitted or adopted): a job that a timed-out sbatch made is
    # found among the others (report_job_error). Replaced, never changed in place.
    _known_jobids: frozenset[str] = frozenset()
    # Snakemake job id -> sbatch failures of its current attempt. Replaced, never changed in place.
    _sbatch_failures: Mapping[int, int] = MappingProxyType({})
    _partition_limits: dict[str, str] | None = None  # sinfo's MaxTime per partition, read once
    _default: str | None = None  # the default partition, once read
    _term_handler_installed = False
    _cancelled_by_us: frozenset[str] = frozenset()  # jobs cancelled here: their end is not news
    _stopping = False  # SIGTERM came: a job submitted from now on is cancelled as it is reported
    # Accounts whose associations set no submit limit: not asked again. Replaced, never changed in place.
    _unlimited_accounts: frozenset[str] = frozenset()
    _said_submit_limit = False
    # id() of the packs (GroupJobs of short jobs, Executor._submit_pack) being submitted. Replaced, never changed in place.
    _pack_ids: frozenset[int] = frozenset()
    _packs_made = 0
    _gather_timer: threading.Timer | None = None
    _requeue_said: frozenset[str] = frozenset()  # jobs whose requeue after a lost node was said
    _said_capped = False  # a rule's threads capped by --cores: said once
    _submit_room_lock = threading.RLock()  # reentrant: a refused job is submitted again from inside run_job

    def __post_init__(self, test_mode: bool = False) -> None:
        quiet = _DropMessages(SQUEUE_ADVICE)
        if isinstance(self.logger, logging.Logger):
            self.logger.addFilter(quiet)
        try:
            super().__post_init__(test_mode)
        finally:
            if isinstance(self.logger, logging.Logger):
                self.logger.removeFilter(quiet)
        # Our account guess, made once (" -A acct" or ""); the lock because the plugin
        # submits from two threads.
        self._guessed_account_arg: str | None = None
        self._default_account: str | None = None  # "" where accounting names none
        self._account_lock = threading.Lock()
        self._failed_status_queries = 0  # in a row
        # Short jobs waiting for others of their shape (packing.shape) to share a SLURM job (_gather).
        self._gathered: dict[tuple[Any, ...], list[Any]] = {}
        self._gather_lock = threading.Lock()

    @property
    def exit_code_folder(self) -> Path | None:
        """Where this run's batch scripts leave their exit codes (Executor.format_job_exec)."""
        workdir = getattr(self.workflow, "workdir_init", None)
        return Path(workdir, ".snakemake", "snakedvc-slurm", self.run_uuid) if workdir else None

    def _initial_interval(self) -> float:
        settings = self.workflow.executor_settings
        init = settings.init_seconds_before_status_checks or 40  # the plugin's fallback for None
        return min(init, settings.max_seconds_between_status_checks)

    def run_jobs(self, jobs: list[Any]) -> None:
        self._install_term_handler()
        self._say_capped_threads(jobs)
        # getattr: upstream's unit tests drive run_jobs around stand-ins of the workflow and settings.
        settings = self.workflow.executor_settings
        pack_runtime, pack_size = getattr(settings, "pack_runtime", 0), getattr(settings, "pack_size", 1)
        pack_cores = getattr(getattr(self.workflow, "resource_settings", None), "cores", None)  # the profile's cores
        arrays = set(self.array_jobs or ())  # rules the user sends as array jobs (the plugin's array-jobs)
        packable = [
            job
            for job in jobs
            if pack_size >= 2
            and packing.packable(job, pack_runtime, requested_gpus, pack_cores)
            and "all" not in arrays
            and job.rule.name not in arrays
        ]
        if packable:
            self._gather(packable)
        # Why: a new job may be short; without this its first status query would wait for
        # however long the back-off has grown while older, long jobs were running.
        super().run_jobs([job for job in jobs if job not in packable])
        if jobs:
            self.next_seconds_between_status_checks = self._initial_interval()

    def _say_capped_threads(self, jobs: list[Any]) -> None:
        # Why: Snakemake caps every job's threads at --cores, remote jobs too (rules.py: "correct
        # even for remote jobs"), so a rule's `threads: 8` under a profile's `cores: 2` gets a
        # 2-CPU SLURM job without a word. Said once per run (a foreach's items are a rule each).
        for job in jobs:
            if self._said_capped:
                return
            try:
                declared = job.rule.resources["_cores"]
                asked = None if declared.is_evaluable() else declared.value
            except (AttributeError, KeyError, TypeError):  # a group job, or another Snakemake's Resource
                continue
            if isinstance(asked, int) and asked > job.threads:
                self._said_capped = True
                self.logger.warning(
                    f"Rule {job.rule.name} asks for {asked} threads, but Snakemake gives a job at most the profile's "
                    f"`cores` ({getattr(self.workflow.resource_settings, 'cores', '?')}): its SLURM job gets {job.threads} CPUs (said "
                    "once; other rules too). Set `cores` in your profile to the CPUs of your cluster's nodes (it also "
                    "sizes groups and packs of short jobs)."
                )

    # Why the gathering: Snakemake hands the executor the jobs it selected in one scheduling round,
    # and when a pack ends its members' successes reach the scheduler one at a time: the next round
    # may hold one freed job, the one after it the rest. Short jobs wait up to PACK_GATHER_S for
    # others of their shape; a full pack goes at once.
    def _gather(self, jobs: list[Any]) -> None:
        size = self.workflow.executor_settings.pack_size
        full: list[list[Any]] = []
        with self._gather_lock:
            for job in jobs:
                waiting = self._gathered.setdefault(packing.shape(job), [])
                waiting.append(job)
                if len(waiting) == size:
                    full.append(waiting[:])
                    waiting.clear()
            if any(self._gathered.values()) and self._gather_timer is None:
                self._gather_timer = threading.Timer(PACK_GATHER_S, self._submit_gathered)
                self._gather_timer.daemon = True
                self._gather_timer.start()
        for members in full:
            self._submit_pack(members)

    def _submit_gathered(self) -> None:
        with self._gather_lock:
            gathered = [members for members in self._gathered.values() if members]
            self._gathered = {}
            self._gather_timer = None
        size = self.workflow.executor_settings.pack_size
        for members in gathered:
            for chunk in packing.even_chunks(members, size):
                try:
                    self._submit_pack(chunk)
                except Exception as e:  # noqa: BLE001 - on this timer thread nobody else would hear of it
                    for job in chunk:
                        self.report_job_error(SubmittedJobInfo(job), msg=f"Not submitted: {e!r}")

    def _submit_pack(self, members: list[Any]) -> None:
        """One SLURM job for ``members`` (short jobs of one shape, gathered by _gather); halved while
        the pack's runtime (its members' one after another, as Snakemake sizes a group) is above its
        partition's MaxTime."""
        if len(members) == 1:
            self.run_job(members[0])
            return
        self._packs_made += 1
        pack = GroupJob(f"pack{self._packs_made}", frozenset(members), self.workflow.global_resources)
        pack.finalize()
        try:
            too_long = self._partition_problem(pack, self.get_partition_arg(pack)) is not None
        except Exception:  # noqa: BLE001 - e.g. a job needing more threads than `cores`: it cannot share
            for job in members:
                self.run_job(job)
            return
        if too_long:
            half = len(members) // 2
            self._submit_pack(members[:half])
            self._submit_pack(members[half:])
            return
        self._pack_ids = self._pack_ids | {id(pack)}
        self.run_job(pack)

    def _is_pack(self, job: Any) -> bool:
        return id(job) in self._pack_ids

    async def sleep(self) -> None:
        # Why: Snakemake's RemoteExecutor.sleep waits the whole interval in one asyncio.sleep,
        # so run_jobs shortening it would only apply to the wait after next. Waiting in
        # slices that re-read the interval makes a submission's reset take effect now, and
        # lets shutdown (which sets `wait` False, then joins this thread) end without a wait.
        # The slices also look for exit codes (with_exit_code_file): a job that has ended is handled
        # now, not when accounting has heard of it and the back-off has run out.
        started = time.monotonic()
        while self.wait and (left := self.next_seconds_between_status_checks - (time.monotonic() - started)) > 0:
            if self._a_job_left_its_exit_code():
                return
            await asyncio.sleep(min(left, SLEEP_SLICE_SECONDS))

    def _a_job_left_its_exit_code(self) -> bool:
        with self.lock:  # Snakemake's, guarding active_jobs
            waiting = {job.external_jobid for job in self.active_jobs}
        if not waiting:  # (also: the status thread's first wait may come before __post_init__)
            return False
        waiting -= self._exit_codes_read
        try:
            return self.exit_code_folder is not None and not waiting.isdisjoint(os.listdir(self.exit_code_folder))
        except OSError:
            return False

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        # Why: plugin 2.7-2.8 matches sacct states whole, so "CANCELLED by <uid>" (every
        # scancel) counts as running forever; and it queries and backs off linearly to 180 s.
        # Here a job whose batch script exited 0 is done without asking SLURM; for the others one
        # query per round reads each state's first word. Jobs still queued or running go straight
        # back; suffixed failures are reported here; jobs in any other state (COMPLETED, FAILED,
        # TIMEOUT, NODE_FAIL, PREEMPTED, ...) go to the plugin, whose handling of them (failure
        # reasons, log deletion, failed-node tracking) is then unchanged.
        still_active = await self._check(active_jobs)
        for job in still_active:
            yield job
        ended = {job.external_jobid for job in active_jobs} - {job.external_jobid for job in still_active}
        self._exit_codes_read -= ended
        if ended and self.exit_code_folder is not None:
            for jobid in ended:
                (self.exit_code_folder / jobid).unlink(missing_ok=True)

    async def _check(self, active_jobs: list[SubmittedJobInfo]) -> list[SubmittedJobInfo]:
        """One status round: reports the jobs that ended, returns those still queued or running."""
        previous = self.next_seconds_between_status_checks
        if not active_jobs:  # (also: Snakemake's status thread runs a first round before __post_init__)
            self.next_seconds_between_status_checks = self._initial_interval()
            return []
        folder = self.exit_code_folder
        codes = read_exit_codes(folder, [job.external_jobid for job in active_jobs]) if folder else {}
        self._exit_codes_read |= {jobid for jobid, code in codes.items() if code != 0}
        exited_zero = [job for job in active_jobs if codes.get(job.external_jobid) == 0]
        for job in exited_zero:
            self._report_success(job)
        others = [job for job in active_jobs if codes.get(job.external_jobid) != 0]
        init = self._initial_interval()
        if not others or (exited_zero and time.monotonic() - self._last_query_at < init):
            # Nothing to ask SLURM, or the round was started by an exit code moments after the last
            # query: the next look comes soon (a successor is usually being submitted).
            self.next_seconds_between_status_checks = init
            return others
        command, states = await self._query_states()
        self._last_query_at = time.monotonic()
        if states is None:
            self._note_failed_query(command)
            # Not handed to the plugin: when its own query fails too it yields none of the
            # jobs, Snakemake forgets them and the workflow hangs. Keep them, ask next round.
            still_active, finished = others, bool(exited_zero)
        else:
            self._failed_status_queries = 0
            still_active, ended = await self._handle_states(others, states)
            finished = bool(exited_zero) or ended
        # min(): the plugin's own update (when it ran) does not count, a submission's reset does.
        previous = min(previous, self.next_seconds_between_status_checks)
        settings = self.workflow.executor_settings
        self.next_seconds_between_status_checks = next_status_interval(
            previous,
            finished=finished,
            init=init,
            cap=settings.max_seconds_between_status_checks,
            factor=settings.status_backoff_factor,
        )
        return still_active

    def _note_failed_query(self, command: str) -> None:
        self._failed_status_queries += 1
        if self._failed_status_queries == STATUS_FAILURES_BEFORE_WARNING:
            self.logger.warning(
                f"The SLURM status query has failed {STATUS_FAILURES_BEFORE_WARNING} times in a row; the jobs "
                f"are kept as running and queried again. Run it to see why: {command}. Without an accounting "
                "database (slurmdbd) sacct cannot work: set snakedvc-slurm-status-command: squeue."
            )

    async def _handle_states(
        self, jobs: list[SubmittedJobInfo], states: dict[str, str]
    ) -> tuple[list[SubmittedJobInfo], bool]:
        """Reports the ``jobs`` that ended (as the query's ``states`` say, or the plugin, for the
        states it knows best); returns those still queued or running, and whether any ended."""
        from_squeue = await self._ends_missing_from_accounting(jobs, states)
        states = {**from_squeue, **states}
        still_active: list[SubmittedJobInfo] = []
        pending: list[SubmittedJobInfo] = []
        for_plugin: list[SubmittedJobInfo] = []
        finished = False
        requeued: dict[str, bool] = {}  # SLURM job id -> requeued after NODE_FAIL (a pack's members share one)
        for job in jobs:
            state = self._state_of(job, states)
            word = state.split()[0] if state else None
            if word == "NODE_FAIL" and await self._requeued_after_node_failure(job, requeued):
                still_active.append(job)  # the same job runs again (a pack's members with it)
            elif word is not None and word not in ACTIVE_STATES and job.aux.get("pack"):
                await self._report_pack_member(job, state or word)
                finished = True
            elif word is None or word in ACTIVE_STATES:
                still_active.append(job)  # queued, running, or not in accounting yet (as the plugin does)
                if word == "PENDING":
                    pending.append(job)
            elif word == "NODE_FAIL":  # not requeued: Snakemake's retry, which SLURM places on nodes that are up
                self._report_end(job, state or word)
                finished = True
            elif job.external_jobid in from_squeue and word == "COMPLETED":
                self._report_success(job)
                finished = True
            elif word in FAIL_STATES and (word != state or job.external_jobid in from_squeue):
                self._report_end(job, state or word)
                finished = True
            else:
                for_plugin.append(job)
        # Why: a job that waits for a reason SLURM never clears (a runtime above the partition's
        # MaxTime, a QOS limit) would keep the workflow waiting forever without a word.
        stuck = await self._fail_jobs_that_never_start(pending) if pending else []
        if stuck:
            still_active = [job for job in still_active if job not in stuck]
            finished = True
        if for_plugin:
            left = [job async for job in super().check_active_jobs(for_plugin)]
            still_active += left
            finished = finished or len(left) < len(for_plugin)
        return still_active, finished

    async def _report_pack_member(self, job_info: SubmittedJobInfo, state: str) -> None:
        """A job of a pack whose SLURM job ended other than with exit 0 (a member failed, or the job
        was cancelled, timed out, lost its node): the member succeeded if its Snakemake finished it
        (its outputs are there and no longer marked incomplete), else it failed, on its own."""
        job = job_info.job
        persistence = self.workflow.persistence
        persistence.deactivate_cache()  # the job's Snakemake unmarked what it finished, not ours
        done = all(os.path.exists(path) for path in job.output) and not await persistence.incomplete(job)
        if done:
            self.report_job_success(job_info)  # the SLURM log is kept: another member failed
            return
        logfile = job_info.aux.get("slurm_logfile")
        others = int(job_info.aux.get("pack_members", 1)) - 1
        self.report_job_error(
            job_info,
            msg=f"Job {job.jobid} (rule {job.name}) did not finish in SLURM job {job_info.external_jobid}, which ran "
            f"it with {others} other short job(s) and ended as '{state}' (SLURM log: {logfile}). ",
            aux_logs=[str(logfile)] if logfile else [],
        )

    async def _requeued_after_node_failure(self, job_info: SubmittedJobInfo, known: dict[str, bool]) -> bool:
        # Why: a job that lost a node ends as NODE_FAIL, and SLURM requeues it (JobRequeue=1, its
        # default): the same job runs again on nodes that are up, and a checkpointing trainer resumes.
        # The plugin reported it failed, so Snakemake's retry ran beside the requeued job, which then
        # ran unwatched; and the plugin excluded every node of the job from later sbatch calls
        # (sacct's NodeList, the healthy nodes too), so a two-node retry could never be placed.
        jobid = job_info.external_jobid
        if jobid not in known:
            try:
                state = (await asyncio.to_thread(slurm.job_states, [jobid])).get(jobid)
            except slurm.SlurmUnavailable:
                state = "PENDING"  # cannot tell: kept, asked again next round
            known[jobid] = state is not None and state.split()[0] in ACTIVE_STATES
        if not known[jobid]:
            return False
        if jobid not in self._requeue_said:
            self._requeue_said = self._requeue_said | {jobid}
            self.logger.warning(
                f"SLURM job {jobid} (rule {job_info.job.name}) lost a node (NODE_FAIL); SLURM "
                "requeued it: it runs again on nodes that are up (a checkpointing training resumes)."
            )
        return True

    async def _ends_missing_from_accounting(
        self, jobs: list[SubmittedJobInfo], states: dict[str, str]
    ) -> dict[str, str]:
        # Why: sacct lists a job by its time window, so a job that never started (held, or
        # cancelled while pending) is missing from it forever; squeue still knows its state.
        # Such an end (cancelled, or done) is handled here; a job that ran and failed reaches
        # sacct, whose state and reason the plugin reports.
        unlisted = [job.external_jobid for job in jobs if self._state_of(job, states) is None]
        if not unlisted:
            return {}
        try:
            found = await asyncio.to_thread(slurm.job_states, unlisted)
        except slurm.SlurmUnavailable as e:
            self.logger.debug(f"squeue for jobs missing from accounting: {e}")
            return {}
        return {jobid: state for jobid, state in found.items() if state.split()[0] in ("CANCELLED", "COMPLETED")}

    def _report_end(self, job: SubmittedJobInfo, state: str) -> None:
        """A job that ended in a failure state: its error names the state and the SLURM log."""
        logfile = job.aux.get("slurm_logfile")
        why = (
            "cancelled by snakedvc-slurm (Snakemake got SIGTERM while it was pending)"
            if job.external_jobid in self._cancelled_by_us
            else f"ended as '{state}' (SLURM log: {logfile})"
        )
        self.report_job_error(
            job, msg=f"SLURM job {job.external_jobid} {why}. ", aux_logs=[str(logfile)] if logfile else []
        )

    async def _fail_jobs_that_never_start(self, pending: list[SubmittedJobInfo]) -> list[SubmittedJobInfo]:
        """Cancels and reports the ``pending`` jobs that wait for a reason SLURM never clears
        (slurm.NEVER_CLEARS: PartitionTimeLimit, QOS limits, ...); returns them."""
        try:
            reasons = await asyncio.to_thread(slurm.pending_reasons, [job.external_jobid for job in pending])
        except slurm.SlurmUnavailable as e:
            self.logger.debug(f"pending reasons not read: {e}")
            return []
        stuck = [job for job in pending if reasons.get(job.external_jobid, ("",))[0] in slurm.NEVER_CLEARS]
        if not stuck:
            return []
        limits = await asyncio.to_thread(self._limits)
        slurm.cancel([job.external_jobid for job in stuck])
        for job in stuck:
            reason, partition, time_limit = reasons[job.external_jobid]
            said = slurm.explain_never_starts(job.external_jobid, reason, partition, time_limit, limits)
            self.report_job_error(job, msg=f"Job {job.job.jobid} (rule {job.job.name}): {said} ")
        return stuck

    def _limits(self) -> dict[str, str]:
        if self._partition_limits is None:
            try:
                self._partition_limits = slurm.partition_limits()
            except slurm.SlurmUnavailable as e:
                self.logger.debug(f"partition limits not read: {e}")
                return {}
        return self._partition_limits

    def _report_success(self, job: SubmittedJobInfo) -> None:
        # What the plugin does for a job that sacct shows COMPLETED (its check_active_jobs).
        self.logger.debug(f"SLURM job {job.external_jobid} exited 0 (exit code file): done.")
        self.report_job_success(job)
        logfile = job.aux.get("slurm_logfile")
        if logfile and not self.workflow.executor_settings.keep_successful_logs:
            try:
                Path(logfile).unlink(missing_ok=True)
            except OSError as e:
                self.logger.warning(f"Could not remove SLURM log file {logfile}: {e}")

    async def _query_states(self) -> tuple[str, dict[str, str] | None]:
        """The plugin's own status command, and job id -> SLURM state from it (None if it failed)."""
        if self.get_status_command() == "sacct":
            command = query_job_status_sacct(self.run_uuid)
        else:
            command = query_job_status_squeue(self.run_uuid)
        async with self.status_rate_limiter:
            states, _duration = await query_job_status(command, self.logger)
        return command, states

    @staticmethod
    def _state_of(job: SubmittedJobInfo, states: dict[str, str]) -> str | None:
        # An array task ("<jobid>_<task>") may be listed under its array's id (sacct -X).
        jobid = job.external_jobid
        return states.get(jobid) or states.get(jobid.split("_", 1)[0])

    # --- submission ---------------------------------------------------------------------------

    def run_job(self, job: Any) -> None:
        # Why: SLURM accepts a job whose runtime is above its partition's MaxTime and keeps it
        # pending forever (reason PartitionTimeLimit); and a GPU job that no partition in
        # partitions.yaml fits goes to the plugin's fallback partition, GPUs or not. Both are
        # refused here, before sbatch, with what to change. The partition chosen for the check
        # is the one the plugin's run_job then uses (get_partition_arg, once per job).
        try:
            partition_arg = self.get_partition_arg(job)
            problem = self._partition_problem(job, partition_arg)
            if not problem:
                self._keep_earlier_attempt_logs(job)
        except WorkflowError:  # the plugin's run_job reports it, as for any job
            partition_arg, problem = None, None
        except Exception as e:  # noqa: BLE001 - the plugin's run_job reports the job's own errors
            self.logger.warning(f"Job {job.jobid}: partition check skipped ({e!r}); submitting as the plugin does.")
            partition_arg, problem = None, None
        if problem:
            self.report_job_error(SubmittedJobInfo(job), msg=problem)
            return
        _BUILDING.partition = (job, partition_arg) if partition_arg is not None else None
        _BUILDING.pack = self._is_pack(job)  # its Snakemake runs every member, whatever one does (--keep-going)
        try:
            try:
                account = self._job_account(job)
            except Exception:  # noqa: BLE001 - the plugin's run_job reports the job's own errors (its account's)
                account = None
            if account is None or account in self._unlimited_accounts:
                super().run_job(job)
                return
            # One look-then-sbatch at a time: the plugin submits from two threads, which both saw
            # the last free place and one was refused (measured).
            with self._submit_room_lock:
                self._wait_for_submit_room(account)
                super().run_job(job)
        finally:
            _BUILDING.partition = None
            _BUILDING.pack = False

    # Why the three below: sites cap how many jobs a user may have queued (sacctmgr's MaxSubmitJobs,
    # a QOS's MaxSubmitJobsPerUser); sbatch then refuses the job (AssocMaxSubmitJobLimit) and the
    # plugin fails it, so a pipeline wider than the cap fails (issue 52). Here a submission waits
    # while the association has no room, and a refusal for a limit the kit cannot read waits for
    # one of the user's jobs to end and submits again: the run never fails for it.
    def _wait_for_submit_room(self, account: str) -> None:
        while True:
            try:
                room = slurm.submit_room(getpass.getuser(), account)
            except slurm.SlurmUnavailable:
                return  # sbatch will say what SLURM says
            if room is None:
                self._unlimited_accounts = self._unlimited_accounts | {account}
                return
            if room.free > 0:
                return
            self._say_submit_limit(f"SLURM's {room.limit} is reached")
            time.sleep(SUBMIT_ROOM_POLL_S)

    def _job_account(self, job: Any) -> str | None:
        """The SLURM account the job is submitted to (its -A, else the user's default account)."""
        words = shlex.split(next(self.get_account_arg(job), "") or "")
        if "-A" in words[:-1]:
            return words[words.index("-A") + 1]
        with self._account_lock:
            if self._default_account is None:
                try:
                    self._default_account = slurm.default_account(getpass.getuser()) or ""
                except slurm.SlurmUnavailable:
                    return None
        return self._default_account or None

    def _say_submit_limit(self, why: str) -> None:
        if not self._said_submit_limit:
            self._said_submit_limit = True
            self.logger.warning(
                f"{why}: each further job is submitted when one of yours has left SLURM's queue "
                "(said once; the run waits, it does not fail)."
            )

    def _submit_when_room(self, job: Any, said: str) -> bool:
        """After sbatch refused ``job`` for a submit limit: submit it again once one of the user's
        jobs has ended; False when none is queued (the limit would never clear)."""
        _BUILDING.retrying = job
        try:
            while True:
                self._say_submit_limit(said.split("The error message was")[-1].strip(" '.\n") or said)
                try:
                    queued = slurm.user_queued_jobs()
                except slurm.SlurmUnavailable:
                    queued = 1  # cannot tell: wait as if one were there
                if queued == 0:
                    return False
                time.sleep(SUBMIT_ROOM_POLL_S)
                _BUILDING.refused = False
                self.run_job(job)
                if not _BUILDING.refused:
                    return True
        finally:
            _BUILDING.retrying = None

    def get_partition_arg(self, job: Any) -> str:
        chosen = getattr(_BUILDING, "partition", None)
        if chosen is not None and chosen[0] is job:
            return chosen[1]
        return super().get_partition_arg(job)

    def _partition_problem(self, job: Any, partition_arg: str) -> str | None:
        """Why ``job`` cannot run in the partition it would be sent to, or None."""
        words = shlex.split(partition_arg)
        partition = words[words.index("-p") + 1] if "-p" in words else None
        gpus = requested_gpus(job)
        config = self._partition_config()
        if gpus and partition and config is not None and not job.resources.get("slurm_partition"):
            listed = config.get(partition) or {}
            if not listed.get("max_gpu"):
                return (
                    f"Job {job.jobid} (rule {job.name}) asks for {gpus} GPU(s), but no partition in "
                    f"{self.workflow.executor_settings.partition_config} fits all of its resources, and the "
                    f"fallback partition {partition} has no GPUs there (max_gpu). Not submitted: lower the "
                    "rule's resources (runtime, mem_mb, threads) or raise that file's limits (max_runtime, "
                    "max_mem_mb, ...) for a GPU partition."
                )
        runtime = job.resources.get("runtime")
        if not runtime:
            return None
        limits = self._limits()
        partition = partition or self._default_partition()
        max_time = limits.get(partition, "") if partition else ""
        limit = slurm.minutes(max_time)
        if limit is not None and runtime > limit:
            return (
                f"Job {job.jobid} (rule {job.name}) asks for runtime {runtime} min, above partition {partition}'s "
                f"MaxTime {max_time} ({limit:g} min): SLURM would keep it pending forever "
                "(PartitionTimeLimit). Not submitted: lower the rule's runtime resource, or send it to a partition "
                "that allows it (`sinfo -o '%P %l'` lists each partition's limit)."
            )
        return None

    def _default_partition(self) -> str | None:
        if self._default is None:
            try:
                self._default = slurm.default_partition()
            except slurm.SlurmUnavailable:
                return None
        return self._default

    def _partition_config(self) -> dict[str, Any] | None:
        """partitions.yaml's partitions (name -> limits), None without one."""
        path = self.workflow.executor_settings.partition_config
        if not path:
            return None
        import yaml

        try:
            return (yaml.safe_load(Path(path).read_text()) or {}).get("partitions") or {}
        except (OSError, yaml.YAMLError, AttributeError):
            return None  # the plugin reports a broken file itself

    def _keep_earlier_attempt_logs(self, job: Any) -> None:
        for kept in keep_earlier_attempt_logs(job):
            self.logger.info(
                f"Job {job.jobid} (rule {job.name}), attempt {job.attempt}: the last attempt's log is kept as {kept}"
            )

    def report_job_submission(self, job_info: SubmittedJobInfo) -> None:
        if job_info.external_jobid:
            self._known_jobids = self._known_jobids | {job_info.external_jobid}
            if self._stopping and job_info.external_jobid not in self._cancelled_by_us:
                # submitted (by the gathering timer's thread) after the SIGTERM's cancel looked
                self._cancelled_by_us = self._cancelled_by_us | {job_info.external_jobid}
                slurm.cancel([job_info.external_jobid])
                self.logger.info(
                    f"SIGTERM: cancelled SLURM job {job_info.external_jobid}, submitted as the run stopped."
                )
        if not self._is_pack(job_info.job):
            super().report_job_submission(job_info)
            return
        # Snakemake handed out the members, not the pack: each is reported (and followed) on its own.
        pack = job_info.job
        self._pack_ids = self._pack_ids - {id(pack)}
        members = sorted(pack.jobs, key=lambda job: job.jobid)
        self.logger.info(
            f"SLURM job {job_info.external_jobid} runs {len(members)} short jobs (Snakemake jobs "
            f"{', '.join(str(job.jobid) for job in members)}; rules {', '.join(sorted({job.name for job in members}))})."
        )
        for member in members:
            aux = {**job_info.aux, "pack": pack.groupid, "pack_members": len(members)}
            super().report_job_submission(SubmittedJobInfo(member, external_jobid=job_info.external_jobid, aux=aux))

    def report_job_error(self, job_info: SubmittedJobInfo, msg: str | None = None, **kwargs: Any) -> None:
        # Why: when slurmctld stalls, sbatch gives up ("Socket timed out") although slurmctld makes
        # the job once it resumes. The plugin reports such a job as failed, and Snakemake's retry
        # then runs a second SLURM job on the same outputs beside the first. Here the job is looked
        # for (this run's job name and the job's comment, an id this run does not know yet) and
        # adopted; only if SLURM made none is it submitted again.
        said = (msg or "").split("sbatch call:")[0]
        if job_info.external_jobid is None and said.startswith("SLURM sbatch failed") and slurm.is_submit_limit(said):
            if getattr(_BUILDING, "retrying", None) is job_info.job:
                _BUILDING.refused = True  # _submit_when_room tries again
                return
            if self._submit_when_room(job_info.job, said):
                return
        ambiguous = said.startswith("SLURM sbatch failed") and slurm.is_ambiguous(said)
        if job_info.external_jobid is None and ambiguous and self._recover_submission(job_info.job, said.strip()):
            return
        if self._is_pack(job_info.job):  # not submitted: each member fails (and is retried) on its own
            self._pack_ids = self._pack_ids - {id(job_info.job)}
            for member in job_info.job.jobs:
                super().report_job_error(SubmittedJobInfo(member), msg=msg, **kwargs)
            return
        super().report_job_error(job_info, msg=msg, **kwargs)

    def _recover_submission(self, job: Any, said: str) -> bool:
        """Adopt the job a failed sbatch made, or submit again; False when neither is possible."""
        failures = self._sbatch_failures.get(job.jobid, 0) + 1
        self._sbatch_failures = {**self._sbatch_failures, job.jobid: failures}
        wildcards = get_job_wildcards(job)
        comment = f"rule_{job.name}" + (f"_wildcards_{wildcards}" if wildcards else "")
        self.logger.warning(
            f"Job {job.jobid} (rule {job.name}): {said} Looking for a SLURM job that it made all the same."
        )
        try:
            adopted = slurm.find_submitted(self.run_uuid, comment, self._known_jobids)
        except slurm.SlurmUnavailable as e:
            self.logger.error(f"Job {job.jobid} (rule {job.name}): not submitted again, {e}")
            return False
        if adopted is not None:
            group_or_rule = f"group_{job.name}" if job.is_group() else f"rule_{job.name}"
            logfile = self.slurm_logdir / group_or_rule / wildcards / f"{adopted}.log"
            self.logger.info(
                f"Job {job.jobid} has been submitted with SLURM jobid {adopted} (adopted; log: {logfile})."
            )
            self.report_job_submission(SubmittedJobInfo(job, external_jobid=adopted, aux={"slurm_logfile": logfile}))
            return True
        if failures >= SBATCH_TRIES:
            return False
        self.logger.info(f"Job {job.jobid} (rule {job.name}): SLURM made no job; submitting it again.")
        self.run_job(job)
        return True

    def _install_term_handler(self) -> None:
        # Why: on SIGTERM Snakemake waits for every active job, and a pending job may wait for days
        # (or forever). Pending jobs are cancelled first, then Snakemake's own handler runs: running
        # jobs still finish. Installed at the first submission, from the scheduler's (main) thread:
        # the scheduler sets its handler after it has made the executor.
        if self._term_handler_installed or threading.current_thread() is not threading.main_thread():
            return
        self._term_handler_installed = True
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: Any) -> None:
            self._cancel_pending_jobs()
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_term)

    def _cancel_pending_jobs(self) -> None:
        # No lock here: the handler runs in the main thread, which may hold Snakemake's lock
        # (not reentrant) when the signal comes; a copy of the list is enough.
        self._stopping = True
        ours = [job.external_jobid for job in list(self.active_jobs)]
        try:
            # By the run's job name too: a pack is submitted from the gathering timer's thread, and
            # between its sbatch and its report it is not among the active jobs yet.
            pending = set(slurm.pending_reasons(ours)) | set(slurm.pending_named(self.run_uuid))
        except slurm.SlurmUnavailable as e:
            self.logger.warning(f"SIGTERM: pending jobs not cancelled, {e}")
            return
        if pending:
            self._cancelled_by_us = self._cancelled_by_us | pending
            slurm.cancel(sorted(pending))
            self.logger.info(
                f"SIGTERM: cancelled the pending SLURM job(s) {', '.join(sorted(pending))}; running jobs finish."
            )

    # Why the three below: the executor interface quotes the job's paths with Python's repr
    # ('it\\'s' is no shell quoting) or not at all (the interpreter), so a project or venv folder
    # whose name holds a quote breaks the batch script, and `$(...)` in it could run. Paths here
    # are quoted for the shell (a Path is, by the interface's own format_cli_value).
    def get_python_executable(self) -> str:
        return shlex.quote(str(super().get_python_executable()))

    def get_snakefile(self) -> Any:
        return Path(super().get_snakefile())

    def get_job_args(self, job: Any) -> str:
        # RemoteExecutor's, with its --wait-for-files paths quoted for the shell.
        waits = ""
        if SharedFSUsage.INPUT_OUTPUT in self.workflow.storage_settings.shared_fs_usage:
            files = [str(self.tmpdir), *map(str, job.get_wait_for_files())]
            if len(files) > 20:  # as the interface does: a file that lists them
                listing = self.get_jobscript(job) + ".waitforfilesfile.txt"
                Path(listing).write_text("".join(f"{name}\n" for name in files))
                waits = f"--wait-for-files-file {shlex.quote(listing)}"
            else:
                waits = "--wait-for-files " + " ".join(map(shlex.quote, files))
        return f"{RealExecutor.get_job_args(self, job)} {waits}"

    def format_job_exec(self, job: Any) -> str:
        # Why: inside its SLURM job the plugin runs each job through the slurm-jobstep
        # executor: an `srun -n1` step that starts a second Snakemake (~2-3 s of CPU before the
        # rule's command starts), for a group job once per grouped job and one at a time
        # (`--jobs 1`). Here the job runs under Snakemake's local executor in the Snakemake that
        # the batch script starts: no second start-up, a group's jobs side by side on its CPUs.
        # The jobstep's srun step was also what received `--signal=TERM@...` (SLURM signals job
        # steps, not the batch shell); `snakedvc launch` now makes that step itself, sized for
        # the layout it launches (one task per node), which the jobstep's `srun -n1` was not.
        # `mpi` jobs call srun in their own command, as the plugin documents; array jobs read
        # their command from the jobstep's array setting: both keep the jobstep.
        # keys(): job.resources is a Namedlist, whose `in` looks at values.
        uses_jobstep = getattr(_BUILDING, "array", False) or "mpi" in job.resources.keys()  # noqa: SIM118
        _BUILDING.local = not uses_jobstep
        try:
            command = super().format_job_exec(job)
        finally:
            _BUILDING.local = False
        if getattr(_BUILDING, "array", False):  # a task's id is not the array's: sacct only
            return command
        folder = self.exit_code_folder
        if folder is None:
            return command
        folder.mkdir(parents=True, exist_ok=True)
        wrapped = not self.workflow.executor_settings.pass_command_as_script
        return with_exit_code_file(command, folder, wrapped=wrapped)

    def cancel(self) -> None:
        with self._gather_lock:  # jobs not submitted yet stay so
            if self._gather_timer is not None:
                self._gather_timer.cancel()
            self._gather_timer, self._gathered = None, {}
        super().cancel()

    def shutdown(self) -> None:
        super().shutdown()
        if self.exit_code_folder and not self.workflow.remote_execution_settings.immediate_submit:
            # (with immediate_submit the jobs run after we exit)
            shutil.rmtree(self.exit_code_folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # another run's folder is there, or it is gone
                self.exit_code_folder.parent.rmdir()

    def additional_general_args(self) -> str:
        if getattr(_BUILDING, "local", False):
            return IN_JOB_EXECUTOR_ARGS + (" --keep-going" if getattr(_BUILDING, "pack", False) else "")
        return super().additional_general_args()

    def run_array_jobs(self, jobs: list[Any]) -> None:
        # Why: the plugin's script mode breaks an array's script (2.8.0 puts its payload option on
        # lines of their own), so an array goes through --wrap="..." on the submit host's shell,
        # as the plugin's default does: safe only for a command with no `$`, backquote, `"` or `\`
        # (a project folder named so). Such jobs are submitted one by one, each as a script.
        settings = self.workflow.executor_settings
        _BUILDING.array = True
        settings.pass_command_as_script = False
        try:
            if any(set('$`"\\') & set(self.format_job_exec(job)) for job in jobs):
                settings.pass_command_as_script = True
                _BUILDING.array = False
                for job in jobs:
                    self.run_job(job)
                return
            super().run_array_jobs(jobs)
        finally:
            _BUILDING.array = False
            settings.pass_command_as_script = True

    def get_account_arg(self, job: Any) -> Iterator[str]:
        # Why: without a slurm_account the plugin's guess pipes sacct into `tail` inside one
        # argument list, which always fails ("sacct: invalid option"), with three warnings
        # per run. A given account is the plugin's business; the guess is made here.
        if job.resources.get("slurm_account"):
            yield from super().get_account_arg(job)
            return
        if self.workflow.executor_settings.no_account:  # a plugin setting the plugin itself ignores
            yield ""
            return
        with self._account_lock:
            if self._guessed_account_arg is None:
                self._guessed_account_arg = self._guess_account_arg()
        yield self._guessed_account_arg

    def _guess_account_arg(self) -> str:
        """The sbatch argument for the account of your newest job (" -A acct"), or "" for your default."""
        command = ["sacct", "-nu", getpass.getuser(), "-o", "Account%256"]
        try:
            output = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as e:
            self.logger.debug(f"No SLURM account given and none guessed ({shlex.join(command)}: {e}).")
            return ""
        account = last_account(output)
        if account is None:
            self.logger.debug("No SLURM account given or found in your recent jobs: submitting without -A.")
            return ""
        # As the plugin does: an account sacctmgr rejects is an error, "" means it cannot tell.
        account = validate_account(account, self.logger) or account
        self.logger.info(f"SLURM account: {account} (from your recent jobs; set resources slurm_account to choose)")
        return f" -A {shlex.quote(account)}"
