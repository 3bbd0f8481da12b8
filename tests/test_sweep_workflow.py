"""Sweeps through the workflow: trials as jobs, successive halving decided at run time, DVC experiments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from snakedvc.engine.config import load_schema, validate_config
from snakedvc.engine.sweep.plan import schedule, total_epochs
from tests.conftest import SCHEMA, dvc, dvc_experiments, dvc_project, md5, run_snakemake, slurm_jobs_by_rule
from tests.test_slurm import wait_for_sacct

# 8 trials, eta 2: rungs of 1, 2, 4 epochs with 8, 4, 2 trials; 16 epochs in all (full grid: 32).
SMALL_SWEEP = {
    "data": {"limit": 200},
    "train": {"max_epochs": 4, "hidden_sizes": [32], "patience": 10},
    "snakedvc": {
        "sweep": {
            "enabled": True,
            "name": "small",
            "method": "grid",
            "space": {"train.lr": [0.001, 0.003], "train.batch_size": [32, 64], "train.dropout": [0.1, 0.3]},
            "strategy": "successive_halving",
            "min_epochs": 1,
            "reduction_factor": 2,
        }
    },
}


def write_sweep(project: Path, sweep: dict) -> str:
    (project / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return "sweep.yaml"


def sweep_experiments(repo: Path) -> dict[str, dict]:
    """name -> {'params': ..., 'trial': ...}: each trial's params and results/trial.json."""
    return {
        name: {"params": exp["params"], "trial": exp["metrics"]}
        for name, exp in dvc_experiments(repo, "results/trial.json").items()
    }


def epoch_lines(log: str) -> list[int]:
    return [int(e) for e in re.findall(r"esol.train: epoch (\d+) train_loss", log)]


def test_dry_run_shows_the_first_rung_trials_before_anything_runs(project: Path) -> None:
    assert (project / "sweeps/esol.yaml").is_file()  # the clone has the repository's sweeps
    proc = run_snakemake(project, "-n", "--configfile", "sweeps/esol.yaml")
    out = proc.stdout + proc.stderr
    trained = re.findall(r"rule sweep_trial:\n(?:.*\n)*?\s+output: results/sweeps/esol/trials/(t\d{3})/rung(\d+)/", out)
    assert sorted(trained) == [(f"t{i:03d}", "0") for i in range(8)]
    assert "checkpoint jobs" in out  # later rungs are decided at run time


def test_esol_sweep_turns_asha_with_one_line_and_its_dry_run_shows_each_slots_first_step(project: Path) -> None:
    text = (project / "sweeps/esol.yaml").read_text()
    assert text.count("strategy: successive_halving") == 1
    (project / "sweeps/esol.yaml").write_text(text.replace("strategy: successive_halving", "strategy: asha"))
    proc = run_snakemake(project, "-n", "--configfile", "sweeps/esol.yaml")
    out = proc.stdout + proc.stderr
    steps = re.findall(
        r"checkpoint sweep_asha_step:\n(?:.*\n)*?\s+output: results/sweeps/esol/asha/slot(\d+)/step0.json", out
    )
    # 8 trials, 4 rungs of eta 2: 2^3 = 8 slots, each deciding its first trial at run time.
    assert sorted(int(s) for s in steps) == list(range(8))
    assert "rule sweep_trial:" not in out


