"""ESOL with loading.stream: training reads the featurise shards (no gather of its splits), locally and
on the test cluster, and trains the very weights in-memory training does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import copy_project, md5, run_snakemake, slurm_jobs_by_rule

SMALL = ["data={limit: 200}", "train={max_epochs: 4, hidden_sizes: [32]}", "featurise={shards: 3}"]
STREAM = "loading={stream: true}"
NO_TRACKING = "snakedvc={tracking: false}"


@pytest.mark.slurm
def test_streamed_training_matches_in_memory_and_slurm_matches_local(slurm_cluster, tmp_path: Path) -> None:
    memory, local, slurm = (copy_project(tmp_path / name) for name in ("memory", "local", "slurm"))
    run_snakemake(memory, "--profile", "profiles/local", "--config", *SMALL, NO_TRACKING)
    run_snakemake(local, "--profile", "profiles/local", "--config", *SMALL, STREAM, NO_TRACKING)
    proc = run_snakemake(slurm, "--profile", "profiles/slurm", "--config", *SMALL, STREAM, NO_TRACKING)
    for project in (local, slurm):
        # The training and validation splits stay as their shards (stored, kept): only test is gathered.
        assert not (project / "results/features/train.npz").exists()
        assert sorted(p.name for p in (project / "results/features/shards/train").glob("*.npz")) == [
            "0-of-3.npz", "1-of-3.npz", "2-of-3.npz",
        ]  # fmt: skip
        assert (project / "results/features/test.npz").is_file()
        log = (project / "logs/train.log").read_text()
        assert "streaming 160 training rows from 3 shards and 20 validation rows from 3" in log
    # Streaming changes how rows reach training, not which: the same weights as in memory, bit for
    # bit, and the same on SLURM as locally.
    assert md5(local / "results/model/model.pt") == md5(memory / "results/model/model.pt")
    assert md5(slurm / "results/model/model.pt") == md5(local / "results/model/model.pt")
    metrics = [json.loads((p / "results/metrics.json").read_text()) for p in (memory, local, slurm)]
    assert abs(metrics[1]["rmse"] - metrics[0]["rmse"]) <= 0.02 and metrics[1] == metrics[2] == metrics[0]
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    assert len(jobs["train"]) == 1 and "gather_features" not in jobs  # gathering is a local rule
