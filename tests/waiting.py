"""The tests' one way to wait: poll for the event itself (a log line, a file, a state), with a deadline."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# A condition that costs time (a `snakedvc runs` or `squeue` in a subprocess, an ssh) is asked
# again only after a pause of at least this many times its cost: the tests' waiting takes at most
# a quarter of a core, where polling every 0.2 s took most of one on a 2-core machine and slowed
# the very runs it waited for. Cheap conditions (a file, a log line) are asked every ``poll`` s.
PAUSE_PER_COST = 3


def wait_until(
    condition: Callable[[], T],
    what: str,
    timeout: float,
    poll: float = 0.2,
    explain: Callable[[], str] | None = None,
    proc: subprocess.Popen[Any] | None = None,
) -> T:
    """``condition()``'s first truthy value, asked every ``poll`` s (or less often where asking costs
    time: see PAUSE_PER_COST). An AssertionError naming ``what``
    (and saying ``explain()``, e.g. a log's tail) if ``timeout`` s pass first, or at once if ``proc``
    has ended without it (with the process's output where it was piped)."""
    deadline = time.monotonic() + timeout
    while True:
        ended = proc is not None and proc.poll() is not None  # asked first: its last words count
        asked = time.monotonic()
        if found := condition():
            return found
        cost = time.monotonic() - asked
        if ended or time.monotonic() > deadline:
            break
        time.sleep(max(poll, PAUSE_PER_COST * cost))
    said = [explain()[-4000:]] if explain else []
    if proc is not None and ended:
        said += [text[-4000:] for text in _output(proc) if text]
        raise AssertionError(
            "\n".join([f"process {proc.pid} ended (exit code {proc.returncode}) while waiting for {what}", *said])
        )
    raise AssertionError("\n".join([f"timed out after {timeout:g} s waiting for {what}", *said]))


def _output(proc: subprocess.Popen[Any]) -> list[str]:
    """What an ended process wrote to its pipes (nothing where it wrote to a file)."""
    try:
        said = proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):  # a child still holds the pipe; already read
        return []
    return [text.decode(errors="replace") if isinstance(text, bytes) else text for text in said if text]


def text_of(path: Path) -> str:
    """A log as it stands ("" before it exists): for conditions and explanations."""
    return path.read_text(errors="replace") if path.exists() else ""
