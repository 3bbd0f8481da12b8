"""The end of a successful run: the run saved as a DVC experiment (a sweep: one per trial) and its
record kept for the report. Above tracking (one run's experiment) and the sweep's saving (each
trial's), which both use tracking."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from snakedvc.engine.config import KEY, ConfigError, typed_overrides
from snakedvc.engine.foreground import forward_sigterm_to_local_jobs
from snakedvc.engine.names import EXPERIMENT_NAME_ENV, EXPERIMENT_REPLACE_ENV, process_alive, release_name
from snakedvc.engine.records import dag_outputs, started_commit, within, write_record
from snakedvc.engine.scheduler_exit import end_pending_scheduler_wakeups
from snakedvc.engine.settings import Settings
from snakedvc.engine.sweep.save import save_trials
from snakedvc.engine.tracking import (
    SKIP_SAVE_ENV,
    TrackingError,
    is_dvc_repo,
    run_settings,
    save_experiment,
    write_effective_params,
)
from snakedvc.io import atomic_path

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
    end_pending_scheduler_wakeups()  # in onsuccess the scheduler is done: exit when the save is
    if os.environ.get(SKIP_SAVE_ENV) == "1":
        return []
    return _finish(
        config, run_settings(config), dag_outputs(workflow), typed_overrides(workflow), root, started_commit()
    )


def start_run(config: dict[str, Any], workflow: Any = None, root: Path | str = ".") -> None:
    """Start of a run that will execute jobs (the kit's ``onstart``): the experiment's configured
    metrics and files must be outputs of this run's DAG, or the run stops here, before any job,
    rather than train and then refuse the save (issue 50: a ``files:`` entry no rule writes). A
    SIGTERM to the run then reaches its local jobs too (snakedvc.engine.foreground)."""
    if workflow is None:
        return
    forward_sigterm_to_local_jobs(workflow, say)
    kit = run_settings(config)
    if kit.sweep.enabled:
        write_sweep_plan(config, root)
    if os.environ.get(SKIP_SAVE_ENV) == "1" or not will_save(kit, root):
        return
    if kit.sweep.enabled:  # each trial's experiment is checked as it is saved
        return
    own = dag_outputs(workflow)
    foreign = [name for name in (*kit.experiment.metrics, *kit.experiment.files) if not within(name, own)]
    if foreign:
        raise ConfigError(
            f"{KEY}.experiment: {', '.join(foreign)} (in metrics / files) is not an output of any job of this "
            "run, so its experiment could not be saved: name outputs of the rules the run's targets need "
            "(a folder a rule writes is a directory() output), or remove the entry. No job was started."
        )


def write_sweep_plan(config: dict[str, Any], root: Path | str = ".") -> Path:
    """The sweep's plan (each trial's params, the rungs, the metric) in its folder as the run starts:
    the live page shows the trials from it before the sweep's report exists."""
    from snakedvc.engine.sweep import plan as sweep_plan

    found = sweep_plan(config)
    target = Path(root) / found.root / "plan.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(found._describe(), indent=2, sort_keys=True, default=str) + "\n")
    return target


def will_save(kit: Settings, root: Path | str = ".") -> bool:
    """Whether a successful run saves an experiment: tracking on, in a DVC repository."""
    return kit.tracking and is_dvc_repo(root)


# A save that has not completed: written before it starts, removed when it ends. A save that
# failed (a full disk, a git lock, the controller killed) leaves it, with what the run produced,
# and the next run of the workflow (or `snakedvc resume`) does that save first: a rerun where
# nothing is left to do would otherwise never save it (Snakemake runs no onsuccess then).
PENDING_FILE = Path(".snakedvc") / "pending-save.json"


def _finish(
    config: dict[str, Any], kit: Settings, own: list[str], overrides: dict[str, Any], root: Path | str, baseline: str
) -> list[str]:
    sweep = kit.sweep.enabled
    record: dict[str, Any] = {"outcome": "done", "outputs": own, "sweep": None, "overrides": overrides}
    if sweep:
        from snakedvc.engine.sweep import plan as sweep_plan

        record["sweep"] = str(sweep_plan(config).report)
    if not kit.tracking:
        saved: list[str] = []
        say("run not recorded: tracking is off (snakedvc.tracking in the config)")
    elif not is_dvc_repo(root):
        saved = []
        say(
            f"run not recorded: {Path(root).resolve()} is in no DVC repository (no .dvc/ there or above): "
            "`dvc init` at the top of the git repository to record runs"
        )
    else:
        saved = _save(config, kit, own, overrides, root, baseline)
    params = kit.experiment.params
    if not sweep:
        write_effective_params(config, params, root)
    write_record(root, {**record, "experiments": saved, "params": params})
    if kit.experiment.name:
        release_name(kit.experiment.name, root)
    return saved


