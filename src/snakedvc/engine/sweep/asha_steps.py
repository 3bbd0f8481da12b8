"""What the sweep module's asha rules run: a slot's step (record a result, decide what is next) and
the sweep's end (winner, each rung, the timeline)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snakedvc.engine.sweep.decisions import (
    DecisionLog,
    DecisionLogError,
    Header,
    ReplayedLog,
    check,
    find_event,
    read_log,
    results_of,
)

log = logging.getLogger(__name__)


def _trial_rung(metrics_path: str | Path) -> tuple[str, int]:
    """(trial, rung) of a trial folder's file: <sweep>/trials/<trial>/rung<r>/<file>."""
    folder = Path(metrics_path).parent
    return folder.parent.name, int(folder.name.removeprefix("rung"))


def outcome_of(metrics_path: str | Path, state_path: str | Path | None, metric: str) -> dict[str, Any]:
    """What a finished trial-rung reports: its metric or why it failed, and its state's md5."""
    import hashlib

    from snakedvc.engine.sweep.promotion import read_trial_metrics

    trial, rung = _trial_rung(metrics_path)
    read = read_trial_metrics(metrics_path, metric)
    outcome: dict[str, Any] = {"trial": trial, "rung": rung, "status": read["status"], "metric": read.get("metric")}
    if read["status"] != "ok":
        outcome["error"] = read["error"]
    if state_path is not None and Path(state_path).is_file():
        outcome["state_md5"] = hashlib.md5(Path(state_path).read_bytes()).hexdigest()
    return outcome


def decide_step(log_path: str | Path, header: Header, slot: int, step: int, trained: Sequence[str],
                output: str | Path, replay_log: str = "") -> dict[str, Any]:  # fmt: skip
    """The `asha_step` checkpoint: record the result of what the slot trained at step-1 (``trained``:
    its metrics file, then its state), decide the slot's next trial-rung and write it to ``output``."""
    from snakedvc.io import atomic_path

    outcome = outcome_of(trained[0], trained[1] if len(trained) > 1 else None, header.metric) if trained else None
    replayed = ReplayedLog.load(replay_log, header) if replay_log else None
    decision = DecisionLog(Path(log_path), header, replay_log).step(slot, step, outcome, replayed)
    with atomic_path(output) as tmp:
        tmp.write_text(json.dumps(decision, indent=2, sort_keys=True) + "\n")
    _say(slot, step, outcome, decision)
    return decision


def _say(slot: int, step: int, outcome: dict[str, Any] | None, decision: dict[str, Any]) -> None:
    if outcome is not None:
        got = f"{outcome['metric']:.6g}" if outcome["status"] == "ok" else f"failed ({outcome.get('error')})"
        log.info("slot %d: %s at rung %d: %s", slot, outcome["trial"], outcome["rung"], got)
    for trial, rung in decision.get("skipped", []):
        log.warning("slot %d: %s was promoted to rung %d but had failed: counted as failed there", slot, trial, rung)
    if decision["action"] == "train":
        log.info("slot %d step %d: train %s to rung %d (%s)", slot, step, decision["trial"], decision["rung"],
                 decision["why"])  # fmt: skip
    else:
        log.info("slot %d step %d: stop (%s)", slot, step, decision["why"])


def timeline(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each trial-rung a slot trained: from the decision that gave it to the slot until its result."""
    start = min((e["time"] for e in events if e["event"] == "decision"), default=0.0)
    rows = []
    for decision in sorted((e for e in events if e["event"] == "decision"), key=lambda e: e["time"]):
        if decision["action"] != "train":
            continue
        result = find_event(events, "result", trial=decision["trial"], rung=decision["rung"])
        rows.append({
            "slot": decision["slot"], "step": decision["step"], "trial": decision["trial"], "rung": decision["rung"],
            "start": decision["time"] - start, "end": None if result is None else result["time"] - start,
            "status": None if result is None else result["status"], "metric": None if result is None else result["metric"],
        })  # fmt: skip
    return rows


def rung_decisions(header: Header, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rung as the synchronous strategy's decision files hold it (results, ranking, who went
    on, who failed), for the sweep's report; rungs no trial reached are left out."""
    asha = header.machine()
    for result in results_of(events):
        asha.report(result)
    decisions = []
    for rung in range(len(header.rungs)):
        results = {}
        for event in (e for e in events if e["event"] == "result" and e["rung"] == rung):
            results[event["trial"]] = {k: event[k] for k in ("status", "metric", "error") if k in event}
        if not results:
            break
        standing = asha.standing(rung)
        ranking = [t for t, metric, _ in standing if metric is not None and results.get(t, {}).get("status") == "ok"]
        decisions.append({
            "rung": rung, "metric": header.metric, "results": results, "ranking": ranking,
            "survivors": [t for t, _, promoted in standing if promoted],
            "failed": sorted(t for t, r in results.items() if r["status"] != "ok"),
        })  # fmt: skip
    return decisions


def finish(log_path: str | Path, header: Header, output: str | Path, replay_log: str = "") -> dict[str, Any]:
    """The `asha_end` checkpoint: the sweep's summary once every slot has stopped: the winner (the
    best of the highest rung reached), each rung's results, the timeline, the epochs trained."""
    from snakedvc.io import atomic_path

    written, events = read_log(log_path)
    if written != header:
        raise DecisionLogError(f"{log_path} was written for another plan of this sweep")
    unfinished = [slot for slot in range(header.slots) if not find_event(events, "decision", slot=slot, action="stop")]
    if unfinished:
        raise DecisionLogError(f"{log_path}: the sweep has not ended: slots {unfinished} have not stopped")
    if not replay_log and (problems := check(header, events)):
        raise DecisionLogError(f"{log_path} disagrees with its own results: " + "; ".join(problems))
    asha = header.machine()
    for result in results_of(events):
        asha.report(result)
    winner = asha.winner()
    epochs = (0, *header.rungs)
    trained = [(e["trial"], e["rung"]) for e in events if e["event"] == "result"]
    summary = {
        "strategy": "asha", "winner": winner[0] if winner else None, "winner_rung": winner[1] if winner else None,
        "rungs": rung_decisions(header, events), "timeline": timeline(events), "slots": header.slots,
        "trial_rungs": len(trained), "epochs_trained": sum(epochs[r + 1] - epochs[r] for _, r in trained),
        "replay_of": replay_log or None,
    }  # fmt: skip
    with atomic_path(output) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
