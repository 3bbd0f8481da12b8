"""The profile's executor: the official SLURM plugin with suffixed states, status back-off,
failed status queries and the account guess fixed (src/snakemake_executor_plugin_snakedvc_slurm).

Every test drives the installed plugin's real Executor (built by its own constructor around a
minimal workflow object) and real command output: a stand-in `sacct` script on PATH where a
test needs chosen states, the test cluster's own sacct where it needs SLURM's (marked slurm).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import snakemake_executor_plugin_slurm as official
import yaml
from snakemake_executor_plugin_slurm.job_status_query import query_job_status_sacct
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.settings import SharedFSUsage

from snakemake_executor_plugin_snakedvc_slurm.executor import (
    SUPPORTED_PLUGIN_VERSIONS,
    Executor,
    ExecutorSettings,
    UnsupportedPluginVersion,
    check_plugin_version,
    last_account,
    next_status_interval,
    read_exit_codes,
    with_exit_code_file,
)
from tests.conftest import REPO, SNAKEMAKE, slurm_jobs_by_rule
from tests.waiting import wait_until

LOGGER = "snakedvc-slurm-test"


class Resources(dict):
    """A job's resources as the plugin reads them: .get() and attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(name) from e


class Job:
    """What the plugin and Snakemake's executor base read from, and report to, a job."""

    def __init__(self, jobid: int = 1, rule: str = "work", **resources: Any) -> None:
        self.jobid = jobid
        self.name = rule
        self.rule = SimpleNamespace(name=rule)
        self.wildcards: dict[str, str] = {}
        self.resources = Resources(resources)
        self.errors: list[tuple[str, dict[str, Any]]] = []

    def is_group(self) -> bool:
        return False

    def log_info(self) -> None:
        pass

    def log_error(self, msg: str | None = None, **kwargs: Any) -> None:
        self.errors.append((msg or "", kwargs))

    def register(self, external_jobid: str | None = None) -> None:
        pass


class Scheduler:
    """Snakemake's scheduler as the executor reports to it."""

    def __init__(self) -> None:
        self.finished: list[Job] = []
        self.failed: list[Job] = []
        self.reported = threading.Event()

    def submit_callback(self, job: Job) -> None:
        pass

    def finish_callback(self, job: Job) -> None:
        self.finished.append(job)
        self.reported.set()

    def error_callback(self, job: Job) -> None:
        self.failed.append(job)
        self.reported.set()


def make_executor(tmp_path: Path, **settings: Any) -> Executor:
    """The real executor, built by its own constructor around a minimal workflow."""
    settings = {"status_command": "sacct", "init_seconds_before_status_checks": 2, **settings}
    workflow = SimpleNamespace(
        executor_settings=ExecutorSettings(logdir=str(tmp_path / "slurm_logs"), **settings),
        remote_execution_settings=SimpleNamespace(
            max_status_checks_per_second=10,
            jobname="snakejob.{rulename}.{jobid}.sh",
            jobscript=None,
            seconds_between_status_checks=10,
            immediate_submit=False,
        ),
        storage_settings=SimpleNamespace(shared_fs_usage=set(SharedFSUsage)),
        # Snakemake's status loop (a thread the constructor starts) first sleeps this long:
        # it stays out of the way while a test calls check_active_jobs itself.
        executor_plugin=SimpleNamespace(common_settings=SimpleNamespace(init_seconds_before_status_checks=3600)),
        main_snakefile=str(tmp_path / "Snakefile"),
        dag=None,
        scheduler=Scheduler(),
        workdir_init=str(tmp_path),
    )
    executor = Executor(workflow, logging.getLogger(LOGGER))
    executor.wait = False  # the status loop ends when it wakes
    return executor


def check(executor: Any, jobs: list[SubmittedJobInfo], method: Any = None) -> list[SubmittedJobInfo]:
    """The jobs a status round hands back as still active (``method``: another class's version)."""
    rounds: AsyncIterator[SubmittedJobInfo] = (method or type(executor).check_active_jobs)(executor, jobs)

    async def drain() -> list[SubmittedJobInfo]:
        return [job async for job in rounds]

    return asyncio.run(drain())


