"""snakedvc's SLURM executor, `executor: snakedvc-slurm`: the official plugin with its fixes (executor.py).

It ships with the kit, and `pip install "snakedvc[engine]"` brings the official plugin it
subclasses (snakemake-executor-plugin-slurm). Snakemake imports every installed
`snakemake_executor_plugin_*` package at start, so where the official plugin is absent (a step
environment that has Snakemake, or one with numpy<2, which plugin 2.8 excludes) this registers
an executor that only says how to install it, and every other executor works as before.
"""

import importlib.util

if importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None:
    from snakemake_executor_plugin_snakedvc_slurm.executor import Executor, ExecutorSettings, common_settings
else:
    from snakemake_executor_plugin_snakedvc_slurm.unavailable import Executor, ExecutorSettings, common_settings

__all__ = ["Executor", "ExecutorSettings", "common_settings"]
