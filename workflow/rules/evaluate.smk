rule evaluate:
    input:
        model="results/model/model.pt",
        test="results/features/test.npz",
    output:
        metrics="results/metrics.json",
        predictions="results/predictions.csv",
        parity="results/plots/parity.png",
    params:
        python=config["python"],
    log:
        "logs/evaluate.log",
    benchmark:
        "logs/benchmarks/evaluate.tsv"
    threads: res("default", "threads")
    resources:
        mem_mb=res("default", "mem_mb"),
        runtime=res("default", "runtime"),
    shell:
        "{params.python:q} -m esol evaluate --log {log:q} --model {input.model:q} --test {input.test:q}"
        " --metrics {output.metrics:q} --predictions {output.predictions:q} --parity {output.parity:q}"

