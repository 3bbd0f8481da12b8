"""The report's job DAG without graphviz, and its resources table: a row for every job of the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from snakedvc.engine.report import layered_svg, log_jobs

SNAKEFILE = """\
rule all:
    input: "b.txt"

rule a:
    output: "a.txt"
    benchmark: "logs/benchmarks/a.tsv"
    shell: "sleep 1.2; echo a > {output}"

rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "sleep 1.1; cp {input} {output}"
"""


def test_layered_svg_draws_each_job_below_its_inputs() -> None:
    svg = layered_svg({0: "all", 1: "fit", 2: "prepare", 3: "track\npath=x"}, [(2, 1), (1, 3), (1, 0), (3, 0)])
    boxes = {title: float(y) for title, y in re.findall(r'<title>([^<]+)</title><rect x="[\d.]+" y="([\d.]+)"', svg)}
    assert boxes["prepare"] < boxes["fit"] < boxes["track path=x"] < boxes["all"], boxes
    assert svg.count("<line ") == 4 and svg.count("<rect ") == 4


def test_report_without_graphviz_draws_the_dag_and_lists_every_job(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Snakefile").write_text(SNAKEFILE)
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=project, check=True, capture_output=True)
    # A PATH with this environment and the system's tools, but no graphviz.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for folder in (Path(sys.executable).parent, Path("/usr/bin"), Path("/bin")):
        for entry in folder.iterdir():
            if entry.name != "dot" and not (bindir / entry.name).exists():
                (bindir / entry.name).symlink_to(entry)
    env = {**os.environ, "PATH": str(bindir)}
    proc = subprocess.run(
        [sys.executable, "-m", "snakedvc", "report"], cwd=project, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    page = (project / "results/report.html").read_text()
    assert "drawn by snakedvc (graphviz&#x27;s dot is not installed)" in page
    assert {"a", "b", "all"} <= set(re.findall(r"<title>([^<]+)</title><rect", page))
    rows = {
        cells[0]: cells[1:]
        for cells in (re.findall(r"<td>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", page))
        if cells
    }
    # Rule a has a benchmark file; b has none: its time comes from Snakemake's log, in whole seconds.
    # (Snakemake's benchmark starts timing a little after the command: 1.19 s measured for its sleep 1.2.)
    assert rows["a"][-1] == "benchmark file" and float(rows["a"][0]) >= 1 and rows["a"][2].endswith("MB")
    assert rows["b"][-1] == "Snakemake&#x27;s log" and rows["b"][1:3] == ["-", "-"] and float(rows["b"][0]) >= 1
    assert "all" in rows


def test_log_jobs_reads_retries_and_slurm_job_ids() -> None:
    log = (
        "[Wed Nov 25 03:10:26 2026]\nrule fit:\n    output: m.pt\n    jobid: 1\n    benchmark: logs/b/fit.tsv\n"
        "    reason: Missing output files: m.pt\n"
        "Job 1 has been submitted with SLURM jobid 41 (log: /p/logs/slurm/rule_fit/41.log).\n"
        "[Wed Nov 25 03:10:40 2026]\nrule fit:\n    output: m.pt\n    jobid: 1\n    benchmark: logs/b/fit.tsv\n"
        "Job 1 has been submitted with SLURM jobid 42 (log: /p/logs/slurm/rule_fit/42.log).\n"
        "[Wed Nov 25 03:11:00 2026]\nFinished jobid: 1 (Rule: fit)\n"
    )
    (job,) = log_jobs(log)
    assert job["rule"] == "fit" and job["slurm_job"] == "42" and job["benchmark"] == "logs/b/fit.tsv"
    assert job["finished"] - job["started"] == 20
