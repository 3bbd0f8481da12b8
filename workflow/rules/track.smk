# Post-rule DVC hook: local rules (always on the submit host, never in a SLURM job)
# that `dvc add` a finished rule's outputs; they never run for a failed job.
# At the end of a successful run, onsuccess saves the run as a DVC experiment.
# See src/snakedvc/tracking.py for the locking.


rule track_split:
    input:
        rules.split.output,
    output:
        dvc_files(rules.split.output),
    log:
        "logs/track/split.log",
    benchmark:
        "logs/benchmarks/track/split.tsv"
    localrule: True
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc track --log {log:q} {input:q}"


rule track_features:
    input:
        features="results/features/{split}.npz",
        rejects="results/features/{split}.rejects.csv",
    output:
        features="results/features/{split}.npz.dvc",
        rejects="results/features/{split}.rejects.csv.dvc",
    log:
        "logs/track/features_{split}.log",
    benchmark:
        "logs/benchmarks/track/features_{split}.tsv"
    localrule: True
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc track --log {log:q} {input.features:q} {input.rejects:q}"


rule track_model:
    input:
        model="results/model/model.pt",
        history="results/model/history.csv",
    output:
        model="results/model/model.pt.dvc",
        history="results/model/history.csv.dvc",
    log:
        "logs/track/model.log",
    benchmark:
        "logs/benchmarks/track/model.tsv"
    localrule: True
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc track --log {log:q} {input.model:q} {input.history:q}"


rule track_parity:
    input:
        parity="results/plots/parity.png",
    output:
        parity="results/plots/parity.png.dvc",
    log:
        "logs/track/parity.log",
    benchmark:
        "logs/benchmarks/track/parity.tsv"
    localrule: True
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc track --log {log:q} {input.parity:q}"


onsuccess:
    end_of_run(config)
