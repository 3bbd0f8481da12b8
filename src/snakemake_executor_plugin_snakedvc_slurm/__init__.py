"""The official SLURM executor without its fixed waits: `executor: snakedvc-slurm`.

Everything (sbatch flags from resources, job scripts, status queries, failures, retries,
cancelling) is snakemake-executor-plugin-slurm's own; this subclass changes two timings that
plugin 2.6.1 hard-codes and no setting reaches:

- it sleeps 5 s before every sbatch call, so each job on a chain of dependent jobs starts
  5 s late (upstream: "SLURM submission is very slow", plugin issue 403). Here the pause is
  `submit-delay-seconds` (default 0); Snakemake's own `--max-jobs-per-timespan` (default
  100/1s) still limits how fast jobs are submitted.
- it adds 10 s to its wait after every status round in which no job finished (up to 180 s),
  so a short job's successor is submitted up to tens of seconds late. Here the wait never
  exceeds `max-seconds-between-status-checks` (default 5 s): one squeue or sacct call for
  all active jobs per interval.

Snakemake names a plugin's settings after the plugin, so in a profile the official
settings are spelled `snakedvc-slurm-<setting>` (e.g. `snakedvc-slurm-status-command`).
"""

# No `from __future__ import annotations`: Snakemake builds its command-line options from
# the settings' field types, which must be real types, not strings.

import contextlib
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any

import snakemake_executor_plugin_slurm as official
from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings as SlurmExecutorSettings
from snakemake_executor_plugin_slurm import common_settings  # noqa: F401 - required by Snakemake
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

DEFAULT_MAX_INTERVAL = 5
# The pause plugin 2.6.1 takes before each sbatch call (run_job: time.sleep(5)).
PLUGIN_SUBMIT_PAUSE = 5


@dataclass
class ExecutorSettings(SlurmExecutorSettings):
    max_seconds_between_status_checks: int = field(
        default=DEFAULT_MAX_INTERVAL,
        metadata={
            "help": "Upper bound on the seconds between two status checks (the official "
            "plugin grows the interval by 10 s per idle round, up to 180 s).",
            "env_var": False,
            "required": False,
        },
    )

    submit_delay_seconds: float = field(
        default=0.0,
        metadata={
            "help": "Seconds to pause before each sbatch call (the official plugin pauses 5 s; "
            "Snakemake's --max-jobs-per-timespan limits the submission rate either way).",
            "env_var": False,
            "required": False,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.submit_delay_seconds, int | float) or self.submit_delay_seconds < 0:
            raise WorkflowError(
                f"snakedvc-slurm-submit-delay-seconds must be a number >= 0, got {self.submit_delay_seconds!r}"
            )
        if not isinstance(self.max_seconds_between_status_checks, int) or self.max_seconds_between_status_checks < 1:
            raise WorkflowError(
                "snakedvc-slurm-max-seconds-between-status-checks must be a positive integer, "
                f"got {self.max_seconds_between_status_checks!r}"
            )


class PluginClock:
    """What the official plugin module sees as `time` while it submits a job: the real module,
    except that its fixed pause before sbatch lasts ``delay`` seconds."""

    def __init__(self, delay: float, clock: Any = time) -> None:
        self.delay = delay
        self._clock = clock

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(self.delay if seconds == PLUGIN_SUBMIT_PAUSE else seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._clock, name)


@contextlib.contextmanager
def plugin_clock(delay: float) -> Iterator[None]:
    saved = official.time
    official.time = PluginClock(delay)
    try:
        yield
    finally:
        official.time = saved


class Executor(SlurmExecutor):
    def run_job(self, job: Any) -> None:
        with plugin_clock(self.workflow.executor_settings.submit_delay_seconds):
            super().run_job(job)

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        async for job in super().check_active_jobs(active_jobs):
            yield job
        # The official generator has just set the next interval as it finished; bound it.
        interval = self.next_seconds_between_status_checks  # type: ignore[has-type]
        cap = self.workflow.executor_settings.max_seconds_between_status_checks
        self.next_seconds_between_status_checks = bounded_interval(interval, cap)


def bounded_interval(interval: float | None, cap: int) -> float | None:
    """The official plugin's next interval, never above ``cap`` (None: Snakemake's default)."""
    return None if interval is None else min(interval, cap)
