from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_project(dest: Path) -> Path:
    """A runnable copy of the workflow (no results) in ``dest``."""
    for name in ("workflow", "profiles"):
        shutil.copytree(REPO / name, dest / name)
    for name in ("params.yaml", "environment.yml"):
        shutil.copy2(REPO / name, dest / name)
    (dest / "data" / "raw").mkdir(parents=True)
    shutil.copy2(REPO / "data" / "raw" / "esol.csv", dest / "data" / "raw" / "esol.csv")
    return dest


def run_snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


# Small enough to train in seconds, large enough for a meaningful split.
SMALL_RUN = ["--config", "data={limit: 200}", "train={max_epochs: 4, hidden_sizes: [32]}"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


def slurm_jobs_by_rule(output: str) -> dict[str, list[str]]:
    """Map rule name -> SLURM job ids, from the plugin's 'submitted with SLURM jobid' lines."""
    import re

    jobs: dict[str, list[str]] = {}
    for jobid, rule in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_([A-Za-z0-9_]+)/", output):
        jobs.setdefault(rule, []).append(jobid)
    return jobs


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The real single-host SLURM test cluster (idempotent: starts it only if needed)."""
    proc = subprocess.run([str(REPO / "scripts" / "slurm-cluster"), "up"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"scripts/slurm-cluster up failed:\n{proc.stdout}\n{proc.stderr}")
