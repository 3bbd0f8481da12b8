"""Detached runs on the real test cluster: controllers as SLURM jobs, several runs at once,
cancel, and a controller lost while its training job runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SMALL_RUN, accounted_jobs, dvc_experiments, dvc_project, md5
from tests.test_runs import EDIT, SOURCE, edit_lr, git, git_state, run_log, runs, snakedvc, submit, wait_until_ended
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm
SLURM = ["--profile", "profiles/slurm"]


def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def record(repo: Path, run_id: str) -> dict:
    return json.loads((repo / ".snakedvc/runs" / run_id / "run.json").read_text())


def wait_for_log(repo: Path, run_id: str, text: str, timeout: float = 300) -> None:
    what = f"{text!r} in the log of run {run_id}"
    wait_until(lambda: text in run_log(repo, run_id), what, timeout, poll=1, explain=lambda: run_log(repo, run_id))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return dvc_project(tmp_path / "repo", tmp_path / "remote")


def test_three_runs_at_once_each_pinned_to_its_submit_and_one_cancelled(slurm_cluster, repo: Path) -> None:
    before = git_state(repo)
    original = (repo / SOURCE).read_text()
    first = submit(repo, "--name", "lr1", *SLURM, "--", *SMALL_RUN)
    assert git_state(repo) == before
    edit_lr(repo, 0.002)
    (repo / SOURCE).write_text(original + EDIT)
    second = submit(repo, "--name", "lr2", *SLURM, "--", *SMALL_RUN)
    third = submit(
        repo, "--name", "lr3", *SLURM, "--", *SMALL_RUN[:2], "train={max_epochs: 4, hidden_sizes: [32], lr: 0.003}"
    )
    doomed = submit(
        repo, "--name", "doomed", *SLURM, "--", *SMALL_RUN[:2], "train={max_epochs: 2000, hidden_sizes: [32]}"
    )

    # Cancel one while its training runs: none of its jobs stays queued, no experiment.
    wait_for_log(repo, doomed, "rule train")
    jobs = record(repo, doomed)["controller_jobs"]
    assert "cancelled run" in snakedvc(repo, "cancel", doomed).stdout
    wait_until(
        lambda: not squeue_ids() & {*jobs, *runs(repo)[doomed]["slurm_jobs"]},
        "none of the cancelled run's jobs in squeue",
        timeout=30,
        poll=1,
        explain=lambda: subprocess.run(["squeue"], capture_output=True, text=True).stdout,
    )

    for run_id in (first, second, third):
        ended = wait_until_ended(repo, run_id, timeout=900)
        assert ended["state"] == "done", snakedvc(repo, "logs", run_id).stdout[-3000:]
        assert ended["controller"] and ended["slurm_jobs"], ended
    assert runs(repo)[doomed]["state"] == "cancelled"
    # Its Snakemake cancelled its jobs itself: no error block for the training job the cancel stopped.
    said = snakedvc(repo, "logs", doomed).stdout
    assert "Terminating processes on user request" in said and "Error in rule" not in said, said[-3000:]

    exps = dvc_experiments(repo)
    assert {"lr1", "lr2", "lr3"} <= set(exps) and "doomed" not in exps
    assert [exps[n]["params"]["train"]["lr"] for n in ("lr1", "lr2", "lr3")] == [0.001, 0.002, 0.003]
    refs = dict(
        line.split()
        for line in git(repo, "for-each-ref", "--format=%(refname:lstrip=-1) %(objectname)", "refs/exps").splitlines()
    )
    assert git(repo, "show", f"{refs['lr1']}:{SOURCE}") + "\n" == original
    for name in ("lr2", "lr3"):
        assert git(repo, "show", f"{refs[name]}:{SOURCE}") + "\n" == original + EDIT
    # The controllers were SLURM jobs of their own (one CPU), named after their runs.
    (controller,) = record(repo, first)["controller_jobs"]
    row = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", controller, "-o", "JobName,AllocCPUS,State"], capture_output=True, text=True
    ).stdout.split("|")
    assert row[:2] == ["snakedvc-lr1", "1"] and row[2].startswith("COMPLETED"), row


def test_a_lost_controller_is_replaced_and_training_resumes_bit_identically(slurm_cluster, repo: Path) -> None:
    # Training long enough (~40 s here) to lose its controller in the middle of it.
    longer = [*SMALL_RUN[:2], "train={max_epochs: 8000, patience: 100000, hidden_sizes: [32], checkpoint_every: 200}"]
    reference = submit(repo, "--name", "uninterrupted", *SLURM, "--", *longer)
    assert wait_until_ended(repo, reference, timeout=900)["state"] == "done"
    interrupted = submit(repo, "--name", "interrupted", *SLURM, "--", *longer)
    wait_for_log(repo, interrupted, "rule train")
    workspace = repo / ".snakedvc/runs" / interrupted / "workspace"
    wait_until(
        lambda: list((workspace / ".checkpoints").rglob("*.pt")),
        "a checkpoint of the run's training (training under way)",
        timeout=300,
        poll=0.5,
        explain=lambda: run_log(repo, interrupted),
    )
    (first_controller,) = record(repo, interrupted)["controller_jobs"]
    subprocess.run(["scancel", first_controller], check=True)  # as an admin, or a node failure, would

    ended = wait_until_ended(repo, interrupted, timeout=900)
    log = snakedvc(repo, "logs", interrupted).stdout
    assert ended["state"] == "done", log[-4000:]
    assert "takes over" in log and "stopping jobs left by the previous controller" in log, log[-4000:]
    assert len(record(repo, interrupted)["controller_jobs"]) == 2
    # No two training jobs of the run overlapped, and the second resumed from a checkpoint. ESOL's
    # train asks for a GPU: its jobs are the run's jobs in the gpu partition.
    trains = sorted((r for r in accounted_jobs(workspace) if r["partition"] == "gpu"), key=lambda r: r["start"])
    assert len(trains) >= 2, trains
    for earlier, later in zip(trains, trains[1:], strict=False):
        assert earlier["end"] <= later["start"], trains
    assert "resumed from epoch" in (workspace / "logs/train.log").read_text()
    same = repo / ".snakedvc/runs" / reference / "workspace/results/model/model.pt"
    assert md5(workspace / "results/model/model.pt") == md5(same)
    assert {"uninterrupted", "interrupted"} <= set(dvc_experiments(repo))


SLOW_LOCAL_RULE = """\
rule all:
    input: "slow.txt"

