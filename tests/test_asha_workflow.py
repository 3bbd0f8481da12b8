"""ASHA sweeps through the workflow (the digits example): one config line, trial-rung jobs decided as
results arrive, a lost controller resumed without rerunning or redeciding, a replay of the decision log."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from datetime import datetime
from itertools import accumulate
from pathlib import Path

import pandas as pd
import pytest
import yaml

from snakedvc.engine.sweep.decisions import check, read_log, results_of
from tests.conftest import accounted_jobs, dvc_experiments, md5, run_snakemake, slurm_jobs_by_rule, trainers_in
from tests.test_digits import LOCAL, SLURM, copy_example, dvc_example
from tests.test_runs import runs, snakedvc, submit, wait_until_ended
from tests.test_slurm import wait_for_sacct
from tests.waiting import wait_until

# 8 trials, eta 2, rungs of 1, 2 and 4 epochs, 2 slots.
EIGHT = {
    "snakedvc": {
        "sweep": {
            "enabled": True,
            "name": "d8",
            "method": "grid",
            "strategy": "asha",
            "min_epochs": 1,
            "reduction_factor": 2,
            "max_concurrent_trials": 2,
            "space": {"train.lr": [0.001, 0.003, 0.01, 0.03], "train.hidden": [16, 64]},
        }  # fmt: skip
    },
    "train": {"epochs": 4},
}


def trial_epochs(log: str) -> list[int]:
    return [int(e) for e in re.findall(r"snakedvc.torch.resume: epoch (\d+): train_loss", log)]


def finished_files(sweep: Path) -> dict[Path, tuple[int, str]]:
    """Each recorded trial-rung's metrics and state: mtime and md5 (a rerun would change both)."""
    _, events = read_log(sweep / "asha/decisions.jsonl")
    files = {}
    for result in results_of(events):
        for name in ("metrics.json", "state.pt"):
            path = sweep / f"trials/{result.trial}/rung{result.rung}/{name}"
            files[path] = (path.stat().st_mtime_ns, md5(path))
    return files