@pytest.mark.slow
def test_sweep_of_eight_trials_records_eight_experiments_and_halves_correctly(tmp_path: Path) -> None:
    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    name = write_sweep(repo, SMALL_SWEEP)
    run_snakemake(repo, "--profile", "profiles/local", "--configfile", name, "--cores", "2")
    sweep_dir = repo / "results/sweeps/small"
    # Building the report says how far it got: a plain line in its rule's log, no bar.
    report_log = (repo / "logs/sweeps/small/report.log").read_text()
    assert "sweep small report: done, 8/8 trials (100.0%)" in report_log and "\r" not in report_log

    # The schedule: the epochs trained add up to the formula, and survivors continued (never restarted).
    config = validate_config({k: v for k, v in SMALL_SWEEP.items() if k != "snakedvc"}, load_schema(SCHEMA))
    rungs = schedule(8, "successive_halving", 1, 2, 4)
    results = {p: json.loads(p.read_text()) for p in sweep_dir.glob("trials/*/rung*/metrics.json")}
    assert len(results) == sum(r.size for r in rungs) == 14
    assert sum(r["epochs_trained"] for r in results.values()) == total_epochs(rungs) == 16
    for rung in rungs[1:]:
        previous = rungs[rung.index - 1].epochs
        for path in sweep_dir.glob(f"trials/*/rung{rung.index}"):
            log = (repo / f"logs/sweeps/small/{path.parent.name}/rung{rung.index}/train.log").read_text()
            assert f"continuing from epoch {previous + 1}: the final state of an earlier run" in log
            assert f"trials/{path.parent.name}/rung{rung.index - 1}/state.pt" in log
            assert epoch_lines(log) == list(range(previous + 1, rung.epochs + 1))
            # dvclive's folder holds every epoch of the trial, earlier rungs' from the state it continued.
            curve = pd.read_csv(path / "live/plots/metrics/valid_rmse.tsv", sep="\t")
            assert curve["step"].tolist() == list(range(1, rung.epochs + 1))

    # Promotion by validation RMSE: each rung keeps the best half of the one before.
    decisions = [json.loads((sweep_dir / f"rungs/rung{r.index}.json").read_text()) for r in rungs]
    for rung, decision in zip(rungs, decisions, strict=True):
        ranked = sorted(decision["results"], key=lambda t: decision["results"][t]["metric"])
        assert all(
            decision["results"][t]["metric"]
            == pytest.approx(results[sweep_dir / f"trials/{t}/rung{rung.index}/metrics.json"]["valid_rmse"])
            for t in ranked
        )
        assert decision["ranking"] == ranked and len(ranked) == rung.size
    for before, after in zip(decisions, decisions[1:], strict=False):
        assert sorted(after["results"]) == sorted(before["survivors"])
    best = decisions[-1]["ranking"][0]

    # Every trial is an experiment with its params and metrics; the best is marked.
    exps = sweep_experiments(repo)
    trial_exps = {n: e for n, e in exps.items() if n.startswith("small-")}
    assert sorted(trial_exps) == [f"small-t{i:03d}" for i in range(8)]
    plan = json.loads((sweep_dir / "report/plan.json").read_text())
    summary = pd.read_csv(sweep_dir / "report/summary.csv").set_index("trial")
    for trial in plan["trials"]:
        exp = trial_exps[f"small-{trial['trial']}"]
        for key, value in trial["overrides"].items():
            section, field = key.split(".")
            assert exp["params"][section][field] == value
        assert exp["params"]["data"] == config["data"]
        assert exp["trial"]["valid_rmse"] == pytest.approx(summary.loc[trial["trial"], "valid_rmse"], rel=1e-5)
        assert exp["trial"]["rung"] == summary.loc[trial["trial"], "rung"]
        assert exp["trial"]["best"] == int(trial["trial"] == best)
    # The winner was evaluated once on test, with the model its last rung trained.
    final = json.loads((sweep_dir / "final/metrics.json").read_text())
    assert trial_exps[f"small-{best}"]["trial"]["final"]["rmse"] == pytest.approx(final["rmse"])
    assert all("final" not in e["trial"] for n, e in trial_exps.items() if n != f"small-{best}")
    # A trial's params are its config at the last rung it reached: the budget is that rung's epochs.
    reached = summary.loc[best, "rung"]
    assert trial_exps[f"small-{best}"]["params"]["train"]["max_epochs"] == rungs[reached].epochs
    assert md5(sweep_dir / f"report/trials/{best}/model.pt") == md5(sweep_dir / f"trials/{best}/rung2/model.pt")
    assert (sweep_dir / "report/rungs.png").read_bytes()[:4] == b"\x89PNG"
    assert not (sweep_dir / f"report/trials/{best}/state.pt").exists()  # the report leaves states out
    # The report (every trial's final model) is in DVC, and the experiments point at it.
    assert (sweep_dir / "report.dvc").is_file()
    assert dvc(repo, "status", "--quiet", check=False).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["successive_halving", "asha"])
