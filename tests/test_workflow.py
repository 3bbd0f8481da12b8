"""The whole workflow, run by Snakemake with the local profile on a small subset."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import REPO, SMALL_RUN, md5, run_snakemake

OUTPUTS = [
    "results/metrics.json",
    "results/model/model.pt",
    "results/model/live/metrics.json",
    "results/model/live/params.yaml",
    "results/model/live/plots/metrics/train_loss.tsv",
    "results/model/live/plots/metrics/valid_loss.tsv",
    "results/plots/parity.png",
    "results/predictions.csv",
    "results/features/train.npz",
    "results/features/train.rejects.csv",
]


def test_dry_run_lists_every_job(project) -> None:
    proc = run_snakemake(project, "-n", "--profile", "profiles/local")
    out = proc.stdout + proc.stderr
    for rule, count in [("split", 1), ("featurise", 3), ("train", 1), ("evaluate", 1), ("all", 1)]:
        assert any(line.split() == [rule, str(count)] for line in out.splitlines()), (rule, out[-2000:])


# Software comes from the project's environment (scripts/setup), not per-rule conda envs:
# the one lint the workflow accepts is the request for a conda environment or container.
CONDA_LINT = "* Specify a conda environment or container for each rule.:"


def test_lint_finds_nothing_but_the_conda_request(project) -> None:
    proc = run_snakemake(project, "--lint", check=False)
    out = proc.stdout + proc.stderr
    findings = {line.strip() for line in out.splitlines() if line.strip().startswith("* ")}
    assert findings <= {CONDA_LINT}, out[-3000:]
    assert "Lints for snakefile" not in out, out[-3000:]
    assert "Lints for rule train " in out  # the linter did run over the rules


@pytest.mark.slow
def test_local_profile_runs_whole_pipeline(project) -> None:
    proc = run_snakemake(project, "--profile", "profiles/local", *SMALL_RUN)
    for path in OUTPUTS:
        assert (project / path).is_file(), path
    metrics = json.loads((project / "results/metrics.json").read_text())
    assert set(metrics) == {"rmse", "mae", "r2", "n"}
    assert metrics["n"] > 0 and metrics["rmse"] > 0
    assert f"test RMSE {metrics['rmse']:.3f}" in proc.stdout + proc.stderr
    for rule in ("split", "train", "evaluate"):
        assert (project / f"logs/benchmarks/{rule}.tsv").is_file()
    assert "epoch 1 " in (project / "logs/train.log").read_text()
    # Up to date: a second dry run plans nothing.
    again = run_snakemake(project, "-n", "--profile", "profiles/local", *SMALL_RUN)
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.slow
def test_default_pipeline_reproduces_the_recorded_outputs_byte_for_byte(project) -> None:
    """The full default run against md5s recorded before the engine moved to snakemake 9.27 and
    numpy 2 (steps in .venv-esol since): an environment or workflow change that alters what the
    steps compute shows up here. Torch, RDKit and the data are pinned (requirements/esol.lock.txt).
    MKL's matrix products differ in the last bits between CPU generations, so the trained weights
    and predictions have one recorded md5 per CPU kind seen (the reference file names them)."""
    run_snakemake(project, "--profile", "profiles/local", "--config", "snakedvc={tracking: false}")
    lines = (REPO / "tests/reference/esol-default.md5").read_text().splitlines()
    recorded: dict[str, set[str]] = {}
    for line in lines:
        if line.strip() and not line.startswith("#"):
            digest, name = line.split()
            recorded.setdefault(name, set()).add(digest)
    found = {name: md5(project / name) for name in recorded}
    assert {name: digest for name, digest in found.items() if digest not in recorded[name]} == {}
    # The history CSV the train step wrote before dvclive did its logging, rebuilt from dvclive's
    # files as it was written (6 significant digits): the same numbers, bit for bit.
    curves = project / "results/model/live/plots/metrics"
    history = pd.read_csv(curves / "train_loss.tsv", sep="\t").rename(columns={"step": "epoch"})
    for name in ("valid_loss", "valid_rmse"):
        history[name] = pd.read_csv(curves / f"{name}.tsv", sep="\t")[name]
    rebuilt = project / "history.csv"
    history.to_csv(rebuilt, index=False, float_format="%.6g")
    # One per CPU kind, as the weights (tests/reference/esol-default.md5 says which is which).
    assert md5(rebuilt) in {"a61e8c9742f9b79b951cd0e8b43a5675", "2102995981213f5159ed7efb6b536fae"}


@pytest.mark.slow
def test_missing_input_file_is_named(project) -> None:
    proc = run_snakemake(
        project, "--profile", "profiles/local", "--config", "data={path: data/raw/absent.csv}", check=False
    )
    assert proc.returncode != 0
    assert "data/raw/absent.csv" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_failed_featurise_names_rule_and_log(project) -> None:
    raw = project / "data/raw/esol.csv"
    lines = raw.read_text().splitlines()
    # Corrupt 5% of the SMILES in the first 200 rows.
    for i in range(1, 200, 20):
        fields = lines[i].rsplit(",", 1)
        lines[i] = fields[0] + ",C1CC(bad"
    raw.write_text("\n".join(lines) + "\n")
    proc = run_snakemake(project, "--profile", "profiles/local", *SMALL_RUN, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error in rule featurise" in out
    assert "max_reject_fraction" in out  # show-failed-logs prints the log's error
    assert not (project / "results/features/train.npz").exists()


FEATURE_FILES = [
    f"results/features/{split}.{ext}" for split in ("train", "valid", "test") for ext in ("npz", "rejects.csv")
]


def feature_md5s(project) -> dict[str, str]:
    return {name: md5(project / name) for name in FEATURE_FILES}


def test_dry_run_with_shards_lists_one_featurise_job_per_shard_and_split(project) -> None:
    proc = run_snakemake(project, "-n", "--config", "featurise={shards: 4}")
    out = proc.stdout + proc.stderr
    for rule, count in [("featurise", 12), ("gather_features", 3)]:
        assert any(line.split() == [rule, str(count)] for line in out.splitlines()), (rule, out[-2000:])
    assert "results/features/shards/valid/3-of-4.npz" in out


@pytest.mark.slow
def test_feature_files_are_identical_for_1_3_and_8_shards(project) -> None:
    found = {}
    for shards in (1, 3, 8):
        run_snakemake(
            project, "--profile", "profiles/local", "--config", "data={limit: 400}",
            f"featurise={{shards: {shards}, chunk_size: 25}}", "--", *FEATURE_FILES,
        )  # fmt: skip
        found[shards] = feature_md5s(project)
        assert not list((project / "results/features/shards").rglob("*.npz"))  # temp shards removed
        for name in FEATURE_FILES:
            (project / name).unlink()
    assert found[1] == found[3] == found[8]
