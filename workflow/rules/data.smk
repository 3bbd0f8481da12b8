rule split:
    input:
        data=config["data"]["path"],
    output:
        train="results/split/train.csv",
        valid="results/split/valid.csv",
        test="results/split/test.csv",
    params:
        python=config["python"],
        cfg=section_json("data", "split"),
    log:
        "logs/split.log",
    benchmark:
        "logs/benchmarks/split.tsv"
    threads: res("default", "threads")
    resources:
        mem_mb=res("default", "mem_mb"),
        runtime=res("default", "runtime"),
    shell:
        "{params.python:q} -m esol split --log {log:q} --params {params.cfg:q} --input {input.data:q}"
        " --train {output.train:q} --valid {output.valid:q} --test {output.test:q}"
