rule featurise:
    input:
        split="results/split/{split}.csv",
    output:
        features="results/features/{split}.npz",
        rejects="results/features/{split}.rejects.csv",
    params:
        cfg=section_json("featurise"),
    log:
        "logs/featurise/{split}.log",
    benchmark:
        "logs/benchmarks/featurise/{split}.tsv"
    threads: res("featurise", "threads")
    resources:
        mem_mb=res("featurise", "mem_mb"),
        runtime=res("featurise", "runtime"),
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc featurise --log {log:q} --params {params.cfg:q} --input {input.split:q}"
        " --output {output.features:q} --rejects {output.rejects:q}"
