"""ASHA's promotion rule against worked examples, and its decision log (snakedvc.engine.sweep.asha)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from snakedvc.cli import main as snakedvc_main
from snakedvc.engine.sweep.asha import Action, Asha, Result, replay
from snakedvc.engine.sweep.asha_steps import decide_step, finish
from snakedvc.engine.sweep.decisions import DecisionLogError, Header, check, read_log, results_of

TRIALS = [f"t{i}" for i in range(9)]


def train(trial: str, rung: int) -> tuple[bool, str | None, int | None]:
    return True, trial, rung


STOP = (False, None, None)


def plain(action: Action) -> tuple[bool, str | None, int | None]:
    return action.train, action.trial, action.rung


# Worked by hand from Determined's rule (eta 3, 3 rungs, 9 trials, 3 slots, lower is better).
# n: results already in the rung; promote = (n + 1) // 3; the new result goes on if it ranks
# within `promote`; else, if `promote` grew, the one ranked `promote` - 1 before it goes on.
WORKED = [
    # (trial, rung, metric), then what the slot that reported does next
    (("t1", 0, 0.5), train("t3", 0)),  # n=0: promote 0 -> a new trial
    (("t0", 0, 0.3), train("t4", 0)),  # n=1: promote 0
    (("t2", 0, 0.4), train("t0", 1)),  # n=2: promote 1; t2 ranks 2nd, so the best so far, t0, goes on
    (("t3", 0, 0.1), train("t3", 1)),  # n=3: promote 1, t3 ranks 1st: on at once (a 2nd promotion)
    (("t0", 1, 0.25), train("t5", 0)),  # rung 1, n=0: promote 0
    (("t4", 0, 0.6), train("t6", 0)),  # n=4: promote 1, unchanged
    (("t3", 1, 0.2), train("t7", 0)),  # rung 1, n=1: promote 0
    (("t5", 0, None), train("t8", 0)),  # failed, n=5: promote 2 > 1, but the 2nd (t0) already went on
    (("t6", 0, 0.35), STOP),  # n=6: promote 2, unchanged, t6 3rd; every trial has started
    (("t7", 0, 0.3), STOP),  # a tie with t0's 0.3: the earlier result ranks first, t7 is 3rd
    (("t8", 0, 0.05), train("t8", 1)),  # n=8: promote 3, t8 ranks 1st
    (("t8", 1, 0.15), train("t8", 2)),  # rung 1, n=2: promote 1, t8 ranks 1st
    (("t8", 2, 0.12), STOP),  # the last rung: nothing goes further
]


def test_worked_example_gives_each_decision_the_rule_gives() -> None:
    asha = Asha(TRIALS, n_rungs=3, eta=3, slots=3)
    assert [plain(asha.first(s)) for s in range(4)] == [train("t0", 0), train("t1", 0), train("t2", 0), STOP]
    for (trial, rung, metric), expected in WORKED:
        assert plain(asha.report(Result(trial, rung, metric))) == expected, (trial, rung, metric)
    assert asha.winner() == ("t8", 2)
    # Rung 0, best first, with who went on; the failed trial last.
    assert asha.standing(0) == [
        ["t8", 0.05, True], ["t3", 0.1, True], ["t0", 0.3, True], ["t7", 0.3, False], ["t6", 0.35, False],
        ["t2", 0.4, False], ["t1", 0.5, False], ["t4", 0.6, False], ["t5", None, False],
    ]  # fmt: skip


def test_a_trial_that_finishes_after_a_later_one_was_promoted_goes_on_when_the_rung_grows() -> None:
    asha = Asha(["t0", "t1", "t2", "t3"], n_rungs=2, eta=2, slots=2)
    assert plain(asha.report(Result("t1", 0, 0.5))) == train("t2", 0)
    assert plain(asha.report(Result("t2", 0, 0.1))) == train("t2", 1)  # started after t0, promoted first
    # t0 ranks 2nd of 3: promote = 3 // 2 = 1, already spent on t2: nothing, and a new trial.
    assert plain(asha.report(Result("t0", 0, 0.2))) == train("t3", 0)
    # The 4th result makes promote 2: t0, ranked 2nd, goes on now, though t3 is the one that reported.
    action = asha.report(Result("t3", 0, 0.3))
    assert plain(action) == train("t0", 1) and "t0 ranked 2" in action.why


def test_max_direction_ranks_higher_first() -> None:
    asha = Asha(["a", "b", "c"], n_rungs=2, eta=2, slots=2, direction="max")
    assert plain(asha.report(Result("a", 0, 0.9))) == train("c", 0)
    assert plain(asha.report(Result("b", 0, 0.95))) == train("b", 1)  # higher accuracy ranks first
    assert asha.standing(0) == [["b", 0.95, True], ["a", 0.9, False]]


def test_a_failed_trial_that_is_promoted_counts_as_failed_at_the_next_rung() -> None:
    # Every result at rung 0 fails: the rung's growth promotes the first failed trial, which
    # counts as failed at rung 1 at once (Determined's early exit), and a new trial starts.
    asha = Asha(["t0", "t1", "t2"], n_rungs=3, eta=2, slots=1)
    assert plain(asha.report(Result("t0", 0, None))) == train("t1", 0)
    action = asha.report(Result("t1", 0, float("nan")))  # a non-finite metric is a failure too
    assert plain(action) == train("t2", 0) and action.skipped == (("t0", 1),)
    assert asha.standing(1) == [["t0", None, False]]
    assert asha.winner() is None  # nothing has succeeded
    asha.report(Result("t2", 0, 0.4))
    assert asha.winner() == ("t2", 0)


def test_the_same_result_twice_or_an_unknown_rung_is_refused() -> None:
    asha = Asha(["t0", "t1"], n_rungs=2, eta=2, slots=1)
    asha.report(Result("t0", 0, 1.0))
    with pytest.raises(ValueError, match="already reported"):
        asha.report(Result("t0", 0, 1.0))
    with pytest.raises(ValueError, match="not one of the sweep's 2 rungs"):
        asha.report(Result("t1", 2, 1.0))


def test_replay_is_a_pure_function_of_the_order() -> None:
    results = [Result(t, r, m) for (t, r, m), _ in WORKED]
    _, first = replay(TRIALS, 3, 3, 3, "min", results)
    _, again = replay(TRIALS, 3, 3, 3, "min", results)
    assert [plain(a) for a in first] == [e for _, e in WORKED] == [plain(a) for a in again]
    # Another order of the same first results gives other decisions: the order is what a log keeps.
    swapped = [results[0], results[1], results[3], results[2]]
    _, other = replay(TRIALS, 3, 3, 3, "min", swapped)
    assert [plain(a) for a in other] == [train("t3", 0), train("t4", 0), train("t3", 1), train("t5", 0)]


# --- the decision log ----------------------------------------------------------------------------

HEADER = Header(tuple(TRIALS), (1, 3, 9), 3, 3, "loss", "min")


def write_trial(root: Path, trial: str, rung: int, metric: float | None) -> list[str]:
    folder = root / "trials" / trial / f"rung{rung}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"loss": metric} if metric is not None else {"error": "diverged"}))
    (folder / "state.pt").write_bytes(f"{trial}-{rung}".encode())
    return [str(folder / "metrics.json"), str(folder / "state.pt")]


def run_worked_example(root: Path) -> Path:
    """The worked example through decide_step, as the workflow's checkpoints take it."""
    log = root / "asha" / "decisions.jsonl"
    steps = {slot: 0 for slot in range(3)}
    slot_of = {}
    for slot in range(3):
        decision = decide_step(log, HEADER, slot, 0, [], root / f"slot{slot}-0.json")
        slot_of[(decision["trial"], 0)] = slot
    for (trial, rung, metric), expected in WORKED:
        slot = slot_of[(trial, rung)]
        steps[slot] += 1
        decision = decide_step(log, HEADER, slot, steps[slot], write_trial(root, trial, rung, metric),
                               root / f"slot{slot}-{steps[slot]}.json")  # fmt: skip
        assert (decision["action"] == "train", decision["trial"], decision["rung"]) == expected
        if decision["action"] == "train":
            slot_of[(decision["trial"], decision["rung"])] = slot
    return log