def submitted(tmp_path: Path, jobid: str, **resources: Any) -> SubmittedJobInfo:
    log = tmp_path / "slurm_logs" / f"{jobid}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("the job's output\n")
    return SubmittedJobInfo(
        Job(int(jobid.split("_")[0]), **resources), external_jobid=jobid, aux={"slurm_logfile": log}
    )


class FakeSacct:
    """A `sacct` on PATH that prints chosen lines (or fails) and counts its calls."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder.mkdir()
        self.out, self.calls, self.fail = folder / "out", folder / "calls", folder / "fail"
        script = folder / "sacct"
        script.write_text(
            "#!/bin/sh\n"
            f'echo "$*" >> {self.calls}\n'
            'case "$*" in "-j "*) exit 0 ;; esac\n'  # the plugin's per-step failure-reason queries: none
            f'[ -e {self.fail} ] && {{ echo "sacct: error: Problem talking to the database" >&2; exit 1; }}\n'
            f"cat {self.out}\n"
        )
        script.chmod(0o755)
        self.prints("")
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    def prints(self, text: str) -> None:
        self.out.write_text(text)

    def status_queries(self) -> int:
        if not self.calls.exists():
            return 0
        return sum("--parsable2" in line for line in self.calls.read_text().splitlines())


@pytest.fixture
def sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSacct:
    return FakeSacct(tmp_path / "bin", monkeypatch)


# --- the plugin version these overrides were written for -----------------------------------


def test_supported_plugin_versions_pass_and_others_fail_naming_versions_and_remedy() -> None:
    import importlib.metadata

    check_plugin_version(importlib.metadata.version("snakemake-executor-plugin-slurm"))  # what is installed
    for version in ("2.7.1", "2.8.0", "2.8.7", "2.8.1.dev0"):
        check_plugin_version(version)
    for version in ("2.7.0", "2.6.1", "2.9.0", "2.9.0rc1", "3.0", "not-a-version"):
        with pytest.raises(UnsupportedPluginVersion) as raised:
            check_plugin_version(version)
        message = str(raised.value)
        assert version in message and SUPPORTED_PLUGIN_VERSIONS in message and "pip install" in message


# --- settings and profile -----------------------------------------------------------------


def test_every_snakedvc_slurm_key_of_the_profile_is_a_valid_setting_of_the_profiles_executor() -> None:
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    folder = REPO / "profiles/slurm"
    profile = yaml.safe_load((folder / "config.yaml").read_text())
    plugin = ExecutorPluginRegistry().get_plugin(profile["executor"])
    assert issubclass(plugin.executor, official.Executor) and plugin.executor is Executor
    assert plugin._executor_settings_cls is ExecutorSettings
    fields = {f"snakedvc-slurm-{name.replace('_', '-')}": name for name in ExecutorSettings.__dataclass_fields__}
    ours = {key: value for key, value in profile.items() if key.startswith("snakedvc-slurm-")}
    assert set(ours) <= set(fields), f"not settings: {set(ours) - set(fields)}"
    values = {fields[key]: value for key, value in ours.items()}
    values["partition_config"] = str(folder / values["partition_config"])  # Snakemake reads it relative to the profile
    settings = ExecutorSettings(**values)  # validates, as at start-up
    assert settings.max_seconds_between_status_checks >= settings.init_seconds_before_status_checks


@pytest.mark.parametrize(
    ("setting", "value", "key"),
    [
        ("max_seconds_between_status_checks", 0, "snakedvc-slurm-max-seconds-between-status-checks"),
        ("max_seconds_between_status_checks", 2.5, "snakedvc-slurm-max-seconds-between-status-checks"),
        ("status_backoff_factor", 0.5, "snakedvc-slurm-status-backoff-factor"),
        ("status_backoff_factor", "2", "snakedvc-slurm-status-backoff-factor"),
        ("status_backoff_factor", float("inf"), "snakedvc-slurm-status-backoff-factor"),
        ("pack_runtime", -1, "snakedvc-slurm-pack-runtime"),
        ("pack_runtime", "5", "snakedvc-slurm-pack-runtime"),
        ("pack_size", 0, "snakedvc-slurm-pack-size"),
    ],
)
def test_bad_status_settings_fail_naming_the_profile_key(setting: str, value: Any, key: str) -> None:
    with pytest.raises(WorkflowError, match=key):
        ExecutorSettings(status_command="sacct", **{setting: value})


def test_a_rule_whose_threads_cores_caps_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Snakemake gives a job at most --cores threads, remote jobs too: the user hears of it, once."""
    executor = make_executor(tmp_path)
    executor.workflow.resource_settings = SimpleNamespace(cores=2)
    jobs = []
    for jobid, (name, asked) in enumerate([("small", 2), ("train", 8), ("other", 6)]):
        job = Job(jobid, name)
        job.threads = min(asked, 2)  # as Snakemake caps it
        declared = SimpleNamespace(is_evaluable=lambda: False, value=asked)
        job.rule = SimpleNamespace(name=name, resources={"_cores": declared})
        jobs.append(job)
    caplog.clear()  # (the executor's own start-up lines)

    def warnings() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        executor._say_capped_threads(jobs[:1])  # within the cap: nothing to say
        assert not warnings()
        executor._say_capped_threads(jobs)
        executor._say_capped_threads(jobs)
    (said,) = warnings()
    assert said.startswith("Rule train asks for 8 threads, but Snakemake gives a job at most the profile's `cores` (2)")
    assert "Set `cores` in your profile to the CPUs of your cluster's nodes" in said


