"""A cluster as a site runs it (issue 52), on the real test cluster: its submit limits
(AccountingStorageEnforce), and slurmctld restarted for maintenance in the middle of a run. A
pipeline wider than the jobs a user may have queued runs to the same record as `dvc exp run`'s,
the kit keeping its jobs under the limit (one it reads: the association's MaxSubmitJobs) or
submitting again after sbatch refused one (one it does not read: the QOS's MaxSubmitJobsPerUser)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from snakedvc import slurm
from tests.conftest import REPO, accounted_jobs, git
from tests.test_dvc_pipeline import clone, dvc, dvc_project, ended_run, experiment, lock, snakedvc
from tests.test_slurm_faults import SLURMCTLD_PIDFILE
from tests.test_tutorial import BIN, ENV
from tests.waiting import wait_until

# The limit's test changes root's own association: no other test may submit meanwhile.
pytestmark = [pytest.mark.slurm, pytest.mark.cluster_alone]

LIMIT = 5
ITEMS = [f"i{n:02d}" for n in range(40)]
WIDE = {
    "stages": {
        "item": {
            "foreach": ITEMS,
            "do": {"cmd": "echo ${item} > out/${item}.txt", "outs": ["out/${item}.txt"]},
        }
    }
}
# Every stage's job small, as a site's admin would ask; longer than the profile packs (snakedvc-slurm-pack-runtime:
# 5), so that each stage is a SLURM job of its own and the limit is met.
RESOURCES = 'resources:\n  "*": {runtime: 10, mem: 100MB}\n'
# (setting, the sacctmgr entity it is set on); -1 clears it
LIMITS = {
    "assoc": ["user", "root", "where", "account=root", "set", "MaxSubmitJobs={}"],
    "qos": ["qos", "normal", "set", "MaxSubmitJobsPerUser={}"],
}


def sacctmgr_modify(words: list[str], value: int) -> None:
    subprocess.run(["sacctmgr", "-i", "modify", *[w.format(value) for w in words]], capture_output=True, check=False)


@contextlib.contextmanager
def submit_limit(kind: str) -> Iterator[None]:
    sacctmgr_modify(LIMITS[kind], LIMIT)
    try:
        # slurmctld hears of it from slurmdbd: the limit is in force once sbatch meets it
        if kind == "assoc":
            wait_until(lambda: slurm.submit_room("root", "root") is not None, timeout=60, what="the limit in force")
        else:
            wait_until(
                lambda: f"MaxSubmitJobsPU={LIMIT}" in slurm.query(["scontrol", "show", "assoc_mgr", "flags=qos"]),
                timeout=60,
                what="the QOS limit in force",
            )
        yield
    finally:
        sacctmgr_modify(LIMITS[kind], -1)


def most_queued_at_once(jobids: list[str]) -> int:
    """The most of ``jobids`` that SLURM held at one time (from each job's submit and end)."""
    rows = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(jobids), "-o", "JobID,Submit,End"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    events = []
    for row in rows:
        _, submit, end = row.split("|")
        events += [(datetime.fromisoformat(submit), 1), (datetime.fromisoformat(end), -1)]
    held = most = 0
    for _, step in sorted(events, key=lambda event: (event[0], event[1])):  # an end before a submit at one time
        held += step
        most = max(most, held)
    return most


@pytest.mark.parametrize("kind", ["assoc", "qos"])
def test_a_pipeline_wider_than_the_submit_limit_runs_to_dvcs_record(
    tmp_path: Path, slurm_cluster: None, kind: str
) -> None:
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": yaml.safe_dump(WIDE), "snakedvc.yaml": RESOURCES})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    dvc(by_dvc, "exp", "run", "-n", "wide")
    with submit_limit(kind):
        proc = snakedvc(by_kit, "exp", "run", "-v", "--profile", "slurm", "-n", "wide", check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-5000:]
    assert lock(by_kit) == lock(by_dvc) and len(lock(by_kit)["stages"]) == len(ITEMS)
    assert experiment(by_kit, "wide") == experiment(by_dvc, "wide")
    assert git(by_kit, "status", "--porcelain") == git(by_dvc, "status", "--porcelain")
    # Said once, naming the limit (the one the kit reads) or SLURM's refusal (the one it does not).
    named = f"MaxSubmitJobs={LIMIT} of user root in account root is reached" if kind == "assoc" else "job submit limit"
    assert said.count("each further job is submitted when one of yours has left SLURM's queue") == 1, said[-5000:]
    assert named in said
    jobids = sorted(set(slurm_jobids(said)))
    assert len(jobids) == len(ITEMS)
    assert most_queued_at_once(jobids) <= LIMIT


def slurm_jobids(said: str) -> list[str]:
    import re

    return re.findall(r"has been submitted with SLURM jobid (\d+)", said)


ONE_STAGE = {"stages": {"one": {"cmd": "echo 1 > one.txt", "outs": ["one.txt"]}}}


def test_a_detached_runs_controller_refused_for_a_submit_limit_waits_for_room(
    tmp_path: Path, slurm_cluster: None
) -> None:
    """`snakedvc submit` with the user's queue full (held jobs up to the QOS's limit): sbatch refuses
    the controller; submit says so once and waits; when one held job leaves the queue it submits
    the controller, and the run saves what `dvc exp run` saves."""
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": yaml.safe_dump(ONE_STAGE), "snakedvc.yaml": RESOURCES})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    dvc(by_dvc, "exp", "run", "-n", "limited")
    said = tmp_path / "submit.err"
    with submit_limit("qos"):
        # The queue is the user's: jobs an earlier test left there (a controller still winding down, a
        # job completing) count against the limit too, and would take the fillers' places.
        queued = ["squeue", "--me", "-h", "-o", "%i %T %j"]
        wait_until(lambda: not slurm.query(queued).strip(), "the user's queue to empty", 300,
                   explain=lambda: slurm.query(queued))  # fmt: skip
        hold = ["sbatch", "--parsable", "--hold", "--job-name", "queue-filler", "-o", "/dev/null", "--wrap", "true"]
        held: list[str] = []
        try:
            for _ in range(LIMIT):
                held.append(slurm.query(hold).strip())
            with said.open("w") as err:
                submit = subprocess.Popen(
                    [str(BIN / "snakedvc"), "submit", "--profile", "slurm", "--name", "limited"],
                    cwd=by_kit, stdout=subprocess.PIPE, stderr=err, text=True, env=ENV,
                )  # fmt: skip
            wait_until(lambda: "for a submit limit" in said.read_text(), "submit to wait for room", 120, proc=submit)
            slurm.cancel(held[:1])
            out, _ = submit.communicate(timeout=300)
        finally:
            slurm.cancel(held)  # the run's stage job needs room too
        assert submit.returncode == 0, said.read_text()
        assert said.read_text().count("for a submit limit") == 1
        run_id = out.strip()
        ended = wait_until(lambda: ended_run(by_kit, run_id), f"run {run_id} to end", 300, poll=1)
    assert ended["state"] == "done", snakedvc(by_kit, "logs", run_id).stdout
    assert experiment(by_kit, "limited") == experiment(by_dvc, "limited")


GATED = """\
stages:
  one:
    cmd: while [ ! -f {gate} ]; do sleep 0.5; done; echo 1 > one.txt
    outs: [one.txt]
  two:
    cmd: cp one.txt two.txt
    deps: [one.txt]
    outs: [two.txt]
"""


def test_slurmctld_restarted_in_the_middle_of_a_run(tmp_path: Path, slurm_cluster: None) -> None:
    """Maintenance: slurmctld stopped and started again while a stage's job runs and the next waits
    for it. The run goes on: the job is kept, the next is submitted, the record is DVC's."""
    gate = tmp_path / "gate"
    dvc_yaml = GATED.format(gate=gate)
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": dvc_yaml, "snakedvc.yaml": RESOURCES})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    gate.touch()
    dvc(by_dvc, "exp", "run", "-n", "kept")
    gate.unlink()
    running = subprocess.Popen(
        [str(BIN / "snakedvc"), "exp", "run", "--profile", "slurm", "-n", "kept"],
        cwd=by_kit, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
    )  # fmt: skip
    try:
        wait_until(
            lambda: any(row.split("|") == [str(by_kit), "RUNNING"] for row in squeue("%Z|%T")),
            "stage one's job to run", timeout=300, proc=running,
        )  # fmt: skip
        pid = int(SLURMCTLD_PIDFILE.read_text())
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), "slurmctld to stop", timeout=60)
        subprocess.run([str(REPO / "scripts" / "slurm-cluster"), "up"], check=True, capture_output=True, timeout=300)
        gate.touch()
        said, _ = running.communicate(timeout=600)
    finally:
        gate.touch()
        if running.poll() is None:
            running.kill()
    assert running.returncode == 0, said[-4000:]
    assert lock(by_kit) == lock(by_dvc)
    assert experiment(by_kit, "kept") == experiment(by_dvc, "kept")
    assert (by_kit / "two.txt").read_text() == "1\n"
    # Each stage's job once, both finished: the running one was not lost or run again.
    jobs = wait_until(
        lambda: (rows := accounted_jobs(by_kit)) and all(row["state"] == "COMPLETED" for row in rows) and rows,
        "accounting of the run's jobs, every one COMPLETED", timeout=60,
    )  # fmt: skip
    assert len(jobs) == 2, jobs


def squeue(columns: str) -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", columns], capture_output=True, text=True, check=True).stdout.split()