def test_the_log_holds_each_result_and_decision_in_order_and_explains_the_sweep(tmp_path: Path, capsys) -> None:
    log = run_worked_example(tmp_path)
    header, events = read_log(log)
    assert header == HEADER
    assert [(r.trial, r.rung, r.metric) for r in results_of(events)] == [w[0] for w in WORKED]
    assert check(header, events) == []
    decisions = [e for e in events if e["event"] == "decision" and e["step"] > 0]
    # What each decision saw: how many results, and its rung's standing then.
    third = decisions[2]
    assert third["after"] == ["t2", 0] and third["seen"] == 3
    assert third["standing"] == [["t0", 0.3, True], ["t2", 0.4, False], ["t1", 0.5, False]]
    failed = next(e for e in events if e["event"] == "result" and e["trial"] == "t5")
    assert failed["status"] == "failed" and failed["error"] == "diverged"
    assert all(len(e.get("state_md5", "")) == 32 for e in events if e["event"] == "result")

    summary = finish(log, HEADER, tmp_path / "summary.json")
    assert (summary["winner"], summary["winner_rung"]) == ("t8", 2)
    assert summary["trial_rungs"] == len(WORKED)
    # Epochs: 9 trials x 1 at rung 0, 3 (t0, t3, t8) x 2 more at rung 1, t8 x 6 more at rung 2.
    assert summary["epochs_trained"] == 9 * 1 + 3 * 2 + 1 * 6
    rung0 = summary["rungs"][0]
    assert rung0["survivors"] == ["t8", "t3", "t0"] and rung0["failed"] == ["t5"]
    assert rung0["ranking"][:4] == ["t8", "t3", "t0", "t7"]
    assert [row["slot"] for row in summary["timeline"] if row["trial"] == "t8"] == [2, 2, 2]

    assert snakedvc_main(["sweep-explain", str(log)]) == 0
    told = capsys.readouterr().out
    assert "result #8: t5 at rung 0: failed" in told
    assert "step 1: train t0 to rung 1 (rung 0 now holds 3 results: the best 1 go on, t0 ranked 1)" in told
    assert "winner: t8 at rung 2" in told and "each one is what the rule gives" in told


