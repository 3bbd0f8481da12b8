"""snakedvc.progress: a tqdm bar on a real terminal (a pseudo-terminal here), plain lines in files
and under SLURM."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios

from snakedvc import progress
from snakedvc.progressbar import wants_bar


def test_a_log_file_gets_plain_lines_and_a_final_count() -> None:
    out = io.StringIO()
    chunks = [list(range(10))] * 5
    seen = list(progress(chunks, total=50, desc="featurise x.csv", unit="molecules", weight=len, stream=out, every_s=0))
    assert seen == chunks
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split(": ", 1)[1].split(" in ")[0] for line in lines] == [
        "10/50 molecules (20.0%)", "20/50 molecules (40.0%)", "30/50 molecules (60.0%)", "40/50 molecules (80.0%)",
        "50/50 molecules (100.0%)", "done, 50/50 molecules (100.0%)",
    ]  # fmt: skip


def test_quiet_between_intervals_and_without_a_total() -> None:
    out = io.StringIO()
    assert list(progress(range(1000), stream=out)) == list(range(1000))
    (line,) = out.getvalue().splitlines()  # only the final line within the 30 s interval
    assert line.startswith("done, 1000 it in ")


def read_all(leader: int) -> str:
    """Everything written to the pseudo-terminal (its other end closed: reads end with EIO)."""
    data = b""
    try:
        while chunk := os.read(leader, 65536):
            data += chunk
    except OSError:
        pass
    os.close(leader)
    return data.decode()


def test_a_terminal_gets_a_tqdm_bar() -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    with os.fdopen(follower, "w") as terminal:
        assert wants_bar(terminal, environ={})
        assert list(progress(range(5), total=5, desc="sweep report", stream=terminal)) == list(range(5))
    drawn = read_all(leader)
    assert "sweep report" in drawn and "\r" in drawn and "100%" in drawn and "5.00/5.00" in drawn


def test_no_bar_in_a_slurm_job_or_when_asked_for_lines() -> None:
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        assert not wants_bar(terminal, environ={"SLURM_JOB_ID": "42"})
        assert not wants_bar(terminal, environ={"SNAKEDVC_PROGRESS": "lines"})
    os.close(leader)
    assert not wants_bar(io.StringIO(), environ={})
