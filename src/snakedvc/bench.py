"""Helpers for the benchmark scripts: timing commands and writing docs/benchmarks.md sections.

Each script owns one section, delimited by HTML comments, and rewrites only that
section, so figures from different scripts live side by side in one file.
"""

from __future__ import annotations

import platform
import re
import subprocess
import time
from pathlib import Path

HEADER = "# Benchmarks\n\nFigures written by the scripts named in each section; rerun them to refresh.\n"


def timed(cmd: list[str], cwd: Path | str) -> float:
    """Wall seconds of a command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed


def machine() -> str:
    import os

    return f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_section(path: Path | str, name: str, body: str) -> None:
    path = Path(path)
    text = path.read_text() if path.exists() else HEADER
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
