"""Records that never lie: every experiment holds only what its own run wrote.

The digits example (a non-chemistry project on the kit) in its own git + DVC repository, run as a
user does one after another: a plain run A, a sweep, a plain run B with another learning rate. Each
run leaves its outputs in the workspace for the next one to find; no record may pick them up.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import dvc, git, run_snakemake
from tests.test_digits import LOCAL, dvc_example

pytestmark = pytest.mark.slow

METRICS_FILES = ("results/metrics.json", "results/live/metrics.json", "results/trial.json")


def shown_experiments(repo: Path, *options: str) -> dict[str, dict[str, Any]]:
    """name -> {'params': ..., 'metrics': {file: data or None}} for every experiment `dvc exp show` lists
    (``options``: e.g. -A, every commit's)."""
    found = {}
    for commit in json.loads(dvc(repo, "exp", "show", "--json", *options).stdout):
        for exp in commit.get("experiments") or []:
            data = exp["revs"][0]["data"]
            params = data["params"].get("results/params.yaml", {}).get("data")
            metrics = {name: (data["metrics"].get(name) or {}).get("data") for name in METRICS_FILES}
            name = exp.get("name") or exp["revs"][0]["name"]
            found[name] = {"name": name, "params": params, "metrics": metrics}
    return found


def written(repo: Path) -> dict[str, Any]:
    """The metrics files a run left, as DVC reads them (None where the run wrote none)."""
    return {name: json.loads((repo / name).read_text()) if (repo / name).is_file() else None for name in METRICS_FILES}


def report_metrics(repo: Path) -> tuple[dict[str, str], str]:
    """`snakedvc report`'s metric cells ('<file>:<key>' -> shown value) and the page."""
    subprocess.run(
        [sys.executable, "-m", "snakedvc", "report", "--out", "results/report.html"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    page = (repo / "results/report.html").read_text()
    cells = re.findall(r'data-metric="([^"]+)"[^>]*>([^<]*)<', page)
    return {html.unescape(key): value for key, value in cells}, page


def test_plain_run_sweep_plain_run_each_record_holds_its_own_results(tmp_path: Path) -> None:
    repo = dvc_example(tmp_path / "repo")

    run_snakemake(repo, "--profile", LOCAL, "--config", "train={epochs: 3}")
    run_a = written(repo)
    assert run_a["results/metrics.json"] and run_a["results/trial.json"] is None

    run_snakemake(repo, "--profile", LOCAL, "--configfile", "sweep.yaml")
    summary = pd.read_csv(repo / "results/sweeps/digits/report/summary.csv").set_index("trial")
    # The sweep's report: its own trials, none of plain run A's metrics beside the winner's params.
    shown, page = report_metrics(repo)
    assert not [key for key in shown if key.startswith(("results/metrics.json:", "results/live/metrics.json:"))], shown
    assert 'id="sweep"' in page and 'alt="results/live"' not in page  # nor A's curves

    run_snakemake(repo, "--profile", LOCAL, "--config", "train={epochs: 3, lr: 0.01}")
    run_b = written(repo)
    assert run_b["results/metrics.json"] != run_a["results/metrics.json"]

    experiments = shown_experiments(repo)
    trials = {name: exp for name, exp in experiments.items() if name.startswith("digits-t")}
    plain = [exp for name, exp in experiments.items() if name not in trials]
    assert len(trials) == 4 and len(plain) == 2, sorted(experiments)
    by_lr = {exp["params"]["train"]["lr"]: exp for exp in plain}
    assert sorted(by_lr) == [0.003, 0.01]
    # A plain run's record: its own metrics files, its own params, no sweep trial's file.
    for exp, run in ((by_lr[0.003], run_a), (by_lr[0.01], run_b)):
        assert exp["params"]["train"]["epochs"] == 3
        assert exp["metrics"] == run, exp
    # A trial's record: its params and trial.json, no plain run's metrics.
    for name, exp in trials.items():
        trial = name.removeprefix("digits-")
        assert exp["metrics"]["results/metrics.json"] is None, (name, exp)
        assert exp["metrics"]["results/live/metrics.json"] is None, (name, exp)
        result = exp["metrics"]["results/trial.json"]
        assert result["valid_accuracy"] == pytest.approx(summary.loc[trial, "valid_accuracy"])
        assert exp["params"]["train"]["epochs"] == summary.loc[trial, "epochs"] == result["epochs"]

    # B's report shows B's metrics only.
    shown, page = report_metrics(repo)
    assert 'id="sweep"' not in page  # the sweep is an earlier run
    # Its header says which run this is: B's experiment, the param its command line changed.
    header = dict(re.findall(r'data-run="([^"]+)">([^<]*)<', page))
    assert header["experiments"] == by_lr[0.01]["name"] and header["outcome"] == "done", header
    assert header["params changed on the command line"] == "train.epochs=3, train.lr=0.01", header
    assert shown and not [key for key in shown if key.startswith("results/trial.json:")], shown
    for key, value in shown.items():
        name, _, field = key.partition(":")
        expected = run_b[name]
        for part in field.split("."):
            expected = expected[part]
        assert value.strip() == f"{expected:.6g}" if isinstance(expected, float) else str(expected), (key, value)


def planned_jobs(text: str) -> list[str]:
    """Rule names of the jobs a Snakemake output plans or runs (its 'rule x:' / 'localrule x:' lines)."""
    return sorted(re.findall(r"^(?:local)?rule (\w+):$", text, re.MULTILINE))


def test_a_detached_run_after_local_runs_and_a_sweep_plans_what_the_repository_would(tmp_path: Path) -> None:
    from snakedvc.engine.runs import Run
    from snakedvc.engine.runs.state import training_progress
    from tests.test_runs import runs, snakedvc, submit, wait_until_ended

    repo = dvc_example(tmp_path / "repo")
    run_snakemake(repo, "--profile", LOCAL, "--config", "train={epochs: 3}")
    run_snakemake(repo, "--profile", LOCAL, "--configfile", "sweep.yaml")
    changed = ["--config", "train={epochs: 3, lr: 0.01}"]
    expected = planned_jobs(run_snakemake(repo, "-n", "--profile", LOCAL, *changed).stdout)
    assert "fit" in expected and "prepare" not in expected, expected

    run_id = submit(repo, "--name", "lr-high", "--profile", LOCAL, "--", *changed)
    ended = wait_until_ended(repo, run_id)
    log = snakedvc(repo, "logs", run_id).stdout
    assert ended["state"] == "done" and ended["experiments"] == ["lr-high"], log[-3000:]
    assert planned_jobs(log) == expected, log[-3000:]
    run = Run.load(repo / ".snakedvc/runs" / run_id)
    # The frozen code holds no earlier run's outputs; the workspace has them, linked.
    frozen = git(repo, "ls-tree", "-r", "--name-only", run.commit).split()
    assert not [path for path in frozen if path.startswith("results/") and not path.endswith(".gitignore")], frozen
    assert (run.workspace / "results/data/digits.npz").stat().st_nlink > 1
    # Only this run's training is shown as live, not the sweep's folders linked in.
    assert [str(p.directory.relative_to(run.workspace)) for p in training_progress(run)] == ["results/live"]
    (experiment,) = [exp for name, exp in shown_experiments(repo).items() if name == "lr-high"]
    assert experiment["params"]["train"]["lr"] == 0.01
    assert experiment["metrics"] == written(run.workspace)
    assert experiment["metrics"]["results/trial.json"] is None

    # The same config again: nothing to do, and the run says so instead of reporting a result.
    again = submit(repo, "--name", "same", "--profile", LOCAL, "--", "--config", "train={epochs: 3}")
    ended = wait_until_ended(repo, again)
    assert ended["state"] == "done" and ended["experiments"] == [], ended
    assert ended["note"].startswith("nothing to be done"), ended
    assert "nothing to be done" in snakedvc(repo, "runs").stdout

    # A failing step: `snakedvc runs` names it, its command and its log's last lines.
    train = repo / "train.py"
    train.write_text(
        train.read_text().replace("def main(", 'raise SystemExit("deliberate failure: bad input")\n\n\ndef main(', 1)
    )
    failing = submit(repo, "--name", "broken", "--profile", LOCAL, "--", *changed)
    ended = wait_until_ended(repo, failing)
    reason = ended["reason"]
    assert ended["state"] == "failed" and reason["step"] == "rule fit", ended
    assert "python train.py" in reason["command"] and reason["log"] == "logs/fit.log", reason
    assert "deliberate failure: bad input" in "\n".join(reason["tail"]), reason
    listed = snakedvc(repo, "runs").stdout
    assert "failed in rule fit" in listed and "| deliberate failure: bad input" in listed, listed
    assert set(runs(repo)) == {run_id, again, failing}
