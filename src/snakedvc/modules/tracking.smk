# snakedvc tracking: `dvc add` of a finished output, as a rule of the workflow.
#
#   module dvc:
#       snakefile: snakedvc.module_path("tracking")
#       config: config
#   use rule * from dvc as dvc_*
#
# Targets come from snakedvc.tracked(config, rules.x.output, ...): `<path>.dvc` for each output.
# The rule is local (always the submit host, never a SLURM job) and runs only after the job
# that made <path> succeeded; every DVC command holds one lock, so concurrent ones never collide.


wildcard_constraints:
    tracked_path=r".+(?<!\.dvc)",


rule track:
    input:
        "{tracked_path}",
    output:
        "{tracked_path}.dvc",
    log:
        "logs/snakedvc/track/{tracked_path}.log",
    benchmark:
        "logs/snakedvc/benchmarks/track/{tracked_path}.tsv"
    localrule: True
    shell:
        "snakedvc track --log {log:q} {input:q}"
