"""snakedvc: a kit that any Snakemake project adopts in a few lines.

Public API (everything else is internal):

In a Snakefile
- ``configure(config, workflow)``: validate the config at start (the ``snakedvc`` key against
  the kit's schema, the rest against the workflow's own schema), with --config values typed.
- ``module_path(name)``: a Snakemake module the kit ships (``"tracking"``, ``"sweep"``).
- ``sweep_plan(config)``: the sweep of ``snakedvc.sweep``: the trial rule's outputs, params and
  inputs (``outputs``, ``flags``, ``section``, ``trial_args``, ``log``, ``benchmark``), the winner (``best``).
- ``tracked(config, *outputs)``: the ``.dvc`` targets that record outputs in DVC (checked first:
  an output DVC would refuse stops the run before any job).
- ``flags(section)``: a config section as ``--name value`` flags for an argparse script (the sweep
  plan's ``flags(key)`` gives a trial's).
- ``training_resources(nodes, gpus_per_node)``: a training rule's SLURM resources for that layout
  (``resources: **snakedvc.training_resources(K, G)``).
- ``finish_run(config, workflow)``: in ``onsuccess``, save the run (or every sweep trial) as a DVC
  experiment holding only what the run's own DAG produced.
- ``ConfigError``, ``validate_config(config, schema)``: schema validation for a user's own checks.

In a step a rule runs
- ``log_to(path)``: stderr and logging into the rule's ``log:`` file, first thing.
- ``atomic_path(path)``: write an output to a temporary file renamed into place on success,
  so a failed step never leaves a half-written output.
- ``progress(items, total=, desc=, unit=, weight=)``: a tqdm bar at a terminal, plain lines in
  a log file or a SLURM job.

On the command line: ``snakedvc launch -- COMMAND`` (1 process, torchrun, srun + torchrun),
``snakedvc restore NAME``, ``snakedvc submit`` (a detached run pinned to the code as it is;
``runs``, ``logs``, ``cancel``, ``resume``, ``clean``). In a training loop: ``snakedvc.torch`` (the ``torch`` extra),
``snakedvc.live.EpochLog`` (per-epoch metrics through dvclive on rank 0; the ``live`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snakedvc.io import atomic_path
from snakedvc.logs import log_to
from snakedvc.progressbar import progress

if TYPE_CHECKING:
    from snakedvc.engine.config import ConfigError, validate_config
    from snakedvc.engine.sweep import plan as sweep_plan
    from snakedvc.engine.tracking import finish_run
    from snakedvc.engine.workflow import configure, flags, module_path, tracked, training_resources

# The host side's names, imported on first use: a step (`from snakedvc import atomic_path`) in a
# job loads no host-side module (and needs none of the engine install).
_HOST = {
    "ConfigError": ("config", "ConfigError"),
    "validate_config": ("config", "validate_config"),
    "sweep_plan": ("sweep", "plan"),
    "finish_run": ("tracking", "finish_run"),
    "configure": ("workflow", "configure"),
    "flags": ("workflow", "flags"),
    "module_path": ("workflow", "module_path"),
    "tracked": ("workflow", "tracked"),
    "training_resources": ("workflow", "training_resources"),
}


def __getattr__(name: str) -> Any:
    if name in _HOST:
        import importlib

        module, attr = _HOST[name]
        return getattr(importlib.import_module(f"snakedvc.engine.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# What a user learns, capability by capability (the README's table lists the same; a test keeps
# them equal and resolves each): a name and, for an object, the members used. Everything else
# in __all__ and in snakedvc.torch / snakedvc.live is optional.
API: dict[str, dict[str, tuple[str, ...]]] = {
    "a workflow on the kit, every run a DVC experiment": {
        "configure": (), "module_path": (), "tracked": (), "finish_run": (),
    },
    "a step's outputs and log": {"log_to": (), "atomic_path": ()},
    "an argparse script as a rule": {"flags": ()},
    "1 GPU, N GPUs, N nodes": {"training_resources": ()},
    "resume after SIGTERM, time limit, preemption": {
        "torch.Resumable": ("from_args", "load", "steps", "save", "finish"), "torch.add_resume_arguments": (),
    },
    "sweeps": {
        "sweep_plan": ("outputs", "trial_args", "previous_state", "flags", "log", "benchmark", "targets", "best"),
    },
    "per-epoch metrics (dvclive)": {"live.EpochLog": ("epoch", "restore", "rows", "finish")},
}  # fmt: skip

__version__ = "0.1.0"
__all__ = [
    "ConfigError",
    "atomic_path",
    "configure",
    "finish_run",
    "flags",
    "log_to",
    "module_path",
    "progress",
    "sweep_plan",
    "tracked",
    "training_resources",
    "validate_config",
    "__version__",
]
