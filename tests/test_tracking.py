"""The DVC hook on real git + DVC repos with a directory remote."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from snakedvc.engine.tracking import TrackingError, track, validate_experiment_name
from tests.conftest import (
    REPO,
    SMALL_RUN,
    dvc,
    dvc_experiments,
    dvc_project,
    git,
    md5,
    run_snakemake,
    slurm_jobs_by_rule,
    trainers_in,
    venv_env,
)
from tests.waiting import text_of, wait_until

SMALL = SMALL_RUN[1:]  # the --config values


def experiments(repo: Path) -> dict[str, dict]:
    return dvc_experiments(repo, "results/metrics.json")


@pytest.mark.parametrize("name", ["run-1", "lr_0.001", "A"])
def test_good_experiment_names(name: str) -> None:
    assert validate_experiment_name(name) == name


@pytest.mark.parametrize("name", ["x; touch /tmp/pwned", "$(reboot)", "-rf", "a/b", "a..b", "x.lock", "x.", ""])
def test_bad_experiment_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        validate_experiment_name(name)


@pytest.mark.parametrize("name", ["a..b", "x.lock", "x."])
def test_names_git_refuses_stop_the_run_at_configure_not_at_its_end(name: str) -> None:
    """The schema's pattern lets these through; the end of the run (a git ref) would not."""
    import snakedvc

    with pytest.raises(snakedvc.ConfigError, match=rf"experiment.name '{re.escape(name)}' is not allowed"):
        snakedvc.configure({"snakedvc": {"experiment": {"name": name}}})


