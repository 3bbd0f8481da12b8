"""Fault tolerance on the real test cluster: scancel, time limit, SIGKILL; each resumes from a checkpoint."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from snakedvc.live import read_progress
from tests.conftest import running_rule_jobs, slurm_jobs_by_rule, trainers_in
from tests.waiting import text_of, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# A training long enough to be interrupted (tens of seconds on 2 cores), with frequent checkpoints.
LONG_TRAIN = [
    "data={limit: 200}",
    "train={max_epochs: 2500, patience: 100000, hidden_sizes: [64], checkpoint_every: 50}",
]


def start(project: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *extra, "--config", *LONG_TRAIN],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_log(project: Path, needle: str, snakemake: subprocess.Popen[str], timeout: float = 300) -> None:
    log = project / "logs/train.log"
    wait_until(
        lambda: needle in text_of(log), f"{needle!r} in {log}", timeout, explain=partial(text_of, log), proc=snakemake
    )


def running_train_job(project: Path) -> str:
    ids = running_rule_jobs("train", project)
    assert len(ids) == 1, ids
    return ids[0]


def finish(snakemake: subprocess.Popen[str]) -> str:
    try:
        output, _ = snakemake.communicate(timeout=900)
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
    assert snakemake.returncode == 0, output[-4000:]
    return output


def test_scancel_then_retry_resumes(slurm_cluster, project: Path) -> None:
    snakemake = start(project, "--retries", "2")
    wait_for_log(project, "epoch 300 ", snakemake)
    # The SLURM job's dvclive folder, read from the submit host through the shared filesystem, grows.
    live = project / "results/model/live"
    # (the log's line can come before the folder's write reaches this host: waited for, not assumed)
    first = wait_until(
        lambda: (found := read_progress(live)) and found.epoch >= 300 and found, "dvclive's epoch 300", 60, 0.1
    )
    wait_until(lambda: (read_progress(live) or first).epoch != first.epoch, "the running job's epoch to move", 60, 0.1)
    subprocess.run(["scancel", running_train_job(project)], check=True)
    output = finish(snakemake)
    assert len(slurm_jobs_by_rule(output)["train"]) == 2
    # scancel sends SIGTERM: the trainer wrote a checkpoint at that step, and the retry resumed from it.
    assert "(SIGTERM checkpoint " in (project / "logs/train.log").read_text()
    assert (project / "results/metrics.json").is_file()
    # The retry rewrote dvclive's folder from the checkpoint: every epoch once, in order.
    steps = [int(line.split("\t")[0]) for line in (live / "plots/metrics/valid_rmse.tsv").read_text().splitlines()[1:]]
    assert steps == list(range(1, 2501))


def test_time_limit_signal_checkpoints_and_resubmits(slurm_cluster, project: Path) -> None:
    # The profile asks SLURM for SIGTERM 90 s before a job's time limit. Rather than wait for a long
    # limit (the signal lands anywhere from 0 to 60 s before the time asked), the running job's
    # limit is cut to 2 minutes (scontrol update), as a cluster's limit would be reached: the
    # warning is then due 30 s after the job started (it came 22 s in, at epoch ~2400, here).
    # 10000 epochs take ~90 s (the signal came at epoch ~2400 of 22 s): it comes mid-training even on
    # a machine 3x as fast, and the next job (the rule's own 60-minute limit) finishes it. (20000
    # epochs made the retry the longest wait of CI's SLURM tests.)
    more = ["train={max_epochs: 10000, patience: 100000, hidden_sizes: [64], checkpoint_every: 500}"]
    snakemake = subprocess.Popen(
        [
            sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--retries", "2",
            "--config", "data={limit: 200}", *more,
        ],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for_log(project, "epoch 100 ", snakemake)
    first = running_train_job(project)
    subprocess.run(["scontrol", "update", f"JobId={first}", "TimeLimit=2"], check=True)
    output = finish(snakemake)
    jobs = slurm_jobs_by_rule(output)["train"]
    assert len(jobs) == 2 and jobs[0] == first
    # The warning signal before the time limit, not the kill at it: the first job checkpointed
    # and ended (FAILED: the step's exit 75 fails the batch script) before its limit (TIMEOUT).
    assert "(SIGTERM checkpoint " in (project / "logs/train.log").read_text()
    state = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", first, "-o", "State,Elapsed"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert re.fullmatch(r"FAILED\|00:0[01]:\d\d", state[0]), state  # within its first 2 minutes


def test_sigkill_resumes_from_periodic_checkpoint(slurm_cluster, project: Path) -> None:
    snakemake = start(project, "--retries", "2")
    wait_for_log(project, "checkpoint (periodic): ", snakemake)
    wait_for_log(project, "epoch 170 ", snakemake)
    pids = trainers_in(project)
    assert pids, "trainer process not found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    output = finish(snakemake)
    log = (project / "logs/train.log").read_text()
    resumed = re.search(r"resumed from epoch (\d+) step (\d+) \(periodic checkpoint", log)
    assert resumed, log[-2000:]
    # A periodic checkpoint (every 50 epochs, at an epoch boundary), not a signal one.
    assert int(resumed.group(1)) % 50 == 1 and int(resumed.group(2)) == 0
    assert len(slurm_jobs_by_rule(output)["train"]) == 2