def test_an_edited_log_is_found_out(tmp_path: Path, capsys) -> None:
    log = run_worked_example(tmp_path)
    lines = log.read_text().splitlines()
    # Swap two results' order (their seq numbers): the decisions no longer follow from them.
    events = [json.loads(line) for line in lines]
    first, second = (e for e in events if e["event"] == "result" and e["seq"] in (0, 1))
    first["seq"], second["seq"] = 1, 0
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    problems = check(*read_log(log))
    assert problems and "after t0 at rung 0: logged train t4" in problems[0]
    with pytest.raises(SystemExit) as exited:
        snakedvc_main(["sweep-explain", str(log)])
    assert exited.value.code == 1
    assert "the rule gives" in capsys.readouterr().out
    with pytest.raises(DecisionLogError, match="disagrees with its own results"):
        finish(log, HEADER, tmp_path / "summary.json")


def test_a_decision_taken_again_is_the_one_in_the_log(tmp_path: Path) -> None:
    """A resumed controller reruns a step whose output it lost: nothing is recorded twice."""
    log = tmp_path / "decisions.jsonl"
    for slot in range(3):
        decide_step(log, HEADER, slot, 0, [], tmp_path / f"s{slot}.json")
    trained = write_trial(tmp_path, "t1", 0, 0.5)
    once = decide_step(log, HEADER, 1, 1, trained, tmp_path / "a.json")
    lines = log.read_text()
    twice = decide_step(log, HEADER, 1, 1, trained, tmp_path / "b.json")
    assert once == twice and log.read_text() == lines
    assert json.loads((tmp_path / "b.json").read_text()) == once
    # A line cut short by a crash is left out, and the decision it held is taken again, the same.
    log.write_text(lines.rsplit("\n", 2)[0] + "\n" + lines.rsplit("\n", 2)[1][:20])
    again = decide_step(log, HEADER, 1, 1, trained, tmp_path / "c.json")
    assert {k: again[k] for k in ("action", "trial", "rung")} == {k: once[k] for k in ("action", "trial", "rung")}


def test_a_log_of_another_plan_is_refused_naming_what_differs(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    decide_step(log, HEADER, 0, 0, [], tmp_path / "s.json")
    other = Header(HEADER.trials, HEADER.rungs, HEADER.eta, 4, HEADER.metric, HEADER.direction)
    with pytest.raises(DecisionLogError, match="another plan of this sweep .*differs in slots"):
        decide_step(log, other, 0, 0, [], tmp_path / "s.json")


def _decide_in_process(args: tuple[str, int, list[str]]) -> dict:
    log, slot, trained = args
    return decide_step(Path(log), HEADER, slot, 1, trained, Path(log).parent / f"out{slot}.json")


def test_slots_deciding_at_once_each_see_a_whole_log(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    for slot in range(3):
        decide_step(log, HEADER, slot, 0, [], tmp_path / f"s{slot}.json")
    jobs = [(str(log), slot, write_trial(tmp_path, f"t{slot}", 0, 0.1 * (slot + 1))) for slot in range(3)]
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        pool.map(_decide_in_process, jobs)
    header, events = read_log(log)
    assert sorted(e["seq"] for e in events if e["event"] == "result") == [0, 1, 2]
    assert check(header, events) == []  # whatever order the lock gave them, each decision follows it
    # Exactly one promotion (the third result makes promote 1) and two new trials.
    actions = sorted((e["trial"], e["rung"]) for e in events if e["event"] == "decision" and e["step"] == 1)
    assert [r for _, r in actions].count(1) == 1 and sorted(t for t, r in actions if r == 0) == ["t3", "t4"]


def test_a_replay_follows_the_log_and_stops_where_a_result_differs(tmp_path: Path) -> None:
    original = run_worked_example(tmp_path / "first")
    # The replay's slots report in another order, yet take the original's decisions.
    log = tmp_path / "replay" / "decisions.jsonl"
    for slot in range(3):
        decide_step(log, HEADER, slot, 0, [], tmp_path / f"s{slot}.json", replay_log=str(original))
    trained = write_trial(tmp_path / "second", "t0", 0, 0.3)
    decision = decide_step(log, HEADER, 0, 1, trained, tmp_path / "d.json", replay_log=str(original))
    # Alone, t0's result gives a new trial; the original's slot 0 went on with t4 after it.
    assert (decision["trial"], decision["rung"]) == ("t4", 0)
    assert read_log(log)[1][0]["replay_of"] == str(original)
    changed = write_trial(tmp_path / "second", "t1", 0, 0.51)
    with pytest.raises(DecisionLogError, match="replay diverged: t1 at rung 0 gave metric 0.51, 0.5 in"):
        decide_step(log, HEADER, 1, 1, changed, tmp_path / "e.json", replay_log=str(original))
