"""DVC's experiment queue as the kit keeps it: `snakedvc exp run --queue` (DVC's sweep syntax),
`snakedvc queue start -j N`, `status`, `logs`, `kill`, `remove`. Each queued experiment is a
detached run; with a SLURM profile its controller and stages are SLURM jobs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from snakedvc.engine.runs.record import Run
from tests.test_dvc_exp_run_words import clone, dvc, dvc_project, snakedvc
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

PIPELINE = """\
stages:
  double:
    cmd: sleep ${pause} && python3 -c "print(${n} * 2)" > double.txt
    params: [n]
    outs: [double.txt]
  measure:
    cmd: python3 measure.py
    deps: [double.txt]
    metrics:
      - metrics.json:
          cache: false
"""
MEASURE = "import json\njson.dump({'v': int(open('double.txt').read())}, open('metrics.json', 'w'))\n"


def queued_project(tmp_path: Path, pause: int = 0) -> Path:
    """``pause``: seconds the first stage sleeps (experiments that overlap, where that is looked at)."""
    files = {"params.yaml": f"n: 1\npause: {pause}\n", "dvc.yaml": PIPELINE, "measure.py": MEASURE}
    return clone(dvc_project(tmp_path / "origin", files), "project")


def runs(repo: Path) -> dict[str, Run]:
    return {run.name: run for run in map(Run.load, (repo / ".snakedvc" / "runs").iterdir())}


def metrics_of(repo: Path) -> dict[str, tuple[int, int]]:
    """Each experiment's n and v, from `dvc exp show --json`."""
    shown = json.loads(dvc(repo, "exp", "show", "--json").stdout)
    found = {}
    for baseline in shown:
        for exp in baseline.get("experiments") or []:
            for rev in exp["revs"]:
                data = rev["data"]
                found[rev["name"]] = (
                    data["params"]["params.yaml"]["data"]["n"],
                    data["metrics"]["metrics.json"]["data"]["v"],
                )
    return found


def all_done(repo: Path, names: list[str]) -> bool:
    states = {name: run.state for name, run in runs(repo).items()}
    return all(states.get(name) in ("done", "failed", "cancelled") for name in names)


def test_a_queued_sweep_runs_when_started_each_its_own_experiment(tmp_path: Path) -> None:
    """-S 'n=1,2' --queue -n sw makes sw-1 and sw-2 (DVC's names for a sweep), waiting; a third
    is removed before it starts; `queue start -j 1` runs the rest one after the other."""
    repo = queued_project(tmp_path)
    queued = snakedvc(repo, "exp", "run", "--queue", "-S", "n=1,2", "-n", "sw").stdout
    assert "Queued experiment 'sw-1' for future execution." in queued and "'sw-2'" in queued
    snakedvc(repo, "exp", "run", "--queue", "-S", "n=5", "-n", "dropped")
    snakedvc(repo, "exp", "run", "--queue", "-S", "n=6", "-n", "killed")
    assert (repo / "params.yaml").read_text() == "n: 1\npause: 0\n"  # the workspace is left as it was
    status = snakedvc(repo, "queue", "status").stdout
    assert [line.split()[-1] for line in status.splitlines()[1:]] == ["Queued"] * 4, status
    assert "killed: cancelled" in snakedvc(repo, "queue", "kill", "killed").stdout  # never started: at once
    assert "Cancelled" in snakedvc(repo, "queue", "status").stdout
    assert "dropped, killed" in snakedvc(repo, "queue", "remove", "dropped", "killed").stdout
    snakedvc(repo, "queue", "start", "-j", "1")
    status = snakedvc(repo, "queue", "status").stdout  # one at a time: the second waits for the first
    assert sorted(line.split()[-1] for line in status.splitlines()[1:]) in (
        ["Queued", "Running"],
        ["Queued", "Success"],
    )
    wait_until(
        lambda: all_done(repo, ["sw-1", "sw-2"]), "both queued experiments to end", timeout=900,
        explain=lambda: snakedvc(repo, "queue", "status").stdout,
    )  # fmt: skip
    recorded = runs(repo)
    assert {name: run.state for name, run in recorded.items()} == {"sw-1": "done", "sw-2": "done"}
    assert metrics_of(repo) == {"sw-1": (1, 2), "sw-2": (2, 4)}
    assert "Running stage 'double':" in snakedvc(repo, "queue", "logs", "sw-1").stdout
    status = snakedvc(repo, "queue", "status").stdout
    assert [line.split()[-1] for line in status.splitlines()[1:]] == ["Success"] * 2, status


def sacct_submit_times(jobs: list[str]) -> dict[str, int]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", "JobID,Submit", "--noconvert"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    import datetime as dt

    return {
        job: int(dt.datetime.fromisoformat(when).timestamp())
        for job, when in (line.split("|") for line in out.splitlines() if line.strip())
    }


@pytest.mark.slurm
def test_three_queued_experiments_run_two_at_a_time_on_the_test_cluster(tmp_path: Path, slurm_cluster: None) -> None:
    repo = queued_project(tmp_path, pause=6)
    snakedvc(repo, "exp", "run", "--queue", "--profile", "slurm", "-S", "n=1,2,3", "-n", "q")
    snakedvc(repo, "queue", "start", "-j", "2")
    names = ["q-1", "q-2", "q-3"]
    wait_until(
        lambda: all_done(repo, names), "three queued experiments to end", timeout=900,
        explain=lambda: snakedvc(repo, "queue", "status").stdout,
    )  # fmt: skip
    recorded = runs(repo)
    assert {name: recorded[name].state for name in names} == dict.fromkeys(names, "done")
    assert metrics_of(repo) == {"q-1": (1, 2), "q-2": (2, 4), "q-3": (3, 6)}
    # Every controller a SLURM job; the third submitted only once one of the first two had ended.
    submitted = sacct_submit_times([job for name in names for job in recorded[name].controller_jobs])
    first_end = min(recorded["q-1"].ended or 0, recorded["q-2"].ended or 0)
    assert submitted[recorded["q-3"].controller_jobs[0]] >= int(first_end)
    assert max(submitted[recorded[name].controller_jobs[0]] for name in ("q-1", "q-2")) < int(first_end) + 1