# --- status interval ----------------------------------------------------------------------


def test_interval_restarts_after_a_finish_and_otherwise_grows_geometrically_up_to_the_cap() -> None:
    waits, wait = [], 2.0
    for _ in range(6):
        wait = next_status_interval(wait, finished=False, init=2, cap=30, factor=1.5)
        waits.append(wait)
    assert waits == [3.0, 4.5, 6.75, 10.125, 15.1875, 22.78125]
    assert next_status_interval(22.78125, finished=False, init=2, cap=30, factor=1.5) == 30
    assert next_status_interval(30, finished=False, init=2, cap=30, factor=1.5) == 30
    assert next_status_interval(30, finished=True, init=2, cap=30, factor=1.5) == 2


def test_status_rounds_set_the_interval_snakemake_sleeps(tmp_path: Path, sacct: FakeSacct) -> None:
    executor = make_executor(tmp_path, max_seconds_between_status_checks=10, status_backoff_factor=2.0)
    check(executor, [])  # no active jobs: no query, next look soon
    assert executor.next_seconds_between_status_checks == 2 and sacct.status_queries() == 0
    running = submitted(tmp_path, "11")
    sacct.prints("11|RUNNING\n")
    waits = []
    for _ in range(4):
        assert check(executor, [running]) == [running]
        waits.append(executor.next_seconds_between_status_checks)
    assert waits == [4, 8, 10, 10]
    assert sacct.status_queries() == 4  # one per round: the plugin was not asked again
    sacct.prints("11|COMPLETED\n")
    assert check(executor, [running]) == []
    assert executor.next_seconds_between_status_checks == 2
    # The plugin's own handling of a finished job: success reported, its SLURM log deleted.
    assert executor.workflow.scheduler.finished == [running.job]
    assert not running.aux["slurm_logfile"].exists()


def test_plugin_default_first_wait_is_bounded_by_the_cap(tmp_path: Path, sacct: FakeSacct) -> None:
    executor = make_executor(tmp_path, init_seconds_before_status_checks=40, max_seconds_between_status_checks=30)
    check(executor, [])
    assert executor.next_seconds_between_status_checks == 30


