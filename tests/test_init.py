"""`snakedvc init` in an existing git repository: what a project needs, never overwriting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

import snakedvc
from snakedvc.engine.workflow import kit_schema
from tests.conftest import REPO, git


def snakedvc_cli(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snakedvc", *args], cwd=repo, capture_output=True, text=True, timeout=120
    )


def test_init_writes_what_a_project_needs_and_never_overwrites(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text("*.pyc\n")
    (repo / "config.yaml").write_text("train:\n  lr: 0.1\n")

    dry = snakedvc_cli(repo, "init", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "write   profiles/slurm/partitions.yaml" in dry.stdout and "run     dvc init" in dry.stdout
    assert not (repo / "profiles").exists() and not (repo / ".dvc").exists()

    done = snakedvc_cli(repo, "init")
    assert done.returncode == 0, done.stderr
    # The profiles are the kit's, the same files this repository's examples run with.
    for name in ("local/config.yaml", "slurm/config.yaml", "slurm/partitions.yaml", "slurm/controller.yaml"):
        assert (repo / "profiles" / name).read_bytes() == (REPO / "profiles" / name).read_bytes(), name
    assert (repo / ".dvc").is_dir() and "results/metrics.json" in (repo / "dvc.yaml").read_text()
    config = yaml.safe_load((repo / "config.yaml").read_text())
    assert config["train"] == {"lr": 0.1} and config["snakedvc"]["experiment"]["metrics"] == ["results/metrics.json"]
    snakedvc.validate_config(config["snakedvc"], kit_schema())
    assert (repo / ".gitignore").read_text().startswith("*.pyc\n")

    # What git sees of a run's outputs: the .dvc files and DVC's .gitignore files, nothing else.
    (repo / "results/model").mkdir(parents=True)
    for name in ("model/model.pt", "model/model.pt.dvc", "model/.gitignore", "metrics.json", "params.yaml"):
        (repo / "results" / name).write_text("x\n")
    (repo / "logs").mkdir()
    (repo / "logs/fit.log").write_text("x\n")
    (repo / ".venv/bin").mkdir(parents=True)  # the tutorial's environment, made in the project
    (repo / ".venv/pyvenv.cfg").write_text("x\n")
    seen = git(repo, "status", "--porcelain", "--untracked-files=all")
    assert "results/model/model.pt.dvc" in seen and "results/model/.gitignore" in seen
    assert "model.pt\n" not in seen and "metrics.json" not in seen and "logs/" not in seen, seen
    assert ".venv" not in seen, seen
    monkeypatch.chdir(repo)
    assert snakedvc.tracked({"snakedvc": {}}, ["results/model/model.pt"]) == ["results/model/model.pt.dvc"]

    # A second init writes nothing and names what is in the way.
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and ".git/" not in str(p)}
    again = snakedvc_cli(repo, "init")
    assert again.returncode == 1
    assert "profiles/local/config.yaml" in again.stderr and "dvc.yaml" in again.stderr
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and ".git/" not in str(p)} == before


def test_init_outside_a_git_repository_says_what_to_do(tmp_path: Path) -> None:
    proc = snakedvc_cli(tmp_path, "init")
    assert proc.returncode == 1 and "git init" in proc.stderr


def test_help_lists_the_users_commands_and_hides_the_controller() -> None:
    from snakedvc.cli import build_parser

    text = build_parser().format_help()
    assert "SUPPRESS" not in text
    listed = {
        line.split()[0]
        for line in text.split("positional arguments:")[-1].splitlines()[2:]
        if line.startswith("    ") and not line.startswith("     ")
    }
    assert {"init", "launch", "submit", "runs", "report"} <= listed and "controller" not in listed, listed
