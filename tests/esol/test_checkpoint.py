"""ESOL's trainer on the resume helper: a run stopped anywhere and resumed ends bit-identical to an
uninterrupted one, on 1 process and under torchrun; the CLI exits 75 on SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from esol.config import FeaturiseConfig, SplitConfig, TrainConfig
from esol.data import read_molecules, split_molecules
from esol.features import FeatureSet, featurise_table, load_features, save_features
from esol.train import train_model
from snakedvc.torch import EXIT_CHECKPOINTED, Resumable, TrainingStopped
from snakedvc.torch.checkpoint import StopRequest, load_state, run_key
from tests.conftest import REPO, folder_files, venv_env
from tests.esol.configs import config_of, defaults
from tests.waiting import text_of, wait_until

CFG = config_of(
    TrainConfig, hidden_sizes=(64, 16), max_epochs=6, patience=100, batch_size=32, seed=3, checkpoint_every=1
)
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
    cfg = config_of(FeaturiseConfig, n_bits=256)
    return {
        name: featurise_table(part, cfg)[0] for name, part in split_molecules(table, config_of(SplitConfig)).items()
    }


def resumable(root: Path, stop: StopAfter | None = None, params: dict | None = None, **kwargs) -> Resumable:
    """A Resumable that leaves this process's signal handlers alone (``stop`` stands in for SIGTERM)."""
    return Resumable(params or {"run": "esol"}, root=root, stop=stop or StopRequest(signals=()), **kwargs)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    # With checkpoints every epoch: writing them changes nothing.
    return train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path_factory.mktemp("ref")))


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
    with pytest.raises(TrainingStopped) as stopped:
        train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path, StopAfter(kill_step)))
    epoch, step = kill_step // STEPS_PER_EPOCH + 1, kill_step % STEPS_PER_EPOCH
    assert stopped.value.checkpoint is not None and stopped.value.checkpoint.exists()
    assert stopped.value.checkpoint.name == f"ckpt-e{epoch:05d}-s{step:06d}.pt"
    with caplog.at_level(logging.INFO):
        resumed = train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path))
    assert f"resumed from epoch {epoch} step {step} (request checkpoint" in caplog.text
    assert_identical(uninterrupted, resumed)
    assert resumed.epochs_trained == CFG.max_epochs - epoch + 1


def test_kill_without_warning_resumes_from_last_periodic_checkpoint(data, uninterrupted, tmp_path: Path, caplog):
    with pytest.raises(TrainingStopped) as stopped:
        stop = StopAfter(3 * STEPS_PER_EPOCH + 4)
        train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path, stop, keep=5))
    assert stopped.value.checkpoint is not None
    stopped.value.checkpoint.unlink()  # SIGKILL gives no chance to write the stop checkpoint
    with caplog.at_level(logging.INFO):
        resumed = train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path, keep=5))
    assert "resumed from epoch 4 step 0 (periodic checkpoint" in caplog.text
    assert_identical(uninterrupted, resumed)


def test_truncated_checkpoint_is_skipped_with_warning(data, uninterrupted, tmp_path: Path, caplog) -> None:
    with pytest.raises(TrainingStopped) as stopped:
        stop = StopAfter(2 * STEPS_PER_EPOCH + 2)
        train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path, stop, keep=5))
    newest = stopped.value.checkpoint
    assert newest is not None
    newest.write_bytes(newest.read_bytes()[:100])
    with caplog.at_level(logging.INFO):
        resumed = train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path, keep=5))
    assert f"skipping unreadable checkpoint {newest}" in caplog.text
    assert "resumed from epoch 3 step 0" in caplog.text
    assert_identical(uninterrupted, resumed)


def test_checkpoint_of_other_params_is_not_used(data, uninterrupted, tmp_path: Path, caplog) -> None:
    with pytest.raises(TrainingStopped) as stopped:
        train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path, StopAfter(10), {"run": "other"}))
    theirs = stopped.value.checkpoint
    assert theirs is not None
    mine = resumable(tmp_path)
    assert mine.store is not None and mine.store.dir != theirs.parent
    mine.store.dir.mkdir(parents=True)
    foreign = mine.store.dir / theirs.name
    foreign.write_bytes(theirs.read_bytes())
    with caplog.at_level(logging.INFO):
        result = train_model(data["train"], data["valid"], CFG, resume=mine)
    assert f"skipping checkpoint {foreign}: it belongs to other params" in caplog.text
    assert "resumed from" not in caplog.text
    assert_identical(uninterrupted, result)


def test_run_key_depends_on_config_and_inputs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x")
    b.write_bytes(b"y")
    assert run_key({"lr": 1}, [a]) == run_key({"lr": 1}, [a])
    assert run_key({"lr": 1}, [a]) != run_key({"lr": 2}, [a])
    assert run_key({"lr": 1}, [a]) != run_key({"lr": 1}, [b])


def test_old_checkpoints_are_pruned(data, tmp_path: Path) -> None:
    resume = resumable(tmp_path, keep=2, keep_checkpoints=True)
    train_model(data["train"], data["valid"], CFG, resume=resume)
    assert resume.store is not None
    # One per epoch but the last (epochs 1..5, each naming the next epoch to run): the newest two stay.
    assert [p.name for p in resume.store.candidates()] == ["ckpt-e00006-s000000.pt", "ckpt-e00005-s000000.pt"]


