"""`snakedvc sweep-explain`: an asha sweep's decision log, told in order and checked against the rule."""

from __future__ import annotations

from pathlib import Path

from snakedvc.engine.sweep.decisions import check, read_log, results_of


def _metric(value: float | None, status: str | None) -> str:
    return f"{value:.6g}" if status == "ok" and value is not None else "failed"


def explain(path: str | Path) -> tuple[str, list[str]]:
    """Every result and decision of the log as a line, the rungs' last standings and the winner;
    and where a decision differs from what the rule gives for the results in their order."""
    header, events = read_log(path)
    start = min((e["time"] for e in events if e["event"] != "plan"), default=0.0)
    trials, rungs = len(header.trials), ", ".join(str(r) for r in header.rungs)
    lines = [
        f"asha sweep: {trials} trials, rungs of {rungs} epochs, eta {header.eta}, {header.slots} slots, "
        f"{header.metric} ({header.direction} is best)"
    ]
    for event in events:
        at = f"{event['time'] - start:8.1f}s  slot {event.get('slot', '-')}"
        if event["event"] == "result":
            got = _metric(event.get("metric"), event.get("status"))
            lines.append(f"{at}  result #{event['seq'] + 1}: {event['trial']} at rung {event['rung']}: {got}")
        elif event["event"] == "decision":
            for trial, rung in event.get("skipped", []):
                lines.append(f"{at}  {trial} promoted to rung {rung} but had failed: counted as failed there")
            train = f"train {event['trial']} to rung {event['rung']}"
            what = train if event["action"] == "train" else "stop"
            lines.append(f"{at}  step {event['step']}: {what} ({event['why']})")
    machine = header.machine()
    for result in results_of(events):
        machine.report(result)
    for rung in range(len(header.rungs)):
        standing = machine.standing(rung)
        if standing:
            shown = ", ".join(f"{t} {_metric(m, 'ok')}{' ^' if p else ''}" for t, m, p in standing)
            lines.append(f"rung {rung} ({header.rungs[rung]} epochs), best first (^ promoted): {shown}")
    winner = machine.winner()
    lines.append(f"winner: {winner[0]} at rung {winner[1]}" if winner else "winner: none (every trial failed)")
    replayed = any(e["event"] == "plan" and e.get("replay_of") for e in events)
    problems = [] if replayed else check(header, events)
    lines.append(
        "decisions: "
        + ("; ".join(problems) if problems else "each one is what the rule gives for the results before it")
    )
    return "\n".join(lines), problems
