"""What snakedvc.slurm and the kit's executor read from SLURM's words, without a cluster."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from snakedvc import slurm
from snakemake_executor_plugin_snakedvc_slurm.executor import requested_gpus


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("5", 5),
        ("5:00", 5),
        ("5:30", 5.5),
        ("2:00:00", 120),
        ("1-00:00:00", 1440),
        ("1-12", 1440 + 720),
        ("1-12:30", 1440 + 750),
        ("infinite", None),
        ("UNLIMITED", None),
        ("", None),
    ],
)
def test_slurm_time_limits_in_minutes(limit: str, expected: float | None) -> None:
    assert slurm.minutes(limit) == expected


def test_only_failures_that_may_have_made_a_job_are_ambiguous() -> None:
    assert slurm.is_ambiguous("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")
    assert slurm.is_ambiguous("sbatch timed out after 60 s")
    # SLURM answered: no job was made, and submitting the same request again fails the same way.
    assert not slurm.is_ambiguous("sbatch: error: invalid partition specified: nope")
    assert not slurm.is_ambiguous("sbatch: error: Memory specification can not be satisfied")


def test_a_partition_time_limit_error_names_partition_limit_and_request() -> None:
    said = slurm.explain_never_starts("42", "PartitionTimeLimit", "short", "10:00", {"short": "5:00"})
    assert said.startswith("SLURM job 42 would wait forever: pending with reason PartitionTimeLimit")
    assert "partition short: MaxTime 5:00; the job asks for 10:00" in said
    assert "lower the rule's runtime" in said and said.endswith("The job was cancelled.")
    said = slurm.explain_never_starts("43", "QOSMaxWallDurationPerJobLimit", "cpu", "10:00", {})
    assert "QOSMaxWallDurationPerJobLimit" in said and "partition cpu: MaxTime" not in said


def test_reasons_that_clear_by_themselves_are_not_failures() -> None:
    for reason in ("Resources", "Priority", "Dependency", "ReqNodeNotAvail", "JobHeldUser", "BeginTime"):
        assert reason not in slurm.NEVER_CLEARS
    for reason in ("PartitionTimeLimit", "PartitionNodeLimit", "QOSMaxWallDurationPerJobLimit"):
        assert reason in slurm.NEVER_CLEARS


@pytest.mark.parametrize(
    ("resources", "gpus"),
    [
        ({}, 0),
        ({"gpu": 2}, 2),
        ({"gres": "gpu:4"}, 4),
        ({"gres": "gpu:a100:3"}, 3),
        ({"gres": "gpu"}, 1),
        ({"gres": "tmpfs:10G"}, 0),
        ({"gpus": "2"}, 2),
        ({"gpus": "a100:2"}, 2),
    ],
)
def test_gpus_a_job_asks_for(resources: dict[str, object], gpus: int) -> None:
    assert requested_gpus(SimpleNamespace(resources=resources)) == gpus
