# Featurisation, scattered: with featurise.shards = K > 1 each split is cut into K contiguous
# blocks of rows, each block its own job (a SLURM job through the profile), and gather_features
# concatenates them in order. With K = 1 featurise writes the split's features itself. The
# features are byte-identical for any K (tested). With loading.stream, training reads the
# training and validation shards themselves: only the test split is gathered.


rule featurise:
    input:
        split="results/split/{split}.csv",
    output:
        features=featurise_output("npz"),
        rejects=featurise_output("rejects.csv"),
    params:
        python=config["python"],
        cfg=section_json("featurise"),
        shard=lambda w: w.get("shard", 0),
        shards=config["featurise"]["shards"],
        stored=STORED,
    log:
        featurise_log("logs/featurise"),
    benchmark:
        featurise_log("logs/benchmarks/featurise", "tsv")
    threads: res("featurise", "threads")
    resources:
        mem_mb=res("featurise", "mem_mb"),
        runtime=res("featurise", "runtime"),
    # Many short jobs when sharded: a cluster profile may run several to a job (profiles/slurm:
    # group-components), one sbatch call and one Snakemake start-up for all of them.
    group: "shards" if config["featurise"]["shards"] > 1 else None
    shell:
        "{params.python:q} -m esol featurise --log {log:q} --params {params.cfg:q} --input {input.split:q}"
        " --shard {params.shard} --shards {params.shards} {params.stored}"
        " --output {output.features:q} --rejects {output.rejects:q}"


if config["featurise"]["shards"] > 1:

    rule gather_features:
        input:
            features=lambda w: feature_shards(w.split, "npz"),
            rejects=lambda w: feature_shards(w.split, "rejects.csv"),
        output:
            features="results/features/{split}.npz",
            rejects="results/features/{split}.rejects.csv",
        params:
            python=config["python"],
            cfg=section_json("featurise"),
            stored=STORED,
        log:
            "logs/featurise/{split}.log",
        benchmark:
            "logs/benchmarks/featurise/{split}.tsv"
        # Streams the shards into one file on the submit host: I/O only, not worth a job.
        localrule: True
        shell:
            "{params.python:q} -m esol gather-features --log {log:q} --params {params.cfg:q}"
            " --where results/split/{wildcards.split}.csv"
            " --features {input.features:q} --shard-rejects {input.rejects:q}"
            " --output {output.features:q} --rejects {output.rejects:q} {params.stored}"
