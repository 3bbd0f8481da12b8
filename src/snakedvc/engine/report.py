"""One HTML file per run (and per sweep) that a person opens: `snakedvc report`.

What it shows, all read from files the run left (the project's dvc.yaml says which):
the metrics files (a table; each value carries ``data-metric="<file>:<key>"``), every dvclive
folder's curves, the image plots dvc.yaml lists, the job DAG
(``snakemake --dag`` through graphviz), the resources each job used (Snakemake's benchmark files;
on SLURM, sacct's elapsed time, CPU efficiency and MaxRSS of the jobs in Snakemake's last log),
and for a sweep its rungs, every trial's curves and the winner.

Self-contained: images are embedded as data URIs, the DAG as inline SVG, no script and nothing
fetched, so it opens from a cluster's shared filesystem or an e-mail attachment without a network
(``dvc plots show`` pages load Vega from a CDN; Snakemake's ``--report`` needs ``report()`` markup
on each rule's outputs and renders them in a JavaScript app).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from snakedvc import slurm
from snakedvc.engine.env import python_module
from snakedvc.engine.page import cell, curves_png, figure, read_curves, table
from snakedvc.engine.records import dvc_yaml_entries, read_record, within
from snakedvc.engine.runs.state import submitted_slurm_jobs
from snakedvc.io import atomic_path
from snakedvc.live import METRICS_FILE, find_logs
from snakedvc.slurm import ACTIVE_STATES

# Accounting hears of a job's end a moment after Snakemake does (snakedvc-slurm sees the exit code
# the batch script leaves), so a report written straight after a run waits a little for it.
ACCOUNTING_SETTLE_S = 20.0

IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}


@dataclass
class Report:
    title: str
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # file -> flattened values
    params: dict[str, Any] = field(default_factory=dict)
    curves: list[tuple[str, bytes]] = field(default_factory=list)  # (caption, PNG)
    images: list[tuple[str, str, bytes]] = field(default_factory=list)  # (path, MIME type, bytes)
    dag_svg: str = ""
    dag_note: str = ""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    jobs_source: str = ""
    sweep: str = ""  # the sweep section's HTML
    note: str = ""  # said under the title: where the report's figures come from
    run: dict[str, Any] = field(default_factory=dict)  # which run: the header's rows


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def read_structured(path: Path) -> Any:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def plot_image_paths(entries: Iterable[Any]) -> list[str]:
    """The image files among dvc.yaml's plots (an entry is a path, or {path: options})."""
    found = []
    for entry in entries:
        name = entry if isinstance(entry, str) else next(iter(entry), "") if isinstance(entry, dict) else ""
        if Path(name).suffix.lower() in IMAGE_TYPES:
            found.append(name)
    return found


_JOB_BLOCK = re.compile(
    r"^\[(?P<when>[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ [\d:]+ \d{4})\]\n(?:local)?(?:rule|checkpoint) (?P<rule>[\w.]+):\n"
    r"(?P<body>(?:    .*\n)+)",
    re.MULTILINE,
)
_FINISHED = re.compile(r"^\[(?P<when>[^\]\n]+)\]\nFinished jobid: (?P<jobid>\d+)", re.MULTILINE)
_SUBMITTED_JOB = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")


def _log_time(text: str) -> float:
    return dt.datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y").timestamp()


def log_jobs(log_text: str) -> list[dict[str, Any]]:
    """Every job of a Snakemake log, in order: rule, wildcards, Snakemake's job id, its benchmark file,
    when it was started (locally) or submitted (SLURM) and when it finished (None if it did not), and
    the SLURM job id where it was one. A job retried appears once, with its last attempt."""
    jobs: dict[str, dict[str, Any]] = {}
    for block in _JOB_BLOCK.finditer(log_text):
        fields = dict(re.findall(r"^    (\w+): (.*)$", block.group("body"), re.MULTILINE))
        jobid = fields.get("jobid", "")
        jobs[jobid] = {
            "rule": block.group("rule"),
            "wildcards": fields.get("wildcards", ""),
            "jobid": jobid,
            "benchmark": fields.get("benchmark", ""),
            "started": _log_time(block.group("when")),
            "finished": None,
            "slurm_job": "",
        }
    for found in _FINISHED.finditer(log_text):
        if found.group("jobid") in jobs:
            jobs[found.group("jobid")]["finished"] = _log_time(found.group("when"))
    for jobid, slurm_job in _SUBMITTED_JOB.findall(log_text):
        if jobid in jobs:
            jobs[jobid]["slurm_job"] = slurm_job
    return list(jobs.values())


