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
# The checkpoint `rung` ranks a rung by the metric in each trial's metrics file at run time and
# decides who goes on; `report` summarises the sweep once the last rung is decided.
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


# The module's own checkpoint, for the plan's run-time helpers (SWEEP.best, later rungs' trials).
SWEEP._bind(checkpoints.rung)


# Only the last rung is an input: asking Snakemake for every rung's checkpoint at once makes it
# plan later rungs before the earlier decisions exist. The earlier ones exist by then (each
# rung's trials are known only once the rung before is decided).
rule report:
    input:
        last=lambda w: checkpoints.rung.get(rung=str(len(SWEEP._rungs) - 1)).output.decision,
    output:
        report=directory(SWEEP.report),
    params:
        decisions=[f"{SWEEP.root}/rungs/rung{r.index}.json" for r in SWEEP._rungs],
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