def test_a_submission_cuts_short_the_wait_snakemake_is_in(tmp_path: Path, sacct: FakeSacct) -> None:
    """Snakemake sleeps the whole interval in one go (RemoteExecutor.sleep): resetting the
    interval after a submission must end a long wait already under way, not the one after."""
    executor = make_executor(tmp_path, init_seconds_before_status_checks=1, no_account=True)
    executor.wait = True  # as in a running workflow
    executor.next_seconds_between_status_checks = 30
    job = Job(7, slurm_partition="cpu")
    threading.Timer(0.3, executor.run_jobs, args=([job],)).start()
    started = time.monotonic()
    asyncio.run(executor.sleep())
    assert time.monotonic() - started < 3
    assert executor.next_seconds_between_status_checks == 1
    # The real plugin did try to submit it (this stand-in job cannot be formatted into a command).
    assert executor.workflow.scheduler.reported.wait(10) and executor.workflow.scheduler.failed == [job]
    executor.wait = False


def test_shutdown_does_not_wait_out_the_interval(tmp_path: Path) -> None:
    executor = make_executor(tmp_path)
    executor.next_seconds_between_status_checks = 30
    started = time.monotonic()
    asyncio.run(executor.sleep())  # `wait` is False, as after shutdown()
    assert time.monotonic() - started < 1


# --- exit code files -------------------------------------------------------------------------


def exits(executor: Executor, job: SubmittedJobInfo, code: str) -> Path:
    """What the job's batch script leaves when it ends (with_exit_code_file)."""
    executor.exit_code_folder.mkdir(parents=True, exist_ok=True)
    path = executor.exit_code_folder / job.external_jobid
    path.write_text(code)
    return path


@pytest.mark.parametrize("wrapped", [False, True])
def test_the_batch_script_leaves_its_commands_exit_code_and_exits_with_it(tmp_path: Path, wrapped: bool) -> None:
    folder = tmp_path / "exit codes"  # a space: the folder is quoted
    folder.mkdir()
    script = with_exit_code_file("echo working; (exit 3)", folder, wrapped=wrapped)
    if wrapped:  # as the plugin submits it: sbatch ... --wrap="<command, " escaped>" through a shell
        script = subprocess.run(f'printf %s "{script}"', shell=True, capture_output=True, text=True).stdout
    done = subprocess.run(["sh", "-c", script], env={**os.environ, "SLURM_JOB_ID": "77"}, capture_output=True)
    assert done.returncode == 3 and done.stdout == b"working\n"
    assert sorted(os.listdir(folder)) == ["77"] and read_exit_codes(folder, ["77", "78"]) == {"77": 3}


def test_a_job_that_exited_0_is_done_without_asking_slurm(tmp_path: Path, sacct: FakeSacct) -> None:
    executor = make_executor(tmp_path)
    job, running = submitted(tmp_path, "41"), submitted(tmp_path, "42")
    code = exits(executor, job, "0\n")
    sacct.prints("41|RUNNING\n42|RUNNING\n")  # accounting has not heard of the end yet
    assert check(executor, [job]) == []
    assert sacct.status_queries() == 0
    # What the plugin does for COMPLETED: success reported, the SLURM log deleted.
    assert executor.workflow.scheduler.finished == [job.job] and not job.aux["slurm_logfile"].exists()
    assert not code.exists()
    # With other jobs active, they are asked about as usual.
    job = submitted(tmp_path, "43")
    exits(executor, job, "0\n")
    assert check(executor, [job, running]) == [running] and sacct.status_queries() == 1
    assert executor.workflow.scheduler.finished[-1] is job.job
    # ... unless the last query was moments ago (init seconds): an exit code does not cost a query.
    job = submitted(tmp_path, "44")
    exits(executor, job, "0\n")
    assert check(executor, [job, running]) == [running] and sacct.status_queries() == 1
    assert executor.next_seconds_between_status_checks == 2


