"""The report's training curves: a run's dvclive folders, declared as outputs or not (issue 50:
`Resumable(..., live="results/live")`, as the tutorial offers it, drew "Training curves (none)")."""

from __future__ import annotations

import json
import os
from pathlib import Path

from snakedvc.engine.report import _live_folders


def dvclive_folder(path: Path, written: float) -> Path:
    (path / "plots/metrics").mkdir(parents=True)
    (path / "plots/metrics/loss.tsv").write_text("step\tloss\n1\t0.5\n")
    (path / "metrics.json").write_text(json.dumps({"step": 1, "loss": 0.5}))
    os.utime(path / "metrics.json", (written, written))
    return path


def test_curves_written_beside_the_outputs_while_the_run_ran_are_the_runs(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results/model.pt").write_bytes(b"model")
    record = {"outputs": ["results/model.pt", "results/declared"], "started": 1000.0, "finished": 2000.0}
    declared = dvclive_folder(tmp_path / "results/declared", written=1500.0)  # a directory() output
    undeclared = dvclive_folder(tmp_path / "results/live", written=1500.0)  # live= alone, this run
    older = dvclive_folder(tmp_path / "results/old-live", written=500.0)  # an earlier run's
    elsewhere = dvclive_folder(tmp_path / "notes/live", written=1500.0)  # beside no output of the run
    found = _live_folders(tmp_path, record)
    assert found == {declared, undeclared}
    assert older not in found and elsewhere not in found
