"""One trainer per checkpoint folder: the lease of `snakedvc.torch.checkpoint`, with real processes.

Holders are separate Python processes (``HOLDER`` below) that take a lease and keep it until the
test writes a line to their stdin; the trainings of the last test run ``tests/test_resume.py``
as a script, as its torchrun test does. Where a SLURM job's state matters, a stand-in ``squeue``
on PATH says what SLURM would.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from snakedvc.errors import CheckpointBusy
from snakedvc.lease import DEFAULT_LEASE_WAIT_S, LEASE_FILE, CheckpointLease
from snakedvc.torch import Resumable, TrainingStopped, add_resume_arguments
from snakedvc.torch.checkpoint import StopRequest
from tests.conftest import REPO
from tests.waiting import wait_until

HOLDER = """
import json, logging, sys
from snakedvc.lease import CheckpointLease
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
lease = CheckpointLease(sys.argv[1], **json.loads(sys.argv[2]))
lease.acquire()
print("acquired", flush=True)
sys.stdin.readline()  # hold it until the test says so
lease.release()
print("released", flush=True)
"""

SQUEUE_RUNNING = 'echo "$@" >> "$(dirname "$0")/calls"\necho RUNNING\n'
SQUEUE_LISTS_NOTHING = 'echo "$@" >> "$(dirname "$0")/calls"\n'
SQUEUE_INVALID_JOB = (
    'echo "$@" >> "$(dirname "$0")/calls"\necho "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1\n'
)


def without_slurm(**extra: str) -> dict[str, str]:
    """This environment minus any SLURM job of the test run itself, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **extra}


class Holder:
    """A separate process that holds a lease on ``folder`` until ``release`` (or ``kill``)."""

    def __init__(self, folder: Path, env: dict[str, str], **options: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder), json.dumps(options)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != "acquired\n":
            raise AssertionError(f"the holder did not take the lease: {self.proc.communicate(timeout=60)[1]}")
        self.pid = self.proc.pid

    def release(self) -> tuple[str, str]:
        """Tell it to release and exit; its stdout and stderr."""
        out, err = self.proc.communicate("release\n", timeout=60)
        assert self.proc.returncode == 0, err
        return out, err

    def kill(self) -> None:
        """SIGKILL, and reap it: a zombie still counts as a live pid."""
        self.proc.kill()
        self.proc.wait(timeout=60)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Callable[..., Holder]]:
    started: list[Holder] = []

    def start(env: dict[str, str] | None = None, **options: float) -> Holder:
        started.append(Holder(tmp_path / "run", env or without_slurm(), **options))
        return started[-1]

    yield start
    for one in started:
        if one.proc.poll() is None:
            one.kill()


