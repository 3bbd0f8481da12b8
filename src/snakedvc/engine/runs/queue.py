"""DVC's experiment queue as detached runs: `snakedvc exp run --queue` and `snakedvc queue ...`.

A queued experiment is a detached run (``submission``) made but not started: its code frozen
and its workspace made at queue time (as `dvc exp run --queue` stashes the workspace), its
controller not yet started. `queue start -j N` starts up to N of them; each controller, when it
ends, starts the next one while fewer than N run. So no process waits on the login node between
experiments (the queue's state is a file and the runs' records), and with a SLURM profile every
experiment's controller and stages are SLURM jobs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snakedvc.engine.runs.record import ACTIVE_STATES, RUN_REF_PREFIX, RUNS_DIR, Run, RunError, git
from snakedvc.engine.runs.state import current_state, list_runs
from snakedvc.engine.runs.workspace import locked

# The queue's settings: {"jobs": N, "started": bool}.
QUEUE_FILE = Path(".snakedvc") / "queue.json"
QUEUE_LOCK = Path(".snakedvc") / "queue.lock"


@dataclass(frozen=True)
class QueueSettings:
    jobs: int = 1
    started: bool = False


def _lock(root: Path) -> Any:
    (root / QUEUE_LOCK).parent.mkdir(parents=True, exist_ok=True)
    return locked(root / QUEUE_LOCK)


def settings(root: Path) -> QueueSettings:
    path = root / QUEUE_FILE
    if not path.is_file():
        return QueueSettings()
    data = json.loads(path.read_text())
    return QueueSettings(int(data.get("jobs", 1)), bool(data.get("started", False)))


def _write(root: Path, value: QueueSettings) -> None:
    path = root / QUEUE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"jobs": value.jobs, "started": value.started}) + "\n")
    partial.replace(path)


def sweeps(overrides: Sequence[str]) -> list[tuple[str, ...]]:
    """The -S values of each experiment a queued `exp run -S ...` makes: one, or one per point of a
    sweep in Hydra's syntax (`lr=0.1,0.2`, `range(1,4)`, `choice(a,b)`), DVC's own expansion."""
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import get_hydra_sweeps, to_hydra_overrides

    by_file = to_path_overrides(list(overrides))
    if not any(o.is_sweep_override() for changes in by_file.values() for o in to_hydra_overrides(changes)):
        return [tuple(overrides)]
    return [
        tuple(f"{path}:{o}" for path, changes in point.items() for o in changes) for point in get_hydra_sweeps(by_file)
    ]


def queued_runs(root: Path) -> list[Run]:
    """The runs of the queue, oldest first."""
    return sorted((run for run in list_runs(root) if run.queued), key=lambda run: run.created)


def waiting(run: Run) -> bool:
    """Queued and never started."""
    return run.queued and run.attempt == 0 and run.state == "queued"


def start(root: Path, jobs: int) -> list[Run]:
    """`queue start -j N`: the queue runs, N experiments at a time; the runs started now."""
    if jobs < 1:
        raise RunError(f"-j {jobs}: the number of experiments at a time is 1 or more")
    with _lock(root):
        _write(root, QueueSettings(jobs, True))
    return start_next(root)


def stop(root: Path) -> None:
    """`queue stop`: no queued experiment starts any more; the running ones finish."""
    with _lock(root):
        _write(root, QueueSettings(settings(root).jobs, False))


def start_next(root: Path) -> list[Run]:
    """Start queued experiments while fewer than the queue's N run (a controller calls this as it
    ends, `queue start` once): the ones started."""
    from snakedvc.engine.runs.submission import start_controller

    started: list[Run] = []
    with _lock(root):
        queue = settings(root)
        if not queue.started:
            return []
        runs = queued_runs(root)
        running = [run for run in runs if not waiting(run) and current_state(run) in ACTIVE_STATES]
        for run in [run for run in runs if waiting(run) and not run.cancel_requested]:
            if len(running) + len(started) >= queue.jobs:
                break
            started.append(start_controller(run))
    return started


def status(root: Path) -> list[dict[str, str]]:
    """What `dvc queue status` lists: each queued experiment's name, run id, created, status."""
    import time

    rows = []
    for run in queued_runs(root):
        state = current_state(run)
        shown = {"queued": "Queued" if waiting(run) else "Running", "running": "Running", "done": "Success"}
        rows.append({
            "name": run.name, "run": run.id,
            "created": time.strftime("%b %d, %Y %H:%M", time.localtime(run.created)),
            "status": shown.get(state, state.capitalize()),
        })  # fmt: skip
    return rows


def remove(root: Path, names: Sequence[str], every: bool = False, queued: bool = False, done: bool = False,
           failed: bool = False) -> list[str]:  # fmt: skip
    """`queue remove`: the named experiments (waiting or finished), or every one of the kinds
    asked; a running one is refused (`queue kill` stops it). The names removed."""
    from snakedvc.engine.runs.state import find_run
    from snakedvc.engine.runs.workspace import remove_workspace

    runs = queued_runs(root)
    chosen = [find_run(root, name) for name in names]
    for run in runs:
        state = current_state(run)
        if every or (queued and waiting(run)) or (done and state == "done") or (failed and state == "failed"):
            chosen.append(run)
    removed = []
    for run in {run.id: run for run in chosen}.values():
        if not run.queued:
            raise RunError(f"{run.name}: not an experiment of the queue (snakedvc runs lists it)")
        if not waiting(run) and current_state(run) in ACTIVE_STATES:
            raise RunError(f"{run.name} is running: `snakedvc queue kill {run.name}` stops it first")
        remove_workspace(run)
        shutil.rmtree(root / RUNS_DIR / run.id, ignore_errors=True)
        if waiting(run):  # its frozen code was only ever the queue's
            git(root, "update-ref", "-d", RUN_REF_PREFIX + run.id)
        removed.append(run.name)
    return removed
