"""An existing DVC pipeline (dvc.yaml) run by Snakemake: one job per stage, recorded as `dvc exp run` records it.

DVC reads the pipeline (its templating, ``vars``, ``foreach``/``matrix``, params, ``wdir``): the kit
never parses DVC's format. DVC decides which stages run (those ``dvc status`` calls changed, and
every stage downstream of one). Snakemake only schedules: each stage is a job of its own (a SLURM
job under a SLURM profile) that runs the stage's commands as DVC would, while on the submit host
the run's own process commits the stages that finished, in batches, serialised by the kit's lock,
so dvc.lock and the cache hold what ``dvc repro`` would have written, and decides at run time, as
``dvc repro`` does, whether a stage downstream of one that ran must run. The jobs are linked by marker files, not by the
stages' outputs: DVC, not Snakemake, decides what is up to date, and Snakemake never deletes or
checks a stage's outputs. At the end one ``dvc exp save`` makes the experiment, committing what
``dvc exp run`` commits: dvc.lock, the params files and the outputs DVC does not cache.

The flow, a module each: ``plan`` (read the pipeline through DVC, decide what runs), ``run``
(`snakedvc exp run`: the plan to Snakemake, then the save), ``commit`` (what dvc.lock records as
stages finish), ``save`` (the experiment). `snakedvc submit` runs ``run`` in a run's workspace
(engine/runs/submission.py).
"""

from snakedvc.engine.dvcpipeline.commit import Bookkeeper
from snakedvc.engine.dvcpipeline.plan import (
    PIPELINE_FOLDER,
    Missing,
    PipelineError,
    Plan,
    Selection,
    Stage,
    dry_run,
    overrides_from_subfolder,
    read_plan,
    set_params,
    stage_run_launch_args,
    stage_run_options,
    targets_from_subfolder,
)
from snakedvc.engine.dvcpipeline.run import (
    ExpRunOptions,
    exp_run,
    is_dvc_pipeline,
    kit_profile,
    pipeline_profile,
    run_plan,
)
from snakedvc.engine.dvcpipeline.save import Recorded, save

__all__ = [
    "PIPELINE_FOLDER", "ExpRunOptions", "Missing", "Recorded", "PipelineError", "Plan", "Selection", "Stage", "Bookkeeper", "dry_run",
    "exp_run", "is_dvc_pipeline", "kit_profile", "overrides_from_subfolder", "pipeline_profile", "read_plan", "run_plan", "save", "set_params",
    "stage_run_launch_args", "stage_run_options", "targets_from_subfolder",
]  # fmt: skip