def test_finish_writes_the_final_state_and_removes_the_checkpoints(data, uninterrupted, tmp_path: Path) -> None:
    resume = resumable(tmp_path / "ckpt", final_state=tmp_path / "state.pt")
    result = train_model(data["train"], data["valid"], CFG, resume=resume)
    assert resume.store is not None and not resume.store.dir.exists()
    state = load_state(tmp_path / "state.pt")
    assert (state["epoch"], state["step"], state["reason"]) == (CFG.max_epochs + 1, 0, "end of run")
    assert [row[0] for row in state["history"]] == list(range(1, CFG.max_epochs + 1))
    assert all(torch.equal(v, result.final_state["model"][k]) for k, v in state["model"].items())
    assert_identical(uninterrupted, result)


def test_initial_and_a_resumable_together_are_an_error(data, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="continue_from"):
        train_model(data["train"], data["valid"], CFG, resume=resumable(tmp_path), initial={"epoch": 1})


def save_split(data: dict[str, FeatureSet], root: Path) -> dict[str, Path]:
    paths = {}
    for name in ("train", "valid"):
        paths[name] = root / f"{name}.npz"
        save_features(data[name], paths[name], config_of(FeaturiseConfig, n_bits=256))
    return paths


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    wait_until(lambda: text in text_of(log), f"{text!r} in {log}", timeout, 0.05, lambda: text_of(log), proc)


def test_cli_exits_75_on_sigterm_and_its_rerun_resumes(data, tmp_path: Path) -> None:
    """One process, a real SIGTERM: the train step checkpoints and exits EXIT_CHECKPOINTED; a rerun finishes."""
    paths = save_split(data, tmp_path)
    params = {**defaults()["train"], "hidden_sizes": [64, 16], "max_epochs": 500, "patience": 1000, "batch_size": 32}
    params["seed"] = 3
    log, out = tmp_path / "train.log", tmp_path / "out"
    command = [
        sys.executable, "-m", "esol", "train", "--log", str(log), "--params", json.dumps(params),
        "--train", str(paths["train"]), "--valid", str(paths["valid"]), "--model", str(out / "model.pt"),
        "--live", str(out / "live"), "--checkpoint-dir", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=venv_env(), stdout=subprocess.PIPE)
    wait_for(log, "epoch 3 ", proc)
    proc.send_signal(signal.SIGTERM)
    stdout = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == EXIT_CHECKPOINTED, log.read_text()
    stopped = re.search(r"esol train: stopped on SIGTERM at epoch (\d+) step (\d+); checkpoint kept: (\S+);", stdout)
    assert stopped, stdout
    assert Path(stopped[3]).is_file() and not (out / "model.pt").exists()
    assert subprocess.run(command, env=venv_env(), timeout=600).returncode == 0
    assert f"resumed from epoch {stopped[1]} step {stopped[2]} (SIGTERM checkpoint {stopped[3]})" in log.read_text()
    assert not Path(stopped[3]).parent.exists()  # checkpoints removed after success
    cfg = TrainConfig(**{**params, "hidden_sizes": (64, 16)})
    straight = train_model(load_features(paths["train"]), load_features(paths["valid"]), cfg)
    resumed = torch.load(out / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(v, resumed[k]) for k, v in straight.model.state_dict().items())


@pytest.mark.slow
def test_sigterm_to_two_torchrun_processes_then_resume(data, tmp_path: Path) -> None:
    """Real signals: SIGTERM to torchrun mid-run; both ranks stop at one step; the rerun resumes exactly."""
    paths = save_split(data, tmp_path)
    params = {**defaults()["train"], "hidden_sizes": [64, 16], "max_epochs": 40, "patience": 100, "batch_size": 32}
    params["seed"] = 3
    env = venv_env()

    def command(out: Path) -> list[str]:
        return [
            sys.executable, "-m", "snakedvc", "launch", "--log", str(out / "train.log"), "--procs-per-node", "2",
            "--", "python", "-m", "esol", "train", "--params", json.dumps(params), "--train", str(paths["train"]), "--valid", str(paths["valid"]),
            "--model", str(out / "model.pt"), "--live", str(out / "live"),
            "--checkpoint-dir", str(out / "ckpt"),
        ]  # fmt: skip

    reference, interrupted = tmp_path / "ref", tmp_path / "int"
    reference.mkdir()
    interrupted.mkdir()
    subprocess.run(command(reference), env=env, check=True, timeout=600)
    proc = subprocess.Popen(command(interrupted), env=env, start_new_session=True)
    log = interrupted / "train.log"
    wait_for(log, "epoch 5 ", proc)
    os.killpg(proc.pid, signal.SIGTERM)  # what SLURM does to the job step
    assert proc.wait(timeout=120) != 0  # non-zero: Snakemake retries
    text = log.read_text()
    assert text.count("received SIGTERM") >= 2  # both ranks
    # Both ranks stopped (and took the exit-75 path) at the same step; rank 0 wrote that checkpoint.
    stops = re.findall(r"ERROR esol: stopped on SIGTERM at epoch (\d+) step (\d+); checkpoint kept: (\S+);", text)
    assert len(stops) == 2 and stops[0] == stops[1], text
    epoch, step, checkpoint = stops[0]
    assert f"checkpoint (SIGTERM): {checkpoint}" in text and Path(checkpoint).is_file()
    assert not (interrupted / "model.pt").exists()
    subprocess.run(command(interrupted), env=env, check=True, timeout=600)
    assert f"resumed from epoch {epoch} step {step} (SIGTERM checkpoint {checkpoint})" in log.read_text()
    ref = torch.load(reference / "model.pt", weights_only=True)["state_dict"]
    res = torch.load(interrupted / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(ref[k], res[k]) for k in ref)
    # dvclive's folder as a straight run's: the epochs before the checkpoint restored from it, none twice.
    assert folder_files(reference / "live") == folder_files(interrupted / "live")
    assert len((reference / "live/plots/metrics/valid_rmse.tsv").read_text().splitlines()) == 1 + 40
