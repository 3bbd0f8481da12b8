"""A foreground run's SIGTERM reaches its local jobs (issue 50).

Snakemake's own SIGTERM handler only stops scheduling: "Will exit after finishing currently running
jobs". Run locally, a training job went on for hours, and the run saved nothing and said nothing.
The kit's ``onstart`` chains a handler in front of Snakemake's (the process's handler, through
``signal``; Snakemake's is called as it was): every process the run started here gets the SIGTERM
too (a ``Resumable`` training checkpoints and exits 75, as under SLURM), then Snakemake's handler
waits for them, removes the unfinished jobs' outputs and fails the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

STOPPING = (
    "SIGTERM: stopping this run's {count} local job process(es). Kept: the outputs of the jobs that had "
    "finished, and a training's checkpoint (rerun the same command to resume from it); the unfinished jobs' "
    "outputs are removed and no experiment is saved."
)


def forward_sigterm_to_local_jobs(workflow: Any, say: Any) -> None:
    """Chain the handler (a run whose jobs run here, in the main thread; else nothing)."""
    if not getattr(workflow, "local_exec", False) or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    main = os.getpid()

    def on_term(signum: int, frame: FrameType | None) -> None:
        started = descendants(main)
        for pid in started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        say(STOPPING.format(count=len(started)))
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


def descendants(root: int, proc: Path = Path("/proc")) -> list[int]:
    """Every living process below ``root`` (Linux's /proc; none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(entry)
            if fields is None:  # ended meanwhile
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def started_at(pid: int, proc: Path = Path("/proc")) -> str | None:
    """When process ``pid`` started (clock ticks since boot): with its pid, it names one process, not
    a later one given the same pid. None where it has ended (or there is no /proc)."""
    fields = _stat_fields(proc / str(pid))
    return fields[19] if fields is not None else None


def _stat_fields(entry: Path) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (state, ppid, ... : field 3 onwards)."""
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
