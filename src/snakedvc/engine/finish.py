"""The end of a successful run: the run saved as a DVC experiment (a sweep: one per trial) and its
record kept for the report. Above tracking (one run's experiment) and the sweep's saving (each
trial's), which both use tracking."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from snakedvc.engine.names import release_name
from snakedvc.engine.records import dag_outputs, write_record
from snakedvc.engine.settings import settings as kit_settings
from snakedvc.engine.sweep.save import save_trials
from snakedvc.engine.tracking import (
    SKIP_SAVE_ENV,
    TrackingError,
    experiment_settings,
    is_dvc_repo,
    save_experiment,
    write_effective_params,
)
from snakedvc.engine.workflow import typed_overrides

log = logging.getLogger(__name__)


def say(line: str) -> None:
    """A line the user sees at the end of a run (Snakemake shows no INFO logging of ours)."""
    print(f"snakedvc: {line}", file=sys.stderr, flush=True)


def finish_run(config: dict[str, Any], workflow: Any = None, root: Path | str = ".") -> list[str]:
    """End of a successful run: save it as a DVC experiment (a sweep: one per trial) built from the
    run's own outputs, and keep its record (.snakedvc/last-run.json) for the report.

    ``workflow``: Snakemake's, as the Snakefile sees it (``snakedvc.finish_run(config, workflow)``):
    its DAG says what this run produced. Saves only when tracking is on and this is a DVC
    repository. Returns the experiments' names.
    """
    if workflow is None:
        raise TrackingError(
            "snakedvc.finish_run needs the workflow to know what this run produced: "
            "call snakedvc.finish_run(config, workflow) in onsuccess"
        )
    if os.environ.get(SKIP_SAVE_ENV) == "1":
        return []
    own = dag_outputs(workflow)
    sweep = kit_settings(config).sweep.enabled
    record: dict[str, Any] = {"outcome": "done", "outputs": own, "sweep": None, "overrides": typed_overrides(workflow)}
    if sweep:
        from snakedvc.engine.sweep import plan as sweep_plan

        record["sweep"] = str(sweep_plan(config).report)
    if not kit_settings(config).tracking:
        saved: list[str] = []
        say("run not recorded: tracking is off (snakedvc.tracking in the config)")
    elif not is_dvc_repo(root):
        saved = []
        say(
            f"run not recorded: {Path(root).resolve()} is in no DVC repository (no .dvc/ there or above): `dvc init` at the top of the git repository to record runs"
        )
    else:
        saved = save_trials(config, root) if sweep else [save_experiment(config, own, root=root)]
        if sweep and saved:
            say(f"saved {len(saved)} trial experiments: {', '.join(saved)} (see them: dvc exp show; snakedvc report)")
        elif sweep:
            say("no trial experiment saved: the sweep's report was not among this run's targets")
        else:
            say(f"saved experiment {saved[0]} (see it: dvc exp show; snakedvc report)")
    params = experiment_settings(config).params
    if not sweep:
        write_effective_params(config, params, root)
    write_record(root, {**record, "experiments": saved, "params": params})
    if experiment_settings(config).name:
        release_name(experiment_settings(config).name, root)
    return saved
