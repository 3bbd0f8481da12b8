"""What `snakedvc ui` shows, read from what the kit already records; it keeps no database.

Runs are `snakedvc runs --json`'s rows (runs.describe); a run adds its dvclive curves, its SLURM
jobs and its log's end. Sweeps are read from their folders (the asha decision log, each
trial-rung's metrics and dvclive folder, the report once written). Experiments are
`dvc exp show -A`'s, read through DVC's command under the kit's lock, and read again only when a
git ref has moved; the curves of an experiment come from the dvclive files it committed.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from snakedvc import slurm
from snakedvc.engine.page import read_curves
from snakedvc.engine.runs.record import Run, RunError
from snakedvc.engine.runs.state import describe, find_run, list_runs, submitted_slurm_jobs
from snakedvc.live import PLOTS_DIR, find_logs

LOG_TAIL_LINES = 200


def runs(root: Path) -> list[dict[str, Any]]:
    """Every detached run of the project, newest first, as `snakedvc runs --json` lists them."""
    return [describe(run) for run in reversed(list_runs(root))]


def run(root: Path, run_id: str) -> dict[str, Any]:
    """One run: its row, each dvclive folder's curves, its SLURM jobs and the end of its log."""
    found = find_run(root, run_id)
    row = describe(found)
    curves = {}
    if found.workspace.is_dir():
        for folder in find_logs(found.workspace, skip=(".git", ".snakemake", ".dvc", ".snakedvc")):
            curves[str(folder.relative_to(found.workspace))] = _curves(folder)
    log = found.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] if found.log.is_file() else []
    given = found.snakemake_args if found.exp_run_args is None else found.exp_run_args  # its command line's own
    return {**row, "curves": curves, "log": log, "log_path": str(found.log), "workspace": str(found.workspace),
            "slurm": _slurm_jobs(found), "given": given}  # fmt: skip


def _slurm_jobs(found: Run) -> list[dict[str, str]]:
    """The run's SLURM jobs: rule (from its log's folder), state, elapsed time, nodes, log."""
    logs = submitted_slurm_jobs(found.log.read_text(errors="replace")) if found.log.is_file() else {}
    fields = ("JobID", "State", "Elapsed", "NodeList")
    accounted = {row["JobID"]: row for row in slurm.accounting(list(logs), fields) if "." not in row["JobID"]}
    kept = {jobid: log for jobid, log in logs.items() if log and _job_log_path(found, log).is_file()}
    return [
        {
            "id": jobid,
            "rule": _rule_of(log),
            "log": kept.get(jobid, ""),  # (the profile deletes a successful job's log)
            "state": accounted.get(jobid, {}).get("State", "?"),
            "elapsed": accounted.get(jobid, {}).get("Elapsed", ""),
            "nodes": accounted.get(jobid, {}).get("NodeList", ""),
        }  # fmt: skip
        for jobid, log in logs.items()
    ]


def _job_log_path(found: Run, log: str) -> Path:
    return Path(log) if Path(log).is_absolute() else found.workspace / log


def _rule_of(log: str) -> str:
    """The rule (or group) a SLURM job ran, from its log's folder (logs/slurm/rule_<rule>/<id>.log)."""
    folder = Path(log).parent.name if log else ""
    if folder.startswith("group_"):
        return f"group {folder.removeprefix('group_')}"
    return folder.removeprefix("rule_")


def job_log(root: Path, run_id: str, jobid: str) -> dict[str, Any]:
    """The end of one of the run's SLURM jobs' logs (only a log the run's controller log names)."""
    found = find_run(root, run_id)
    logs = submitted_slurm_jobs(found.log.read_text(errors="replace")) if found.log.is_file() else {}
    if not logs.get(jobid):
        raise RunError(f"run {run_id} names no log of SLURM job {jobid}")
    path = _job_log_path(found, logs[jobid])
    lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] if path.is_file() else ["(no such file)"]
    return {"path": str(path), "lines": lines}


def run_dag(root: Path, run_id: str) -> dict[str, str]:
    """A run's DAG as SVG, and a note: a workflow's jobs as the report draws them (``snakemake --dag``
    in the run's workspace, finished jobs dashed); a dvc.yaml's stages from the plan the run made,
    each that has run ticked."""
    from snakedvc.engine.report import job_dag_svg

    found = find_run(root, run_id)
    workspace = found.workspace
    if not workspace.is_dir():
        return {"svg": "", "note": f"no DAG: the run's workspace {workspace} is gone"}
    if found.exp_run_args is None:
        svg, note = job_dag_svg(workspace, found.snakemake_args)
        return {"svg": svg, "note": note}
    plans = sorted(workspace.glob(".snakedvc/pipeline/*/plan.json"), key=lambda path: path.stat().st_mtime)
    if not plans:
        return {"svg": "", "note": "no DAG yet: the run has not planned its stages"}
    return {"svg": _stages_svg(workspace, plans[-1]), "note": "the dvc.yaml's stages; ✓: has run"}


