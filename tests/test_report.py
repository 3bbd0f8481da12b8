"""`snakedvc report`: the HTML page of an ESOL run, of an ESOL sweep and of the digits example,
opened in a real headless Chromium: no console error, every image loaded, the DAG drawn, the
metrics in the page equal to the metrics files. Screenshots are left in each test's tmp_path
(report.png) for a person to look at."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.browser import CHROMIUM, PageView, keep_for_docs, open_page
from tests.conftest import SMALL_RUN, dvc_project, run_snakemake
from tests.test_digits import LOCAL, copy_example
from tests.test_sweep_workflow import SMALL_SWEEP, write_sweep

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM or not shutil.which("dot"), reason="needs chromium and graphviz: make test"),
]


def report(project: Path, *snakemake_args: str) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "snakedvc", "report", "--", *snakemake_args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = project / "results/report.html"
    assert f"report: {path}" in proc.stdout
    return path


def shown_metrics_match(view: PageView, project: Path, name: str) -> dict:
    values = json.loads((project / name).read_text())
    for key, value in values.items():
        if isinstance(value, float):
            assert float(view.metrics[f"{name}:{key}"]) == pytest.approx(value, rel=1e-5), key
        elif not isinstance(value, dict):
            assert view.metrics[f"{name}:{key}"] == str(value), key
    return values


def check_page(view: PageView, images: int) -> None:
    assert view.errors == []
    assert len(view.images) == images, view.images
    for image in view.images:
        assert image["complete"] and image["width"] > 100, image  # decoded, not a broken icon
    assert view.svgs >= 1  # the job DAG
    assert view.headings[:1] == ["Metrics"] and {"Job DAG", "Resources used", "Training curves"} <= set(view.headings)


def test_esol_run_report(tmp_path: Path) -> None:
    project = dvc_project(tmp_path / "repo", tmp_path / "remote")
    run_snakemake(project, "--profile", "profiles/local", *SMALL_RUN)
    view = open_page(report(project, *SMALL_RUN), tmp_path / "report.png")
    check_page(view, images=2)  # the dvclive curves, the parity plot
    assert {i["alt"] for i in view.images} == {"dvclive: results/model/live", "results/plots/parity.png"}
    metrics = shown_metrics_match(view, project, "results/metrics.json")
    assert "rmse" in metrics
    shown_metrics_match(view, project, "results/model/live/metrics.json")
    # Each rule's resources, from its benchmark file, and the DAG names the rules.
    for rule in ("split", "train", "evaluate"):
        assert f"\n{rule}\t" in view.text, view.text[-2000:]
    assert "train" in view.text and "featurise" in view.text
    keep_for_docs(tmp_path / "report.png", "report/run")


def test_esol_sweep_report(tmp_path: Path) -> None:
    project = dvc_project(tmp_path / "repo", tmp_path / "remote")
    sweep = write_sweep(project, SMALL_SWEEP)
    run_snakemake(project, "--profile", "profiles/local", "--configfile", sweep)
    view = open_page(report(project, "--configfile", sweep), tmp_path / "report.png")
    # The rungs, every trial's curves in one figure, the winner's parity plot on the test set.
    check_page(view, images=3)
    assert {i["alt"] for i in view.images} == {
        "Rungs: each trial's metric per rung",
        "Every trial's curves",
        "results/sweeps/small/final/parity.png",
    }
    summary = pd.read_csv(project / "results/sweeps/small/report/summary.csv")
    winner = str(summary.loc[summary["best"].astype(bool), "trial"].iloc[0])
    assert view.winner == winner and "Sweep small" in view.headings
    for trial in summary["trial"]:
        assert trial in view.text
    # The winner's test metrics, as the sweep's final evaluation wrote them.
    assert "rmse" in shown_metrics_match(view, project, "results/sweeps/small/final/metrics.json")
    keep_for_docs(tmp_path / "report.png", "report/sweep")


def test_digits_report_shows_the_confusion_matrix(tmp_path: Path) -> None:
    project = copy_example(tmp_path / "digits")
    run_snakemake(project, "--profile", LOCAL)
    view = open_page(report(project), tmp_path / "report.png")
    check_page(view, images=2)
    assert {i["alt"] for i in view.images} == {"dvclive: results/live", "results/confusion.png"}
    shown_metrics_match(view, project, "results/metrics.json")
    assert view.metrics["results/live/metrics.json:step"] == "20"


def test_a_sweep_that_is_not_the_last_run_is_reported_alone_and_absent_values_are_empty(tmp_path: Path) -> None:
    """`snakedvc report --sweep DIR` after a plain run showed the sweep under the plain run's header
    ("sweep: no"), and `nan` in the error column of trials that succeeded."""
    import json as json_

    from snakedvc.engine.records import write_record
    from snakedvc.engine.report import write_report

    root = tmp_path / "project"
    sweep = root / "results/sweeps/old/report"
    sweep.mkdir(parents=True)
    (sweep / "summary.csv").write_text(
        "trial,rung,valid_loss,best,status,error\nt000,1,0.5,True,ok,\nt001,0,,False,failed,diverged\n"
    )
    (sweep / "plan.json").write_text(json_.dumps({"name": "old", "metric": "valid_loss", "direction": "min"}))
    # No final evaluation rule: the winner's own files show (records.md promises its metrics; none showed).
    (sweep / "trials/t000").mkdir(parents=True)
    (sweep / "trials/t000/metrics.json").write_text('{"valid_loss": 0.5, "test_rmse": 0.9}')
    (sweep / "trials/t001").mkdir(parents=True)
    (sweep / "trials/t001/metrics.json").write_text('{"error": "diverged"}')
    (root / "results/metrics.json").write_text('{"accuracy": 0.75}')
    (root / "dvc.yaml").write_text("metrics: [results/metrics.json]\n")
    write_record(root, {"outcome": "done", "outputs": ["results/metrics.json"], "sweep": None, "experiments": ["plain"],
                        "params": "results/params.yaml"})  # fmt: skip
    page = write_report(root, "results/report.html", sweep_dir="results/sweeps/old/report").read_text()
    assert 'id="run"' not in page and "sweep: no" not in page and 'data-metric="results/metrics.json' not in page
    assert "The sweep results/sweeps/old/report alone: it is not the last run" in page and "plain" in page
    assert 'id="sweep"' in page and ">nan<" not in page
    assert 'data-metric="results/sweeps/old/report/trials/t000/metrics.json:test_rmse"' in page, page[:3000]
    assert "trials/t001/metrics.json" not in page
    # The plain run's own report is as before: its header and metrics, no sweep section.
    own = write_report(root, "results/report.html").read_text()
    assert 'id="run"' in own and 'data-metric="results/metrics.json:accuracy"' in own and 'id="sweep"' not in own


def test_a_run_that_failed_after_the_recorded_one_is_named_on_the_page(tmp_path: Path) -> None:
    """After a failed run, the page showed the older run's results with no word of the failure."""
    import os

    from snakedvc.engine.records import read_record, write_record
    from snakedvc.engine.report import write_report

    root = tmp_path / "project"
    (root / "results").mkdir(parents=True)
    (root / "results/metrics.json").write_text('{"accuracy": 0.75}')
    (root / "dvc.yaml").write_text("metrics: [results/metrics.json]\n")
    write_record(root, {"outcome": "done", "outputs": ["results/metrics.json"], "sweep": None, "experiments": ["plain"],
                        "params": "results/params.yaml"})  # fmt: skip
    finished = float(read_record(root)["finished"])
    logs = root / ".snakemake/log"
    logs.mkdir(parents=True)
    earlier = logs / "2026-01-01T000000.000000.snakemake.log"
    earlier.write_text("Error in rule train:\n    jobid: 1\n")  # a failure before the recorded run
    os.utime(earlier, (finished - 10, finished - 10))
    assert 'id="note"' not in write_report(root, "results/report.html").read_text()
    later = logs / "2026-01-02T000000.000000.snakemake.log"
    later.write_text("Error in rule train:\n    jobid: 1\nExiting because a job execution failed.\n")
    os.utime(later, (finished + 10, finished + 10))
    page = write_report(root, "results/report.html").read_text()
    assert "A later run did not finish (its Snakemake log: .snakemake/log/2026-01-02T000000" in page, page[:3000]
    assert 'data-metric="results/metrics.json:accuracy"' in page  # the recorded run's, as before
