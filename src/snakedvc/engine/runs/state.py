"""What a run is doing: its state and why, its SLURM jobs, its trainings' progress, a failure's reason."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from snakedvc import slurm
from snakedvc.engine.runs.record import ACTIVE_STATES, RUN_RECORD, RUNS_DIR, Run, RunError, this_host
from snakedvc.live import JOBS_BEGAN, METRICS_FILE, Progress, find_logs, read_progress
from snakedvc.slurm import SlurmUnavailable

# --- watching -------------------------------------------------------------------------------
_PROGRESS = re.compile(r"(\d+) of (\d+) steps \(")
# The last row of Snakemake's "Job stats:" table, printed before the first job: "total   3" (in
# that table only: a stage's `ls -l` prints "total 12" too).
_PLANNED = re.compile(r"^Job stats:\n(?:[^\n]*\n)*?total\s+(\d+)$", re.MULTILINE)
# Snakemake's SLURM executor: "Job 3 has been submitted with SLURM jobid 1234 (log: .../rule_<name>/<wildcards>/1234.log)."
_SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+)(?: \(log: ([^)]*)\))?")


def list_runs(root: Path) -> list[Run]:
    folder = root / RUNS_DIR
    if not folder.is_dir():
        return []
    runs = []
    for record in sorted(folder.glob(f"*/{RUN_RECORD}")):
        with contextlib.suppress(RunError):
            runs.append(Run.load(record.parent))
    return runs


def find_run(root: Path, key: str) -> Run:
    """A run by id, id prefix or name."""
    if not key.strip():
        raise RunError("give a run: its id, an id prefix or its name (`snakedvc runs` lists them)")
    runs = list_runs(root)
    matches = [r for r in runs if r.id == key or r.name == key] or [r for r in runs if r.id.startswith(key)]
    if not matches:
        raise RunError(f"no run {key!r} in {root / RUNS_DIR} (`snakedvc runs` lists them)")
    if len(matches) > 1:
        raise RunError(f"{key!r} names several runs ({', '.join(r.id for r in matches)}): give the full id")
    return matches[0]


def squeue_states(jobids: Sequence[str]) -> dict[str, str]:
    """SLURM job id -> state, for those of ``jobids`` still queued or running; SlurmUnavailable
    when SLURM does not answer (within QUERY_TIMEOUT_S): a silent SLURM is not an empty queue."""
    if not jobids or not slurm.can_query():
        return {}
    return slurm.queued(jobids)


def controller_alive(run: Run) -> bool:
    """Whether the run's controller is queued or running; SlurmUnavailable when SLURM cannot say."""
    if run.slurm:
        return bool(run.controller_jobs) and bool(squeue_states(run.controller_jobs[-1:]))
    if not run.controller_pid or run.controller_host != this_host():
        return False
    try:
        os.kill(run.controller_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current_state(run: Run) -> str:
    """The recorded state; "lost" for an active run whose controller is gone; "unknown" for an
    active run whose controller SLURM cannot tell about now (see state_and_why)."""
    return state_and_why(run)[0]


# SLURM's silence is learnt once per half minute: `snakedvc runs` with ten runs waits one timeout,
# not ten. (monotonic time, what SLURM said)
_silent_slurm: list[tuple[float, str]] = []
SILENCE_REMEMBERED_S = 30


def state_and_why(run: Run) -> tuple[str, str]:
    """(state, why): why says what "unknown" rests on (SLURM's error), "" otherwise."""
    if run.state not in ACTIVE_STATES:
        return run.state, ""
    if run.queued and run.attempt == 0:  # waiting in the queue: no controller yet
        return run.state, ""
    if run.slurm and _silent_slurm and time.monotonic() - _silent_slurm[-1][0] < SILENCE_REMEMBERED_S:
        said = _silent_slurm[-1][1]
    else:
        try:
            alive = controller_alive(run)
        except SlurmUnavailable as e:
            said = str(e)
            _silent_slurm.append((time.monotonic(), said))
        else:
            said = ""
    if said:
        return "unknown", f"{said}; its controller job {run.controller_jobs[-1]} may be alive"
    if alive:
        return run.state, ""
    # The record may have changed since it was read (the controller just finished).
    fresh = Run.load(run.dir)
    if fresh.state in ACTIVE_STATES:
        return "lost", ""
    return fresh.state, ""


def progress(run: Run) -> tuple[int, int] | None:
    """(steps done, steps total) from Snakemake's last progress line in the controller log, or its
    job stats' total (0 done) where that came after it: a run whose first step has not ended."""
    text = _read(run.log)
    found = list(_PROGRESS.finditer(text))
    planned = list(_PLANNED.finditer(text))
    if planned and (not found or planned[-1].start() > found[-1].start()):
        return 0, int(planned[-1][1])
    return (int(found[-1][1]), int(found[-1][2])) if found else None


def slurm_jobs(run: Run) -> list[str]:
    """SLURM job ids the run's controllers submitted (from their log)."""
    return list(submitted_slurm_jobs(_read(run.log)))


def submitted_slurm_jobs(log_text: str) -> dict[str, str]:
    """SLURM job id -> its job log's path ("" where the line names none), in order of submission,
    from the SLURM executor's lines in a Snakemake log."""
    return dict(_SUBMITTED.findall(log_text))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


NOTHING_TO_BE_DONE = "Nothing to be done"
_RULE_ERROR = re.compile(r"^Error in rule (\S+?):\n((?:    .*\n?)*)", re.MULTILINE)
_HOOK_ERROR = re.compile(
    r"^(\w+) in file \"[^\"]*\", line \d+:\n((?:(?!  File ).*\n)+)\s+File [^\n]*, in __on(success|error)",
    re.MULTILINE,
)


def failure_reason(log_text: str, workspace: Path, lines: int = 10) -> dict[str, Any]:
    """Why a run failed, from Snakemake's output: the failing step (a rule, or the end-of-run hook
    that saves the experiment), its command and log, and the log's last ``lines`` lines."""
    rules = list(_RULE_ERROR.finditer(log_text))
    if rules:
        found = rules[-1]
        block = found.group(2)
        logs = re.search(r"^    log: (.*?)(?: \(check log file\(s\) for error details\))?$", block, re.MULTILINE)
        paths = [p.strip() for p in logs.group(1).split(",")] if logs else []
        shell = re.search(r"^    shell:\n((?:        .*\n?)*)", block, re.MULTILINE)
        command = [line.strip() for line in (shell.group(1) if shell else "").splitlines()]
        message = re.search(r"^    message: (.*)$", block, re.MULTILINE)
        tail = _read(workspace / paths[0]).splitlines()[-lines:] if paths else []
        return {
            "step": f"rule {found.group(1)}",
            "message": message.group(1) if message and message.group(1) != "None" else "",
            "command": " ".join(line for line in command if line and not line.startswith("(")),
            "log": paths[0] if paths else "",
            "tail": tail,
        }
    hooks = list(_HOOK_ERROR.finditer(log_text))
    if hooks:
        found = hooks[-1]
        first, *rest = found.group(2).strip().splitlines()
        return {"step": f"end of run (on{found.group(3)}: saving the experiment)", "message": f"{found.group(1)}: {first}",
                "command": "", "log": "", "tail": rest[-lines:]}  # fmt: skip
    return {"step": "", "message": "", "command": "", "log": "", "tail": log_text.strip().splitlines()[-lines:]}


def training_progress(run: Run, limit: int = 5) -> list[Progress]:
    """The run's trainings as their dvclive folders say (snakedvc.live), most recently written first."""
    if not run.workspace.is_dir():
        return []
    # Folders written since the run's jobs began: those linked in from earlier runs, or checked
    # out or pulled by DVC before its jobs (an earlier experiment's), are not live.
    began = run.created
    with contextlib.suppress(OSError):
        began = max(began, (run.workspace / JOBS_BEGAN).stat().st_mtime)
    found = (read_progress(folder) for folder in find_logs(run.workspace) if _written_since(folder, began))
    return [p for p in found if p is not None][:limit]


def _written_since(folder: Path, moment: float) -> bool:
    try:
        return (folder / METRICS_FILE).stat().st_mtime >= moment
    except OSError:
        return False


def describe(run: Run) -> dict[str, Any]:
    done = progress(run)
    state, why = state_and_why(run)
    training = training_progress(run) if state in ACTIVE_STATES else []
    return {
        "id": run.id,
        "name": run.name,
        "state": state,
        "jobs": f"{done[0]}/{done[1]}" if done else "-",
        "slurm_jobs": slurm_jobs(run),
        "controller": (
            ",".join(run.controller_jobs) if run.slurm else (f"pid {run.controller_pid}" if run.controller_pid else "-")
        ),
        "started": dt.datetime.fromtimestamp(run.created).strftime("%Y-%m-%d %H:%M:%S"),
        "experiments": run.experiments,
        "note": why or run.note,
        "reason": run.reason if state == "failed" else {},
        # Live progress of a running run's trainings: folder (in its workspace), epoch, latest metrics.
        "training": [
            {
                "log": str(p.directory.relative_to(run.workspace)),
                "epoch": p.epoch,
                "metrics": p.metrics,
                "updated": p.updated,
                "summary": p.describe(),
            }
            for p in training
        ],
    }


def format_runs(runs: Sequence[Run]) -> str:
    header = ("RUN", "NAME", "STATE", "JOBS", "STARTED", "CONTROLLER", "SLURM JOBS", "EXPERIMENT")
    rows = [header]
    described = [describe(run) for run in runs]
    for d in described:
        rows.append((
            d["id"], d["name"], d["state"], d["jobs"], d["started"], d["controller"],
            ",".join(d["slurm_jobs"][-5:]) or "-", ",".join(d["experiments"]) or "-",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(rows[0], widths, strict=True)).rstrip()]
    for row, d in zip(rows[1:], described, strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        # Under a running run: each training's latest epoch, read from its dvclive folder.
        lines += [f"    {t['log']}: {t['summary']}" for t in d["training"]]
        if d["note"]:
            lines.append(f"    {d['note']}")
        lines += describe_failure(d["reason"])
    return "\n".join(lines)


def describe_failure(reason: dict[str, Any]) -> list[str]:
    """A failed run's reason as indented lines under its row."""
    if not reason:
        return []
    said = [f"    failed in {reason['step'] or 'snakemake'}" + (f": {reason['message']}" if reason["message"] else "")]
    if reason["command"]:
        said.append(f"    command: {reason['command']}")
    if reason["log"]:
        said.append(f"    log: {reason['log']} (in the run's workspace), last lines:")
    said += [f"      | {line}" for line in reason["tail"]]
    return said


def follow(path: Path, run: Run, poll: float = 1.0) -> Iterator[str]:
    """The log's text as it grows, until the run has finished."""
    position = 0
    while True:
        text = _read(path)
        if len(text) > position:
            yield text[position:]
            position = len(text)
        if current_state(run) not in {*ACTIVE_STATES, "unknown"}:
            rest = _read(path)[position:]
            if rest:
                yield rest
            return
        time.sleep(poll)