@pytest.fixture
def squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Put a stand-in squeue with this shell body first on PATH (here and for children); returns its folder."""

    def install(body: str) -> Path:
        folder = tmp_path / "bin"
        folder.mkdir(exist_ok=True)
        script = folder / "squeue"
        script.write_text(f"#!/bin/sh\n{body}")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        return folder

    return install


def lease_in(folder: Path) -> dict:
    return json.loads((folder / LEASE_FILE).read_text())


def test_a_second_holder_waits_then_refuses_naming_the_first(tmp_path: Path, holder, squeue) -> None:
    bin_dir = squeue(SQUEUE_RUNNING)  # the first holder's SLURM job runs
    first = holder(without_slurm(SLURM_JOB_ID="4242"))
    started = time.monotonic()
    with pytest.raises(CheckpointBusy) as busy:
        CheckpointLease(tmp_path / "run", wait_s=2, poll_s=0.2).acquire()
    assert time.monotonic() - started >= 2
    message = str(busy.value)
    assert f"host {socket.gethostname()}, pid {first.pid}, SLURM job 4242" in message
    assert f"Lease file: {tmp_path / 'run' / LEASE_FILE}" in message
    assert "scancel 4242" in message and f"kill {first.pid}" in message
    assert "holding it for " in message
    assert busy.value.holder["pid"] == first.pid
    assert (bin_dir / "calls").read_text().splitlines()[0] == "-h -j 4242 -o %T"
    first.release()
    assert not (tmp_path / "run").exists()  # the lease file was all the folder held


def test_the_refusal_names_no_slurm_job_without_one(tmp_path: Path, holder) -> None:
    first = holder()
    with pytest.raises(CheckpointBusy, match=f"host {socket.gethostname()}, pid {first.pid}, holding it") as busy:
        CheckpointLease(tmp_path / "run", wait_s=0).acquire()
    assert "SLURM" not in str(busy.value) and "scancel" not in str(busy.value)


def test_a_second_holder_waits_and_takes_the_lease_once_the_first_releases(tmp_path: Path, holder, caplog) -> None:
    first = holder()
    released: list[tuple[str, str]] = []
    timer = threading.Timer(1.5, lambda: released.append(first.release()))
    timer.start()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="snakedvc"):
        lease = CheckpointLease(tmp_path / "run", wait_s=60, poll_s=0.2).acquire()
    timer.join()
    try:
        assert time.monotonic() - started >= 1.0
        assert f"is leased to host {socket.gethostname()}, pid {first.pid}; waiting up to 60 s" in caplog.text
        assert released and released[0][0] == "released\n"
        assert lease_in(tmp_path / "run")["pid"] == os.getpid()
    finally:
        lease.release()
    assert not (tmp_path / "run").exists()


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over(tmp_path: Path, holder, caplog) -> None:
    first = holder()
    first.kill()  # SIGKILL: no release, its lease file stays
    assert lease_in(tmp_path / "run")["pid"] == first.pid
    with caplog.at_level(logging.WARNING, logger="snakedvc"):
        lease = CheckpointLease(tmp_path / "run", wait_s=0).acquire()
    try:
        assert (
            f"took over the lease on {tmp_path / 'run'} from host {socket.gethostname()}, pid {first.pid}: "
            f"process {first.pid} no longer runs" in caplog.text
        )
        assert lease_in(tmp_path / "run")["pid"] == os.getpid()
    finally:
        lease.release()


@pytest.mark.parametrize("squeue_says", [SQUEUE_LISTS_NOTHING, SQUEUE_INVALID_JOB], ids=["lists-nothing", "invalid"])
def test_a_lease_of_a_slurm_job_that_squeue_no_longer_runs_is_taken_over(
    tmp_path: Path, holder, squeue, squeue_says: str, caplog
) -> None:
    """The holder's process still exists, but SLURM says its job is over: that pid is not the job's
    (reused), or the holder is on a host whose processes we cannot see. Its later release leaves
    the new lease alone."""
    first = holder(without_slurm(SLURM_JOB_ID="5151", SLURM_ARRAY_JOB_ID="5150", SLURM_ARRAY_TASK_ID="1"))
    bin_dir = squeue(squeue_says)
    with caplog.at_level(logging.WARNING, logger="snakedvc"):
        lease = CheckpointLease(tmp_path / "run", wait_s=0).acquire()
    try:
        assert f"pid {first.pid}, SLURM job 5151 (array task 5150_1): its SLURM job 5150_1 has ended" in caplog.text
        assert (bin_dir / "calls").read_text() == "-h -j 5150_1 -o %T\n"
        _, err = first.release()
        assert "was no longer ours at release" in err
        assert lease_in(tmp_path / "run")["pid"] == os.getpid()
    finally:
        lease.release()


def test_release_deletes_only_our_own_lease(tmp_path: Path, holder, caplog) -> None:
    """A holder that stops refreshing goes stale after ``stale_after_s``; once taken over, its release leaves the
    new holder's file alone."""
    first = holder(refresh_s=3600)  # alive, but silent
    last_sign_of_life = time.time() - 5  # its file's mtime: as if it had last refreshed it 5 s ago
    os.utime(tmp_path / "run" / LEASE_FILE, (last_sign_of_life, last_sign_of_life))
    with caplog.at_level(logging.WARNING, logger="snakedvc"):
        lease = CheckpointLease(tmp_path / "run", wait_s=0, stale_after_s=1).acquire()
    try:
        assert re.search(rf"pid {first.pid}: no sign of life for \d+ s \(stale after 1 s\)", caplog.text)
        ours = lease_in(tmp_path / "run")
        _, err = first.release()
        assert f"was no longer ours at release (now held by host {socket.gethostname()}, pid {os.getpid()})" in err
        assert lease_in(tmp_path / "run") == ours
    finally:
        lease.release()
    assert not (tmp_path / "run").exists()


