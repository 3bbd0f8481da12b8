# snakedvc in one module: tracking (`dvc add` of finished outputs on the submit host) and sweeps.
#
#   module kit:
#       snakefile: snakedvc.module_path("kit")
#       config: config
#   use rule * from kit as kit_*
#
# The same rules as the two modules it includes, which a workflow may also use one at a time.


include: "tracking.smk"
include: "sweep.smk"
