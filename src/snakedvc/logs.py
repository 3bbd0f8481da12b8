"""Send a step's stderr and logging to its rule's `log:` file, first thing, so a failed job's log holds the error."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to(path: str | os.PathLike[str] | None, level: int = logging.INFO) -> None:
    """Append stderr (of this process and its children) and log records to ``path``.

    ``None`` keeps stderr where it is and only sets up logging. The file descriptor 2 itself
    is redirected, so tracebacks, warnings and subprocesses' stderr land there too.
    """
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    logging.basicConfig(level=level, format=FORMAT, stream=sys.stderr, force=True)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font-cache notes say nothing of the run


class _UnlessConfigured(logging.StreamHandler):
    """Writes the kit's records to stderr while the program has set up no logging of its own; once it
    has (a handler on the root logger), records reach that through propagation and this stays quiet."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        self.setStream(sys.stderr)  # the current one: log_to may have replaced it
        super().emit(record)


def show_kit_messages(level: int = logging.INFO) -> None:
    """Let the kit's INFO lines (checkpoint saved, resumed from, lease taken over) reach stderr, and so
    the rule's log, in a script that sets up no logging. Idempotent; called by the training helpers."""
    kit = logging.getLogger("snakedvc")
    if not any(isinstance(handler, _UnlessConfigured) for handler in kit.handlers):
        handler = _UnlessConfigured(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        kit.addHandler(handler)
    if kit.level == logging.NOTSET:
        kit.setLevel(level)


def keep_earlier_attempt_logs(job: Any) -> list[Path]:
    """Before attempt N of a retried job: move each of its rule logs (`log:`) that holds something
    to ``<stem>.attempt<N-1><suffix>`` (logs/train.log -> logs/train.attempt1.log), so the retry's
    fresh log does not erase what made the last attempt fail. Returns the kept files.

    Both of the kit's executors call it (snakedvc-local, snakedvc-slurm): one behaviour whichever
    runs the job. A group job's members keep theirs in their own run."""
    attempt = getattr(job, "attempt", 1)
    if attempt <= 1 or job.is_group():
        return []
    kept = []
    for log in job.log:
        path = Path(log)
        if path.is_file() and path.stat().st_size:
            earlier = path.with_name(f"{path.stem}.attempt{attempt - 1}{path.suffix}")
            path.replace(earlier)
            kept.append(earlier)
    return kept