def test_a_job_that_exited_non_zero_waits_for_its_state_and_reason_from_sacct(tmp_path: Path, sacct: FakeSacct) -> None:
    executor = make_executor(tmp_path)
    job = submitted(tmp_path, "45")
    code = exits(executor, job, "1\n")
    executor.active_jobs = [job]
    assert executor._a_job_left_its_exit_code()
    sacct.prints("45|RUNNING\n")
    assert check(executor, [job]) == [job] and sacct.status_queries() == 1
    assert not executor._a_job_left_its_exit_code()  # read once: no more early rounds for it
    sacct.prints("45|FAILED\n")
    assert check(executor, [job]) == []
    assert executor.workflow.scheduler.failed == [job.job]
    assert "SLURM status is: 'FAILED'" in job.job.errors[0][0] and job.aux["slurm_logfile"].exists()
    assert not code.exists()


def test_a_wait_ends_when_an_active_job_leaves_its_exit_code(tmp_path: Path) -> None:
    executor = make_executor(tmp_path)
    executor.wait = True  # as in a running workflow
    executor.next_seconds_between_status_checks = 30
    job, other = submitted(tmp_path, "46"), submitted(tmp_path, "47")
    executor.active_jobs = [job]
    exits(executor, other, "0\n")  # not one of the active jobs: no reason to look now
    threading.Timer(0.5, exits, args=(executor, job, "0\n")).start()
    started = time.monotonic()
    asyncio.run(executor.sleep())
    assert 0.4 < time.monotonic() - started < 3
    executor.wait = False


# --- states ---------------------------------------------------------------------------------


def test_suffixed_cancel_is_reported_here_where_the_plugin_would_wait_forever(tmp_path: Path, sacct: FakeSacct) -> None:
    executor = make_executor(tmp_path)
    job = submitted(tmp_path, "12")
    sacct.prints("12|CANCELLED by 1000\n")
    assert check(executor, [job], official.Executor.check_active_jobs) == [job]  # upstream: "still running"
    assert executor.workflow.scheduler.failed == []
    before = sacct.status_queries()
    executor.next_seconds_between_status_checks = 20
    assert check(executor, [job]) == []
    assert sacct.status_queries() == before + 1
    assert executor.workflow.scheduler.failed == [job.job]
    [(message, details)] = job.job.errors
    assert "SLURM job 12" in message and "'CANCELLED by 1000'" in message and str(job.aux["slurm_logfile"]) in message
    assert details["aux_logs"] == [str(job.aux["slurm_logfile"])]
    assert job.aux["slurm_logfile"].exists()  # a failed job's log is kept
    assert executor.next_seconds_between_status_checks == 2


def test_one_round_sorts_running_suffixed_and_terminal_jobs(tmp_path: Path, sacct: FakeSacct) -> None:
    executor = make_executor(tmp_path)
    running, pending, unseen = submitted(tmp_path, "21"), submitted(tmp_path, "22"), submitted(tmp_path, "23")
    cancelled, failed, array_task = submitted(tmp_path, "24"), submitted(tmp_path, "25"), submitted(tmp_path, "26_3")
    sacct.prints("21|RUNNING\n22|PENDING\n24|CANCELLED by 0\n25|FAILED\n26|COMPLETED\n")
    still = check(executor, [running, pending, unseen, cancelled, failed, array_task])
    assert still == [running, pending, unseen]  # not in accounting yet counts as queued, as upstream
    scheduler = executor.workflow.scheduler
    assert scheduler.finished == [array_task.job]  # found under its array's id
    assert scheduler.failed == [cancelled.job, failed.job]
    # FAILED (no suffix) went to the plugin: its message, with sacct's failure reason.
    assert "SLURM status is: 'FAILED'" in failed.job.errors[0][0] and "Reason" in failed.job.errors[0][0]
    assert sacct.status_queries() == 2  # ours, then the plugin's for the jobs it handled