def test_injected_experiment_name_fails_before_any_job(project: Path, tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    proc = run_snakemake(
        project,
        "--profile",
        "profiles/local",
        "--config",
        f"snakedvc={{experiment: {{name: 'x; touch {target}'}}}}",
        check=False,
    )
    assert proc.returncode != 0
    assert "experiment.name" in proc.stdout + proc.stderr
    assert not target.exists()
    assert not (project / "results").exists()


def test_track_refuses_missing_output(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="missing output"):
        track(["nope.bin"], root=tmp_path)


@pytest.mark.slow
def test_two_runs_are_two_experiments_and_restore_is_exact(tmp_path: Path) -> None:
    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    run_snakemake(repo, "--profile", "profiles/local", "--config", *SMALL, "snakedvc={experiment: {name: first}}")
    first_metrics = json.loads((repo / "results/metrics.json").read_text())
    first_model = md5(repo / "results/model/model.pt")
    run_snakemake(
        repo,
        "--profile",
        "profiles/local",
        "--config",
        "data={limit: 200}",
        "train={max_epochs: 4, hidden_sizes: [32], lr: 0.003}",
        "snakedvc={experiment: {name: second}}",
    )
    second_metrics = json.loads((repo / "results/metrics.json").read_text())
    assert md5(repo / "results/model/model.pt") != first_model

    exps = experiments(repo)
    assert set(exps) == {"first", "second"}
    assert exps["first"]["metrics"] == first_metrics
    assert exps["second"]["metrics"] == second_metrics
    assert exps["first"]["params"]["train"]["lr"] == 0.001
    assert exps["second"]["params"]["train"]["lr"] == 0.003  # the --config override, not params.yaml
    assert exps["second"]["params"]["data"]["limit"] == 200
    # Nested --config values keep their types (YAML's BaseLoader would make '4' of them).
    assert exps["second"]["params"]["train"]["max_epochs"] == 4
    # The run's effective params are shown once, and DVC's scratch files are never committed.
    shown = json.loads(dvc(repo, "exp", "show", "--json").stdout)
    listed = [exp for commit in shown for exp in commit.get("experiments") or []]
    assert len(listed) == 2
    for exp in listed:
        # (the examples' own dvc.yaml files, in this repository's clone, name params files of theirs)
        shown_params = {f for f in exp["revs"][0]["data"]["params"] if not f.startswith("examples/")}
        assert shown_params == {"results/params.yaml"}
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    named = [ref for ref in refs if ref.rsplit("/", 1)[-1] in ("first", "second")]
    assert len(named) == 2, refs
    for ref in named:
        committed = git(repo, "ls-tree", "-r", "--name-only", ref).split()
        assert not [f for f in committed if f.startswith(".dvc/tmp")], ref
        assert not [f for f in committed if f.endswith(".snakemake_timestamp")], ref  # Snakemake's, not the run's
        assert "results/model/model.pt.dvc" in committed and "results/metrics.json" in committed
        assert "results/model/live/plots/metrics/valid_rmse.tsv" in committed  # dvclive's folder
    # dvc reads dvclive's files with dvc.yaml alone: the summary in exp show, the curves in plots diff.
    for exp in listed:
        live = exp["revs"][0]["data"]["metrics"]["results/model/live/metrics.json"]["data"]
        assert live["step"] == 4 and live["best_epoch"] <= 4 and live["valid_rmse"] > 0
    plots = json.loads(dvc(repo, "plots", "diff", "first", "second", "--json").stdout)["data"]
    (loss,) = plots["Loss per epoch (standardised MSE)"]
    assert sorted(loss["revisions"]) == ["first", "second"]
    points = loss["content"]["data"]["values"]
    for rev in ("first", "second"):
        assert sorted({int(p["step"]) for p in points if p["rev"] == rev}) == [1, 2, 3, 4], rev
    # Every artifact is in the DVC cache.
    assert dvc(repo, "status", "--quiet", check=False).returncode == 0

    subprocess.run([sys.executable, "-m", "snakedvc", "restore", "first"], cwd=repo, check=True)
    assert md5(repo / "results/model/model.pt") == first_model
    plan = run_snakemake(repo, "-n", "--profile", "profiles/local", "--config", *SMALL)
    assert "Nothing to be done" in plan.stdout + plan.stderr
    # Tracked outputs stay writable for the next run.
    assert (repo / "results/model/model.pt").stat().st_mode & 0o200


@pytest.mark.slow
def test_failed_train_saves_no_experiment_but_keeps_features(tmp_path: Path) -> None:
    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    diverging = ["--config", "data={limit: 200}", "train={max_epochs: 4, hidden_sizes: [32], lr: 1e30}"]
    proc = run_snakemake(repo, "--profile", "profiles/local", *diverging, check=False)
    assert proc.returncode != 0
    assert "Error in rule train" in proc.stdout + proc.stderr
    assert "training diverged" in (repo / "logs/train.log").read_text()
    assert experiments(repo) == {}
    for split in ("train", "valid", "test"):
        dvc_file = repo / f"results/features/{split}.npz.dvc"
        assert dvc_file.is_file()
        entry = yaml.safe_load(dvc_file.read_text())["outs"][0]
        assert entry["md5"] == md5(repo / f"results/features/{split}.npz")
    # The cache holds exactly what the .dvc files name: nothing half-written.
    cached = {p.parent.name + p.name for p in (repo / ".dvc/cache/files/md5").rglob("*") if p.is_file()}
    named = {yaml.safe_load(p.read_text())["outs"][0]["md5"] for p in (repo / "results").rglob("*.dvc")}
    assert cached == named
    assert not (repo / "results/model/model.pt.dvc").exists()


@pytest.mark.slow
def test_push_then_fresh_clone_pulls_run_and_model(tmp_path: Path) -> None:
    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    run_snakemake(
        repo, "--profile", "profiles/local", "--config", *SMALL, "snakedvc={experiment: {name: shared, push: true}}"
    )
    model = md5(repo / "results/model/model.pt")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(clone))
    dvc(clone, "exp", "pull", "origin", "shared")
    assert "shared" in dvc(clone, "exp", "list", "--name-only").stdout
    dvc(clone, "exp", "apply", "shared")
    dvc(clone, "pull", "results/model/model.pt.dvc")
    assert md5(clone / "results/model/model.pt") == model


