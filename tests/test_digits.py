"""The digits example (examples/digits), run the way its user runs it: a copy of the folder,
Snakemake started there with the repository's shared profiles (absolute paths)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from snakedvc.engine.sweep.plan import schedule, total_epochs
from snakedvc.live import read_progress
from tests.conftest import (
    REPO,
    SNAKEMAKE,
    dvc,
    dvc_experiments,
    folder_files,
    git,
    md5,
    run_snakemake,
    slurm_jobs_by_rule,
    trainers_in,
)
from tests.test_slurm import wait_for_sacct
from tests.waiting import wait_until

EXAMPLE = REPO / "examples" / "digits"
LOCAL = str(REPO / "profiles" / "local")
SLURM = str(REPO / "profiles" / "slurm")
CONDA_LINT = "* Specify a conda environment or container for each rule.:"
# Small batches: an epoch of many steps, so a SIGTERM lands mid-epoch, seconds before the end.
LONG_RUN = ["--config", "train={epochs: 60, batch_size: 8}"]


def copy_example(dest: Path) -> Path:
    """The example's files alone, as a user starts a project from it (no outputs of a run in place)."""
    shutil.copytree(
        EXAMPLE, dest, ignore=shutil.ignore_patterns("results", "logs", ".snakemake", ".checkpoints", "__pycache__")
    )
    return dest


