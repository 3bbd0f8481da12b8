"""What `snakedvc exp run` shows on the terminal, as `dvc exp run` shows it: each stage's own
output (`Running stage 'x':`, `> cmd`, what the command prints), read from the stage's job log
as it grows, wherever the job runs. Stages that run side by side have their lines prefixed with
their name. Snakemake's own lines go to a log file of the run, and to the terminal only with -v.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

from snakedvc.engine.dvcpipeline.plan import Plan

# What a run shows: Snakemake's lines and the kit's notes (-v); the stages' output, as DVC shows
# it (the default); errors alone (-q).
VERBOSE, STAGES, QUIET = "verbose", "stages", "quiet"


class StageOutput:
    """Streams the job logs of a plan's stages; ``pump()`` prints what is new, ``drain()`` the rest."""

    def __init__(self, plan: Plan, root: Path, out: TextIO | None = None) -> None:
        self.plan, self.root = plan, root
        self.out = out or sys.stdout
        self._read: dict[str, int] = {}  # bytes of each stage's log already read
        self._partial: dict[str, bytes] = {}  # a line not yet ended
        self._done: set[str] = set()
        self._by_log = {Path(plan.log(name)).name: name for name in plan.run}
        self._by_marker = {Path(plan.ran(name)).name: name for name in plan.run}
        self._position = {name: index for index, name in enumerate(plan.run)}

    def pump(self, final: bool = False) -> None:
        logs = self._listing(Path(self.plan.log(self.plan.run[0])).parent) if self.plan.run else set()
        ran = self._listing(Path(self.plan.ran(self.plan.run[0])).parent) if self.plan.run else set()
        started = [self._by_log[log] for log in logs if log in self._by_log and self._by_log[log] not in self._done]
        finished = {self._by_marker[marker] for marker in ran if marker in self._by_marker}
        side_by_side = len([name for name in started if name not in finished]) > 1
        for name in sorted(started, key=self._position.__getitem__):
            ended = final or name in finished
            self._print(name, self._new_bytes(name), side_by_side, ended)
            if ended:
                self._done.add(name)
        self.out.flush()

    def drain(self) -> None:
        """Every line left, the stages' jobs all ended."""
        self.pump(final=True)

    def _listing(self, folder: Path) -> set[str]:
        try:
            return set(os.listdir(self.root / folder))
        except FileNotFoundError:
            return set()

    def _new_bytes(self, name: str) -> bytes:
        path = self.root / self.plan.log(name)
        try:
            with open(path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._read.get(name, 0):
                    self._read[name] = 0  # a retried job's new log (its last one was moved aside)
                handle.seek(self._read.get(name, 0))
                data = handle.read()
        except FileNotFoundError:  # moved aside as a job is retried: its next log comes
            return b""
        self._read[name] = self._read.get(name, 0) + len(data)
        return data

    def _print(self, name: str, data: bytes, prefixed: bool, ended: bool) -> None:
        text = self._partial.pop(name, b"") + data
        lines = text.split(b"\n")
        rest = lines.pop()  # after the last newline: a line still being written
        if rest and not ended:
            self._partial[name] = rest
        elif rest:
            lines.append(rest)
        for line in lines:
            said = line.decode(errors="replace")
            self.out.write(f"{name}| {said}\n" if prefixed else f"{said}\n")