def _stages_svg(workspace: Path, plan_file: Path) -> str:
    from snakedvc.engine.dvcpipeline.plan import Plan
    from snakedvc.engine.report import layered_svg

    plan = Plan.load(plan_file)
    ids = {stage.name: index for index, stage in enumerate(plan.stages)}
    done = {stage.name for stage in plan.stages if (workspace / plan.ran(stage.name)).exists()}
    labels = {ids[stage.name]: stage.name + (" ✓" if stage.name in done else "") for stage in plan.stages}
    edges = [(ids[up], ids[stage.name]) for stage in plan.stages for up in stage.upstream if up in ids]
    return layered_svg(labels, edges)


def _curves(folder: Path) -> dict[str, list[list[float]]]:
    return {name: [[step, value] for step, value in points] for name, points in read_curves(folder).items()}


# --- sweeps ---------------------------------------------------------------------------------


def sweep_folders(root: Path) -> dict[str, Path]:
    """Sweep name -> its folder (``<dir>/<name>`` with trials/), in the project and in its runs' workspaces."""
    found: dict[str, Path] = {}
    patterns = ("*/sweeps/*/", "*/*/sweeps/*/", ".snakedvc/runs/*/workspace/*/sweeps/*/")
    # A sweep's folder has its plan from the run's start (finish.write_sweep_plan), its trials after.
    folders = {
        mark.parent for pattern in patterns for name in ("plan.json", "trials") for mark in root.glob(pattern + name)
    }
    for folder in sorted(folders):
        key = folder.name if folder.name not in found else str(folder.relative_to(root))
        found[key] = folder
    return found


def _trial_folders(folder: Path) -> list[Path]:
    trials = folder / "trials"
    return sorted(p for p in trials.iterdir() if p.is_dir()) if trials.is_dir() else []


def sweeps(root: Path) -> list[dict[str, Any]]:
    return [_sweep_row(name, folder) for name, folder in sweep_folders(root).items()]


def _sweep_row(name: str, folder: Path) -> dict[str, Any]:
    trials = {p.name for p in _trial_folders(folder)} | {str(t["trial"]) for t in _planned(folder)}
    return {
        "name": name,
        "folder": str(folder),
        "trials": len(trials),
        "ended": (folder / "report/summary.csv").is_file(),
    }


def sweep(root: Path, name: str) -> dict[str, Any]:
    """One sweep: each trial's rungs and metric, its fate and why (asha's log), curves, params."""
    folders = sweep_folders(root)
    if name not in folders:
        raise RunError(f"no sweep {name!r} in {root} (the page's Sweeps list names them)")
    folder = folders[name]
    trials = {p.name: _trial(p) for p in _trial_folders(folder)}
    summary = _summary(folder / "report/summary.csv")
    for planned in _planned(folder):  # each trial's params from the start (the report's, once written)
        trial = trials.setdefault(str(planned["trial"]), {"rungs": {}, "curves": {}})
        trial["params"] = dict(planned.get("overrides") or {})
    for row in summary:
        trial = trials.setdefault(str(row["trial"]), {"rungs": {}, "curves": {}})
        trial["params"] = {k: v for k, v in row.items() if "." in k}
        trial["best"] = str(row.get("best")).lower() == "true"
    fates, explained = _asha(folder, bool(summary))
    for trial_id, fate in fates.items():
        trials.setdefault(trial_id, {"rungs": {}, "curves": {}})["fate"] = fate
    metric = _sweep_metric(folder)
    return {"name": name, "folder": str(folder), "ended": bool(summary), "trials": trials, "explain": explained,
            "metric": metric}  # fmt: skip


def _planned(folder: Path) -> list[dict[str, Any]]:
    """The sweep's trials as its plan lists them (written by the run as it starts), valid ones."""
    with contextlib.suppress(OSError, ValueError):
        trials = json.loads((folder / "plan.json").read_text()).get("trials") or []
        return [trial for trial in trials if not trial.get("error")]
    return []


def _sweep_metric(folder: Path) -> str:
    """The metric the sweep ranks by (its plan, its report's, or the asha decision log's header)."""
    for source in (folder / "plan.json", folder / "report/plan.json", folder / "asha/decisions.jsonl"):
        with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
            first = json.loads(source.read_text().splitlines()[0] if source.suffix == ".jsonl" else source.read_text())
            return str(first["metric"])
    return ""