# runtime=10: above the profile's pack-runtime, so each job is a SLURM job of its own, tracked as it ends.
FANOUT = """
rule all:
    input: expand("out/{i}.bin.dvc", i=range(8))

rule make:
    output: "out/{i}.bin"
    resources: mem_mb=100, runtime=10
    shell: "sleep 2; head -c 200000 /dev/urandom > {output}"

rule track:
    input: "out/{i}.bin"
    output: "out/{i}.bin.dvc"
    localrule: True
    shell: "python -m snakedvc track {input}"
"""


def fanout_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "fan"
    repo.mkdir()
    (repo / "Snakefile").write_text(FANOUT)
    git(repo, "init", "-q")
    dvc(repo, "init", "-q")
    dvc(repo, "config", "core.analytics", "false")
    shutil.copytree(REPO / "profiles/slurm", repo / "profiles/slurm")  # the profile and its partitions.yaml
    return repo


def assert_all_eight_recorded(repo: Path, output: str) -> None:
    assert "Unable to acquire lock" not in output
    ignored = (repo / "out/.gitignore").read_text().split()
    assert sorted(ignored) == sorted(f"/{i}.bin" for i in range(8))
    for i in range(8):
        entry = yaml.safe_load((repo / f"out/{i}.bin.dvc").read_text())["outs"][0]
        assert entry["md5"] == md5(repo / f"out/{i}.bin")
    assert dvc(repo, "status", "--quiet", check=False).returncode == 0


