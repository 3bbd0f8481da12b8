"""A run's Snakemake exits when its work is done (snakedvc.engine.scheduler_exit).

Each pass of Snakemake's scheduler leaves a non-daemon timer of --max-jobs-per-timespan's timespan,
which the interpreter waits for at exit. With a timespan of an hour the wait is an hour: a run that
ends here within the tests' 10-minute timeout ended because the kit dropped the timers (without the
kit's hooks, each of these runs waits the hour out and times out).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from snakedvc.engine.scheduler_exit import end_pending_scheduler_wakeups
from tests.conftest import run_snakemake
from tests.test_dvc_pipeline import dvc_project, snakedvc

AN_HOURS_WAKEUP = ["--max-jobs-per-timespan", "100/1h"]

SNAKEFILE = """\
import snakedvc

configfile: "config.yaml"
include: snakedvc.module_path("kit")

rule step:
    output: "out/step.txt"
    shell: "echo {config[word]} > {output} && test {config[word]} != fail"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "config.yaml").write_text("word: hello\nsnakedvc:\n  tracking: false\n")
    return tmp_path


@pytest.mark.parametrize(("word", "code"), [("hello", 0), ("fail", 1)])
def test_a_kit_workflow_exits_when_its_last_job_has(project: Path, word: str, code: int) -> None:
    # onsuccess, and onerror for a failed job
    proc = run_snakemake(
        project, "--cores", "1", *AN_HOURS_WAKEUP, "--config", f"word={word}", check=False, timeout=600
    )
    assert proc.returncode == code, proc.stderr[-3000:]
    assert (project / "out/step.txt").is_file() == (code == 0)


def test_exp_run_exits_when_its_last_stage_has(tmp_path: Path) -> None:
    dvc_yaml = {"stages": {"one": {"cmd": "echo 1 > one.txt", "outs": ["one.txt"]}}}
    repo = dvc_project(tmp_path / "origin", {"dvc.yaml": yaml.safe_dump(dvc_yaml)})
    try:
        proc = snakedvc(repo, "exp", "run", "-n", "quick", "--", *AN_HOURS_WAKEUP)
    except subprocess.TimeoutExpired:  # (the helper's own timeout)
        pytest.fail("snakedvc exp run waited for Snakemake's scheduler timer")
    assert "Ran experiment(s): quick" in proc.stdout + proc.stderr


def test_only_the_schedulers_timers_are_cancelled() -> None:
    import threading

    mine = threading.Timer(3600, print)
    mine.start()
    try:
        assert end_pending_scheduler_wakeups() == 0
        assert mine.is_alive() and not mine.finished.is_set()
    finally:
        mine.cancel()