def _trial(folder: Path) -> dict[str, Any]:
    rungs: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    for rung in sorted(folder.glob("rung*"), key=lambda p: int(p.name[4:] or 0)):
        metrics = rung / "metrics.json"
        with contextlib.suppress(OSError, ValueError):
            rungs[rung.name[4:]] = json.loads(metrics.read_text())
        for live in rung.glob("*/" + str(PLOTS_DIR)):
            curves = _curves(live.parent.parent)  # the furthest rung's folder holds the whole curve
    return {"rungs": rungs, "curves": curves}


def _summary(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return list(csv.DictReader(io.StringIO(path.read_text())))


def _asha(folder: Path, ended: bool) -> tuple[dict[str, str], str]:
    """Each trial's fate as the asha decision log tells it (training, waiting or stopped at a rung,
    and why), and what `sweep-explain` says; nothing for the other strategies (their report tells it)."""
    log = folder / "asha" / "decisions.jsonl"
    if not log.is_file():
        return {}, ""
    from snakedvc.engine.sweep.decisions import read_log
    from snakedvc.engine.sweep.explain import explain

    try:
        header, events = read_log(log)
        text, _ = explain(log)
    except Exception as e:  # noqa: BLE001 - a log being appended to: read whole next time
        return {}, f"(the decision log is being written: {e})"
    fates: dict[str, str] = {}
    for event in events:
        if event["event"] == "decision" and event["action"] == "train":
            fates[event["trial"]] = f"training to rung {event['rung']} ({header.rungs[event['rung']]} epochs)"
    last = len(header.rungs) - 1
    for line in text.splitlines():
        if not (line.startswith("rung ") and "best first" in line):
            continue
        head, _, listed = line.partition(": ")
        rung = int(head.split()[1])
        entries = [entry.split() for entry in listed.split(", ") if entry.strip()]
        for rank, entry in enumerate(entries, 1):
            if len(entry) == 3 or fates.get(entry[0], "").startswith(f"training to rung {rung + 1}"):
                continue  # promoted: its fate is a later rung's
            where = f"rung {rung} ({header.rungs[rung]} epochs): ranked {rank} of {len(entries)} there"
            if rung == last:
                fates[entry[0]] = f"reached the last rung, {where}"
            else:
                verb = "stopped at" if ended else "waiting at"
                fates[entry[0]] = f"{verb} {where} (ASHA promotes the best 1 in {header.eta})"
    winner = text.splitlines()[-2] if ended else ""
    if winner.startswith("winner: ") and winner.split()[1] != "none":
        fates[winner.split()[1]] = f"winner ({fates.get(winner.split()[1], '')})"
    return fates, text


# --- DVC's experiments ----------------------------------------------------------------------


class Experiments:
    """`dvc exp show -A --json`, read again only when a git ref (or HEAD) moved since the last read.

    DVC reads every experiment's commit (about 10 s for 1,000 here): ``listing`` answers at once
    with what git names (experiments, baselines, dates) and DVC's params and metrics where it has
    read them, while DVC reads in the background (``complete`` says when it has)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamp = ""
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reading: threading.Thread | None = None
        self._error = ""

    def rows(self) -> list[dict[str, Any]]:
        """DVC's rows, current (read now if a ref moved)."""
        with self._lock:
            stamp = _refs_stamp(self.root)
            if stamp != self._stamp:
                self._rows, self._stamp = _exp_show(self.root), stamp
            return self._rows

    def listing(self) -> dict[str, Any]:
        stamp = _refs_stamp(self.root)
        with self._lock:
            if stamp == self._stamp:
                return {"rows": self._rows, "complete": True, "error": ""}
            if self._reading is None or not self._reading.is_alive():
                self._reading = threading.Thread(target=self._read, args=(stamp,), daemon=True)
                self._reading.start()
            known = {row["rev"]: row for row in self._rows}
        return {"rows": _git_listing(self.root, known), "complete": False, "error": self._error}

    def _read(self, stamp: str) -> None:
        try:
            rows = _exp_show(self.root)
        except RunError as e:
            self._error = str(e)
            return
        with self._lock:
            self._rows, self._stamp, self._error = rows, stamp, ""

    def compare(self, revs: list[str]) -> dict[str, Any]:
        """The picked experiments' params and metrics side by side (keys that differ marked) and curves."""
        picked = [row for row in self.rows() if row["rev"] in revs or row["name"] in revs]
        keys = {kind: sorted({k for row in picked for k in row[kind]}) for kind in ("params", "metrics")}
        differ = {
            kind: [k for k in keys[kind] if len({json.dumps(row[kind].get(k)) for row in picked}) > 1] for kind in keys
        }
        curves = {row["name"] or row["rev"][:7]: committed_curves(self.root, row["rev"]) for row in picked}
        return {"experiments": picked, "keys": keys, "differ": differ, "curves": curves}


def _refs_stamp(root: Path) -> str:
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(objectname) %(refname)"], cwd=root, capture_output=True, text=True
    ).stdout
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout
    return hashlib.sha1((out + head).encode()).hexdigest()


