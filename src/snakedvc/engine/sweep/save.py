"""The end of a sweep: every completed trial saved as its own DVC experiment."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from snakedvc.engine.config import KEY
from snakedvc.engine.settings import Settings
from snakedvc.engine.sweep.plan import plan
from snakedvc.engine.tracking import TrackingError, save_experiment
from snakedvc.io import atomic_path

log = logging.getLogger(__name__)


def save_trials(config: dict[str, Any], kit: Settings, root: Path | str = ".", baseline: str = "") -> list[str]:
    """Save every completed trial of a sweep as its own DVC experiment, `<sweep>-<trial>`.

    Each holds the trial's effective params (its config at the last rung it reached), its
    results in ``snakedvc.sweep.trial_metrics`` (the metric, rung, epochs, whether it won, and
    ``final_metrics`` for the winner) and the sweep report through its .dvc file. Nothing is
    saved before the report exists (a run that asked for other targets). The winner is saved
    last, so the workspace's params are the winner's afterwards. ``kit``: the run's settings
    (tracking.run_settings).
    """
    import pandas as pd

    sweep = plan(config)
    settings = sweep._settings
    base = Path(root)
    report = Path(sweep.report)
    if not (base / report / "summary.csv").is_file():
        log.info("sweep %s: no report yet (%s), no experiments saved", sweep.name, report)
        return []
    params_file = kit.experiment.params
    table = pd.read_csv(base / report / "summary.csv")
    done = table[table["status"] == "ok"].sort_values("best", kind="stable")
    final = _final_metrics(sweep, base)
    extra = [f"{report}.dvc", str(report.parent / ".gitignore")]
    trial_metrics = base / settings.trial_metrics
    saved = []
    for row in done.to_dict("records"):  # records: a metric's name need not be an identifier
        trial, rung = str(row["trial"]), int(row["rung"])
        # Every metric the trial wrote at the rung it reached, then the sweep's own figures.
        results: dict[str, Any] = {**_written(base / sweep._path(trial, rung, settings.metrics_file)),
                                   settings.metric: float(row[settings.metric]), "rung": rung,
                                   "epochs": int(row["epochs"]), "best": int(bool(row["best"]))}  # fmt: skip
        if row["best"] and final:
            results["final"] = final
        with atomic_path(trial_metrics) as tmp:
            tmp.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        params = {**sweep._trial_config(trial, rung), KEY: config.get(KEY) or {}}
        files = [params_file, settings.trial_metrics, *(f for f in extra if (base / f).is_file())]
        overrides = sweep._trial(trial).overrides
        saved.append(
            save_experiment(
                params,
                files,
                kit.experiment,
                name=f"{sweep.name}-{trial}",
                message=f"sweep {sweep.name} trial {trial}: {overrides}",
                root=root,
                files=files,
                baseline=baseline,
            )
        )
    trial_metrics.unlink(missing_ok=True)
    log.info("sweep %s: %d trial experiments saved", sweep.name, len(saved))
    return saved


def _final_metrics(sweep: Any, base: Path) -> dict[str, Any]:
    """The winner's final evaluation (snakedvc.sweep.final_metrics), where the sweep has one."""
    name = sweep._settings.final_metrics
    if not name:
        return {}
    path = base / sweep.root / name
    if not path.is_file():
        raise TrackingError(
            f"sweep {sweep.name}: snakedvc.sweep.final_metrics names {name}, which the run did not produce"
        )
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def _written(path: Path) -> dict[str, Any]:
    """The metrics a trial wrote (its metrics file, a JSON object), or none where it wrote no object."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
