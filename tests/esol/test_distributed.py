"""One training code path for 1..N processes: DDP over gloo on CPU gives the 1-process weights."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from esol.config import FeaturiseConfig, SplitConfig
from esol.data import read_molecules, split_molecules
from esol.features import featurise_table, save_features
from snakedvc.torch.distributed import detect
from tests.conftest import REPO, venv_env
from tests.esol.configs import config_of, defaults

# Few epochs: float32 summation order differs between one GEMM over the global batch and
# two half-batch GEMMs plus an all-reduce (~1e-7 per step), and Adam carries it forward.
CONFIG = {
    **defaults()["train"],
    "hidden_sizes": [64, 16],
    "max_epochs": 3,
    "patience": 100,
    "batch_size": 50,
    "seed": 5,
}


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("features")
    table = read_molecules(REPO / "data/raw/esol.csv", "smiles", "measured log solubility in mols per litre", 333)
    cfg = config_of(FeaturiseConfig, n_bits=512)
    paths = {}
    for name, part in split_molecules(table, config_of(SplitConfig, seed=0)).items():
        paths[name] = root / f"{name}.npz"
        save_features(featurise_table(part, cfg)[0], paths[name], cfg)
    return paths


def train_args(features: dict[str, Path], out: Path) -> list[str]:
    return [
        "--params", json.dumps(CONFIG),
        "--train", str(features["train"]),
        "--valid", str(features["valid"]),
        "--model", str(out / "model.pt"),
        "--live", str(out / "live"),
    ]  # fmt: skip


def launch(features: dict[str, Path], out: Path, procs: int) -> str:
    log = out / "train.log"
    cmd = [sys.executable, "-m", "snakedvc", "launch", "--log", str(log), "--procs-per-node", str(procs), "--"]
    cmd += ["python", "-m", "esol", "train"]
    subprocess.run([*cmd, *train_args(features, out)], check=True, env=venv_env(), timeout=600)
    return log.read_text()


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def max_difference(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_detect_reads_torchrun_environment() -> None:
    ctx = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, cuda=False)
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.backend, ctx.is_main) == (3, 4, 1, "gloo", False)
    gpu = detect({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, cuda=True)
    assert gpu.backend == "nccl" and str(gpu.device) == "cuda:1" and gpu.is_main
    single = detect({}, cuda=False)
    assert single.world_size == 1 and single.backend is None and not single.distributed


@pytest.mark.slow
def test_two_processes_match_one_process(features, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    launch(features, one, 1)
    log = launch(features, two, 2)
    assert "rank 0 of 2" in log and "rank 1 of 2" in log
    assert max_difference(one / "model.pt", two / "model.pt") < 1e-5
    # dvclive's folder written by rank 0 alone: one row per epoch, the losses as one process's.
    h1 = pd.read_csv(one / "live/plots/metrics/valid_loss.tsv", sep="\t")
    h2 = pd.read_csv(two / "live/plots/metrics/valid_loss.tsv", sep="\t")
    assert h1["step"].tolist() == h2["step"].tolist() == list(range(1, CONFIG["max_epochs"] + 1))
    assert np.allclose(h1["valid_loss"], h2["valid_loss"], rtol=1e-4)


@pytest.mark.slow
def test_two_torchrun_agents_as_two_nodes(features, tmp_path: Path) -> None:
    one, nodes = tmp_path / "one", tmp_path / "nodes"
    one.mkdir()
    nodes.mkdir()
    launch(features, one, 1)
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={rank}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=snakedvc-test",
                "-m",
                "esol",
                "train",
                *train_args(features, nodes),
            ],
            env=venv_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [agent.communicate(timeout=600)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs
    joined = "\n".join(outputs)
    assert "rank 0 of 2" in joined and "rank 1 of 2" in joined
    assert max_difference(one / "model.pt", nodes / "model.pt") < 1e-5
