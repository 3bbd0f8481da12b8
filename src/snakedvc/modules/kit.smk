# snakedvc in one line of a Snakefile, after `configfile:`:
#
#   include: snakedvc.module_path("kit")
#
# - the config validated (snakedvc.configure: the `snakedvc` key against the kit's schema, the
#   rest against the workflow's own, --config values typed) before any rule reads it;
# - tracking (`dvc add` of finished outputs on the submit host) and sweeps, as the rules
#   kit_track, kit_rung and kit_report;
# - before the first job, the experiment's configured metrics and files checked against the run's
#   DAG; at the end of a successful run, the run saved as a DVC experiment (a sweep: one per trial);
#   at the end of one that did not finish, a line that says no experiment was saved.
#   Snakemake keeps one `onstart`, `onsuccess` and `onerror`: a workflow's own replaces the kit's,
#   and then calls snakedvc.start_run(config, workflow) / snakedvc.finish_run(config, workflow) itself.
#
# The two modules it uses, which a workflow may also use one at a time under names of its own.
import snakedvc


from snakedvc.errors import config_error_ends_run
from snakedvc.engine.scheduler_exit import end_pending_scheduler_wakeups


try:
    snakedvc.configure(config, workflow)
except snakedvc.ConfigError as error:  # the message alone: the kit's stack lines read as a crash
    config_error_ends_run(error)


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


onstart:
    try:
        snakedvc.start_run(config, workflow)
    except snakedvc.ConfigError as error:  # as above: the message alone
        config_error_ends_run(error)


onsuccess:
    snakedvc.finish_run(config, workflow)


# A run that did not finish (a job failed, a stop) ends with the kit's line too, as every run does.
onerror:
    from snakedvc.engine.finish import say as kit_say

    end_pending_scheduler_wakeups()

    kit_say(
        "no experiment saved: the run did not finish (a job failed, or the run was stopped: Snakemake's lines "
        "above name the job and its log); the outputs of jobs that finished are kept, and a stopped training's "
        "checkpoint: the same command again (after a fix, where a job failed) starts from them"
    )
