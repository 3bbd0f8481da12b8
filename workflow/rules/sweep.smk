# Hyperparameter sweep (config `sweep.enabled`): every trial of every rung is its own job.
# Rung r trains each survivor of rung r-1 on to the rung's epochs, continuing from the state
# its previous rung ended in; the checkpoint rule `sweep_rung` ranks a rung by validation
# RMSE at run time and decides who goes on. The winner is evaluated once on test.


rule sweep_featurise:
    input:
        split="results/split/{split}.csv",
    output:
        features=f"{SWEEP_DIR}/features/{{fkey}}/{{split}}.npz",
        rejects=f"{SWEEP_DIR}/features/{{fkey}}/{{split}}.rejects.csv",
    params:
        cfg=lambda w: json.dumps(SWEEP.featurise_by_key()[w.fkey], sort_keys=True),
    log:
        f"logs/sweeps/{SWEEP_NAME}/featurise/{{fkey}}/{{split}}.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP_NAME}/featurise/{{fkey}}/{{split}}.tsv"
    threads: res("featurise", "threads")
    resources:
        mem_mb=res("featurise", "mem_mb"),
        runtime=res("featurise", "runtime"),
    shell:
        "python -m esol featurise --log {log:q} --params {params.cfg:q} --input {input.split:q}"
        " --output {output.features:q} --rejects {output.rejects:q}"


rule sweep_train:
    input:
        train=lambda w: sweep_features(w.trial, "train"),
        valid=lambda w: sweep_features(w.trial, "valid"),
        previous=lambda w: [trial_dir(w.trial, int(w.rung) - 1)] if int(w.rung) > 0 else [],
    output:
        directory(f"{SWEEP_DIR}/trials/{{trial}}/rung{{rung}}"),
    params:
        cfg=lambda w: json.dumps(SWEEP.train_section(w.trial, int(w.rung)), sort_keys=True),
        # Continue from where the trial's previous rung ended (quoted here: it may be empty).
        resume=lambda w, input: shlex.join(["--resume-from", f"{input.previous[0]}/state.pt"])
        if input.previous
        else "",
        nodes=res("train", "nodes"),
        procs=res("train", "processes"),
    log:
        f"logs/sweeps/{SWEEP_NAME}/{{trial}}/rung{{rung}}.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP_NAME}/{{trial}}/rung{{rung}}.tsv"
    threads: max(res("train", "threads"), res("train", "processes"))
    resources:
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        gpu=res("train", "gpu"),
        nodes=res("train", "nodes"),
    # `exec` for the same reason as in train.smk: SIGTERM must reach the trainer.
    shell:
        "mkdir -p {output:q} && exec snakedvc launch --log {log:q} --nodes {params.nodes}"
        " --procs-per-node {params.procs} -- python -m esol train --params {params.cfg:q} --train {input.train:q}"
        " --valid {input.valid:q} {params.resume} --model {output:q}/model.pt"
        " --history {output:q}/history.csv --state-out {output:q}/state.pt --result {output:q}/result.json"


checkpoint sweep_rung:
    input:
        lambda w: [trial_dir(t, int(w.rung)) for t in rung_trials(int(w.rung))],
    output:
        decision=f"{SWEEP_DIR}/rungs/rung{{rung}}.json",
    params:
        keep=lambda w: SWEEP.keep_after(int(w.rung)),
    log:
        f"logs/sweeps/{SWEEP_NAME}/rung{{rung}}.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP_NAME}/rung{{rung}}.tsv"
    localrule: True
    shell:
        "python -m snakedvc sweep-promote --log {log:q} --rung {wildcards.rung} --keep {params.keep}"
        " --output {output.decision:q} {input:q}"


rule sweep_evaluate:
    input:
        trial=best_trial_dir,
        test=lambda w: sweep_features(Path(best_trial_dir(w)).parent.name, "test"),
    output:
        metrics=f"{SWEEP_DIR}/final/metrics.json",
        predictions=f"{SWEEP_DIR}/final/predictions.csv",
        parity=f"{SWEEP_DIR}/final/parity.png",
        loss_curve=f"{SWEEP_DIR}/final/loss.csv",
    log:
        f"logs/sweeps/{SWEEP_NAME}/evaluate.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP_NAME}/evaluate.tsv"
    threads: res("default", "threads")
    resources:
        mem_mb=res("default", "mem_mb"),
        runtime=res("default", "runtime"),
    shell:
        "python -m esol evaluate --log {log:q} --model {input.trial:q}/model.pt --test {input.test:q}"
        " --history {input.trial:q}/history.csv --metrics {output.metrics:q}"
        " --predictions {output.predictions:q} --parity {output.parity:q}"
        " --loss-curve {output.loss_curve:q}"


rule sweep_report:
    input:
        final=rules.sweep_evaluate.output,
        last_rung=lambda w: checkpoints.sweep_rung.get(rung=str(len(SWEEP.rungs) - 1)).output,
    output:
        report=directory(f"{SWEEP_DIR}/report"),
        plan=f"{SWEEP_DIR}/plan.json",
    params:
        plan=lambda w: json.dumps(SWEEP.describe(), sort_keys=True),
        final=lambda w, input: Path(input.final[0]).parent,
        sweep_dir=lambda w, output: Path(output.plan).parent,
    log:
        f"logs/sweeps/{SWEEP_NAME}/report.log",
    benchmark:
        f"logs/benchmarks/sweeps/{SWEEP_NAME}/report.tsv"
    localrule: True
    shell:
        "printf '%s\\n' {params.plan:q} > {output.plan:q} && python -m snakedvc sweep-report --log {log:q}"
        " --plan {output.plan:q} --sweep-dir {params.sweep_dir:q} --final {params.final:q} --output {output.report:q}"
