"""snakedvc.live: dvclive's files written by rank 0, a resumed job's folder as a straight run's, and
progress read from outside while a training writes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from snakedvc.live import EpochLog, find_logs, read_progress
from tests.conftest import folder_files

EPOCHS = [(e, {"train_loss": 1.0 / e, "valid_accuracy": 0.5 + e / 100}) for e in range(1, 7)]


def write(folder: Path, rows, restore=(), final=None, params=None) -> EpochLog:
    log = EpochLog(folder, params=params)
    log.restore(restore)
    for epoch, metrics in rows:
        log.epoch(epoch, **metrics)
    log.finish(**(final or {}))
    return log


def test_epochs_land_in_dvclives_layout(tmp_path: Path) -> None:
    folder = tmp_path / "live"
    log = write(folder, EPOCHS, final={"test_accuracy": 0.9}, params={"lr": 0.003, "hidden": 64})
    assert log.rows == EPOCHS
    summary = json.loads((folder / "metrics.json").read_text())
    assert summary == {"step": 6, "train_loss": 1 / 6, "valid_accuracy": 0.56, "test_accuracy": 0.9}
    assert yaml.safe_load((folder / "params.yaml").read_text()) == {"lr": 0.003, "hidden": 64}
    tsv = (folder / "plots/metrics/train_loss.tsv").read_text().splitlines()
    assert tsv[0] == "step\ttrain_loss"
    assert [line.split("\t")[0] for line in tsv[1:]] == [str(e) for e, _ in EPOCHS]
    # The final metric is a summary value, not a curve.
    assert not (folder / "plots/metrics/test_accuracy.tsv").exists()
    assert read_progress(folder).epoch == 6


def test_a_resumed_log_equals_a_straight_one(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    write(straight, EPOCHS, final={"test_accuracy": 0.9})
    # A job stopped after epoch 4 whose checkpoint holds epochs 1..3: the retry starts a fresh
    # folder (what the killed job wrote after the checkpoint is gone), restores 1..3, trains 4..6.
    resumed = tmp_path / "resumed"
    write(resumed, EPOCHS[:4])
    log = write(resumed, EPOCHS[3:], restore=EPOCHS[:3], final={"test_accuracy": 0.9})
    assert log.rows == EPOCHS
    assert folder_files(resumed) == folder_files(straight)


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    log = EpochLog(tmp_path / "live", main=False)
    log.epoch(1, loss=0.5)
    log.finish(test=1.0)
    assert log.rows == [(1, {"loss": 0.5})]  # kept for the checkpoint all the same
    assert not (tmp_path / "live").exists()


def test_without_dvclive_the_error_names_the_folder_and_the_fix(tmp_path: Path) -> None:
    # A fresh interpreter in which dvclive cannot be imported (None in sys.modules blocks it).
    code = (
        "import sys; sys.modules['dvclive'] = None\n"
        "from snakedvc.live import EpochLog\n"
        f"EpochLog({str(tmp_path / 'live')!r}, main=False)\n"  # other ranks never import it
        f"EpochLog({str(tmp_path / 'live')!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert str(tmp_path / "live") in proc.stderr and "pip install 'snakedvc[live]'" in proc.stderr


def test_progress_is_read_while_epochs_are_written(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "live"
    assert read_progress(folder) is None
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            progress = read_progress(folder)
            if progress is not None:
                seen.append(progress.epoch)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        log = EpochLog(folder)
        for epoch in range(1, 41):
            log.epoch(epoch, loss=1.0 / epoch)
            time.sleep(0.01)
        log.finish()
    finally:
        done.set()
        thread.join()
    assert seen == sorted(seen), "progress went backwards"
    assert len(set(seen)) > 5 and seen[-1] == 40
    progress = read_progress(folder)
    assert progress.metrics == {"loss": 1 / 40}
    assert progress.describe(now=progress.updated + 3) == "epoch 40 loss 0.025 (3 s ago)"
    assert list(find_logs(tmp_path)) == [folder]


@pytest.mark.parametrize("broken", ["", "{", '{"loss": 1}', "[]"])
def test_a_folder_without_a_complete_summary_has_no_progress(tmp_path: Path, broken: str) -> None:
    (tmp_path / "metrics.json").write_text(broken)
    assert read_progress(tmp_path) is None