def test_a_job_that_lost_a_node_stays_active_while_slurm_requeues_it(tmp_path: Path, sacct: FakeSacct) -> None:
    """NODE_FAIL: SLURM requeues the job (JobRequeue=1), which runs again; reported failed (and retried
    by Snakemake beside it) only when SLURM did not requeue it; no node excluded from later jobs."""
    executor = make_executor(tmp_path)
    requeued, not_requeued = submitted(tmp_path, "31"), submitted(tmp_path, "32")
    packed = [submitted(tmp_path, "33"), submitted(tmp_path, "33")]  # short jobs sharing one SLURM job
    for member in packed:
        member.aux["pack"] = "pack1"
    sacct.prints("31|NODE_FAIL\n32|NODE_FAIL\n33|NODE_FAIL\n")
    squeue = tmp_path / "bin" / "squeue"
    squeue.write_text("#!/bin/sh\necho '31 PENDING'\necho '32 NODE_FAIL'\necho '33 PENDING'\n")
    squeue.chmod(0o755)
    assert check(executor, [requeued, not_requeued, *packed]) == [requeued, *packed]
    assert executor.workflow.scheduler.failed == [not_requeued.job]
    assert "SLURM job 32 ended as 'NODE_FAIL'" in not_requeued.job.errors[0][0]
    assert not executor._failed_nodes  # the plugin's --exclude of every node the job had


def test_failed_status_query_keeps_jobs_where_the_plugin_drops_them(
    tmp_path: Path, sacct: FakeSacct, caplog: pytest.LogCaptureFixture
) -> None:
    executor = make_executor(tmp_path, status_attempts=2)
    job = submitted(tmp_path, "31")
    sacct.fail.touch()
    # Upstream: every attempt fails, none of the jobs comes back, none is reported: Snakemake
    # forgets the job and waits for it forever.
    assert check(executor, [job], official.Executor.check_active_jobs) == []
    assert executor.workflow.scheduler.failed == executor.workflow.scheduler.finished == []
    caplog.clear()
    before = sacct.status_queries()
    for _ in range(4):
        assert check(executor, [job]) == [job]
    assert sacct.status_queries() == before + 4
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]  # once
    assert "failed 3 times in a row" in warning and "sacct -X" in warning
    sacct.fail.unlink()
    sacct.prints("31|COMPLETED\n")
    assert check(executor, [job]) == [] and executor.workflow.scheduler.finished == [job.job]


# --- account --------------------------------------------------------------------------------


def test_last_account_reads_the_newest_job_and_ignores_none() -> None:
    padded = "      root \n" + " " * 250 + "lab-a \n\n"
    assert last_account(padded) == "lab-a"
    assert last_account("") is None
    assert last_account("  lab-a\n  (null)\n") is None
    assert last_account("none\n") is None


def test_no_account_found_submits_without_one_quietly(
    tmp_path: Path, sacct: FakeSacct, caplog: pytest.LogCaptureFixture
) -> None:
    executor = make_executor(tmp_path)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    caplog.clear()
    sacct.prints("(null)\n")
    assert [next(executor.get_account_arg(Job())) for _ in range(3)] == ["", "", ""]
    assert len(sacct.calls.read_text().splitlines()) == 1  # guessed once
    assert "-nu" in sacct.calls.read_text() and "|" not in sacct.calls.read_text()
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_no_account_setting_skips_the_guess(tmp_path: Path, sacct: FakeSacct) -> None:
    executor = make_executor(tmp_path, no_account=True)
    assert next(executor.get_account_arg(Job())) == ""
    assert not sacct.calls.exists()


# --- against the test cluster -----------------------------------------------------------------