@pytest.mark.slow
def test_digits_sweep_runs_asha_by_changing_one_config_line(tmp_path: Path) -> None:
    repo = dvc_example(tmp_path / "repo")
    sweep_file = repo / "sweep.yaml"
    text = sweep_file.read_text()
    assert text.count("strategy: successive_halving") == 1
    sweep_file.write_text(text.replace("strategy: successive_halving", "strategy: asha"))
    run_snakemake(repo, "--profile", LOCAL, "--configfile", "sweep.yaml")
    sweep = repo / "results/sweeps/digits"

    # The decision log: every decision is what the rule gives for the results before it.
    header, events = read_log(sweep / "asha/decisions.jsonl")
    assert header.slots == 4 and header.rungs == (2, 4, 8) and header.eta == 2  # slots: eta^(rungs-1), <= trials
    assert check(header, events) == []
    explained = snakedvc(repo, "sweep-explain", "results/sweeps/digits/asha/decisions.jsonl").stdout
    assert "each one is what the rule gives" in explained
    results = results_of(events)
    assert len({(r.trial, r.rung) for r in results}) == len(results)  # no trial-rung twice
    summary = json.loads((sweep / "asha/summary.json").read_text())
    winner, reached = summary["winner"], summary["winner_rung"]
    top = [r for r in results if r.rung == reached]
    assert reached == 2 and winner == max(top, key=lambda r: r.metric).trial

    # Every trial-rung a job of the trial rule; a promoted one continued from its own previous state.
    epochs = (0, 2, 4, 8)
    for result in results:
        folder = sweep / f"trials/{result.trial}/rung{result.rung}"
        assert json.loads((folder / "metrics.json").read_text())["epochs"] == epochs[result.rung + 1]
        log = (repo / f"logs/sweeps/digits/{result.trial}/rung{result.rung}/train.log").read_text()
        assert trial_epochs(log) == list(range(epochs[result.rung] + 1, epochs[result.rung + 1] + 1))
        if result.rung:
            assert f"trials/{result.trial}/rung{result.rung - 1}/state.pt" in log
    assert summary["epochs_trained"] == sum(epochs[r.rung + 1] - epochs[r.rung] for r in results)

    # Each trial an experiment with the rung it reached; the winner marked; its params at that rung.
    table = pd.read_csv(sweep / "report/summary.csv").set_index("trial")
    experiments = dvc_experiments(repo, "results/trial.json")
    assert sorted(experiments) == [f"digits-t{i:03d}" for i in range(4)]
    for trial in table.index:
        furthest = max(r.rung for r in results if r.trial == trial)
        exp = experiments[f"digits-{trial}"]
        assert exp["metrics"]["rung"] == table.loc[trial, "rung"] == furthest
        assert exp["params"]["train"]["epochs"] == epochs[furthest + 1]
        assert exp["metrics"]["best"] == int(trial == winner)
    # The report: the promotion timeline and the decision log beside the summary.
    report = sweep / "report"
    assert (report / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert (report / "decisions.jsonl").read_text() == (sweep / "asha/decisions.jsonl").read_text()
    assert md5(report / f"trials/{winner}/model.pt") == md5(sweep / f"trials/{winner}/rung2/model.pt")
    # The run's page shows the timeline beside the rungs, and says what asha trained.
    snakedvc(repo, "report")
    page = (repo / "results/report.html").read_text()
    assert "Promotion timeline: which trial-rung ran in which slot when" in page
    assert f"asha on 4 slots: {summary['epochs_trained']} epochs trained in {len(results)} trial-rung jobs" in page
    timeline = summary["timeline"]
    assert sorted((row["trial"], row["rung"]) for row in timeline) == sorted((r.trial, r.rung) for r in results)
    assert all(row["end"] >= row["start"] for row in timeline) and {row["slot"] for row in timeline} <= set(range(4))


def controller_pid(repo: Path, run_id: str) -> int:
    return int(json.loads((repo / f".snakedvc/runs/{run_id}/run.json").read_text())["controller_pid"])


def complete_lines(path: Path) -> list[str]:
    lines = path.read_text().split("\n")
    return lines[:-1]  # what follows the last newline is a line being written, if anything


# The same, with 4 trials: the loss test runs it twice (lost and resumed, then replayed).
FOUR = json.loads(json.dumps(EIGHT))
FOUR["snakedvc"]["sweep"]["space"] = {"train.lr": [0.003, 0.03], "train.hidden": [16, 64]}


@pytest.mark.slow
def test_a_lost_controller_resumes_the_sweep_keeping_every_trial_rung_and_decision(tmp_path: Path) -> None:
    repo = dvc_example(tmp_path / "repo")
    (repo / "eight.yaml").write_text(yaml.safe_dump(FOUR))
    run_id = submit(repo, "--name", "asha-lost", "--profile", LOCAL, "--", "--configfile", "eight.yaml")
    workspace = repo / f".snakedvc/runs/{run_id}/workspace"
    sweep = workspace / "results/sweeps/d8"
    log = sweep / "asha/decisions.jsonl"

    def results_so_far() -> int:
        assert runs(repo)[run_id]["state"] in ("queued", "running"), snakedvc(repo, "logs", run_id).stdout[-3000:]
        return sum('"event": "result"' in line for line in complete_lines(log)) if log.is_file() else 0

    try:
        wait_until(lambda: results_so_far() >= 3, "3 results in the decision log", timeout=300, poll=0.2)
        first = controller_pid(repo, run_id)
        # The machine is lost: the controller, its Snakemake and the trial jobs die at once.
        os.killpg(first, signal.SIGKILL)
        for pid in trainers_in(workspace, b"train.py"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: runs(repo)[run_id]["state"] == "lost", "the run to show as lost", timeout=30, poll=0.5)
        before = complete_lines(log)
        finished = finished_files(sweep)
        assert len(finished) >= 6

        snakedvc(repo, "resume", run_id)
        ended = wait_until_ended(repo, run_id)
    finally:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError, KeyError):
            os.killpg(controller_pid(repo, run_id), signal.SIGKILL)
    assert ended["state"] == "done", snakedvc(repo, "logs", run_id).stdout[-3000:]

    # Every decision taken before the loss is kept, in its place; the log goes on from there.
    after = complete_lines(log)
    assert after[: len(before)] == before and len(after) > len(before)
    # No trial-rung that had finished ran again: its metrics and state are the very files it wrote.
    for path, (mtime, digest) in finished.items():
        assert (path.stat().st_mtime_ns, md5(path)) == (mtime, digest), path
    header, events = read_log(log)
    results = results_of(events)
    assert len({(r.trial, r.rung) for r in results}) == len(results)
    # What an uninterrupted run decides for the same order of results.
    assert check(header, events) == []
    experiments = dvc_experiments(repo, "results/trial.json")
    assert sorted(n for n in experiments if n.startswith("d8-")) == [f"d8-t{i:03d}" for i in range(4)]

    # An uninterrupted run that replays the log takes the same decisions, slot by slot and step by
    # step; its trial-rungs give the same metrics and states (checked as each arrives), and the same winner.
    replay = copy_example(tmp_path / "replay")
    replayed = json.loads(json.dumps(FOUR))
    replayed["snakedvc"]["sweep"]["replay"] = str(log)
    (replay / "eight.yaml").write_text(yaml.safe_dump(replayed))
    run_snakemake(replay, "--profile", LOCAL, "--configfile", "eight.yaml")
    again = replay / "results/sweeps/d8"
    _, replay_events = read_log(again / "asha/decisions.jsonl")

    def decisions(events: list[dict]) -> dict:
        return {
            (e["slot"], e["step"]): (e["action"], e["trial"], e["rung"]) for e in events if e["event"] == "decision"
        }

    assert decisions(replay_events) == decisions(events)
    assert {(r.trial, r.rung, r.metric) for r in results_of(replay_events)} == {
        (r.trial, r.rung, r.metric) for r in results
    }
    for result in results:
        for name in ("state.pt", "model.pt"):
            path = f"trials/{result.trial}/rung{result.rung}/{name}"
            assert md5(again / path) == md5(sweep / path), path
    winner = json.loads((sweep / "asha/summary.json").read_text())["winner"]
    assert json.loads((again / "asha/summary.json").read_text())["winner"] == winner


