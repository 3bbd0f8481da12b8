# Featurisation, scattered: each split is cut into featurise.shards contiguous blocks of rows,
# each block its own job (a SLURM job through the profile); gather_features concatenates them in
# order. The gathered features are byte-identical for any number of shards.


rule featurise:
    input:
        split="results/split/{split}.csv",
    output:
        features=temp("results/features/shards/{split}/{shard}-of-{shards}.npz"),
        rejects=temp("results/features/shards/{split}/{shard}-of-{shards}.rejects.csv"),
    params:
        cfg=section_json("featurise"),
    log:
        "logs/featurise/{split}/{shard}-of-{shards}.log",
    benchmark:
        "logs/benchmarks/featurise/{split}/{shard}-of-{shards}.tsv"
    threads: res("featurise", "threads")
    resources:
        mem_mb=res("featurise", "mem_mb"),
        runtime=res("featurise", "runtime"),
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc featurise --log {log:q} --params {params.cfg:q} --input {input.split:q}"
        " --shard {wildcards.shard} --shards {wildcards.shards}"
        " --output {output.features:q} --rejects {output.rejects:q}"


rule gather_features:
    input:
        features=lambda w: feature_shards(w.split, "npz"),
        rejects=lambda w: feature_shards(w.split, "rejects.csv"),
    output:
        features="results/features/{split}.npz",
        rejects="results/features/{split}.rejects.csv",
    params:
        cfg=section_json("featurise"),
    log:
        "logs/featurise/{split}.log",
    benchmark:
        "logs/benchmarks/featurise/{split}.tsv"
    # Streams the shards into one file on the submit host: I/O only, not worth a job.
    localrule: True
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc gather-features --log {log:q} --params {params.cfg:q}"
        " --where results/split/{wildcards.split}.csv"
        " --features {input.features:q} --shard-rejects {input.rejects:q}"
        " --output {output.features:q} --rejects {output.rejects:q}"