def slurm(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.mark.slurm
def test_on_slurm_a_scancelled_job_fails_where_the_plugin_sees_it_running(slurm_cluster: None, tmp_path: Path) -> None:
    executor = make_executor(tmp_path)
    log = tmp_path / "slurm_logs" / "sleeper.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    jobid = slurm("sbatch", "--parsable", "--job-name", executor.run_uuid, "-o", str(log), "--wrap", "sleep 300")
    try:
        wait_until(lambda: slurm("squeue", "-h", "-j", jobid, "-o", "%T") == "RUNNING", "the job to run", timeout=30)
        slurm("scancel", jobid)
        # What the plugin's own status query reads (slurmdbd learns of the cancel a moment later).
        query = shlex.split(query_job_status_sacct(executor.run_uuid))
        cancelled = f"{jobid}|CANCELLED by 0"
        wait_until(lambda: slurm(*query) == cancelled, repr(cancelled), timeout=30, explain=lambda: slurm(*query))
        job = SubmittedJobInfo(Job(1), external_jobid=jobid, aux={"slurm_logfile": log})
        assert check(executor, [job], official.Executor.check_active_jobs) == [job]  # the upstream bug
        assert check(executor, [job]) == []
        assert executor.workflow.scheduler.failed == [job.job]
        message = job.job.errors[0][0]
        assert f"SLURM job {jobid} ended as 'CANCELLED by " in message and str(log) in message
    finally:
        subprocess.run(["scancel", jobid], check=False)


@pytest.mark.slurm
def test_on_sigterm_a_pending_job_not_yet_among_the_active_ones_is_cancelled_too(
    slurm_cluster: None, tmp_path: Path
) -> None:
    """A pack is submitted from the gathering timer's thread: between its sbatch and its report it
    is not among the active jobs. SIGTERM's cancel finds it by the run's job name; a job reported
    after the SIGTERM is cancelled as it is reported. (Held jobs: pending for as long as the test.)"""
    executor = make_executor(tmp_path)
    held = ["sbatch", "--parsable", "--hold", "--job-name", executor.run_uuid, "-o", "/dev/null", "--wrap", "true"]
    unreported, late = slurm(*held), ""
    try:
        executor._cancel_pending_jobs()
        state = slurm("squeue", "-h", "-j", unreported, "-o", "%T")
        assert state in ("", "CANCELLED"), state  # (a cancelled pending job may already have left squeue)
        late = slurm(*held)  # submitted by another thread as the SIGTERM came
        executor.report_job_submission(SubmittedJobInfo(Job(2), external_jobid=late, aux={}))
        assert slurm("squeue", "-h", "-j", late, "-o", "%T") in ("", "CANCELLED")
        assert {unreported, late} <= executor._cancelled_by_us  # their ends are reported as the cancel's
    finally:
        subprocess.run(["scancel", unreported, *filter(None, [late])], check=False)


EXIT_CODE_SNAKEFILE = """
rule all:
    input: "ok.txt", "failed.txt"

rule ok:
    output: "ok.txt"
    resources: mem_mb=100, runtime=10
    shell: "echo ok > {output}"

rule fails:
    output: "failed.txt"
    resources: mem_mb=100, runtime=10
    shell: "exit 3"
"""
# (runtime above the profile's pack-runtime: a SLURM job each, whose own exit code is the point)


@pytest.mark.slurm
@pytest.mark.parametrize("as_script", [False, True], ids=["wrap", "pass-command-as-script"])
def test_on_slurm_a_job_that_exited_0_is_done_by_its_exit_code_a_failure_by_sacct(
    slurm_cluster: None, tmp_path: Path, as_script: bool
) -> None:
    """Both ways the plugin hands sbatch the command, 10 s between status queries: the
    success is seen from the exit code file, the failure still gets sacct's state and the log."""
    (tmp_path / "Snakefile").write_text(EXIT_CODE_SNAKEFILE)
    command = [*SNAKEMAKE, "--executor", "snakedvc-slurm", "--jobs", "2", "--verbose", "--keep-going"]
    command += ["--snakedvc-slurm-init-seconds-before-status-checks", "10", "--snakedvc-slurm-logdir", "slurm-logs"]
    command += ["--snakedvc-slurm-pass-command-as-script"] if as_script else []
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and (tmp_path / "ok.txt").read_text() == "ok\n", output[-3000:]
    jobs = slurm_jobs_by_rule(output)
    assert f"SLURM job {jobs['ok'][0]} exited 0 (exit code file): done." in output
    assert f"SLURM-job '{jobs['fails'][0]}' failed, SLURM status is: 'FAILED'" in output
    assert f"slurm-logs/rule_fails/{jobs['fails'][0]}.log" in output
    assert not (tmp_path / ".snakemake/snakedvc-slurm").exists()  # the run's exit codes are cleared


@pytest.mark.slurm
def test_on_slurm_the_account_is_guessed_once_from_recent_jobs(
    slurm_cluster: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slurm("sbatch", "--parsable", "--job-name", "snakedvc-account-test", "-o", "/dev/null", "--wrap", "true")
    account = last_account(slurm("sacct", "-nu", "root", "-o", "Account%256"))
    assert account  # the job just submitted is there
    executor = make_executor(tmp_path)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert [next(executor.get_account_arg(Job())) for _ in range(2)] == [f" -A {account}"] * 2
    infos = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "account" in r.getMessage()]
    assert infos == [f"SLURM account: {account} (from your recent jobs; set resources slurm_account to choose)"]
    # A given account is the plugin's business (validated with sacctmgr).
    assert list(executor.get_account_arg(Job(slurm_account=account))) == [f" -A {account}"]
    # The upstream guess: a shell pipe inside an argument list, always a warning, never an account.
    logger = logging.getLogger(LOGGER)
    caplog.clear()
    assert official.accounts.get_account(logger) is None
    assert "not able to get a SLURM account via sacct" in caplog.records[-1].getMessage()


@pytest.mark.slurm
def test_the_plugins_start_up_advice_to_use_squeue_is_not_printed(
    slurm_cluster: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Plugin 2.8's settings check, run by its own __post_init__ against the cluster's real
    MinJobAge (300 s >= 3 x 2 s): the official executor warns that squeue would do; ours, which
    uses sacct on purpose, does not. Other warnings still pass."""
    from snakemake_executor_plugin_snakedvc_slurm.executor import SQUEUE_ADVICE

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        official.Executor.__post_init__(make_executor(tmp_path / "official"))
    assert any(SQUEUE_ADVICE in r.getMessage() for r in caplog.records), "the plugin no longer warns: drop the filter"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        executor = make_executor(tmp_path / "ours")
        executor.logger.warning("another warning")
    messages = [r.getMessage() for r in caplog.records]
    assert not any(SQUEUE_ADVICE in m for m in messages) and "another warning" in messages


@pytest.mark.parametrize(
    ("nodes", "gpus", "wanted", "unwanted"),
    [
        (1, 0, ["--nodes=1", "--ntasks=1"], ["--gpus", "--gres"]),
        # CPU across nodes: one task a node, or SLURM shrinks --nodes=2 --ntasks=1 to one node.
        (2, 0, ["--nodes=2", "--ntasks=2"], ["--gpus", "--gres"]),
        (1, 2, ["--nodes=1", "--gpus=2"], ["--ntasks", "--gres"]),
        # GPUs across nodes: per node (--gres), not per job (--gpus).
        (3, 4, ["--nodes=3", "--gres=gpu:4"], ["--ntasks", "--gpus"]),
    ],
)
def test_training_resources_reach_sbatch_as_the_layout_needs(
    nodes: int, gpus: int, wanted: list[str], unwanted: list[str]
) -> None:
    """snakedvc.training_resources through the plugin's own sbatch builders (the profile's tasks_per_gpu: 0)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    import snakedvc

    job = Job(**snakedvc.training_resources(nodes, gpus), tasks_per_gpu=0)
    job.threads = 2
    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "", "partition": "", "workdir": ""}
    words = (get_submit_command(job, params) + " " + set_gres_string(job)).split()
    for flag in wanted:
        assert flag in words, (flag, words)
    for prefix in unwanted:
        assert not any(word.startswith(prefix) for word in words), (prefix, words)
