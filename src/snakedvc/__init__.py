"""snakedvc: a kit that any Snakemake project adopts in a few lines.

Public API (everything else is internal; ``API`` below says which names each capability needs):

In a Snakefile
- ``include: snakedvc.module_path("kit")`` (after ``configfile:``): the config validated (the
  ``snakedvc`` key against the kit's schema, the rest against the workflow's own, --config values
  typed), the kit's rules (``dvc add`` of finished outputs on the submit host; a sweep's rungs and
  report) and, at the end of a successful run, the run saved as a DVC experiment holding only what
  its own DAG produced (a sweep: one per trial).
- ``targets(config, *outputs, track=...)``: what ``rule all`` asks for: the outputs and the ``.dvc``
  records of ``track`` (checked first: an output DVC would refuse stops the run before any job);
  while sweeping, the sweep's report.
- ``flags(config, key)``: a config section as ``--name value`` flags for an argparse script, in
  ``params:`` (in a sweep trial's job: the trial's values at its rung).
- ``sweep_plan(config)``: the sweep of ``snakedvc.sweep``: the trial rule's input, outputs, log and
  benchmark (``previous_state``, ``outputs``, ``log``, ``benchmark``) and ``trial_args()`` for
  ``snakedvc launch``; the winner (``best``).
- ``training_resources(nodes, gpus_per_node)``: a training rule's SLURM resources for that layout
  (``resources: **snakedvc.training_resources(K, G)``).
- Without the kit's include (rules of its own names, an ``onsuccess`` of its own):
  ``configure(config, workflow)``, ``tracked(config, *outputs)``, ``start_run(config, workflow)``
  (in ``onstart``), ``finish_run(config, workflow)`` (in ``onsuccess``);
  ``ConfigError``, ``validate_config(config, schema)`` for checks of a user's own.

In a step a rule runs (optional: Snakemake's ``log:`` and its removal of a failed job's outputs do
the rest)
- ``log_to(path)``: stderr and logging into the rule's ``log:`` file, first thing.
- ``atomic_path(path)``: write an output to a temporary file renamed into place on success,
  so nothing ever reads a half-written output.
- ``progress(items, total=, desc=, unit=, weight=)``: a tqdm bar at a terminal, plain lines in
  a log file or a SLURM job.

On the command line: ``snakedvc launch -- COMMAND`` (1 process, torchrun, srun + torchrun),
``snakedvc restore NAME``, ``snakedvc submit`` (a detached run pinned to the code as it is;
``runs``, ``logs``, ``cancel``, ``resume``, ``clean``). In a training loop: ``snakedvc.torch``
(the ``torch`` extra): ``Resumable`` (``epochs``, ``steps``, ``log``, ``finish``); ``ShardedRows``
(``batches``) for data larger than memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snakedvc.errors import ConfigError
from snakedvc.io import atomic_path
from snakedvc.logs import log_to
from snakedvc.progressbar import progress

if TYPE_CHECKING:
    from snakedvc.engine.config import validate_config
    from snakedvc.engine.finish import finish_run, start_run
    from snakedvc.engine.sweep import plan as sweep_plan
    from snakedvc.engine.workflow import configure, flags, module_path, targets, tracked, training_resources

# The host side's names, imported on first use: a step (`from snakedvc import atomic_path`) in a
# job loads no host-side module (and needs none of the engine install).
_HOST = {
    "validate_config": ("config", "validate_config"),
    "sweep_plan": ("sweep", "plan"),
    "finish_run": ("finish", "finish_run"),
    "start_run": ("finish", "start_run"),
    "configure": ("workflow", "configure"),
    "flags": ("workflow", "flags"),
    "module_path": ("workflow", "module_path"),
    "targets": ("workflow", "targets"),
    "tracked": ("workflow", "tracked"),
    "training_resources": ("workflow", "training_resources"),
}


def __getattr__(name: str) -> Any:
    if name in _HOST:
        import importlib

        module, attr = _HOST[name]
        return getattr(importlib.import_module(f"snakedvc.engine.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# What a user learns, capability by capability (docs/reference.md's table lists the same; a test keeps
# them equal and resolves each): a name and, for an object, the members used. Everything else
# in __all__ and in snakedvc.torch / snakedvc.live is optional.
API: dict[str, dict[str, tuple[str, ...]]] = {
    "a workflow on the kit, every run a DVC experiment": {"module_path": (), "targets": ()},
    "an argparse script as a rule": {"flags": ()},
    "1 GPU, N GPUs, N nodes": {"training_resources": ()},
    "resume after SIGTERM, time limit, preemption; per-epoch metrics": {
        "torch.Resumable": ("epochs", "steps", "log", "finish"),
    },
    "sweeps": {"sweep_plan": ("outputs", "previous_state", "trial_args", "log", "benchmark")},
    "data larger than memory, the same batches on 1 or N ranks": {"torch.ShardedRows": ("batches",)},
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
    "start_run",
    "sweep_plan",
    "targets",
    "tracked",
    "training_resources",
    "validate_config",
    "__version__",
]
