"""Progress of long work: a tqdm bar where a person watches a terminal, plain lines elsewhere.

    for chunk in progress(chunks, total=n_rows, unit="molecules", desc="featurise test", weight=len):
        ...

A bar is drawn only when the stream is a terminal and the process is not a SLURM job (a batch
job's stderr is a file even when it looks otherwise). Everywhere else (a rule's log file, SLURM's
job log, a pipe) it writes one line at most every ``every_s`` seconds and one at the end, so a
log holds a readable record instead of carriage-return noise.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TypeVar

from snakedvc import slurm

T = TypeVar("T")

__all__ = ["progress", "wants_bar"]


def wants_bar(stream: IO[str], environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """A live bar only for a person at a terminal: not under SLURM, not into a file or pipe."""
    if slurm.job_id(environ) or environ.get("SNAKEDVC_PROGRESS") == "lines":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress(
    items: Iterable[T],
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    weight: Callable[[T], int] | None = None,
    stream: IO[str] | None = None,
    every_s: float = 30.0,
) -> Iterator[T]:
    """Yield ``items``, reporting how far along they are; ``weight(item)`` counts an item as that
    many units (a chunk of rows), ``total`` is in those units."""
    out = stream or sys.stderr
    size = weight or (lambda _item: 1)
    if wants_bar(out):
        from tqdm import tqdm

        with tqdm(total=total, desc=desc, unit=unit, file=out, unit_scale=True, dynamic_ncols=True) as bar:
            for item in items:
                yield item
                bar.update(size(item))
        return
    done, start = 0, time.monotonic()
    last = start
    for item in items:
        yield item
        done += size(item)
        now = time.monotonic()
        if now - last >= every_s:
            out.write(_line(desc, done, total, unit, now - start) + "\n")
            out.flush()
            last = now
    out.write(_line(desc, done, total, unit, time.monotonic() - start, finished=True) + "\n")
    out.flush()


def _line(desc: str, done: int, total: int | None, unit: str, seconds: float, finished: bool = False) -> str:
    rate = done / seconds if seconds > 0 else 0.0
    share = f" ({done / total:.1%})" if total else ""
    of = f"/{total}" if total else ""
    head = f"{desc}: " if desc else ""
    state = "done, " if finished else ""
    return f"{head}{state}{done}{of} {unit}{share} in {seconds:.0f} s, {rate:.0f} {unit}/s"
