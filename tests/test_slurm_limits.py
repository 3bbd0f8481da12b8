"""A site's submit limits (issue 52), on the real test cluster with AccountingStorageEnforce: a
pipeline wider than the jobs a user may have queued runs to the same record as `dvc exp run`'s,
the kit keeping its jobs under the limit (one it reads: the association's MaxSubmitJobs) or
submitting again after sbatch refused one (one it does not read: the QOS's MaxSubmitJobsPerUser)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from snakedvc import slurm
from tests.conftest import git
from tests.test_dvc_pipeline import clone, dvc, dvc_project, experiment, lock, snakedvc
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
# Every stage's job small and short, as a site's admin would ask.
RESOURCES = 'resources:\n  "*": {runtime: 5, mem: 100MB}\n'
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
