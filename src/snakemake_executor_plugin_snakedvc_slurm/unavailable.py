"""`executor: snakedvc-slurm` where the official SLURM plugin is not installed: an error that says what to do."""

from dataclasses import dataclass

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

MISSING = (
    "executor snakedvc-slurm needs the official SLURM plugin, which this environment lacks: "
    'pip install "snakedvc[engine]" (it brings snakemake-executor-plugin-slurm>=2.7.1,<2.9, which needs numpy>=2.4.5)'
)

common_settings = CommonSettings(non_local_exec=True, implies_no_shared_fs=False, job_deploy_sources=False)


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    pass


class Executor(RemoteExecutor):
    def __post_init__(self) -> None:
        raise WorkflowError(MISSING)

    def run_job(self, job):
        raise WorkflowError(MISSING)

    async def check_active_jobs(self, active_jobs):
        raise WorkflowError(MISSING)
        yield  # an async generator, as the interface wants

    def cancel_jobs(self, active_jobs):
        pass
