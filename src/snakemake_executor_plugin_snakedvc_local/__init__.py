"""snakedvc's local executor, `executor: snakedvc-local` (profiles/local): Snakemake's own local
executor, with what the kit's SLURM executor does as well, so a run behaves alike on both.

- A retried job keeps its last attempt's rule log (logs/train.log -> logs/train.attempt1.log);
  Snakemake's local executor lets the retry write over it.

Everything else is Snakemake's local executor, unchanged: its settings, threads, resources.
"""

from __future__ import annotations

from typing import Any

from snakemake.executors.local import Executor as LocalExecutor
from snakemake.executors.local import common_settings

from snakedvc.logs import keep_earlier_attempt_logs

__all__ = ["Executor", "common_settings"]


class Executor(LocalExecutor):
    def run_job(self, job: Any) -> None:
        for kept in keep_earlier_attempt_logs(job):
            self.logger.info(
                f"Job {job.jobid} (rule {job.name}), attempt {job.attempt}: the last attempt's log is kept as {kept}"
            )
        super().run_job(job)