def test_failing_trials_are_reported_and_excluded_and_the_sweep_completes(project: Path, strategy: str) -> None:
    sweep = json.loads(json.dumps(SMALL_SWEEP))
    # 6 trials: dropout 1.5 is invalid (3 trials, caught before any job); lr 1e30 diverges (1 trial, at run time).
    sweep["snakedvc"]["sweep"]["space"] = {"train.lr": [0.001, 0.003, 1e30], "train.dropout": [0.1, 1.5]}
    # ESOL's sweep with ASHA: the one line; the diverged trial counts as the worst result of its rung.
    sweep["snakedvc"]["sweep"]["strategy"] = strategy
    name = write_sweep(project, sweep)
    proc = run_snakemake(project, "--profile", "profiles/local", "--configfile", name, "--cores", "2")
    out = proc.stdout + proc.stderr
    summary = pd.read_csv(project / "results/sweeps/small/report/summary.csv").set_index("trial")
    plan = {
        t["trial"]: t["overrides"]
        for t in json.loads((project / "results/sweeps/small/report/plan.json").read_text())["trials"]
    }
    invalid = [t for t, o in plan.items() if o["train.dropout"] == 1.5]
    diverged = [t for t, o in plan.items() if o["train.lr"] == 1e30 and o["train.dropout"] == 0.1]
    assert len(invalid) == 3 and len(diverged) == 1
    for trial in invalid:
        assert summary.loc[trial, "status"] == "invalid"
        assert "train.dropout" in summary.loc[trial, "error"]
    assert summary.loc[diverged[0], "status"] == "failed"
    assert "training diverged" in summary.loc[diverged[0], "error"]
    assert not (project / f"results/sweeps/small/trials/{diverged[0]}/rung1").exists()
    ok = summary[summary["status"] == "ok"]
    assert len(ok) == 2 and ok["best"].sum() == 1
    assert ok[ok["best"]].index[0] not in invalid + diverged
    # Reported in the printed summary too.
    assert "excluded:" in out and diverged[0] in out
    assert json.loads((project / "results/sweeps/small/final/metrics.json").read_text())["n"] > 0


@pytest.mark.slurm
def test_sweep_through_slurm_records_eight_experiments(slurm_cluster, tmp_path: Path) -> None:
    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    sweep = json.loads(json.dumps(SMALL_SWEEP))
    sweep["train"]["max_epochs"] = 2  # rungs of 1 and 2 epochs: 8 + 4 training jobs
    name = write_sweep(repo, sweep)
    proc = run_snakemake(repo, "--profile", "profiles/slurm", "--configfile", name, timeout=1500)
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    assert len(jobs["sweep_trial"]) == 12
    assert "sweep_rung" not in jobs and "track_sweep" not in jobs  # promotion and DVC on the submit host
    decision = json.loads((repo / "results/sweeps/small/rungs/rung1.json").read_text())
    best = decision["ranking"][0]
    exps = {n: e for n, e in sweep_experiments(repo).items() if n.startswith("small-")}
    assert len(exps) == 8
    assert [n for n, e in exps.items() if e["trial"]["best"] == 1] == [f"small-{best}"]
    plan = {
        t["trial"]: t["overrides"]
        for t in json.loads((repo / "results/sweeps/small/report/plan.json").read_text())["trials"]
    }
    for name, exp in exps.items():
        for key, value in plan[name.split("-")[1]].items():
            section, field = key.split(".")
            assert exp["params"][section][field] == value, (name, key)
    accounted = wait_for_sacct(jobs["sweep_trial"][0])
    assert accounted["partition"] == "gpu" and "gres/gpu=1" in accounted["tres"]
