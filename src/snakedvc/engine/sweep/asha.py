"""Asynchronous successive halving (ASHA): a trial is promoted the moment it earns it.

The rule is Determined's (``master/pkg/searcher/asha.go``). When a trial's result at rung k
arrives and the rung already holds n results, ``num_promote = (n + 1) // eta``:

- the new result is promoted at once if it ranks among the best ``num_promote`` of the rung;
- otherwise, if ``num_promote`` grew, the trial ranked ``num_promote`` (0-based, before this
  result) is promoted, unless it already was;
- at most one promotion per result; when there is none, the next trial starts while any are
  left, else the slot that reported stops.

A failed trial (its metrics file says ``error``, e.g. it diverged) counts as the worst result.
Should one be promoted all the same, it counts as failed at the next rung at once, which may
promote another there (Determined's early-exit recursion). Ties go to the earlier result.

Everything here is a pure function of the order in which results arrive: ``replay`` gives
every decision from a sequence of results. The workflow keeps that sequence, and the decisions
it took, in a decision log (``snakedvc.engine.sweep.decisions``), so a finished sweep can be
explained, checked and replayed; ``asha_steps`` is what the sweep module's rules run.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Result:
    """One trial-rung's outcome: its metric, or None where the trial failed."""

    trial: str
    rung: int
    metric: float | None


@dataclass(frozen=True)
class Action:
    """What the slot that reported does next: train ``trial`` to ``rung``, or stop."""

    train: bool
    trial: str | None = None
    rung: int | None = None
    why: str = ""
    # Failed trials promoted on the way, each counted as failed at the next rung (trial, rung).
    skipped: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": "train" if self.train else "stop",
            "trial": self.trial,
            "rung": self.rung,
            "why": self.why,
            "skipped": [list(s) for s in self.skipped],
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Action:
        return cls(
            values["action"] == "train",
            values.get("trial"),
            values.get("rung"),
            values.get("why", ""),
            tuple((str(t), int(r)) for t, r in values.get("skipped", [])),
        )

    def same_as(self, other: Action) -> bool:
        return (self.train, self.trial, self.rung, self.skipped) == (
            other.train,
            other.trial,
            other.rung,
            other.skipped,
        )


@dataclass
class _Entry:
    key: float  # the metric signed so that lower is better; +inf for a failed trial
    trial: str
    promoted: bool = False


@dataclass
class Asha:
    """ASHA's state: each rung's results (best first), the trials started, the slots' first trials."""

    trials: Sequence[str]  # in the order they start
    n_rungs: int
    eta: int
    slots: int
    direction: str = "min"
    _rungs: list[list[_Entry]] = field(default_factory=list, repr=False)
    _started: int = 0
    _seen: set[tuple[str, int]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.eta < 2 or self.n_rungs < 1 or self.slots < 1:
            raise ValueError(
                f"ASHA needs eta >= 2, rungs >= 1 and slots >= 1 (got {self.eta}, {self.n_rungs}, {self.slots})"
            )
        self._rungs = [[] for _ in range(self.n_rungs)]
        self._started = min(self.slots, len(self.trials))

    def first(self, slot: int) -> Action:
        """What a slot trains first: the slot-th trial at rung 0 (a slot beyond the trials stops)."""
        if slot < min(self.slots, len(self.trials)):
            return Action(True, self.trials[slot], 0, "first trials: one per slot")
        return Action(False, why="more slots than trials")

    def _key(self, metric: float | None) -> float:
        if metric is None or not math.isfinite(metric):
            return math.inf
        return metric if self.direction == "min" else -metric

    def report(self, result: Result) -> Action:
        """Take one result; what the slot that produced it does next."""
        trial, rung = result.trial, result.rung
        if (trial, rung) in self._seen:
            raise ValueError(f"trial {trial} already reported a result at rung {rung}")
        if not 0 <= rung < self.n_rungs:
            raise ValueError(f"trial {trial}: rung {rung} is not one of the sweep's {self.n_rungs} rungs")
        skipped: list[tuple[str, int]] = []
        promoted = self._take(trial, rung, result.metric, skipped)
        if promoted is not None:
            target, to_rung, why = promoted
            return Action(True, target, to_rung, why, tuple(skipped))
        if self._started < len(self.trials):
            self._started += 1
            return Action(True, self.trials[self._started - 1], 0, "nothing to promote: a new trial", tuple(skipped))
        return Action(False, why="nothing to promote and every trial has started", skipped=tuple(skipped))

    def _take(
        self, trial: str, rung: int, metric: float | None, skipped: list[tuple[str, int]]
    ) -> tuple[str, int, str] | None:
        """Insert a result in its rung; the (trial, rung, why) it promotes, if any."""
        self._seen.add((trial, rung))
        entries = self._rungs[rung]
        key = self._key(metric)
        before = len(entries)
        old_promote, num_promote = before // self.eta, (before + 1) // self.eta
        # bisect_right: after equal keys, so a tie goes to the earlier result.
        index = bisect.bisect_right([e.key for e in entries], key)
        top = rung == self.n_rungs - 1
        promote_now = not top and index < num_promote
        entries.insert(index, _Entry(key, trial, promote_now))
        if top:
            return None
        if promote_now:
            target = trial
            why = f"ranked {index + 1} of {before + 1} at rung {rung}: within the best {num_promote}"
        elif num_promote != old_promote and not entries[old_promote].promoted:
            entries[old_promote].promoted = True
            target = entries[old_promote].trial
            why = f"rung {rung} now holds {before + 1} results: the best {num_promote} go on, {target} ranked {old_promote + 1}"
        else:
            return None
        if math.isinf(next(e.key for e in entries if e.trial == target)):
            skipped.append((target, rung + 1))
            self._seen.add((target, rung + 1))
            return self._take(target, rung + 1, None, skipped)
        return target, rung + 1, why

    def standing(self, rung: int) -> list[list[Any]]:
        """A rung's results, best first: [trial, metric, promoted]."""
        sign = 1.0 if self.direction == "min" else -1.0
        return [[e.trial, None if math.isinf(e.key) else sign * e.key, e.promoted] for e in self._rungs[rung]]

    def winner(self) -> tuple[str, int] | None:
        """The best trial of the highest rung with a result that did not fail (ties: the earlier)."""
        for rung in reversed(range(self.n_rungs)):
            ok = [e for e in self._rungs[rung] if not math.isinf(e.key)]
            if ok:
                return ok[0].trial, rung
        return None

    @property
    def all_started(self) -> bool:
        return self._started >= len(self.trials)


def replay(trials: Sequence[str], n_rungs: int, eta: int, slots: int, direction: str,
           results: Sequence[Result]) -> tuple[Asha, list[Action]]:  # fmt: skip
    """Every decision from a sequence of results: what an uninterrupted sweep decides given that order."""
    asha = Asha(trials, n_rungs, eta, slots, direction)
    return asha, [asha.report(r) for r in results]
