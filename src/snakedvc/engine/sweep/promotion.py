"""Promotion: a trial's result from its metrics file, and a rung's ranking and survivors."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from snakedvc.io import atomic_path

log = logging.getLogger(__name__)


def read_trial_metrics(path: str | Path, metric: str) -> dict[str, Any]:
    """A trial's outcome from its metrics file: status ok with the metric, or failed with why."""
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        return {"status": "failed", "error": f"unreadable metrics file {path}: {error}"}
    if not isinstance(values, dict):
        return {"status": "failed", "error": f"{path}: expected a JSON object, got {type(values).__name__}"}
    if values.get("error"):
        return {"status": "failed", "error": str(values["error"]), "metrics": values}
    value = values.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return {"status": "failed", "error": f"{path}: metric {metric!r} is {value!r}, not a finite number"}
    return {"status": "ok", "metric": float(value), "metrics": values}


def promote(results: Mapping[str, Mapping[str, Any]], keep: int, direction: str) -> dict[str, Any]:
    """Rank a rung's trials by the metric (best first; ties by trial id); failed ones are excluded."""
    sign = 1.0 if direction == "min" else -1.0
    ok = sorted((sign * r["metric"], trial) for trial, r in results.items() if r.get("status") == "ok")
    ranking = [trial for _, trial in ok]
    failed = sorted(trial for trial, r in results.items() if r.get("status") != "ok")
    return {"ranking": ranking, "survivors": ranking[:keep], "failed": failed, "results": dict(results)}


def decide(metrics_files: Sequence[str], rung: int, keep: int, metric: str, direction: str, output: str) -> None:
    """The rung's decision file (the sweep module's checkpoint): ranking, survivors, failed trials."""
    # Each input is <sweep>/trials/<trial>/rung<r>/<metrics file>.
    results = {Path(m).parent.parent.name: read_trial_metrics(m, metric) for m in metrics_files}
    decision = {"rung": rung, "metric": metric, **promote(results, keep, direction)}
    with atomic_path(output) as tmp:
        tmp.write_text(json.dumps(decision, indent=2, sort_keys=True) + "\n")
    for trial in decision["failed"]:
        log.warning("rung %d: trial %s failed and is excluded: %s", rung, trial, results[trial].get("error"))
    log.info("rung %d ranking by %s (%s): %s; promoted %s", rung, metric, direction,
             decision["ranking"], decision["survivors"])  # fmt: skip
