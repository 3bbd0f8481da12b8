"""The official SLURM executor with a bounded status-check interval: `executor: snakedvc-slurm`.

Everything (sbatch flags from resources, job scripts, status queries, failures, retries,
cancelling) is snakemake-executor-plugin-slurm's own; this subclass changes one thing. Plugin
2.6.1 adds a hard-coded 10 s to its wait after every status round in which no job finished
(up to 180 s), so on a pipeline of short jobs each job's successor is submitted up to tens of
seconds late. Here the wait never exceeds `max-seconds-between-status-checks` (default 5 s).
One squeue or sacct call per interval for all active jobs: cheap for the controller.

Snakemake names a plugin's settings after the plugin, so in a profile the official
settings are spelled `snakedvc-slurm-<setting>` (e.g. `snakedvc-slurm-status-command`).
"""

# No `from __future__ import annotations`: Snakemake builds its command-line options from
# the settings' field types, which must be real types, not strings.

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings as SlurmExecutorSettings
from snakemake_executor_plugin_slurm import common_settings  # noqa: F401 - required by Snakemake
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

DEFAULT_MAX_INTERVAL = 5


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

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.max_seconds_between_status_checks, int) or self.max_seconds_between_status_checks < 1:
            raise WorkflowError(
                "snakedvc-slurm-max-seconds-between-status-checks must be a positive integer, "
                f"got {self.max_seconds_between_status_checks!r}"
            )


class Executor(SlurmExecutor):
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
