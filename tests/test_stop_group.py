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