@pytest.mark.slow
def test_eight_concurrent_tracked_jobs_locally(tmp_path: Path) -> None:
    repo = fanout_repo(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "8", "--jobs", "8"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=venv_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_all_eight_recorded(repo, proc.stdout + proc.stderr)


@pytest.mark.slurm
def test_eight_concurrent_tracked_jobs_through_slurm(slurm_cluster, tmp_path: Path) -> None:
    repo = fanout_repo(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--jobs", "8", "--local-cores", "8"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=venv_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    assert len(jobs["make"]) == 8
    assert "track" not in jobs  # DVC runs on the submit host only
    assert_all_eight_recorded(repo, proc.stdout + proc.stderr)


@pytest.mark.slow
def test_stopped_training_with_no_retry_left_records_no_model(tmp_path: Path) -> None:
    """Retries exhausted: the run fails naming the rule and the kept checkpoint; DVC records no model."""
    import signal

    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    config = ["data={limit: 200}", "train={max_epochs: 100000, patience: 100000, hidden_sizes: [64]}"]
    snakemake = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/local", "--retries", "0", "--config", *config],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = repo / "logs/train.log"
    wait_until(
        lambda: "epoch 20 " in text_of(log), "epoch 20 in the log", 300, explain=lambda: text_of(log), proc=snakemake
    )
    trainer = trainers_in(repo)
    assert trainer, "trainer process not found"
    os.kill(trainer[0], signal.SIGTERM)
    output, _ = snakemake.communicate(timeout=300)
    assert snakemake.returncode != 0
    assert "Error in rule train" in output
    assert "checkpoint kept: .checkpoints/train/" in log.read_text()
    assert list((repo / ".checkpoints/train").rglob("ckpt-*.pt"))
    assert not (repo / "results/model/model.pt").exists()
    assert not (repo / "results/model/model.pt.dvc").exists()
    assert experiments(repo) == {}


def test_a_never_run_pipeline_elsewhere_in_the_repository_changes_nothing(tmp_path: Path) -> None:
    """Another dvc.yaml in the repository, never run (its dependency and outputs missing): the run
    saves its experiment (dvc exp save without targets failed on it: make run in a fresh clone did),
    and no stage of that pipeline is run or committed."""
    repo = dvc_project(tmp_path / "repo", tmp_path / "remote")
    other = repo / "other"
    other.mkdir()
    (other / "dvc.yaml").write_text("stages:\n  unrun:\n    cmd: cp a b\n    deps: [a]\n    outs: [b]\n")
    git(repo, "add", "other")
    git(repo, "commit", "-q", "-m", "another pipeline")
    assert "unrun" in dvc(repo, "stage", "list", "--all").stdout  # DVC sees it
    run_snakemake(repo, "--profile", "profiles/local", "--config", *SMALL, "snakedvc={experiment: {name: mine}}")
    assert set(experiments(repo)) == {"mine"}
    assert not (other / "dvc.lock").exists() and not (other / "b").exists()
    ref = next(r for r in git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split() if r.endswith("/mine"))
    assert git(repo, "diff", "--name-only", "HEAD", ref, "--", "other").strip() == ""


TWO_MODELS = """\
import snakedvc

configfile: "config.yaml"
include: snakedvc.module_path("kit")

rule fit:
    output: "results/model.txt"
    params: width=config["width"]
    shell: "echo {params.width} > {output}"

rule probe:
    output: "results/probe.json"
    params: depth=config["depth"]
    shell: "echo '{{\\"depth\\": {params.depth}}}' > {output}"

rule all:
    input: snakedvc.targets(config, rules.fit.output, track=rules.fit.output)
    default_target: True
"""


@pytest.mark.slow
def test_a_run_that_fails_ends_with_the_kits_line_saying_no_experiment_was_saved(tmp_path: Path) -> None:
    """Every run ends with one kit line (the tutorial says so); a failed one ended with Snakemake's
    error alone (a stranger's trial)."""
    repo = models_repo(tmp_path, TWO_MODELS.replace('"echo {params.width} > {output}"', '"exit 3"'))
    failed = run_snakemake(repo, "--cores", "1", check=False)
    assert failed.returncode != 0
    assert "snakedvc: no experiment saved: the run did not finish" in failed.stderr, failed.stderr[-2000:]
    assert experiments(repo) == {}


def models_repo(tmp_path: Path, snakefile: str) -> Path:
    """A git + DVC repository with ``snakefile`` and its config, committed."""
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / "Snakefile").write_text(snakefile)
    (repo / "config.yaml").write_text("width: 1\ndepth: 1\n")
    (repo / ".gitignore").write_text(".snakemake/\nlogs/\n")
    git(repo, "init", "-q", "-b", "main")
    dvc(repo, "init", "-q")
    dvc(repo, "config", "core.analytics", "false")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the project")
    return repo


@pytest.mark.slow
def test_a_record_keeps_another_runs_pointer_as_the_commit_has_it(tmp_path: Path) -> None:
    """The user commits a run's model pointer; a second run retrains (the workspace's pointer
    changes, uncommitted); a third run makes only another output. Its experiment held the second
    run's pointer (git keeps a tracked file as the workspace has it), so restoring it gave the
    second run's model: found by a sweep's trials after a run with procs=2."""
    repo = models_repo(tmp_path, TWO_MODELS)
    local = ("--cores", "1")
    run_snakemake(repo, *local, "--config", "snakedvc={experiment: {name: first}}")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the first model")
    committed = git(repo, "rev-parse", "HEAD:results/model.txt.dvc").strip()
    run_snakemake(repo, *local, "--config", "width=2", "snakedvc={experiment: {name: second}}")
    retrained = (repo / "results/model.txt.dvc").read_text()
    assert git(repo, "hash-object", "results/model.txt.dvc").strip() != committed  # changed, not committed
    run_snakemake(repo, *local, "results/probe.json", "--config", "depth=2", "snakedvc={experiment: {name: probe}}")
    assert git(repo, "rev-parse", f"{ref(repo, 'probe')}:results/model.txt.dvc").strip() == committed
    assert git(repo, "show", f"{ref(repo, 'second')}:results/model.txt.dvc") == retrained  # its own, kept
    assert yaml.safe_load(git(repo, "show", f"{ref(repo, 'probe')}:results/params.yaml"))["depth"] == 2


def ref(repo: Path, name: str) -> str:
    """The experiment ``name``'s ref."""
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    return next(r for r in refs if r.rsplit("/", 1)[-1] == name)
