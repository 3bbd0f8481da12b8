"""snakemake-executor-plugin-slurm's own test suite, from its sdist at the installed version, run
against our executor snakedvc-slurm on the test cluster (scripts/plugin-tests; the results and
every expected failure are explained in docs/upstream/plugin-test-suite.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

OURS = "snakemake_executor_plugin_snakedvc_slurm.executor.Executor"
# Plugin 2.8.0 ships 213 tests, 20 of which run workflows on SLURM, and 38 unit tests that
# build an Executor stub; a later 2.8.x may add some, never fewer without us noticing.
MIN_SUITE_TESTS = 213
MIN_SLURM_WORKFLOW_TESTS = 20
MIN_STUB_TESTS = 38
# About 7 minutes on the idle 2-CPU test cluster; longer when other work fills its queue.
TIMEOUT_SECONDS = 1800


def test_plugin_suite_runs_against_snakedvc_slurm(slurm_cluster: None, tmp_path: Path) -> None:
    summary_file = tmp_path / "summary.json"
    command = [sys.executable, str(REPO / "scripts" / "plugin-tests"), "--python", sys.executable]
    proc = subprocess.Popen(
        [*command, "--json", str(summary_file)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the script stops its pytest processes and cancels its SLURM jobs
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(f"scripts/plugin-tests took over {TIMEOUT_SECONDS} s:\n{output[-8000:]}")
    assert proc.returncode == 0, f"scripts/plugin-tests failed:\n{output[-8000:]}"

    summary = json.loads(summary_file.read_text())
    assert summary["executor"] == "snakedvc-slurm"
    assert summary["problems"] == []
    results = summary["results"]
    suite = [r for r in results.values() if r["phase"] == "suite"]
    workflows = {key: r for key, r in results.items() if r["phase"] == "suite" and r["kind"] == "slurm-workflow"}
    stubs = [r for r in results.values() if r["phase"] == "stubs"]
    assert len(suite) >= MIN_SUITE_TESTS
    assert len(workflows) >= MIN_SLURM_WORKFLOW_TESTS
    assert len(stubs) >= MIN_STUB_TESTS

    passed = {key: r for key, r in workflows.items() if r["outcome"] == "passed"}
    assert passed, "no SLURM workflow test passed"
    for key, r in passed.items():
        # Snakemake built our Executor (nothing else), which submitted real SLURM jobs that completed.
        assert set(r["run"]["executor_classes"]) == {OURS}, key
        assert set(r["run"]["settings_classes"]) == {OURS + "Settings"}, key
        assert r["run"]["slurm_jobs"], key
        states = {summary["slurm_job_states"].get(job) for job in r["run"]["slurm_jobs"]}
        assert states == {"COMPLETED"}, f"{key}: SLURM job states {states}"
