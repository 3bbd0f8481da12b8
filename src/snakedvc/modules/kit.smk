# snakedvc in one line of a Snakefile: tracking (`dvc add` of finished outputs on the submit host)
# and sweeps, as rules kit_track, kit_rung and kit_report.
#
#   include: snakedvc.module_path("kit")
#
# The two modules it uses, which a workflow may also use one at a time under names of its own.
import snakedvc


module snakedvc_tracking:
    snakefile:
        snakedvc.module_path("tracking")
    config:
        config


use rule * from snakedvc_tracking as kit_*


module snakedvc_sweep:
    snakefile:
        snakedvc.module_path("sweep")
    config:
        config


use rule * from snakedvc_sweep as kit_*
