"""Generated launch command lines, compared against reference files (tests/reference/launch/)."""

from __future__ import annotations

import os
import shlex

import pytest

from snakedvc.launch import Layout, in_allocation_outside_steps, launch_command, rdzv_port
from tests.conftest import REPO

REFERENCES = REPO / "tests" / "reference" / "launch"
# Any command a user writes after `snakedvc launch --`: here their own script with awkward arguments.
COMMAND = ["python", "train.py", "--params", '{"lr": 0.001}', "--data", "data/train.npz", "--model", "my model.pt"]

CASES = {
    "one_process": dict(layout=Layout()),
    "two_local_processes": dict(layout=Layout(procs_per_node=2)),
    "four_gpus_one_node": dict(layout=Layout(procs_per_node=4)),
    "two_nodes_two_gpus": dict(
        layout=Layout(nodes=2, procs_per_node=2), slurm_job_id="4242", first_host="gpu-node-07", cpus_per_task=8
    ),
    # What tests/test_multinode.py runs on the two-node test cluster (job id and port normalised).
    "two_nodes_cpu": dict(layout=Layout(nodes=2), slurm_job_id="4242", first_host="node1", cpus_per_task=1),
    # In a batch script (where snakedvc-slurm runs a rule's command): a job step of its own.
    "one_process_in_batch_script": dict(layout=Layout(), own_step=True, cpus_per_task=4),
    "two_processes_in_batch_script": dict(layout=Layout(procs_per_node=2), own_step=True, cpus_per_task=2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_command_matches_reference(name: str) -> None:
    case = CASES[name]
    command = launch_command(
        case["layout"],
        COMMAND,
        python="python",
        slurm_job_id=case.get("slurm_job_id"),
        first_host=case.get("first_host"),
        own_step=case.get("own_step", False),
        cpus_per_task=case.get("cpus_per_task"),
    )
    text = shlex.join(command) + "\n"
    reference = REFERENCES / f"{name}.txt"
    if os.environ.get("SNAKEDVC_UPDATE_REFERENCES") == "1":
        reference.write_text(text)
    assert text == reference.read_text(), f"{name}: generated command differs from {reference}"


@pytest.mark.parametrize(
    "command", [["python", "-m", "mypkg.train", "--epochs", "3"], ["./train.sh", "x"], ["trainer"]]
)
def test_any_command_runs_unchanged_under_torchrun(command: list[str]) -> None:
    assert launch_command(Layout(), command) == command
    wrapped = launch_command(Layout(procs_per_node=2), command)
    assert wrapped[wrapped.index("--no-python") + 1 :] == command


def test_arguments_stay_single_words() -> None:
    hostile = ["python", "train.py", "--model", "x; touch /tmp/pwned", "--params", "$(reboot)"]
    command = launch_command(Layout(procs_per_node=2), hostile)
    assert command[-len(hostile) :] == hostile
    assert shlex.split(shlex.join(command)) == command


def test_nothing_to_launch_is_an_error() -> None:
    with pytest.raises(ValueError, match="after `--`"):
        launch_command(Layout(), [])


def test_multi_node_needs_slurm_allocation() -> None:
    with pytest.raises(ValueError, match="SLURM"):
        launch_command(Layout(nodes=2), COMMAND)


def test_a_step_of_its_own_only_inside_an_allocation_outside_steps() -> None:
    assert in_allocation_outside_steps({"SLURM_JOB_ID": "7"})  # batch script, salloc shell
    assert not in_allocation_outside_steps({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})  # inside srun
    assert not in_allocation_outside_steps({})  # no SLURM
    assert launch_command(Layout(), COMMAND, own_step=True)[:1] == ["srun"]
    assert launch_command(Layout(), COMMAND, own_step=False) == COMMAND


def test_rendezvous_port_depends_on_job_and_stays_in_range() -> None:
    assert rdzv_port("1") != rdzv_port("2")
    assert all(29500 <= rdzv_port(str(j)) < 49500 for j in (0, 1, 19999, 20000, 10**9))


def test_layout_rejects_zero() -> None:
    with pytest.raises(ValueError):
        Layout(nodes=0)
