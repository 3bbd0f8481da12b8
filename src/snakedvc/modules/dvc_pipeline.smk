# snakedvc exp run: a project's own dvc.yaml as Snakemake jobs, one per stage (per foreach or
# matrix item). Started by `snakedvc exp run`, which reads the pipeline through DVC and writes
# the plan this file loads (config key snakedvc_pipeline): which stages run, in what order.
#
# A stage's job runs its commands as DVC would (`snakedvc stage-run`: in its wdir, by the shell,
# DVC_ROOT and DVC_STAGE set, its outputs removed first, their folders made). No DVC runs here:
# `snakedvc exp run`'s own process commits the stages that finished, in batches, and tells a
# stage whose upstream stages ran whether to run (its job waits for that word: --decision).
# A stage's threads and resources come from snakedvc.yaml (the plan has them); the profile
# routes them as it routes any rule's. Jobs are linked by marker files under the plan's folder,
# never by the stages' outputs: DVC alone decides what is up to date.
from snakedvc.engine.dvcpipeline import Plan, stage_run_options
from snakedvc.engine.env import python_module
from snakedvc.engine.scheduler_exit import end_pending_scheduler_wakeups

# The kit by this interpreter's path, leaving PATH as the user has it: a stage's `python` is the
# one first on the user's PATH, as under `dvc exp run` (a project's own venv, not the kit's).
KIT = python_module("snakedvc")
PLAN = Plan.load(config["snakedvc_pipeline"])


rule all:
    input:
        [PLAN.ran(name) for name in PLAN.run],
    default_target: True


# The run ends when its last stage has, not up to a second later (snakedvc.engine.scheduler_exit).
onsuccess:
    end_pending_scheduler_wakeups()


onerror:
    end_pending_scheduler_wakeups()


for stage in PLAN.stages:

    rule:
        name:
            stage.rule
        input:
            PLAN.waits_for(stage.name),
        output:
            touch(PLAN.ran(stage.name)),
        params:
            stage=stage.name,
            wdir=stage.wdir,
            outs=list(stage.outs),
            commands=list(stage.commands),
            options=stage_run_options(stage.job),
            decision=["--decision", PLAN.decision(stage.name)] if PLAN.waits(stage.name) else [],
            plan=f"{PLAN.folder}/plan.json",
            kit=KIT,
        log:
            PLAN.log(stage.name),
        threads: stage.job.threads
        resources:
            **stage.job.resources,
        shell:
            "{params.kit:q} stage-run --stage {params.stage:q} --wdir {params.wdir:q} {params.options:q} {params.decision:q}"
            " --plan {params.plan:q}"
            " --remove {params.outs:q} -- {params.commands:q} > {log:q} 2>&1"