def _save(
    config: dict[str, Any], kit: Settings, own: list[str], overrides: dict[str, Any], root: Path | str, baseline: str
) -> list[str]:
    """The experiment(s), with a pending mark that outlives a failure (see PENDING_FILE)."""
    settings = kit.experiment  # a submitted run's name comes from its controller: kept
    kept = {**config, KEY: {**(config.get(KEY) or {}),
                            "experiment": {**((config.get(KEY) or {}).get("experiment") or {}),
                                           "name": settings.name, "replace": settings.replace}}}  # fmt: skip
    pending = Path(root) / PENDING_FILE
    pending.parent.mkdir(parents=True, exist_ok=True)
    # pid and host: a second run started meanwhile must not take a save still in progress for a failed one.
    left = {"config": kept, "outputs": own, "overrides": overrides, "baseline": baseline,
            "pid": os.getpid(), "host": socket.gethostname()}  # fmt: skip
    pending.write_text(json.dumps(left, default=str))
    sweep = kit.sweep.enabled
    try:
        saved = (
            save_trials(config, kit, root, baseline)
            if sweep
            else [save_experiment(config, own, settings, root=root, baseline=baseline)]
        )
    except TrackingError as error:
        if error.saved:  # saved; what failed came after (the push)
            pending.unlink(missing_ok=True)
            raise
        raise TrackingError(
            f"{error}\nNo experiment was saved, and none was half-saved; the run's results are kept. Once the "
            "cause is fixed, run the workflow again (not a dry run): its first step is this save."
        ) from None
    pending.unlink(missing_ok=True)
    if sweep and saved:
        say(f"saved {len(saved)} trial experiments: {', '.join(saved)} (see them: dvc exp show; snakedvc report)")
    elif sweep:
        say("no trial experiment saved: the sweep's report was not among this run's targets")
    else:
        say(f"saved experiment {saved[0]} (see it: dvc exp show; snakedvc report)")
    return saved


def pending_save(root: Path | str = ".") -> dict[str, Any] | None:
    """The save an earlier run left pending (PENDING_FILE): its config, outputs, overrides,
    baseline; None where there is none, or where the run that writes it is still saving."""
    pending = Path(root) / PENDING_FILE
    if not pending.is_file():
        return None
    try:
        left: dict[str, Any] = json.loads(pending.read_text())
    except ValueError:
        pending.unlink()
        return None
    saver = int(left.get("pid") or 0)
    if left.get("host") == socket.gethostname() and saver != os.getpid() and process_alive(saver):
        return None  # not pending: its run is saving it now
    return left


def describe_pending(left: dict[str, Any]) -> str:
    """One line: the pending save's experiment and the outputs it holds."""
    name = ((left.get("config") or {}).get(KEY) or {}).get("experiment", {}).get("name") or "(a name of DVC's)"
    outputs = left.get("outputs") or []
    shown = ", ".join(outputs[:5]) + (f" and {len(outputs) - 5} more" if len(outputs) > 5 else "")
    return f"experiment {name}, of the outputs {shown or 'none'}"


# How out of a pending save that cannot succeed: said wherever it blocks a run.
WAY_OUT = (
    "Fix the cause and run again (the pending save is its first step, with the experiment settings of the "
    "config as they are now), or give the save up with `snakedvc pending drop` (the run's outputs stay in "
    "the workspace; a run that makes them again records them). `snakedvc pending` shows it."
)


def drop_pending(root: Path | str = ".") -> dict[str, Any] | None:
    """`snakedvc pending drop`: the pending save given up; what it was (None: there was none)."""
    left = pending_save(root)
    (Path(root) / PENDING_FILE).unlink(missing_ok=True)
    return left


def save_pending(root: Path | str = ".", experiment: dict[str, Any] | None = None) -> list[str]:
    """Do the save an earlier run left pending (PENDING_FILE), before anything of this run; a
    ConfigError (this run stops before any job) where it fails again, saying the way out.
    ``experiment``: this run's `snakedvc.experiment` settings, in place of the failed run's (a
    mistake there, corrected in the config, is what made the save fail); its name is the one
    the earlier run was given."""
    left = pending_save(root)
    if left is None:
        return []
    say(f"an earlier run's experiment was not saved (its save failed): saving it first: {describe_pending(left)}")
    config = left["config"]
    if experiment is not None:
        kit = config.get(KEY) or {}
        earlier = kit.get("experiment") or {}
        named = {key: earlier[key] for key in ("name", "replace") if key in earlier}
        config = {**config, KEY: {**kit, "experiment": {**experiment, **named}}}
    environment = {
        key: os.environ.pop(key) for key in (EXPERIMENT_NAME_ENV, EXPERIMENT_REPLACE_ENV) if key in os.environ
    }
    try:
        kit = run_settings(config)  # the submitted run's name is its own, not this run's (popped above)
        return _finish(config, kit, left["outputs"], left.get("overrides") or {}, root, left.get("baseline", ""))
    except TrackingError as error:
        raise ConfigError(
            f"an earlier run's save is pending ({describe_pending(left)}) and failed again, so this run does not "
            f"start:\n{error}\n{WAY_OUT}"
        ) from None
    finally:
        os.environ.update(environment)
