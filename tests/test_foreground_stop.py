"""SIGTERM to a foreground local run stops its jobs too, and says what was kept (issue 50).

Snakemake alone only stops scheduling on SIGTERM and waits for its running jobs: a local training
went on for its full length, and the run said nothing of it."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from snakedvc.engine.foreground import descendants
from tests.conftest import SNAKEMAKE
from tests.test_save_faults import experiments, project, run_named  # noqa: F401 - the fixture
from tests.test_stop_group import alive
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def sleeping_job(run: subprocess.Popen[str]) -> list[int]:
    """The run's job: the `sleep 3600` its train rule runs (pause=3600)."""
    found = []
    for pid in descendants(run.pid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"3600"]:
                found.append(pid)
        except OSError:
            continue
    return found


def test_sigterm_to_a_foreground_run_stops_its_local_jobs_and_says_what_was_kept(project: Path) -> None:  # noqa: F811
    command = [*SNAKEMAKE, *run_named("second", lr=0.02), "pause=3600"]
    run = subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        jobs = wait_until(lambda: sleeping_job(run), "the train job's sleep 3600", 120, proc=run)
        run.send_signal(signal.SIGTERM)
        # Snakemake alone waits out the job's hour; with the kit the job gets the SIGTERM too.
        said, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            for pid in sleeping_job(run):
                subprocess.run(["kill", str(pid)], check=False)
    assert run.returncode != 0
    assert "SIGTERM: stopping this run's" in said and "a training's checkpoint" in said, said[-3000:]
    # Gone, or a zombie its parent has not reaped yet (under load, a moment after Snakemake's exit).
    wait_until(lambda: not any(alive(pid) for pid in jobs), "the stopped job's processes to end", 30)
    assert experiments(project) == {"first": 0.01}  # nothing saved for the stopped run
