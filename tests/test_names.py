"""Experiment names never overwrite: a name in use is refused before any job, everywhere a name enters."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import dvc, dvc_experiments, git, run_snakemake
from tests.test_user_config import CONFIG, SNAKEFILE
from tests.waiting import wait_until

# train waits when asked, so that a second run can start while the first is going: on the fifo
# .git/hold-train where a test made one (it waits until the test writes to it: no race with a
# busy machine), else for `pause` seconds.
SLOW_SNAKEFILE = SNAKEFILE.replace(
    'shell: "echo {params.lr} > {output}"',
    'shell: "if [ -p .git/hold-train ]; then cat .git/hold-train; else sleep {config[pause]}; fi; '
    'echo {params.lr} > {output}"',
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Snakefile").write_text(SLOW_SNAKEFILE)
    (project / "config.yaml").write_text(
        "pause: 0\n" + CONFIG.replace("tracking: false", "tracking: true\n  experiment: {metrics: []}")
    )
    (project / "dvc.yaml").write_text("params: [results/params.yaml]\n")
    git(project, "init", "-q", "-b", "main")
    dvc(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "project")
    return project


def named(name: str, *more: str) -> list[str]:
    return ["--cores", "1", "--config", f"snakedvc={{experiment: {{name: {name}{''.join(more)}}}}}"]


def lr_of(project: Path, name: str) -> float:
    return dvc_experiments(project)[name]["params"]["train"]["lr"]


def test_a_name_in_use_is_refused_before_any_job_and_replaced_only_when_asked(project: Path) -> None:
    run_snakemake(project, *named("pavid-nark"))
    assert lr_of(project, "pavid-nark") == 0.01
    (project / "out/model.txt").unlink()
    (project / "config.yaml").write_text((project / "config.yaml").read_text().replace("lr: 0.01", "lr: 0.02"))
    refused = run_snakemake(project, *named("pavid-nark"), check=False)
    said = refused.stderr + refused.stdout
    assert refused.returncode != 0
    assert "experiment 'pavid-nark' exists already (saved " in said and "on baseline " in said, said[-2000:]
    assert "snakedvc={experiment: {replace: true}}" in said
    assert not (project / "out/model.txt").exists()  # no job ran
    assert lr_of(project, "pavid-nark") == 0.01  # the record is intact
    # What runs no job saves nothing, and is not refused: a dry run, the DAG (snakedvc report draws it).
    for reading in (["-n"], ["--dag"], ["-np"]):
        assert run_snakemake(project, *named("pavid-nark"), *reading, check=False).returncode == 0, reading
    run_snakemake(project, *named("pavid-nark", ", replace: true"))
    assert lr_of(project, "pavid-nark") == 0.02
    assert len(dvc_experiments(project)) == 1


def test_two_runs_started_at_once_with_one_name_one_is_refused(project: Path) -> None:
    hold = project / ".git" / "hold-train"
    os.mkfifo(hold)
    first = subprocess.Popen(
        [sys.executable, "-m", "snakemake", *named("twin")],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    claim = project / ".git" / "snakedvc-names" / "twin"
    wait_until(claim.is_file, "the first run to claim its name", 60, proc=first)
    second = run_snakemake(project, *named("twin"), "pause=0", check=False)
    assert second.returncode != 0
    assert "experiment name 'twin' is claimed by a run that is going: process" in second.stderr + second.stdout
    writer = wait_until(lambda: _fifo_writer(hold), "the first run's train to wait on its fifo", 120, proc=first)
    os.write(writer, b"go\n")
    os.close(writer)
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 0, output[-2000:]
    assert set(dvc_experiments(project)) == {"twin"} and not claim.exists()


def _fifo_writer(fifo: Path) -> int | None:
    """The fifo opened for writing once a reader has it open (None before: ENXIO)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None


def test_a_claim_left_by_a_killed_run_is_stale(project: Path) -> None:
    claim = project / ".git" / "snakedvc-names" / "gone"
    claim.parent.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    claim.write_text(f'{{"pid": {gone.pid}, "host": "{__import__("socket").gethostname()}", "since": "then"}}')
    run_snakemake(project, *named("gone"))
    assert "gone" in dvc_experiments(project)


def test_submit_refuses_an_experiment_name_in_use(project: Path) -> None:
    run_snakemake(project, *named("kept"))
    profile = Path(__file__).resolve().parents[1] / "src/snakedvc/profiles/local"
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "snakedvc", "submit", "--profile", str(profile), "--name", "kept"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "experiment 'kept' exists already" in proc.stderr, proc.stderr
    assert "snakedvc submit --replace" in proc.stderr
    assert time.time() - started < 30
    assert not (project / ".snakedvc/runs").exists() or not list((project / ".snakedvc/runs").iterdir())


def test_the_record_says_when_the_run_started_not_when_its_end_began(project: Path) -> None:
    """The report's header times come from the record: started was the moment the end-of-run hook
    loaded the records module (the issue saw 16:20:39 for a run begun at 16:20:21)."""
    import json

    before = time.time()
    run_snakemake(project, *named("timed"), "pause=4")
    record = json.loads((project / ".snakedvc/last-run.json").read_text())
    # Before the 4-second job, not at the end (however slow the machine is to start Snakemake).
    assert before <= record["started"] <= record["finished"] - 4, (before, record)
