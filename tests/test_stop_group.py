"""A stopped `snakedvc exp run` stops its stages' commands too, even where Snakemake does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from snakedvc.engine.dvcpipeline.run import stop_group
from tests.waiting import wait_until

# A Snakemake that ignores the stop (as one starved of CPU past the kit's wait), whose job's command
# runs in a session of its own, out of the group's reach.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "300"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_command_that_outlives_its_stopped_snakemake_is_killed(tmp_path: Path) -> None:
    noted = tmp_path / "child.pid"
    process = subprocess.Popen([sys.executable, "-c", STUBBORN, str(noted)], start_new_session=True)
    try:
        child = int(wait_until(lambda: noted.is_file() and noted.read_text(), "the job's command to start", 60))
        stop_group(process, wait_s=1)
        assert process.returncode is not None
        wait_until(lambda: not alive(child), "the job's command to be gone", 30)
    finally:
        for pid in (process.pid, int(noted.read_text()) if noted.is_file() and noted.read_text() else 0):
            if pid and alive(pid):
                os.kill(pid, 9)


# `snakedvc exp run` starting Snakemake when a stop comes (a cancel while the run is being set up):
# the stop lands inside Popen, while the child is between fork and exec.
STOPPED_WHILE_STARTING = """
import os, signal, subprocess, sys, time
from snakedvc.engine.dvcpipeline.run import start_and_follow

class StoppedWhileStarting(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        parent = os.getpid()
        def stop_the_parent():
            open(sys.argv[1], "w").write(str(os.getpid()))  # the child, Snakemake to be
            os.kill(parent, signal.SIGINT)
            time.sleep(0.5)
        super().__init__(*args, preexec_fn=stop_the_parent, **kwargs)

subprocess.Popen = StoppedWhileStarting

class Books:
    def step(self): pass
    def stop_waiting(self, why): pass
    def heartbeat_file(self):
        import pathlib
        return pathlib.Path(sys.argv[1]).with_name("alive")

try:
    start_and_follow(["sleep", "300"], {"start_new_session": True}, Books(), None)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_a_stop_while_snakemake_is_being_started_stops_it_too(tmp_path: Path) -> None:
    """A cancel that reached `snakedvc exp run` inside Popen raised there: the Snakemake it was
    starting, in a session of its own, was lost and ran the stages with nobody to stop it (issue 51:
    an orphaned Snakemake submitted the train job after `cancel --remote` said cancelled)."""
    noted, said = tmp_path / "child.pid", tmp_path / "stderr"
    with open(said, "w") as stderr:  # not a pipe: a lost Snakemake would hold it open
        proc = subprocess.run([sys.executable, "-c", STOPPED_WHILE_STARTING, str(noted)], stderr=stderr, timeout=120)
    child = int(noted.read_text())
    try:
        assert proc.returncode == 130, said.read_text()[-2000:]
        wait_until(lambda: not alive(child), "the Snakemake being started to be stopped too", 30)
    finally:
        if alive(child):
            os.kill(child, 9)
