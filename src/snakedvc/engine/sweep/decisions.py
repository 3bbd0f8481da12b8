"""An asha sweep's decision log: a plan line, then results and decisions in the order they happened.

One JSON line per event, appended under a lock by the slots' decisions (each a local job of the
workflow's controller). Each decision is a pure function of the results before it (``check``
says where one is not); ``ReplayedLog`` is an earlier log that a replay follows.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snakedvc.engine.sweep.asha import Action, Asha, Result


class DecisionLogError(Exception):
    """The decision log does not belong to this sweep, or disagrees with itself or a replayed log."""


@dataclass(frozen=True)
class Header:
    """What a decision log was written for; a log for another plan is refused, not reused."""

    trials: tuple[str, ...]
    rungs: tuple[int, ...]  # each rung's epochs
    eta: int
    slots: int
    metric: str
    direction: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "trials": list(self.trials),
            "rungs": list(self.rungs),
            "eta": self.eta,
            "slots": self.slots,
            "metric": self.metric,
            "direction": self.direction,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Header:
        return cls(
            tuple(values["trials"]),
            tuple(values["rungs"]),
            int(values["eta"]),
            int(values["slots"]),
            str(values["metric"]),
            str(values["direction"]),
        )

    def machine(self) -> Asha:
        return Asha(self.trials, len(self.rungs), self.eta, self.slots, self.direction)


def _read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event of a log; a line cut short by a crash (the last) is left out."""
    events: list[dict[str, Any]] = []
    if not path.is_file():
        return events
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events


@dataclass
class DecisionLog:
    """The sweep's decision log: a plan line, then results and decisions in the order they happened.

    Many slots' decisions run at once (each a local job of the workflow's controller): every
    read-decide-append holds an exclusive lock on the log, and each event is one line written
    by one ``write``. A decision already in the log is never taken again: a controller that was
    lost and resumed keeps what its predecessor decided.
    """

    path: Path
    header: Header
    replay_of: str = ""  # the log a replay follows, named in the plan line

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                events = _read_events(self.path)
                self._check_header(events)
                yield events
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _check_header(self, events: list[dict[str, Any]]) -> None:
        plans = [e for e in events if e["event"] == "plan"]
        if not plans:
            plan = {"event": "plan", "time": time.time(), "replay_of": self.replay_of, **self.header.as_dict()}
            self._append([plan], events)
            return
        written = Header.from_dict(plans[0])
        if written != self.header:
            differs = [k for k, v in self.header.as_dict().items() if written.as_dict()[k] != v]
            raise DecisionLogError(
                f"{self.path} was written for another plan of this sweep (it differs in {', '.join(differs)}): "
                "give the sweep another name, or remove its folder to start it again"
            )

    def _append(self, new: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in new)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        events.extend(new)

    def step(self, slot: int, step: int, outcome: dict[str, Any] | None,
             replayed: ReplayedLog | None = None) -> dict[str, Any]:  # fmt: skip
        """The decision of one slot's step: step 0 its first trial; step k > 0 what follows the
        outcome of the trial-rung it trained at step k-1 (``trial``, ``rung``, ``status``,
        ``metric``, ...), which is recorded first unless the log already holds it."""
        with self._locked() as events:
            if outcome is not None and not find_event(events, "result", trial=outcome["trial"], rung=outcome["rung"]):
                seq = sum(e["event"] == "result" for e in events)
                event = {**outcome, "event": "result", "seq": seq, "slot": slot, "step": step - 1, "time": time.time()}
                if replayed is not None:
                    replayed.check_result(event)
                self._append([event], events)
            asha, action = self._decide(slot, outcome, events)
            if replayed is not None:
                action = replayed.decision(slot, step)
            done = find_event(events, "decision", slot=slot, step=step)
            if done:
                if not Action.from_dict(done).same_as(action):
                    raise DecisionLogError(
                        f"{self.path}: slot {slot} step {step} was decided as {done['action']} {done.get('trial')} "
                        f"but its results now give {action.as_dict()}; the log was edited or mixes two sweeps"
                    )
                return done
            decision = {"event": "decision", "slot": slot, "step": step, "time": time.time(), **action.as_dict()}
            if outcome is not None:
                decision["after"] = [outcome["trial"], outcome["rung"]]
                decision["seen"] = sum(e["event"] == "result" for e in events)
                decision["standing"] = asha.standing(int(outcome["rung"]))
            self._append([decision], events)
            return decision

    def _decide(self, slot: int, outcome: dict[str, Any] | None, events: list[dict[str, Any]]) -> tuple[Asha, Action]:
        """The rule's decision after ``outcome``, from the results up to it in the log's order."""
        asha = self.header.machine()
        if outcome is None:
            return asha, asha.first(slot)
        results = results_of(events)
        upto = next(i for i, r in enumerate(results) if (r.trial, r.rung) == (outcome["trial"], outcome["rung"]))
        actions = [asha.report(r) for r in results[: upto + 1]]
        return asha, actions[-1]


