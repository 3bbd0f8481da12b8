# snakedvc sweep: successive halving over the workflow's own training rule.
#
#   SWEEP = snakedvc.sweep_plan(config)
#   module sweep:
#       snakefile: snakedvc.module_path("sweep")
#       config: config
#   use rule * from sweep as sweep_*
#   use rule train as sweep_trial with:           # the user's rule, one job per trial and rung
#       output: **SWEEP.outputs(model="model.pt")
#       params: hp=SWEEP.section("train"), trial=SWEEP.trial_args("--continue-from", "--final-state")
#       log: SWEEP.log()
#       benchmark: SWEEP.benchmark()
#
# Rung r trains each survivor of rung r-1 (rung 0: every valid trial) on to the rung's epochs.
# successive_halving and full: the checkpoint `rung` ranks a rung by the metric in each trial's
# metrics file at run time and decides who goes on. asha: the checkpoints `asha_step` and
# `asha_end` below. `report` summarises the sweep once the last decision is made.
import json

import snakedvc

SWEEP = snakedvc.sweep_plan(config)


checkpoint rung:
    input:
        lambda w: [SWEEP._path(t, int(w.rung), SWEEP._settings.metrics_file) for t in SWEEP._rung_trials(int(w.rung))],
    output:
        decision=f"{SWEEP.root}/rungs/rung{{rung}}.json",
    params:
        keep=lambda w: SWEEP._keep_after(int(w.rung)),
        metric=SWEEP._settings.metric,
        direction=SWEEP._settings.direction,
    log:
        f"logs/sweeps/{SWEEP.name}/rung{{rung}}.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP.name}/rung{{rung}}.tsv"
    wildcard_constraints:
        rung=r"\d+",
    localrule: True
    shell:
        "snakedvc sweep-promote --log {log:q} --rung {wildcards.rung} --keep {params.keep}"
        " --metric {params.metric:q} --direction {params.direction} --output {output.decision:q} {input:q}"


# strategy asha: each of the sweep's slots is a chain of steps. A step is a decision, taken when
# the trial-rung of the slot's step before has its result: record that result in the decision
# log, then promote a trial to its next rung, start a new trial, or stop the slot (snakedvc
# sweep-asha-step; the log's lock orders the slots' decisions). The trial-rung a step names is an
# input of the step after it, so Snakemake runs it as a job of the trial rule in between.
checkpoint asha_step:
    input:
        SWEEP._asha_trained,
    output:
        decision=SWEEP._asha_step_file("{slot}", "{step}"),
    params:
        header=lambda w: json.dumps(SWEEP._asha_header().as_dict(), sort_keys=True),
        log=SWEEP._asha_log,
        replay=SWEEP._settings.replay,
    log:
        f"logs/sweeps/{SWEEP.name}/asha/slot{{slot}}/step{{step}}.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP.name}/asha/slot{{slot}}/step{{step}}.tsv"
    wildcard_constraints:
        slot=r"\d+",
        step=r"\d+",
    localrule: True
    shell:
        "snakedvc sweep-asha-step --log {log:q} --decisions {params.log:q} --plan {params.header:q}"
        " --slot {wildcards.slot} --step {wildcards.step} --replay={params.replay:q} --output {output.decision:q}"
        " {input:q}"


# The end of an asha sweep: every slot has stopped. Its input is every slot's steps so far (the
# next undecided step of each slot included), so all slots go on side by side.
checkpoint asha_end:
    input:
        SWEEP._asha_frontier,
    output:
        summary=f"{SWEEP.root}/asha/summary.json",
    params:
        header=lambda w: json.dumps(SWEEP._asha_header().as_dict(), sort_keys=True),
        log=SWEEP._asha_log,
        replay=SWEEP._settings.replay,
    log:
        f"logs/sweeps/{SWEEP.name}/asha/end.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP.name}/asha/end.tsv"
    localrule: True
    shell:
        "snakedvc sweep-asha-end --log {log:q} --decisions {params.log:q} --plan {params.header:q}"
        " --replay={params.replay:q} --output {output.summary:q}"


# The module's own checkpoints, for the plan's run-time helpers (SWEEP.best, later rungs' trials).
SWEEP._bind(checkpoints.rung, checkpoints.asha_step, checkpoints.asha_end)


# Only the last rung is an input: asking Snakemake for every rung's checkpoint at once makes it
# plan later rungs before the earlier decisions exist. The earlier ones exist by then (each
# rung's trials are known only once the rung before is decided).
# An asha sweep's report reads its end's summary and decision log instead.
rule report:
    input:
        last=lambda w: (
            checkpoints.asha_end.get().output.summary
            if SWEEP._asha
            else checkpoints.rung.get(rung=str(len(SWEEP._rungs) - 1)).output.decision
        ),
    output:
        report=directory(SWEEP.report),
    params:
        decisions=(
            [SWEEP._asha_log, f"{SWEEP.root}/asha/summary.json"]
            if SWEEP._asha
            else [f"{SWEEP.root}/rungs/rung{r.index}.json" for r in SWEEP._rungs]
        ),
        plan=lambda w: json.dumps(SWEEP._describe(), sort_keys=True),
        trials=f"{SWEEP.root}/trials",
        state=SWEEP._settings.state_file,
    log:
        f"logs/sweeps/{SWEEP.name}/report.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP.name}/report.tsv"
    localrule: True
    shell:
        "snakedvc sweep-report --log {log:q} --plan {params.plan:q} --trials {params.trials:q}"
        " --leave-out {params.state:q} --output {output.report:q} {params.decisions:q}"