@pytest.mark.slurm
def test_asha_on_slurm_keeps_to_its_slots_and_decides_on_the_submit_host(slurm_cluster, tmp_path: Path) -> None:
    repo = dvc_example(tmp_path / "repo")
    sweep = yaml.safe_load((repo / "sweep.yaml").read_text())
    sweep["snakedvc"]["sweep"].update(strategy="asha", max_concurrent_trials=2)
    sweep["train"]["epochs"] = 4  # rungs of 2 and 4 epochs
    (repo / "asha.yaml").write_text(yaml.safe_dump(sweep))
    proc = run_snakemake(repo, "--profile", SLURM, "--configfile", "asha.yaml", timeout=900)
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    summary = json.loads((repo / "results/sweeps/digits/asha/summary.json").read_text())
    # Every trial-rung a SLURM job of the trial rule; decisions and DVC on the submit host.
    assert len(jobs["sweep_trial"]) == summary["trial_rungs"] >= 5
    assert set(jobs) == {"prepare", "sweep_trial"}
    rows = [wait_for_sacct(jobid) for jobid in jobs["sweep_trial"]]
    assert all(row["state"] == "COMPLETED" and row["partition"] == "gpu" for row in rows)
    # Both slots used: two trial jobs submitted and not yet finished at a time, as Snakemake saw
    # them. (Whether SLURM also ran both at once is its choice: a job of another session on the
    # shared test cluster can hold a GPU.) Never more than the 2 slots' trial jobs run at once.
    events = re.findall(
        r"submitted with SLURM jobid \d+ \(log: \S*/rule_sweep_trial/|Finished jobid: \d+ \(Rule: sweep_trial\)",
        proc.stdout + proc.stderr,
    )
    in_flight = max(accumulate(1 if event.startswith("submitted") else -1 for event in events))
    trials = [row for row in accounted_jobs(repo) if row["id"] in jobs["sweep_trial"]]
    assert len(trials) == len(jobs["sweep_trial"])
    at = datetime.fromisoformat
    running = max(sum(at(r["start"]) <= at(t["start"]) < at(r["end"]) for r in trials) for t in trials)
    assert in_flight == 2 and running <= 2, (events, trials)
    experiments = dvc_experiments(repo, "results/trial.json")
    assert len([n for n in experiments if n.startswith("digits-")]) == 4
    assert [n for n, e in experiments.items() if e["metrics"].get("best") == 1] == [f"digits-{summary['winner']}"]