def find_event(events: list[dict[str, Any]], kind: str, **match: Any) -> dict[str, Any] | None:
    for event in events:
        if event["event"] == kind and all(event.get(k) == v for k, v in match.items()):
            return event
    return None


def results_of(events: list[dict[str, Any]]) -> list[Result]:
    """The results of a log in the order they arrived."""
    found = [e for e in events if e["event"] == "result"]
    return [Result(e["trial"], int(e["rung"]), None if e.get("status") == "failed" else e.get("metric"))
            for e in sorted(found, key=lambda e: e["seq"])]  # fmt: skip


def read_log(path: str | Path) -> tuple[Header, list[dict[str, Any]]]:
    """A decision log's plan and events; DecisionLogError where it is none."""
    events = _read_events(Path(path))
    plans = [e for e in events if e["event"] == "plan"]
    if not plans:
        raise DecisionLogError(f"{path}: not a sweep's decision log (no plan line)")
    return Header.from_dict(plans[0]), events


@dataclass
class ReplayedLog:
    """An earlier sweep's decision log that a replay follows: every slot's steps are decided as
    they were then, and every result must be what it was then (metric and state)."""

    path: Path
    events: list[dict[str, Any]]

    @classmethod
    def load(cls, path: str | Path, header: Header) -> ReplayedLog:
        written, events = read_log(path)
        if written != header:
            raise DecisionLogError(f"replay: {path} was written for another plan than this sweep's")
        return cls(Path(path), events)

    def decision(self, slot: int, step: int) -> Action:
        found = find_event(self.events, "decision", slot=slot, step=step)
        if found is None:
            raise DecisionLogError(f"replay: {self.path} has no decision for slot {slot} step {step}")
        return Action.from_dict(found)

    def check_result(self, result: dict[str, Any]) -> None:
        then = find_event(self.events, "result", trial=result["trial"], rung=result["rung"])
        if then is None:
            raise DecisionLogError(f"replay: {self.path} has no result of {result['trial']} at rung {result['rung']}")
        for key in ("status", "metric", "state_md5"):
            if then.get(key) != result.get(key):
                hint = (
                    " (the state a promotion continues from is not the same bytes: a training is replayable when "
                    "it seeds every generator its checkpoints keep: torch, Python's random, NumPy's global one)"
                    if key == "state_md5"
                    else ""
                )
                raise DecisionLogError(
                    f"replay diverged: {result['trial']} at rung {result['rung']} gave {key} {result.get(key)!r}, "
                    f"{then.get(key)!r} in {self.path}{hint}"
                )


def check(header: Header, events: list[dict[str, Any]]) -> list[str]:
    """Where a log's decisions differ from what its results, in their order, give (empty: none).
    A log written by a replay follows its original's decisions, so it is not checked this way."""
    asha = header.machine()
    problems = []
    for slot in range(header.slots):
        logged = find_event(events, "decision", slot=slot, step=0)
        if logged and not Action.from_dict(logged).same_as(asha.first(slot)):
            problems.append(f"slot {slot} step 0: logged {logged['trial']}, the rule gives {asha.first(slot).trial}")
    for event in sorted((e for e in events if e["event"] == "result"), key=lambda e: e["seq"]):
        metric = None if event.get("status") == "failed" else event.get("metric")
        action = asha.report(Result(event["trial"], int(event["rung"]), metric))
        logged = find_event(events, "decision", slot=event["slot"], step=event["step"] + 1)
        if logged and not Action.from_dict(logged).same_as(action):
            problems.append(
                f"after {event['trial']} at rung {event['rung']}: logged {logged['action']} {logged.get('trial')} "
                f"rung {logged.get('rung')}, the rule gives {action.as_dict()['action']} {action.trial} rung {action.rung}"
            )
    return problems