def test_an_unreadable_lease_is_stale_only_once_it_is_a_few_seconds_old(tmp_path: Path, caplog) -> None:
    """An empty lease file is what a creator that died between creating and writing it leaves; a new one may be
    one that is being written."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LEASE_FILE).touch()
    now = time.time()
    os.utime(folder / LEASE_FILE, (now - 3, now - 3))
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="snakedvc"):
        lease = CheckpointLease(folder, wait_s=0).acquire()
    try:
        assert time.monotonic() - started >= 1.5  # waited for the file to be 5 s old
        assert "is unreadable (empty) but new: its creator may be writing it" in caplog.text
        assert re.search(r"took over the lease on .*: its file is unreadable \(empty\) and \d+ s old", caplog.text)
    finally:
        lease.release()


def test_lease_wait_option_defaults_to_the_lease_default() -> None:
    parser = argparse.ArgumentParser()
    add_resume_arguments(parser)
    assert parser.parse_args([]).lease_wait == DEFAULT_LEASE_WAIT_S
    assert parser.parse_args(["--lease-wait", "5"]).lease_wait == 5.0


# ---------------------------------------------------------------- Resumable: two trainings of one run


class StopAtOnce:
    """Stands in for a SIGTERM before the first step (this process's signal handlers stay pytest's)."""

    requested = True
    signum = signal.SIGTERM


def test_resumable_releases_its_lease_when_it_stops_not_only_at_exit(tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    stopping = Resumable({"lr": 1}, root=tmp_path, stop=StopAtOnce())
    stopping.load(model)
    assert stopping.store is not None
    assert lease_in(stopping.store.dir)["pid"] == os.getpid()
    with pytest.raises(TrainingStopped):
        for _ in stopping.steps(range(3), 0):
            pass
    assert not (stopping.store.dir / LEASE_FILE).exists()  # a retry may start before this process is gone
    retry = Resumable({"lr": 1}, root=tmp_path, stop=StopRequest(signals=()), lease_wait_s=0)
    assert retry.load(model).source == "checkpoint"
    for _ in retry.steps(range(3), 0):
        pass
    retry.finish()
    assert retry.store is not None and not retry.store.dir.exists()  # checkpoints gone, lease released


def test_a_second_training_of_the_same_run_refuses_then_waits_and_resumes(tmp_path: Path) -> None:
    """A training holds the run's checkpoint folder; a second one with a short --lease-wait fails naming it; a third
    that waits takes over once the first stops on SIGTERM (after its checkpoint) and resumes from it."""
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(256, 8, generator=generator)
    data = tmp_path / "data.pt"
    torch.save({"X": X, "y": X @ torch.randn(8, generator=generator)}, data)
    epochs = 60  # about 50 s with --step-sleep: still running when the third one starts
    key_dir = tmp_path / "ckpt" / "(the run's, once made)"  # the key holds the script's code: found below

    started: list[subprocess.Popen[bytes]] = []

    def launch(name: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
        (tmp_path / name).mkdir()
        log = tmp_path / name / "train.log"
        command = [
            sys.executable, str(REPO / "tests" / "test_resume.py"), "--data", str(data),
            "--out", str(tmp_path / name / "model.pt"), "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--epochs", str(epochs), *extra,
        ]  # fmt: skip
        with open(log, "wb") as handle:
            proc = subprocess.Popen(command, env=without_slurm(), stdout=handle, stderr=subprocess.STDOUT)
        started.append(proc)
        return proc, log

    def wait_for(text: str, log: Path, proc: subprocess.Popen[bytes]) -> None:
        wait_until(lambda: text in log.read_text(), f"{text!r} in {log}", 120, explain=log.read_text, proc=proc)

    first, first_log = launch("first", "--step-sleep", "0.05")  # about 0.8 s an epoch
    try:
        wait_for("epoch 0 loss", first_log, first)
        (key_dir,) = (tmp_path / "ckpt").iterdir()
        assert lease_in(key_dir)["pid"] == first.pid

        refused, refused_log = launch("refused", "--lease-wait", "1")
        assert refused.wait(timeout=120) == 1
        text = refused_log.read_text()
        assert "CheckpointBusy: checkpoint folder" in text
        assert f"host {socket.gethostname()}, pid {first.pid}, holding it for " in text
        assert "resumed from" not in text and "epoch 0 loss" not in text

        waiting, waiting_log = launch("waiting", "--lease-wait", "120")
        wait_for(
            f"is leased to host {socket.gethostname()}, pid {first.pid}; waiting up to 120 s", waiting_log, waiting
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 75, first_log.read_text()
        stopped = re.search(r"stopped on SIGTERM at epoch (\d+) step (\d+)", first_log.read_text())
        assert stopped, first_log.read_text()
        assert waiting.wait(timeout=300) == 0, waiting_log.read_text()
        text = waiting_log.read_text()
        assert f"resumed from epoch {stopped[1]} step {stopped[2]} (SIGTERM checkpoint" in text
        assert f"epoch {epochs - 1} loss" in text
        assert not key_dir.exists()  # checkpoints removed and the lease released at the end
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
