"""Which files a DVC stage's Python processes read: `snakedvc stage-run` puts this folder first on
PYTHONPATH, so every Python its commands start loads ``sitecustomize`` from here, which installs an
audit hook (PEP 578) noting each file opened for reading under the repository, with the time, in
the file ``SNAKEDVC_READS`` names. The submit host's plan says which of them another stage of the
run writes: a stage that read such a file before that stage finished ran on the wrong bytes (DVC
runs stages one at a time, so there it works by order alone), and runs again after it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# The file the hook appends to (JSON lines: {"path": absolute path, "t": time.time()}).
READS_ENV = "SNAKEDVC_READS"
# The repository whose files count (DVC_ROOT).
ROOT_ENV = "SNAKEDVC_READS_ROOT"


def hook_folder() -> str:
    """The folder to put first on PYTHONPATH (it holds sitecustomize.py)."""
    return str(Path(__file__).resolve().parent / "hook")


def read_log(path: Path) -> list[tuple[str, float]]:
    """The reads a stage's processes noted: (absolute path, time), in order; none where there is no file."""
    if not path.is_file():
        return []
    reads = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:  # a line cut short by a killed process
            continue
        reads.append((str(entry["path"]), float(entry["t"])))
    return reads


def environment(reads_file: Path, root: Path, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the hook on: its folder first on PYTHONPATH, where to write, what counts."""
    path = os.pathsep.join(filter(None, [hook_folder(), environ.get("PYTHONPATH", "")]))
    return {**environ, "PYTHONPATH": path, READS_ENV: str(reads_file), ROOT_ENV: str(root)}


def judge(
    name: str,
    reads: list[tuple[str, float]],
    run: list[str],
    outs: dict[str, list[str]],
    upstream: dict[str, list[str]],
    finished_at: dict[str, float | None],
) -> tuple[dict[str, str], dict[str, str]]:
    """What stage ``name`` read of the files other stages of the run write, undeclared: those read
    before their stage finished (``finished_at``: None, still running), from a stage before it in
    ``run`` (DVC's order: there it would have read that stage's new bytes), so it runs again after
    it; and the rest (read after, or from a stage DVC runs later), for a warning. Each {path: stage}."""
    order = {stage: index for index, stage in enumerate(run)}
    needed, todo = set(), list(upstream.get(name, []))
    while todo:  # the stages it depends on, declared: their outputs are whole before it starts
        stage = todo.pop()
        if stage not in needed:
            needed.add(stage)
            todo += upstream.get(stage, [])
    writers = [(out, stage) for stage in run if stage != name and stage not in needed for out in outs.get(stage, [])]
    premature: dict[str, str] = {}
    undeclared: dict[str, str] = {}
    for path, when in reads:
        writer = next((s for out, s in writers if path == out or path.startswith(out.rstrip(os.sep) + os.sep)), None)
        if writer is None:
            continue
        finished = finished_at.get(writer)
        before_it = order[writer] < order.get(name, len(order))
        if before_it and (finished is None or finished > when):
            premature[path] = writer
        else:
            undeclared[path] = writer
    return premature, undeclared
