rule train:
    input:
        train="results/features/train.npz",
        valid="results/features/valid.npz",
    output:
        model="results/model/model.pt",
        history="results/model/history.csv",
    params:
        cfg=section_json("train"),
    log:
        "logs/train.log",
    benchmark:
        "logs/benchmarks/train.tsv"
    threads: res("train", "threads")
    resources:
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        gpu=res("train", "gpu"),
    conda:
        "../../environment.yml"
    shell:
        "python -m snakedvc train --log {log:q} --params {params.cfg:q} --train {input.train:q}"
        " --valid {input.valid:q} --model {output.model:q} --history {output.history:q}"