def _git_listing(root: Path, known: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The experiments as git names them (refs/exps/<baseline>/<name>), each baseline first; DVC's
    params and metrics where ``known`` (an earlier read) has them."""
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(objectname) %(refname) %(creatordate:iso-strict)", "refs/exps"],
        cwd=root, capture_output=True, text=True,
    ).stdout  # fmt: skip
    by_baseline: dict[str, list[dict[str, Any]]] = {}
    for line in out.splitlines():
        rev, ref, created = line.split(" ")
        parts = ref.split("/")
        if len(parts) != 5:  # refs/exps/ab/cdef.../name (not DVC's own exec or stash refs)
            continue
        baseline = parts[2] + parts[3]
        empty: dict[str, Any] = {"params": {}, "metrics": {}}
        row = {**empty, **known.get(rev, {}), "rev": rev, "name": parts[4], "baseline": baseline[:7],
               "is_baseline": False, "created": created}  # fmt: skip
        by_baseline.setdefault(baseline, []).append(row)
    # as DVC's listing: the workspace first
    rows: list[dict[str, Any]] = [{"params": {}, "metrics": {}, **known.get("workspace", {}), "rev": "workspace",
                                   "name": "", "baseline": "workspace", "is_baseline": True}]  # fmt: skip
    for baseline, experiments in by_baseline.items():
        first = known.get(baseline, {"params": {}, "metrics": {}, "name": ""})
        rows.append({**first, "rev": baseline, "baseline": baseline[:7], "is_baseline": True})
        rows += sorted(experiments, key=lambda row: str(row["created"]))
    return rows


def _exp_show(root: Path) -> list[dict[str, Any]]:
    from snakedvc.engine.tracking import repo_lock

    with repo_lock(root):
        proc = subprocess.run(
            [sys.executable, "-m", "dvc", "exp", "show", "-A", "--json"], cwd=root, capture_output=True, text=True
        )
    if proc.returncode != 0:
        raise RunError(f"dvc exp show -A --json failed in {root}: {proc.stderr.strip()[-2000:]}")
    rows = []
    for baseline in json.loads(proc.stdout or "[]"):
        rows.append(_exp_row(baseline, baseline, None))
        for experiment in baseline.get("experiments") or []:
            for rev in experiment.get("revs") or []:
                rows.append(_exp_row(rev, baseline, experiment.get("name")))
    return rows


def _exp_row(entry: dict[str, Any], baseline: dict[str, Any], name: str | None) -> dict[str, Any]:
    data = entry.get("data") or {}
    flat: dict[str, dict[str, Any]] = {"params": {}, "metrics": {}}
    for kind in flat:
        for file, content in (data.get(kind) or {}).items():
            for key, value in _flatten(content.get("data") or {}).items():
                flat[kind][f"{file}:{key}"] = value
    return {
        "rev": entry.get("rev", ""),
        "name": entry.get("name") or name or "",
        "baseline": baseline.get("name")
        or ("workspace" if baseline.get("rev") == "workspace" else baseline.get("rev", "")[:7]),
        "is_baseline": entry is baseline,
        "created": data.get("timestamp"),
        **flat,
    }


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def committed_curves(root: Path, rev: str) -> dict[str, list[list[float]]]:
    """The dvclive curves (plots/metrics/*.tsv) an experiment's commit holds, name -> [[step, value]]."""
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], cwd=root, capture_output=True, text=True)
    curves: dict[str, list[list[float]]] = {}
    for path in listed.stdout.splitlines():
        if f"/{PLOTS_DIR}/" not in f"/{path}" or not path.endswith(".tsv"):
            continue
        text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True).stdout
        name = path.split(f"{PLOTS_DIR}/", 1)[1].removesuffix(".tsv")
        curves[name] = _tsv_points(text)
    return curves


def _tsv_points(text: str) -> list[list[float]]:
    lines = text.splitlines()
    if not lines:
        return []
    header = lines[0].split("\t")
    step = header.index("step") if "step" in header else 0
    points = []
    for line in lines[1:]:
        cells = line.split("\t")
        with contextlib.suppress(ValueError, IndexError):
            points.append([float(cells[step]), float(cells[-1])])
    return points