def benchmark_row(path: Path) -> dict[str, Any]:
    """The last line of a Snakemake benchmark file: wall and CPU seconds, max RSS (MB); {} if unreadable."""
    try:
        lines = path.read_text().splitlines()
        row = dict(zip(lines[0].split("\t"), lines[-1].split("\t"), strict=False))
        rss = row.get("max_rss", "")
        return {
            "elapsed_s": float(row["s"]),
            "cpu_s": float(row.get("cpu_time") or 0),
            "max_rss": f"{float(rss):.0f} MB" if rss not in ("", "NA", "-") else "-",
        }
    except (OSError, IndexError, KeyError, ValueError):
        return {}


def run_jobs(root: Path, jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row for every job of the run: its benchmark file's figures where the rule has ``benchmark:``,
    else the times in Snakemake's log (whole seconds, no CPU or memory figure)."""
    rows = []
    for job in jobs:
        measured = benchmark_row(root / job["benchmark"]) if job["benchmark"] else {}
        logged = job["finished"] - job["started"] if job["finished"] is not None else None
        rows.append({
            "job": " ".join(filter(None, [job["rule"], job["wildcards"]])),
            "elapsed_s": measured.get("elapsed_s", logged if logged is not None else "-"),
            "cpu_s": measured.get("cpu_s", "-"),
            "max_rss": measured.get("max_rss", "-"),
            "measured by": "benchmark file" if measured else "Snakemake's log",
        })  # fmt: skip
    return rows


def slurm_jobs(log_text: str) -> dict[str, str]:
    """SLURM job id -> what it ran ("featurise train", "group shards"), from the plugin's job log
    paths, .../rule_<rule>/<wildcards>/<id>.log or .../group_<group>/<id>.log ("" where a line names
    none). sacct's Comment holds the rule only where the cluster stores job comments."""
    jobs = {}
    for jobid, log in submitted_slurm_jobs(log_text).items():
        folders = Path(log).parent.parts if log else ()
        start = next((i for i, part in enumerate(folders) if part.startswith(("rule_", "group_"))), None)
        if start is None:
            jobs[jobid] = ""
            continue
        kind, _, name = folders[start].partition("_")
        jobs[jobid] = " ".join([name if kind == "rule" else f"group {name}", *folders[start + 1 :]])
    return jobs


def sacct_jobs(names: dict[str, str], settle_s: float = 0.0) -> list[dict[str, Any]]:
    """Per SLURM job: what it ran, state, elapsed, CPU time and efficiency, the largest MaxRSS of its steps.
    With ``settle_s`` (the run is over), asks again each second, for up to that long, while a job
    still shows as not ended or accounting does not list it yet."""
    job_ids = list(names)
    if not job_ids or not slurm.has_accounting():
        return []
    deadline = time.monotonic() + settle_s
    while True:
        rows = _sacct_rows(names)
        settled = len(rows) == len(job_ids) and not any(row["state"] in ACTIVE_STATES for row in rows)
        if settled or time.monotonic() >= deadline:
            return rows
        time.sleep(1)


def _sacct_rows(names: dict[str, str]) -> list[dict[str, Any]]:
    fields = ["JobID", "State", "ElapsedRaw", "TotalCPU", "AllocCPUS", "MaxRSS", "NNodes"]
    jobs: dict[str, dict[str, Any]] = {}
    for cells in slurm.accounting(list(names), fields):
        job, _, step = cells["JobID"].partition(".")
        if not step:
            jobs[job] = {
                "job": f"{job} {names.get(job, '')}".strip(),
                "state": cells["State"].split()[0] if cells["State"] else "",
                "elapsed_s": float(cells["ElapsedRaw"] or 0),
                "cpu_s": _seconds(cells["TotalCPU"]),
                "cpus": int(cells["AllocCPUS"] or 0),
                "nodes": cells["NNodes"],
                "rss_kb": 0.0,
            }
        elif job in jobs:
            jobs[job]["rss_kb"] = max(jobs[job]["rss_kb"], _kilobytes(cells["MaxRSS"]))
    rows = []
    for usage in jobs.values():
        wall_cpu = usage["elapsed_s"] * max(usage["cpus"], 1)
        rows.append({
            "job": usage["job"], "state": usage["state"], "elapsed_s": usage["elapsed_s"], "cpu_s": usage["cpu_s"],
            "cpu_efficiency": f"{usage['cpu_s'] / wall_cpu:.0%}" if wall_cpu else "-",
            "max_rss": f"{usage['rss_kb'] / 1024:.0f} MB" if usage["rss_kb"] else "-", "nodes": usage["nodes"],
        })  # fmt: skip
    return rows


def gather_frequency() -> str:
    """The cluster's accounting sampling interval, as `scontrol show config` says ("30 s"), or "?"."""
    value = slurm.config_value("JobAcctGatherFrequency") or "?"
    return f"{value} s" if value.isdigit() else value


def _seconds(text: str) -> float:
    """sacct's [D-]HH:MM:SS(.fff) or MM:SS.fff."""
    if not text:
        return 0.0
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (float(days) if days else 0.0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _kilobytes(text: str) -> float:
    units = {"K": 1.0, "M": 1024.0, "G": 1024.0**2}
    if not text:
        return 0.0
    if text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text) / 1024


def job_dag_svg(root: Path, snakemake_args: Sequence[str]) -> tuple[str, str]:
    """The run's job DAG as SVG, or "" and why not: graphviz's drawing of ``snakemake --dag`` (finished
    jobs dashed) where `dot` is installed, else the kit's own layered drawing of ``snakemake --d3dag``."""
    if shutil.which("dot") is None:
        return kit_dag_svg(root, snakemake_args)
    dag = subprocess.run(
        [*python_module("snakemake"), "--dag", "--nolock", "--quiet", "all", *snakemake_args],
        cwd=root,
        capture_output=True,
        text=True,
    )
    start = dag.stdout.find("digraph")
    if dag.returncode != 0 or start < 0:
        return "", f"snakemake --dag failed: {(dag.stderr or dag.stdout).strip()[-500:]}"
    svg = subprocess.run(["dot", "-Tsvg"], input=dag.stdout[start:], capture_output=True, text=True)
    if svg.returncode != 0:
        return "", f"dot failed: {svg.stderr.strip()[-500:]}"
    text = svg.stdout
    return text[text.find("<svg") :], ""


def kit_dag_svg(root: Path, snakemake_args: Sequence[str]) -> tuple[str, str]:
    """The job DAG drawn without graphviz: ``snakemake --d3dag`` laid out by layered_svg."""
    dag = subprocess.run(
        # --forceall: every job of the DAG with its edges (without it, jobs already done have none).
        [*python_module("snakemake"), "--d3dag", "--forceall", "--nolock", "--quiet", "all", *snakemake_args],
        cwd=root,
        capture_output=True,
        text=True,
    )
    start = dag.stdout.find("{")
    try:
        graph = json.loads(dag.stdout[start:]) if dag.returncode == 0 and start >= 0 else None
    except ValueError:
        graph = None
    if graph is None:
        return "", f"snakemake --d3dag failed: {(dag.stderr or dag.stdout).strip()[-500:]}"
    labels = {node["id"]: str(node["value"].get("label") or node["value"].get("rule")) for node in graph["nodes"]}
    edges = [(edge["u"], edge["v"]) for edge in graph.get("edges") or graph.get("links") or []]
    return layered_svg(labels, edges), "drawn by snakedvc (graphviz's dot is not installed)"


def layered_svg(labels: dict[int, str], edges: Sequence[tuple[int, int]]) -> str:
    """A DAG as SVG: each node one layer below its deepest input (longest path), nodes of a layer
    ordered by the mean position of their inputs, arrows from input to job. No graphviz needed."""
    inputs: dict[int, list[int]] = {node: [] for node in labels}
    for source, target in edges:
        inputs[target].append(source)
    layer: dict[int, int] = {}

    def depth(node: int) -> int:
        if node not in layer:
            layer[node] = 0  # guards a cycle (a DAG has none)
            layer[node] = 1 + max((depth(parent) for parent in inputs[node]), default=-1)
        return layer[node]

    for node in labels:
        depth(node)
    rows: dict[int, list[int]] = {}
    place: dict[int, float] = {}
    for node in sorted(labels, key=lambda n: (layer[n], labels[n], n)):
        rows.setdefault(layer[node], []).append(node)
    for index in sorted(rows):
        row = rows[index]
        row.sort(key=lambda n: (sum(place[p] for p in inputs[n]) / len(inputs[n]) if inputs[n] else 0.0, labels[n]))
        for position, node in enumerate(row):
            place[node] = float(position)
    width, height, gap_x, gap_y = 150, 34, 20, 36
    widest = max((len(row) for row in rows.values()), default=1)
    x = {n: 10 + place[n] * (width + gap_x) for n in labels}
    y = {n: 10 + layer[n] * (height + gap_y) for n in labels}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{20 + widest * (width + gap_x)}" '
        f'height="{20 + len(rows) * (height + gap_y)}" font-family="sans-serif" font-size="11">',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>',
    ]
    for source, target in edges:
        parts.append(
            f'<line x1="{x[source] + width / 2:.0f}" y1="{y[source] + height:.0f}" x2="{x[target] + width / 2:.0f}" '
            f'y2="{y[target]:.0f}" stroke="#666" marker-end="url(#arrow)"/>'
        )
    for node, label in labels.items():
        lines = label.split("\n")
        parts.append(
            f'<g><title>{html.escape(" ".join(lines))}</title><rect x="{x[node]:.0f}" y="{y[node]:.0f}" width="{width}" '
            f'height="{height}" rx="6" fill="#eef3fb" stroke="#4a6fa5"/>'
        )
        for i, line in enumerate(lines[:2]):
            parts.append(
                f'<text x="{x[node] + width / 2:.0f}" y="{y[node] + height / 2 + 4 - 6 * (min(len(lines), 2) - 1) + 12 * i:.0f}" text-anchor="middle">'
                f"{html.escape(line[:24])}</text>"
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _live_folders(root: Path, record: dict[str, Any] | None) -> set[Path]:
    """The run's dvclive folders: those among its output folders, and those beside its outputs that
    its jobs wrote while it ran (``Resumable(..., live="results/live")`` with no output declared
    for it: issue 50). Without a record, those under results/."""
    if record is None:
        return set(find_logs(root / "results")) if (root / "results").is_dir() else set()
    outputs = [root / p for p in record["outputs"]]
    found = {folder for base in outputs if base.is_dir() for folder in find_logs(base)}
    beside = {base.parent for base in outputs if base.parent != root and base.parent.is_dir()}
    started, finished = float(record.get("started") or 0), float(record.get("finished") or 0)
    for folder in {folder for base in beside for folder in find_logs(base)} - found:
        written = (folder / METRICS_FILE).stat().st_mtime
        if started <= written <= finished:
            found.add(folder)
    return found


def collect(root: Path, title: str, snakemake_args: Sequence[str] = (), sweep_dir: Path | None = None) -> Report:
    entries = dvc_yaml_entries(root)
    report = Report(title=title)
    record = read_record(root)
    if sweep_dir is not None and (record is None or root / str(record.get("sweep") or "") != sweep_dir):
        return _sweep_alone(report, root, sweep_dir, record)

    def ours(path: str) -> bool:
        """Only what the last run produced (its record); without a record, whatever the workspace holds."""
        return record is None or within(path, [*record["outputs"], record["params"]])

    if record is None:
        report.note = "No run record (.snakedvc/last-run.json): showing the files the workspace holds."
    else:
        report.run = run_header(record)
        report.note = _later_failed_run(root, record)
    for name in entries["metrics"]:
        path = root / str(name)
        if path.is_file() and ours(str(name)):
            report.metrics[str(name)] = flatten(read_structured(path))
    for name in entries["params"]:
        if isinstance(name, str) and (root / name).is_file() and ours(name):
            report.params.update(flatten(read_structured(root / name)))
    for folder in sorted(_live_folders(root, record)):
        relative = folder.relative_to(root)
        if sweep_dir and folder.is_relative_to(sweep_dir.parent):
            continue  # the sweep's trials, which the sweep section draws together
        curves = read_curves(folder)
        if curves:
            report.curves.append((str(relative), curves_png({str(relative): curves}, str(relative))))
    for name in plot_image_paths(entries["plots"]):
        path = root / name
        if path.is_file() and ours(name):
            report.images.append((name, IMAGE_TYPES[path.suffix.lower()], path.read_bytes()))
    report.dag_svg, report.dag_note = job_dag_svg(root, snakemake_args)
    report.jobs, report.jobs_source = job_resources(root)
    if sweep_dir:
        _add_sweep(report, root, sweep_dir)
    return report


def _add_sweep(report: Report, root: Path, sweep_dir: Path) -> None:
    """The sweep's section, and the winner's final evaluation (the sweep module's `final` folder)."""
    if not (sweep_dir / "summary.csv").is_file():
        return
    from snakedvc.engine.sweep.report import html_section

    report.sweep = html_section(sweep_dir)
    final = sweep_dir.parent / "final"
    # Without a final evaluation rule: the files the winner's last rung wrote (its trials/ folder).
    shown = sorted(final.glob("*")) if final.is_dir() else _winners_files(sweep_dir)
    for path in shown:
        name = str(path.relative_to(root))
        if path.suffix in (".json", ".yaml"):
            report.metrics[name] = flatten(read_structured(path))
        elif path.suffix.lower() in IMAGE_TYPES:
            report.images.append((name, IMAGE_TYPES[path.suffix.lower()], path.read_bytes()))


def _winners_files(sweep_dir: Path) -> list[Path]:
    """The files in the sweep report's folder of its winner (summary.csv's best row), if any."""
    import csv

    with (sweep_dir / "summary.csv").open(newline="") as rows:
        best = [row["trial"] for row in csv.DictReader(rows) if row.get("best", "").lower() in ("true", "1")]
    folder = sweep_dir / "trials" / best[0] if best else None
    return sorted(p for p in folder.glob("*") if p.is_file()) if folder and folder.is_dir() else []


def _sweep_alone(report: Report, root: Path, sweep_dir: Path, record: dict[str, Any] | None) -> Report:
    """A sweep that is not the last run's (`snakedvc report --sweep DIR` after another run): its section
    alone, under a header of its own, never under the last run's header, metrics or jobs."""
    last = ", ".join((record or {}).get("experiments") or []) or "none saved"
    report.note = (
        f"The sweep {sweep_dir.relative_to(root)} alone: it is not the last run of this workspace "
        f"(that run's experiments: {last}; `snakedvc report` shows it)."
    )
    _add_sweep(report, root, sweep_dir)
    if not report.sweep:
        report.note += f" It has no report yet ({sweep_dir / 'summary.csv'} is missing)."
    return report


def job_resources(root: Path) -> tuple[list[dict[str, Any]], str]:
    """A row per job of the last run, and where the figures come from: on SLURM accounting's
    (beside the job's own benchmark), else Snakemake's last log and the rules' benchmark files."""
    last_log = _latest_snakemake_log(root)
    run_over = "Complete log(s):" in last_log  # Snakemake's last line, after success or failure
    jobs = log_jobs(last_log)
    accounted = sacct_jobs(slurm_jobs(last_log), ACCOUNTING_SETTLE_S if run_over else 0.0)
    if accounted:
        # The job's own peak memory beside accounting's: sacct samples a job every
        # JobAcctGatherFrequency seconds, so a job shorter than that may show next to nothing.
        in_job = {job["slurm_job"]: benchmark_row(root / job["benchmark"]) for job in jobs if job["benchmark"]}
        for row in accounted:
            row["max_rss_in_job"] = in_job.get(row["job"].split()[0], {}).get("max_rss", "-")
        return accounted, (
            "sacct (SLURM jobs in Snakemake's last log). max_rss is accounting's, sampled every "
            f"{gather_frequency()} (JobAcctGatherFrequency): a job shorter than that may show next to nothing; "
            "max_rss_in_job is Snakemake's sampling of the batch script's processes, from the rule's benchmark "
            "file (a command that runs as a job step of its own, as snakedvc launch runs one in a SLURM job, is "
            "not among them: for those only accounting's figure exists)"
        )
    source = "Snakemake's last log: every job; figures from the rule's benchmark file where it has one"
    return run_jobs(root, jobs), source


def run_header(record: dict[str, Any]) -> dict[str, Any]:
    """Which run the report shows: its experiments, commit, what its command line changed, when, how it ended."""

    def when(seconds: Any) -> str:
        return dt.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S") if seconds else "?"

    changed = flatten(record.get("overrides") or {})
    return {
        "experiments": ", ".join(record.get("experiments") or []) or "none saved",
        "sweep": record.get("sweep") or "no",
        "commit": (record.get("commit") or "?")[:12],
        "params changed on the command line": ", ".join(f"{k}={v}" for k, v in changed.items()) or "none",
        "started": when(record.get("started")),
        "ended": when(record.get("finished")),
        "outcome": record.get("outcome", "?"),
    }


def _later_failed_run(root: Path, record: dict[str, Any]) -> str:
    """A note where a run that failed came after the recorded one (its Snakemake log is newer and
    says so): the page shows the last run that finished, which a reader must not take for it."""
    for path in sorted((root / ".snakemake" / "log").glob("*.snakemake.log"), reverse=True):
        if path.stat().st_mtime <= float(record.get("finished") or 0):
            break
        text = path.read_text(errors="replace")
        if "Error in rule" in text or "Exiting because a job execution failed" in text:
            return (
                f"A later run did not finish (its Snakemake log: {path.relative_to(root)}); this page shows the last "
                "run that did, and no experiment was saved for the later one."
            )
    return ""


def _latest_snakemake_log(root: Path) -> str:
    """The newest of Snakemake's logs that ran jobs (dry runs and --dag leave logs too)."""
    for path in sorted((root / ".snakemake" / "log").glob("*.snakemake.log"), reverse=True):
        text = path.read_text(errors="replace")
        if "Finished job" in text:
            return text
    return ""


STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} .meta{color:#666} table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f3f3f3} tr.best td{background:#fff4c2;font-weight:600} figure{margin:1em 0}
figure img{max-width:100%;border:1px solid #ddd} figcaption{color:#555;font-size:.9em}
.dag svg{max-width:100%;height:auto} details{margin:.5em 0 1.5em}
"""


def render(report: Report) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(report.title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(report.title)}</h1>",
        f'<p class="meta">Written {dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")} by snakedvc report.</p>',
        f'<p class="meta" id="note">{html.escape(report.note)}</p>' if report.note else "",
    ]
    if report.run:
        rows = "".join(
            f'<tr><th>{html.escape(k)}</th><td data-run="{html.escape(k)}">{html.escape(str(v))}</td></tr>'
            for k, v in report.run.items()
        )
        parts.append(f'<table id="run"><tbody>{rows}</tbody></table>')
    parts.append('<h2 id="metrics">Metrics</h2>')
    if not report.metrics:
        parts.append("<p>(no metrics file of dvc.yaml was found)</p>")
    for name, values in report.metrics.items():
        rows = "".join(
            f'<tr><td>{html.escape(k)}</td><td data-metric="{html.escape(name)}:{html.escape(k)}">{cell(v)}</td></tr>'
            for k, v in values.items()
        )
        parts.append(f"<h3>{html.escape(name)}</h3><table><tbody>{rows}</tbody></table>")
    if report.sweep:
        parts.append(report.sweep)
    parts.append('<h2 id="curves">Training curves</h2>')
    none = "<p>(none: the sweep's trials are drawn above)</p>" if report.sweep else "<p>(none)</p>"
    parts += [figure(png, "image/png", f"dvclive: {caption}") for caption, png in report.curves] or [none]
    parts.append('<h2 id="plots">Plots</h2>')
    no_plots = "<p>(none: no image among the plots dvc.yaml names, e.g. a parity plot your evaluation writes)</p>"
    parts += [figure(data, mime, name) for name, mime, data in report.images] or [no_plots]
    parts.append('<h2 id="dag">Job DAG</h2>')
    parts.append(
        (
            f'<div class="dag">{report.dag_svg}</div>'
            + (f'<p class="meta">{html.escape(report.dag_note)}</p>' if report.dag_note else "")
        )
        if report.dag_svg
        else f"<p>{html.escape(report.dag_note)}</p>"
    )
    parts.append(f'<h2 id="resources">Resources used</h2><p class="meta">From {html.escape(report.jobs_source)}.</p>')
    parts.append(table(report.jobs))
    if report.params:
        param_rows = [{"param": k, "value": v} for k, v in report.params.items()]
        shown = table(param_rows)
        parts.append(
            f'<h2 id="params">Params</h2><details><summary>{len(param_rows)} values</summary>{shown}</details>'
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(
    root: Path | str,
    out: Path | str,
    title: str = "",
    snakemake_args: Sequence[str] = (),
    sweep_dir: Path | str | None = None,
) -> Path:
    base = Path(root).resolve()
    sweep = (base / sweep_dir) if sweep_dir else None
    report = collect(base, title or f"Run report: {base.name}", snakemake_args, sweep)
    target = base / out
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        tmp.write_text(render(report))
    return target