rule slow:  # as a tracking step waiting its turn for the DVC lock: local, and long quiet
    output: "slow.txt"
    localrule: True
    shell: "sleep 36 && echo done > {output}"
"""


def test_a_cancel_lets_a_local_rule_finish_that_outlasts_the_quiet_time(slurm_cluster, tmp_path: Path) -> None:
    """A cancelled SLURM run's controller says which local rules it is letting finish, so the cancel
    (which stops everything after 30 s without a line in the log) does not kill a tracking step
    that waits longer than that for the lock: no "Error in rule", the step's output whole."""
    project = tmp_path / "slow"
    (project / "workflow").mkdir(parents=True)
    (project / "workflow" / "Snakefile").write_text(SLOW_LOCAL_RULE)
    git(project, "init", "-q", "-b", "main")
    snakedvc(project, "init")
    git(project, "add", "-A")
    git(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a slow local rule")
    run_id = submit(project, "--name", "slow", *SLURM)
    wait_for_log(project, run_id, "Shell command: sleep 36")
    assert "cancelled run" in snakedvc(project, "cancel", run_id, timeout=300).stdout
    said = run_log(project, run_id)
    assert "local steps still running, let finish" in said and "Error in rule" not in said, said[-3000:]
    assert (project / ".snakedvc/runs" / run_id / "workspace/slow.txt").read_text() == "done\n"
    assert runs(project)[run_id]["state"] == "cancelled"