def dvc_example(dest: Path) -> Path:
    """The example as its own git + DVC repository, committed."""
    copy_example(dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "config", "user.email", "test@example.com")
    git(dest, "config", "user.name", "snakedvc tests")
    dvc(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "digits project")
    return dest


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One local run of the example in a DVC repository (shared by the local and the SLURM test)."""
    repo = dvc_example(tmp_path_factory.mktemp("digits") / "local")
    run_snakemake(repo, "--profile", LOCAL)
    return repo


def test_lint_finds_nothing_but_the_conda_request(tmp_path: Path) -> None:
    proc = run_snakemake(copy_example(tmp_path / "digits"), "--lint", check=False)
    out = proc.stdout + proc.stderr
    findings = {line.strip() for line in out.splitlines() if line.strip().startswith("* ")}
    assert findings <= {CONDA_LINT}, out[-3000:]
    assert "Lints for snakefile" not in out, out[-3000:]
    assert "Lints for rule fit " in out  # the linter did run over the rules


def test_local_run_is_recorded_as_a_dvc_experiment(local_run: Path) -> None:
    for path in ("results/data/digits.npz", "results/model.pt", "logs/fit.log", "logs/benchmarks/fit.tsv"):
        assert (local_run / path).is_file(), path
    metrics = json.loads((local_run / "results/metrics.json").read_text())
    assert 0.5 < metrics["valid_accuracy"] <= 1 and 0.5 < metrics["test_accuracy"] <= 1, metrics
    assert "epoch 20: train_loss" in (local_run / "logs/fit.log").read_text()
    # The outputs are in DVC, and the run is an experiment with its params (real types) and metrics.
    for path in ("results/data/digits.npz.dvc", "results/model.pt.dvc"):
        assert (local_run / path).is_file(), path
    (experiment,) = dvc_experiments(local_run).values()
    train = experiment["params"]["train"]
    assert train["epochs"] == 20 and type(train["epochs"]) is int
    assert train["lr"] == 0.003 and type(train["lr"]) is float
    assert type(train["hidden"]) is int and type(experiment["params"]["data"]["valid_fraction"]) is float
    assert "snakedvc" not in experiment["params"]
    assert experiment["metrics"]["valid_accuracy"] == pytest.approx(metrics["valid_accuracy"])
    assert experiment["metrics"]["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    # Per-epoch curves in dvclive's folder, its summary in the experiment beside the metrics file's.
    live = local_run / "results/live"
    assert yaml.safe_load((live / "params.yaml").read_text())["epochs"] == 20
    rows = pd.read_csv(live / "plots/metrics/train_loss.tsv", sep="\t")
    assert rows["step"].tolist() == list(range(1, 21))
    assert read_progress(live).epoch == 20
    ((_, live_metrics),) = dvc_experiments(local_run, "results/live/metrics.json").items()
    summary = live_metrics["metrics"]
    assert summary["step"] == 20 and summary["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert summary["valid_accuracy"] == pytest.approx(metrics["valid_accuracy"])
    # Up to date afterwards: a dry run plans nothing.
    again = run_snakemake(local_run, "-n", "--profile", LOCAL)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_dvc_plots_diff_renders_the_curves_of_two_experiments(local_run: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(local_run, repo, symlinks=True)  # its first experiment included
    run_snakemake(repo, "--profile", LOCAL, "--config", "train={epochs: 5, lr: 0.01}")
    names = sorted(dvc_experiments(repo))
    assert len(names) == 2, names
    out = tmp_path / "plots"
    dvc(repo, "plots", "diff", *names, "--out", str(out))
    html = (out / "index.html").read_text()
    for name in names:
        assert name in html
    # One curve per metric, each with both experiments' points: 20 epochs and 5.
    shown = json.loads(dvc(repo, "plots", "diff", *names, "--json").stdout)
    (curve,) = shown["data"]["results/live/plots/metrics/valid_accuracy.tsv"]
    assert sorted(curve["revisions"]) == names
    points = curve["content"]["data"]["values"]
    steps = {name: sorted(int(point["step"]) for point in points if point["rev"] == name) for name in names}
    assert sorted(map(len, steps.values())) == [5, 20], steps


@pytest.mark.slurm
def test_slurm_run_matches_local_and_fit_goes_to_the_gpu_partition(
    slurm_cluster: None, local_run: Path, tmp_path: Path
) -> None:
    project = copy_example(tmp_path / "slurm")
    proc = run_snakemake(project, "--profile", SLURM)
    for path in ("results/data/digits.npz", "results/model.pt", "results/metrics.json"):
        assert md5(project / path) == md5(local_run / path), f"{path} differs between local and SLURM"
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    assert {rule: len(ids) for rule, ids in jobs.items()} == {"prepare": 1, "fit": 1}, jobs
    # The rule is `fit`, not `train`: the profile routes it by the gpu resource it declares.
    fit = wait_for_sacct(jobs["fit"][0])
    assert fit["partition"] == "gpu" and "gres/gpu=1" in fit["tres"], fit
    assert fit["state"] == "COMPLETED", fit
    prepare = wait_for_sacct(jobs["prepare"][0])
    assert prepare["partition"] == "cpu" and "gres/gpu" not in prepare["tres"], prepare


@pytest.mark.slow
def test_sweep_halves_continues_and_records_every_trial(tmp_path: Path) -> None:
    repo = dvc_example(tmp_path / "repo")
    run_snakemake(repo, "--profile", LOCAL, "--configfile", "sweep.yaml")
    sweep = repo / "results/sweeps/digits"
    plan = json.loads((sweep / "report/plan.json").read_text())
    rungs = schedule(4, "successive_halving", 2, 2, 8)
    assert [(r.epochs, r.size) for r in rungs] == [(2, 4), (4, 2), (8, 1)]
    assert [(r["epochs"], r["size"]) for r in plan["rungs"]] == [(r.epochs, r.size) for r in rungs]
    assert plan["total_epochs"] == total_epochs(rungs) == 16

    # Each rung ranks its trials by validation accuracy (higher first) and promotes the best half.
    decisions = [json.loads((sweep / f"rungs/rung{r.index}.json").read_text()) for r in rungs]
    for rung, decision in zip(rungs, decisions, strict=True):
        results = decision["results"]
        assert len(results) == rung.size and all(r["status"] == "ok" for r in results.values())
        assert decision["ranking"] == sorted(results, key=lambda t: (-results[t]["metric"], t))
        keep = rungs[rung.index + 1].size if rung.index + 1 < len(rungs) else 1
        assert decision["survivors"] == decision["ranking"][:keep]
    for before, after in zip(decisions, decisions[1:], strict=False):
        assert sorted(after["results"]) == sorted(before["survivors"])

    # Survivors continue from their previous rung's final state: they train only the new epochs.
    for rung in rungs[1:]:
        previous = rungs[rung.index - 1].epochs
        for trial in decisions[rung.index]["results"]:
            log = (repo / f"logs/sweeps/digits/{trial}/rung{rung.index}/train.log").read_text()
            assert f"continuing from epoch {previous + 1}: the final state of an earlier run" in log
            assert f"trials/{trial}/rung{rung.index - 1}/state.pt" in log
            epochs = [int(e) for e in re.findall(r"snakedvc.torch.resume: epoch (\d+): train_loss", log)]
            assert epochs == list(range(previous + 1, rung.epochs + 1)), (trial, rung, epochs)

    # Every trial is a DVC experiment with its params and validation accuracy; the best is marked.
    best = decisions[-1]["ranking"][0]
    summary = pd.read_csv(sweep / "report/summary.csv").set_index("trial")
    assert summary["best"].sum() == 1 and bool(summary.loc[best, "best"])
    experiments = dvc_experiments(repo, "results/trial.json")
    assert sorted(experiments) == [f"digits-t{i:03d}" for i in range(4)]
    for trial in plan["trials"]:
        exp = experiments[f"digits-{trial['trial']}"]
        for key, value in trial["overrides"].items():
            field = key.split(".")[1]
            assert exp["params"]["train"][field] == value and type(exp["params"]["train"][field]) is type(value)
        assert exp["params"]["train"]["epochs"] == summary.loc[trial["trial"], "epochs"] == exp["metrics"]["epochs"]
        assert exp["metrics"]["valid_accuracy"] == pytest.approx(summary.loc[trial["trial"], "valid_accuracy"])
        assert exp["metrics"]["best"] == int(trial["trial"] == best)
        # Every metric the trial wrote, at the rung it reached (the others showed `!` in dvc exp show).
        rung = summary.loc[trial["trial"], "rung"]
        wrote = json.loads((sweep / f"trials/{trial['trial']}/rung{rung}/metrics.json").read_text())
        assert exp["metrics"]["test_accuracy"] == wrote["test_accuracy"]
    assert (sweep / "report.dvc").is_file()
    # A trial's dvclive folder holds all its epochs: those of earlier rungs came with the state it continued from.
    curve = pd.read_csv(sweep / f"trials/{best}/rung2/live/plots/metrics/valid_accuracy.tsv", sep="\t")
    assert curve["step"].tolist() == list(range(1, 9))
    assert curve["valid_accuracy"].iloc[-1] == pytest.approx(summary.loc[best, "valid_accuracy"])
    # The winner's model in the report is the one its last rung trained.
    assert md5(sweep / f"report/trials/{best}/model.pt") == md5(sweep / f"trials/{best}/rung2/model.pt")


def test_sigterm_checkpoints_exits_75_and_the_rerun_resumes_bit_identically(tmp_path: Path) -> None:
    # The reference run, watched from outside as it goes: dvclive's folder shows each epoch as it ends.
    reference = copy_example(tmp_path / "reference")
    running = subprocess.Popen(
        [*SNAKEMAKE, "--profile", LOCAL, *LONG_RUN], cwd=reference, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    seen: list[int] = []

    def watched_to_the_end() -> bool:
        ended = running.poll() is not None  # asked first: the last epoch is read after the end
        progress = read_progress(reference / "results/live")
        if progress is not None and (not seen or progress.epoch != seen[-1]):
            seen.append(progress.epoch)
        return ended

    wait_until(watched_to_the_end, "the reference run to end", timeout=600, poll=0.05)
    assert running.returncode == 0, running.stdout.read().decode()[-3000:]
    assert seen == sorted(seen) and len(seen) >= 5 and seen[-1] == 60, seen

    project = copy_example(tmp_path / "project")
    snakemake = subprocess.Popen(
        [*SNAKEMAKE, "--profile", LOCAL, *LONG_RUN],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Signal the trainer as soon as its first periodic checkpoint exists: mid-run, seconds before its end.
        checkpoints = ".checkpoints/*/ckpt-*.pt"
        wait_until(lambda: list(project.glob(checkpoints)), f"a checkpoint ({checkpoints})", 120, 0.02, proc=snakemake)
        (pid,) = trainers_in(project, b"train.py")
        os.kill(pid, signal.SIGTERM)
        output, _ = snakemake.communicate(timeout=300)
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
    assert snakemake.returncode != 0
    assert "returned non-zero exit status 75" in output, output[-3000:]
    stopped = (project / "logs/fit.log").read_text()
    assert "received SIGTERM" in stopped, stopped[-2000:]
    assert not (project / "results/model.pt").exists()
    (checkpoint,) = re.findall(r"checkpoint \(SIGTERM\): (\S+)", stopped)
    assert (project / checkpoint).is_file()

    run_snakemake(project, "--profile", LOCAL, *LONG_RUN)
    resumed = (project / "logs/fit.log").read_text()
    assert f"(SIGTERM checkpoint {checkpoint})" in resumed and "resumed from epoch" in resumed, resumed[:2000]
    assert md5(project / "results/model.pt") == md5(reference / "results/model.pt")
    assert (project / "results/metrics.json").read_text() == (reference / "results/metrics.json").read_text()
    # dvclive's folder too: the epochs before the checkpoint came back from it, none twice.
    assert folder_files(project / "results/live") == folder_files(reference / "results/live")
    assert not list(project.glob(".checkpoints/*/*.pt"))  # removed once training finished


@pytest.mark.slow
def test_run_in_a_subfolder_of_a_dvc_repository_is_recorded_there(tmp_path: Path) -> None:
    """A clone of this repository, the example's README as written: `cd examples/digits && snakemake
    --profile ../../profiles/local`. It recorded nothing, silently (the kit looked for .dvc/ in the
    workflow's own folder); DVC and git find their root upward."""
    from tests.conftest import dvc_experiments, dvc_project

    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    digits = repo / "examples" / "digits"
    proc = run_snakemake(
        digits,
        "--profile",
        "../../profiles/local",
        "--config",
        "train={epochs: 2}",
        "snakedvc={experiment: {name: sub}}",
    )
    assert "snakedvc: saved experiment sub" in proc.stderr
    shown = dvc_experiments(repo, "examples/digits/results/metrics.json", "examples/digits/results/params.yaml")
    assert shown["sub"]["params"]["train"]["epochs"] == 2  # paths as DVC gives them, from the top
    ref = next(r for r in git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split() if r.endswith("/sub"))
    committed = git(repo, "ls-tree", "-r", "--name-only", ref).split()
    assert "examples/digits/results/model.pt.dvc" in committed and "examples/digits/results/metrics.json" in committed
    assert not [p for p in committed if p.endswith(".snakemake_timestamp") or p.startswith(".dvc/tmp")]
    # Restored from the repository's top or from the folder: the model's bytes come back.
    model = (digits / "results/model.pt").read_bytes()
    (digits / "results/model.pt").unlink()
    subprocess.run([sys.executable, "-m", "snakedvc", "restore", "sub"], cwd=digits, check=True)
    assert (digits / "results/model.pt").read_bytes() == model
