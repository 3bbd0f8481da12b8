"""Generated launch command lines, compared against reference files (tests/reference/launch/)."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from snakedvc.launch import Layout, launch_command, rdzv_port
from snakedvc.slurm import in_allocation_outside_steps
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
    "two_nodes_cpu": dict(layout=Layout(nodes=2), slurm_job_id="4242", first_host="node1", cpus_per_task=1),
    # In a batch script (where snakedvc-slurm runs a rule's command): a job step of its own.
    "one_process_in_batch_script": dict(layout=Layout(), own_step=True, cpus_per_task=4),
    "two_processes_in_batch_script": dict(layout=Layout(procs_per_node=2), own_step=True, cpus_per_task=2),
    # `snakedvc launch --log logs/fit.log`: every rank's lines prefixed in the rule's log, each kept apart too.
    "two_local_processes_with_log": dict(layout=Layout(procs_per_node=2), rank_logs="logs/fit.log.ranks"),
    "one_process_with_log": dict(layout=Layout(), rank_logs="logs/fit.log.ranks"),
    # What tests/test_multinode.py runs on the two-node test cluster (job id and port normalised).
    "two_nodes_cpu_with_log": dict(
        layout=Layout(nodes=2),
        slurm_job_id="4242",
        first_host="node1",
        cpus_per_task=1,
        rank_logs="logs/train.log.ranks",
    ),
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
        rank_logs=case.get("rank_logs"),
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


USER_SCRIPT = """
import logging, os, sys
import snakedvc.torch  # a training script that sets up no logging of its own
print("progress: epoch 1 of 2 from rank", os.environ.get("RANK", "0"), flush=True)
logging.getLogger("snakedvc.torch.resume").info("resumed from epoch 1 step 7")
print("an error line", file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("procs", [1, 2])
def test_launch_log_keeps_stdout_stderr_and_the_kits_messages(tmp_path, procs: int) -> None:
    """What `snakedvc launch --log logs/<rule>.log` leaves in the rule's log for a script that only
    prints: its stdout, its stderr and the kit's INFO lines; with N ranks each line names its rank."""
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(USER_SCRIPT)
    log = tmp_path / "logs" / "fit.log"
    subprocess.run(
        [sys.executable, "-m", "snakedvc", "launch", "--log", str(log), "--procs-per-node", str(procs), "--",
         sys.executable, "train.py"],
        cwd=tmp_path, check=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    text = log.read_text()
    assert "launch: " in text
    for rank in range(procs):
        prefix = f"[default{rank}]:" if procs > 1 else ""
        assert f"{prefix}progress: epoch 1 of 2 from rank {rank}" in text, text
        assert f"{prefix}an error line" in text, text
        assert re.search(rf"{re.escape(prefix)}.* INFO snakedvc.torch.resume: resumed from epoch 1 step 7", text), text
    kept = sorted(p.relative_to(log.parent) for p in log.parent.rglob("stdout.log"))
    assert len(kept) == (procs if procs > 1 else 0), kept
