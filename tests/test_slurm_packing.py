"""Short jobs packed many to a SLURM job (issue 52): which jobs share one, and, on the real test
cluster, a wide DVC `foreach` of short stages that makes one `sbatch` per pack, records what
`dvc exp run` records, keeps each stage's log its own and fails only the stage that failed."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from snakemake_executor_plugin_snakedvc_slurm.packing import even_chunks, packable, shape
from tests.conftest import accounted_jobs
from tests.test_dvc_pipeline import clone, dvc, dvc_project, experiment, lock, snakedvc
from tests.waiting import wait_until


class Resources(dict):
    """job.resources as far as packing reads it (Snakemake's Namedlist: get, items, keys)."""


def job(name: str = "r", attempt: int = 1, group: bool = False, threads: int = 1, **resources: Any) -> SimpleNamespace:
    return SimpleNamespace(
        name=name, attempt=attempt, is_group=lambda: group, threads=threads, resources=Resources(resources)
    )


def no_gpus(job: Any) -> int:
    return int(job.resources.get("gpu", 0))


def test_only_short_single_node_cpu_jobs_pack() -> None:
    assert packable(job(runtime=5, mem_mb=100), 5, no_gpus)
    assert not packable(job(runtime=6), 5, no_gpus)  # longer than pack-runtime
    assert not packable(job(mem_mb=100), 5, no_gpus)  # no runtime declared: its length is unknown
    assert not packable(job(runtime=5), 0, no_gpus)  # packing off
    assert not packable(job(runtime=1, gpu=1), 5, no_gpus)
    assert not packable(job(runtime=1, nodes=2), 5, no_gpus)
    assert not packable(job(runtime=1, mpi="srun"), 5, no_gpus)
    assert not packable(job(runtime=1, group=True), 5, no_gpus)  # a user's own group stays as it is
    assert packable(job(runtime=1, threads=2), 5, no_gpus, max_threads=2)
    assert not packable(job(runtime=1, threads=4), 5, no_gpus, max_threads=2)  # the pack would give it 2 CPUs


def test_packs_share_a_shape_and_are_even_and_at_most_the_size() -> None:
    assert [len(c) for c in even_chunks(list(range(60)), 50)] == [30, 30]
    assert [len(c) for c in even_chunks(list(range(101)), 50)] == [34, 34, 33]
    assert [len(c) for c in even_chunks(list(range(3)), 50)] == [3]
    assert even_chunks([], 50) == []
    # What each job is sized by (runtime, memory, threads) differs within a pack; where it runs may not.
    base = shape(job("a", runtime=2, mem_mb=100, threads=1))
    assert shape(job("b", runtime=1, mem_mb=900, threads=2)) == base
    assert shape(job("c", runtime=2, mem_mb=100, slurm_partition="short")) != base
    assert shape(job("d", runtime=2, mem_mb=100, slurm_extra="'--hold'")) != base
    assert shape(job("e", runtime=2, mem_mb=100, slurm_account="lab")) != base
    assert shape(job("f", attempt=2, runtime=2, mem_mb=100)) != base  # a retry's resources may differ


ITEMS = [f"i{n:02d}" for n in range(60)]
BROKEN = "i07"


def wide(items: list[str], failing: str | None = None) -> str:
    command = "mkdir -p out && echo ${item} > out/${item}.txt"  # (dvc repro makes no output folder)
    if failing:
        command = f"test ${{item}} != {failing} && {command}"
    return yaml.safe_dump({"stages": {"item": {"foreach": items, "do": {"cmd": command, "outs": ["out/${item}.txt"]}}}})


SHORT = 'resources:\n  "*": {runtime: 2, mem: 100MB}\n'


def sbatch_ids(said: str) -> list[str]:
    return re.findall(r"has been submitted with SLURM jobid (\d+)", said)


def run_log(repo: Path) -> str:
    (log,) = repo.glob(".snakedvc/pipeline/*/snakemake.log")
    return log.read_text()


@pytest.mark.slurm
def test_sixty_short_stages_make_two_slurm_jobs_and_dvcs_record(tmp_path: Path, slurm_cluster: None) -> None:
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": wide(ITEMS), "snakedvc.yaml": SHORT})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    dvc(by_dvc, "exp", "run", "-n", "wide")
    snakedvc(by_kit, "exp", "run", "--profile", "slurm", "-n", "wide")
    assert lock(by_kit) == lock(by_dvc) and len(lock(by_kit)["stages"]) == len(ITEMS)
    assert experiment(by_kit, "wide") == experiment(by_dvc, "wide")
    # One sbatch per pack (at most 50 stages each): 60 stages in two.
    jobids = sbatch_ids(run_log(by_kit))
    assert len(jobids) == 2, jobids
    jobs = wait_until(
        lambda: (rows := accounted_jobs(by_kit)) and len(rows) == 2 and all(r["state"] == "COMPLETED" for r in rows)
        and rows, "accounting of the two packs, COMPLETED", timeout=60,
    )  # fmt: skip
    assert sorted(row["id"] for row in jobs) == sorted(jobids)
    # Each stage's log is its own: its command, no other stage's.
    logs = sorted(by_kit.glob(".snakedvc/pipeline/*/logs/stage_item_*.log"))
    assert len(logs) == len(ITEMS)
    for log, item in zip(logs, sorted(ITEMS), strict=True):
        text = log.read_text()
        assert f"echo {item} > out/{item}.txt" in text and not re.search(rf"echo (?!{item}\b)i\d\d", text), text


@pytest.mark.slurm
def test_a_failing_packed_stage_fails_only_itself(tmp_path: Path, slurm_cluster: None) -> None:
    items = ITEMS[:12]
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": wide(items, BROKEN), "snakedvc.yaml": SHORT})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    dvc(by_dvc, "repro", "-k", check=False)
    proc = snakedvc(by_kit, "exp", "run", "--profile", "slurm", "-k", check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # The failure names the stage that failed and its own log; every other stage is recorded as DVC records it.
    assert f"stage 'item@{BROKEN}' failed: its log is " in said, said[-3000:]
    assert lock(by_kit) == lock(by_dvc) and len(lock(by_kit)["stages"]) == len(items) - 1
    (broken_log,) = by_kit.glob(f".snakedvc/pipeline/*/logs/stage_item_{BROKEN}.log")
    assert f"test {BROKEN} != {BROKEN}" in broken_log.read_text()
    assert not re.search(rf"echo (?!{BROKEN}\b)i\d\d", broken_log.read_text())
    # One pack, then the failed stage's retry (the profile's retries: 1) on its own, named in the error.
    log = run_log(by_kit)
    first, *retries = sbatch_ids(log)
    assert len(retries) == 1, log[-3000:]
    assert f"(rule stage_item_{BROKEN}) did not finish in SLURM job {first}, which ran it with 11 other" in log
    assert f"rule_stage_item_{BROKEN}/{retries[0]}.log" in log


# Each stage waits (up to 2 min) for the other to have started: run one after the other, they fail.
MEET = (
    "mkdir -p out started && snakedvc launch -- sh -c "
    "'touch started/${item} && n=0 && until [ -e started/a ] && [ -e started/b ]; "
    "do n=$((n+1)); [ $n -lt 240 ] || exit 9; sleep 0.5; done && echo ${item} > out/${item}.txt'"
)


@pytest.mark.slurm
def test_packed_jobs_launched_as_steps_run_side_by_side(tmp_path: Path, slurm_cluster: None) -> None:
    """A pack's jobs that each start `snakedvc launch` (a SLURM step, as a sweep's trials do) share
    the pack's CPUs: each step asking for them all, SLURM would run the steps one at a time."""
    pipeline = {"stages": {"meet": {"foreach": ["a", "b"], "do": {"cmd": MEET, "outs": ["out/${item}.txt"]}}}}
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": yaml.safe_dump(pipeline), "snakedvc.yaml": SHORT})
    repo = clone(origin, "by-kit")
    proc = snakedvc(repo, "exp", "run", "--profile", "slurm", check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert len(sbatch_ids(run_log(repo))) == 1  # the two stages shared one SLURM job
    assert sorted(lock(repo)["stages"]) == ["meet@a", "meet@b"]
