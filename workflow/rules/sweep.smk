# Hyperparameter sweep (config `snakedvc.sweep`): the kit's sweep module over this workflow's
# own train rule. Every trial of every rung is a `sweep_trial` job; the module's checkpoint
# `sweep_rung` ranks a rung by validation RMSE and decides who goes on; the winner is
# evaluated once on test.


module sweep:
    snakefile:
        snakedvc.module_path("sweep")
    config:
        config


use rule * from sweep as sweep_*


# Trials that change the featurise section get their own features, built once per variant.
rule sweep_featurise:
    input:
        split="results/split/{split}.csv",
    output:
        features=f"{SWEEP.root}/features/{{fkey}}/{{split}}.npz",
        rejects=f"{SWEEP.root}/features/{{fkey}}/{{split}}.rejects.csv",
    params:
        python=config["python"],
        cfg=lambda w: json.dumps(SWEEP.variants("featurise")[w.fkey], sort_keys=True),
        stored=STORED,
    log:
        f"logs/sweeps/{SWEEP.name}/featurise/{{fkey}}/{{split}}.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP.name}/featurise/{{fkey}}/{{split}}.tsv"
    threads: res("featurise", "threads")
    resources:
        mem_mb=res("featurise", "mem_mb"),
        runtime=res("featurise", "runtime"),
    shell:
        "{params.python:q} -m esol featurise --log {log:q} --params {params.cfg:q} --input {input.split:q}"
        " --output {output.features:q} --rejects {output.rejects:q} {params.stored}"


# A trial is the train rule with the trial's config, trained to its rung's epochs; it continues
# from its previous rung's state and writes its validation RMSE for the ranking.
use rule train as sweep_trial with:
    input:
        train=lambda w: sweep_features(w.trial, "train"),
        valid=lambda w: sweep_features(w.trial, "valid"),
        previous=SWEEP.previous_state,
    output:
        **SWEEP.outputs(model="model.pt"),
        live=directory(SWEEP.trial_file("live")),
    params:
        cfg=SWEEP.section("train"),
        trial=SWEEP.trial_args("--resume-from", "--state-out", metrics_flag="--result"),
    log:
        SWEEP.log(),
    benchmark:
        SWEEP.benchmark()


rule sweep_evaluate:
    input:
        model=SWEEP.best("model.pt"),
        test=lambda w: sweep_features(SWEEP.best_trial(), "test"),
    output:
        metrics=f"{SWEEP.root}/final/metrics.json",
        predictions=f"{SWEEP.root}/final/predictions.csv",
        parity=f"{SWEEP.root}/final/parity.png",
    params:
        python=config["python"],
    log:
        f"logs/sweeps/{SWEEP.name}/evaluate.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP.name}/evaluate.tsv"
    threads: res("default", "threads")
    resources:
        mem_mb=res("default", "mem_mb"),
        runtime=res("default", "runtime"),
    shell:
        "{params.python:q} -m esol evaluate --log {log:q} --model {input.model:q} --test {input.test:q}"
        " --metrics {output.metrics:q} --predictions {output.predictions:q} --parity {output.parity:q}"
