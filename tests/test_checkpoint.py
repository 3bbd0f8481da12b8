"""Kill-and-resume exactness: a run stopped anywhere and resumed ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from esol.config import FeaturiseConfig, SplitConfig, TrainConfig
from esol.data import read_molecules, split_molecules
from esol.features import FeatureSet, featurise_table, save_features
from esol.train import TrainingStopped, train_model
from snakedvc.torch.checkpoint import EXIT_CHECKPOINTED, CheckpointStore, run_key
from tests.conftest import REPO, venv_env

CFG = TrainConfig(hidden_sizes=(64, 16), max_epochs=6, patience=100, batch_size=32, seed=3, checkpoint_every=1)
STEPS_PER_EPOCH = 8  # 240 training molecules / batch 32, rounded up


class StopAfter:
    """Asks to stop once the trainer has polled ``steps`` times (a deterministic kill point)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.polls = 0

    @property
    def requested(self) -> bool:
        self.polls += 1
        return self.polls > self.steps


@pytest.fixture(scope="module")
def data() -> dict[str, FeatureSet]:
    table = read_molecules(REPO / "data/raw/esol.csv", "smiles", "measured log solubility in mols per litre", 300)
    cfg = FeaturiseConfig(n_bits=256)
    return {name: featurise_table(part, cfg)[0] for name, part in split_molecules(table, SplitConfig()).items()}


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    store = CheckpointStore(tmp_path_factory.mktemp("ref"), "ref")
    return train_model(data["train"], data["valid"], CFG, store=store)


def assert_identical(a, b) -> None:
    for name, tensor in a.model.state_dict().items():
        assert torch.equal(tensor, b.model.state_dict()[name]), name
    assert a.history.equals(b.history)
    assert a.best_epoch == b.best_epoch


@pytest.mark.parametrize(
    "kill_step",
    [3, 2 * STEPS_PER_EPOCH + 5, 5 * STEPS_PER_EPOCH + 6],
    ids=["during-epoch-1", "mid-run", "last-epoch"],
)
def test_stop_and_resume_is_bitwise_identical(data, uninterrupted, tmp_path: Path, kill_step: int, caplog) -> None:
    store = CheckpointStore(tmp_path, "run")
    with pytest.raises(TrainingStopped) as stopped:
        train_model(data["train"], data["valid"], CFG, store=store, stop=StopAfter(kill_step))
    assert stopped.value.checkpoint is not None and stopped.value.checkpoint.exists()
    with caplog.at_level(logging.INFO, logger="esol.train"):
        resumed = train_model(data["train"], data["valid"], CFG, store=store)
    assert f"resumed from epoch {kill_step // STEPS_PER_EPOCH + 1} step {kill_step % STEPS_PER_EPOCH}" in caplog.text
    assert_identical(uninterrupted, resumed)


def test_kill_without_warning_resumes_from_last_periodic_checkpoint(data, uninterrupted, tmp_path: Path, caplog):
    store = CheckpointStore(tmp_path, "run", keep=5)
    with pytest.raises(TrainingStopped):
        train_model(data["train"], data["valid"], CFG, store=store, stop=StopAfter(3 * STEPS_PER_EPOCH + 4))
    store.latest_path().unlink()  # SIGKILL gives no chance to write the stop checkpoint
    with caplog.at_level(logging.INFO, logger="esol.train"):
        resumed = train_model(data["train"], data["valid"], CFG, store=store)
    assert "resumed from epoch 4 step 0" in caplog.text
    assert_identical(uninterrupted, resumed)


def test_truncated_checkpoint_is_skipped_with_warning(data, uninterrupted, tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path, "run", keep=5)
    with pytest.raises(TrainingStopped):
        train_model(data["train"], data["valid"], CFG, store=store, stop=StopAfter(2 * STEPS_PER_EPOCH + 2))
    newest = store.latest_path()
    newest.write_bytes(newest.read_bytes()[:100])
    with caplog.at_level(logging.INFO):
        resumed = train_model(data["train"], data["valid"], CFG, store=store)
    assert f"skipping unreadable checkpoint {newest}" in caplog.text
    assert "resumed from epoch 3 step 0" in caplog.text
    assert_identical(uninterrupted, resumed)


def test_checkpoint_of_other_params_is_not_used(data, tmp_path: Path, caplog) -> None:
    other = CheckpointStore(tmp_path, "other-params")
    with pytest.raises(TrainingStopped):
        train_model(data["train"], data["valid"], CFG, store=other, stop=StopAfter(10))
    mine = CheckpointStore(tmp_path, "my-params")
    mine.dir.mkdir(parents=True)
    foreign = mine.dir / other.latest_path().name
    foreign.write_bytes(other.latest_path().read_bytes())
    with caplog.at_level(logging.INFO):
        train_model(data["train"], data["valid"], CFG, store=mine)
    assert f"skipping checkpoint {foreign}: it belongs to other params" in caplog.text
    assert "resumed from" not in caplog.text


def test_run_key_depends_on_config_and_inputs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x")
    b.write_bytes(b"y")
    assert run_key({"lr": 1}, [a]) == run_key({"lr": 1}, [a])
    assert run_key({"lr": 1}, [a]) != run_key({"lr": 2}, [a])
    assert run_key({"lr": 1}, [a]) != run_key({"lr": 1}, [b])


def test_old_checkpoints_are_pruned(data, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "run", keep=2)
    train_model(data["train"], data["valid"], CFG, store=store)
    assert len(store.candidates()) == 2


@pytest.mark.slow
def test_sigterm_to_two_torchrun_processes_then_resume(data, tmp_path: Path) -> None:
    """Real signals: SIGTERM to torchrun mid-run; both ranks stop at one step; the rerun resumes exactly."""
    paths = {}
    for name in ("train", "valid"):
        paths[name] = tmp_path / f"{name}.npz"
        save_features(data[name], paths[name], FeaturiseConfig(n_bits=256))
    params = {"hidden_sizes": [64, 16], "max_epochs": 40, "patience": 100, "batch_size": 32, "seed": 3}
    env = venv_env()

    def command(out: Path) -> list[str]:
        return [
            sys.executable, "-m", "snakedvc", "launch", "--log", str(out / "train.log"), "--procs-per-node", "2",
            "--", "python", "-m", "esol", "train", "--params", json.dumps(params), "--train", str(paths["train"]), "--valid", str(paths["valid"]),
            "--model", str(out / "model.pt"), "--history", str(out / "history.csv"),
            "--checkpoint-dir", str(out / "ckpt"),
        ]  # fmt: skip

    reference, interrupted = tmp_path / "ref", tmp_path / "int"
    reference.mkdir()
    interrupted.mkdir()
    subprocess.run(command(reference), env=env, check=True, timeout=600)
    proc = subprocess.Popen(command(interrupted), env=env, start_new_session=True)
    log = interrupted / "train.log"
    deadline = time.time() + 300
    while time.time() < deadline and "epoch 5 " not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # what SLURM does to the job step
    assert proc.wait(timeout=120) != 0
    text = log.read_text()
    assert text.count("received SIGTERM") >= 2  # both ranks
    assert "checkpoint (SIGTERM):" in text and not (interrupted / "model.pt").exists()
    subprocess.run(command(interrupted), env=env, check=True, timeout=600)
    assert "resumed from epoch" in log.read_text()
    ref = torch.load(reference / "model.pt", weights_only=True)["state_dict"]
    res = torch.load(interrupted / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(ref[k], res[k]) for k in ref)
    assert (reference / "history.csv").read_text() == (interrupted / "history.csv").read_text()
    assert EXIT_CHECKPOINTED == 75
