rule train:
    input:
        train=split_features("train"),
        valid=split_features("valid"),
    output:
        model="results/model/model.pt",
        # dvclive's folder (snakedvc.live): every epoch's losses, readable while the job runs.
        live=directory("results/model/live"),
    log:
        "logs/train.log",
    benchmark:
        "logs/benchmarks/train.tsv"
    params:
        python=config["python"],
        cfg=section_json("train"),
        nodes=res("train", "nodes"),
        procs=res("train", "processes"),
        # A sweep trial's own arguments (rules/sweep.smk); none for the workflow's model.
        trial="",
        # config loading: stream the splits from their (shard) files, with DataLoader workers.
        stream="--stream" if STREAM else "",
        workers=config["loading"]["workers"],
        block_rows=config["loading"]["block_rows"],
    # One core per process on each node (torchrun's workers run one intra-op thread each by default).
    threads: max(res("train", "threads"), res("train", "processes"))
    resources:
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        # nodes, GPUs per node and tasks, spelled the way the SLURM plugin reads them for this layout
        **snakedvc.training_resources(res("train", "nodes"), res("train", "gpu")),
    # `exec`: the trainer must be Snakemake's direct child, so SLURM's SIGTERM reaches it and
    # Snakemake waits for its checkpoint; a bash in between would die on TERM first.
    shell:
        "exec {params.python:q} -m snakedvc launch --log {log:q} --nodes {params.nodes} --procs-per-node {params.procs}"
        " -- {params.python:q} -m esol train --params {params.cfg:q} --train {input.train:q} --valid {input.valid:q}"
        " --model {output.model:q} --live {output.live:q} {params.stream} --loader-workers {params.workers}"
        " --block-rows {params.block_rows}"
        " {params.trial}"
