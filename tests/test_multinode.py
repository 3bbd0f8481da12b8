"""Training and workflows across nodes on the real test cluster with two compute nodes.

`scripts/slurm-cluster` with SLURM_CLUSTER_NODES=2: node1 and node2 are slurmds in network
namespaces of their own (own address, own hostname), so SLURM allocates them as separate
machines and a job's processes on the two talk over TCP. The train rule asks for two nodes
through the config only (`resources.train.nodes: 2`); profiles/slurm is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from snakedvc.launch import rdzv_port
from tests.conftest import REPO, cluster_up, copy_project, run_snakemake, slurm_jobs_by_rule
from tests.test_slurm_resume import finish, running_train_job, wait_for_log
from tests.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.multinode]

TWO_NODES = "resources={train: {nodes: 2, gpu: 0}}"
# The launch command line generated for this layout (tests/test_launch.py keeps it current).
REFERENCE = REPO / "tests/reference/launch/two_nodes_cpu_with_log.txt"
SMALL = ["data={limit: 200}", "train={max_epochs: 3, hidden_sizes: [32]}"]


def ended_job(jobid: str) -> dict[str, dict[str, str]] | None:
    """sacct rows of a job and its steps, by job id ("123", "123.batch", "123.0"), once they show the job's end."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-j", jobid, "-o", "JobID,State,NNodes,NodeList"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {}
    for line in out.splitlines():
        job, state, nnodes, nodelist = line.split("|")
        rows[job] = {"state": state.split()[0], "nnodes": nnodes, "nodelist": nodelist}
    return rows if jobid in rows and rows[jobid]["state"] not in ("PENDING", "RUNNING", "COMPLETING") else None


def accounted(jobid: str, timeout: float = 60) -> dict[str, dict[str, str]]:
    """The rows of ``ended_job``, waited for: accounting may hear of a job's end a few seconds late."""
    return wait_until(
        lambda: ended_job(jobid),
        f"accounting of job {jobid}'s end",
        timeout,
        poll=0.5,
        explain=lambda: subprocess.run(["sacct", "-P", "-j", jobid], capture_output=True, text=True).stdout,
    )


def hostnames(nodelist: str) -> set[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def launcher(text: str, jobid: str) -> list[str]:
    """The launch command up to the user's command (`--no-python`), with what varies by job normalised."""
    line = next(line for line in text.splitlines() if "srun " in line)
    argv = shlex.split(line[line.index("srun ") :])
    argv = argv[: argv.index("--no-python") + 1]
    normal = {jobid: "<job>", str(rdzv_port(jobid)): "<port>"}
    words = [re.sub(r"\d+", lambda m: normal.get(m.group(), m.group()), word) for word in argv]
    # The interpreter: the project's environment here, "python" in the reference.
    return ["python" if word.endswith("/python") else word for word in words]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def test_training_across_two_nodes_equals_one_process(multinode_cluster, project: Path) -> None:
    target = "results/model/model.pt"
    model = project / target
    proc = run_snakemake(project, "--profile", "profiles/slurm", "--config", *SMALL, TWO_NODES, "--", target)
    (jobid,) = slurm_jobs_by_rule(proc.stdout + proc.stderr)["train"]
    rows = accounted(jobid)
    assert rows[jobid]["nnodes"] == "2" and rows[jobid]["state"] == "COMPLETED", rows
    # The training itself is one job step over both nodes (snakedvc launch's srun), one task a node.
    assert rows[f"{jobid}.0"]["nnodes"] == "2", rows
    assert hostnames(rows[f"{jobid}.0"]["nodelist"]) == {"node1", "node2"}

    log = (project / "logs/train.log").read_text()
    assert launcher(log, jobid) == launcher(REFERENCE.read_text(), "4242")
    ranks = dict(re.findall(r"rank (\d) of 2 on (\S+) ", log))
    assert set(ranks) == {"0", "1"} and len(set(ranks.values())) == 2, log[:2000]
    assert set(ranks.values()) == {"node1", "node2"}

    # The same training in one process (local profile): the same weights up to float32 summation order.
    two_nodes = weights(model)
    run_snakemake(project, "--profile", "profiles/local", "--config", *SMALL, "--", target)
    assert "rank 1 of" not in (project / "logs/train.log").read_text()
    one = weights(model)
    assert one.keys() == two_nodes.keys()
    difference = max((one[k] - two_nodes[k]).abs().max().item() for k in one)
    assert difference < 1e-5, difference


def test_sigterm_to_two_node_training_checkpoints_and_the_retry_resumes(multinode_cluster, project: Path) -> None:
    long_train = ["data={limit: 200}", "train={max_epochs: 2500, patience: 100000, hidden_sizes: [64]}"]
    snakemake = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--retries", "2",
         "--config", *long_train, TWO_NODES],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for_log(project, "epoch 200 ", snakemake)
    first = running_train_job(project)
    # SIGTERM to the job's steps, as SLURM sends it before the time limit (--signal=TERM@90): the
    # training step on both nodes gets it, the batch script does not. (A plain scancel signals
    # the batch script too; tests/test_slurm_resume.py covers that on one node.)
    subprocess.run(["scancel", "--signal=TERM", first], check=True)
    output = finish(snakemake)

    jobs = slurm_jobs_by_rule(output)["train"]
    assert len(jobs) == 2 and jobs[0] == first, jobs
    for job in jobs:
        assert accounted(job)[job]["nnodes"] == "2"
    # Both ranks, one on each node, stopped at the same step (snakedvc launch --log keeps each rank's
    # output apart in logs/train.log.ranks/, one folder per launch and node); rank 0 wrote the checkpoint there.
    kept = {str(p): p.read_text() for p in (project / "logs/train.log.ranks").rglob("stderr.log")}
    stops = [
        m for text in kept.values() for m in re.findall(r"esol: stopped on SIGTERM at epoch (\d+) step (\d+)", text)
    ]
    assert len(stops) == 2 and stops[0] == stops[1], sorted(kept)
    epoch, step = stops[0]
    log = (project / "logs/train.log").read_text()
    assert f"resumed from epoch {epoch} step {step} (SIGTERM checkpoint" in log, log[:3000]
    assert len(set(re.findall(r"rank \d of 2 on (\S+) ", log))) == 2
    assert (project / "results/metrics.json").is_file()


def test_featurise_shards_and_sweep_trials_spread_over_the_nodes(multinode_cluster, project: Path) -> None:
    sweep = {
        "data": {"limit": 200},
        "train": {"max_epochs": 2, "hidden_sizes": [32], "patience": 10},
        "featurise": {"shards": 4},
        "snakedvc": {
            "sweep": {
                "enabled": True,
                "name": "spread",
                "method": "grid",
                "space": {"train.lr": [0.001, 0.003], "train.dropout": [0.1, 0.3]},
                "strategy": "successive_halving",
                "min_epochs": 1,
                "reduction_factor": 2,
            }
        },
    }
    (project / "sweep.yaml").write_text(json.dumps(sweep))
    proc = run_snakemake(
        project, "--profile", "profiles/slurm", "--group-components", "shards=2", "--configfile", "sweep.yaml"
    )
    out = proc.stdout + proc.stderr
    groups = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/group_shards", out)
    trials = slurm_jobs_by_rule(out)["sweep_trial"]
    assert len(groups) >= 2 and len(trials) == 6, (groups, trials)
    for kind, jobs in (("featurise groups", groups), ("sweep trials", trials)):
        nodes = set().union(*(hostnames(accounted(job)[job]["nodelist"]) for job in jobs))
        assert nodes == {"node1", "node2"}, (kind, nodes)
    assert json.loads((project / "results/sweeps/spread/rungs/rung1.json").read_text())["ranking"]


LOST_NODE_TRAIN = [
    "data={limit: 200}",
    "train={max_epochs: 1500, patience: 100000, hidden_sizes: [64], checkpoint_every: 50}",
]


def lose_node(node: str) -> list[int]:
    """A node lost as a power cut loses it: its slurmd and every process of its jobs killed at once
    (everything in its network namespace, scripts/slurm-cluster's sdvc-<node>). The pids killed."""
    pids = [int(pid) for pid in subprocess.run(
        ["ip", "netns", "pids", f"sdvc-{node}"], capture_output=True, text=True, check=True
    ).stdout.split()]  # fmt: skip
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


@pytest.fixture
def three_node_cluster() -> Iterator[None]:
    """The test cluster with three compute nodes: two-node training that loses one has two left."""
    cluster_up(3)
    yield
    cluster_up(3)  # a lost node's slurmd started again (SLURM returns it to service: ReturnToService=2)


def test_a_node_lost_in_two_node_training_the_training_resumes_bit_for_bit(
    three_node_cluster: None, project: Path, tmp_path: Path
) -> None:
    target = "results/model/model.pt"
    reference = copy_project(tmp_path / "reference")
    run_snakemake(reference, "--profile", "profiles/slurm", "--config", *LOST_NODE_TRAIN, TWO_NODES, "--", target)
    snakemake = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--retries", "2",
         "--config", *LOST_NODE_TRAIN, TWO_NODES, "--", target],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for_log(project, "epoch 300 ", snakemake)
    first = running_train_job(project)
    batch_node, other = sorted(hostnames(running_nodelist(first)))
    lose_node(other)  # not the batch script's node: the job's second half vanishes under it
    output = finish(snakemake)

    # SLURM marked the node down and requeued the job (JobRequeue=1): the same job ran again on the
    # nodes that are up; no retry of Snakemake's ran beside it.
    assert slurm_jobs_by_rule(output)["train"] == [first], output[-3000:]
    assert f"SLURM job {first} (rule train) lost a node (NODE_FAIL); SLURM requeued it" in output
    attempts = wait_until(lambda: job_attempts(first), f"accounting of job {first}'s requeue", timeout=60)
    assert [state for state, _ in attempts] == ["NODE_FAIL", "COMPLETED"], attempts
    assert other in hostnames(attempts[0][1]) and other not in hostnames(attempts[1][1]), attempts
    # The training resumed from its last periodic checkpoint, and ended with the reference's weights, bit for bit.
    log = (project / "logs/train.log").read_text()
    assert re.search(r"resumed from epoch \d+ step \d+ \(periodic checkpoint", log), log[-3000:]
    lost, kept = weights(project / target), weights(reference / target)
    assert lost.keys() == kept.keys() and all(torch.equal(lost[k], kept[k]) for k in kept)


def job_attempts(jobid: str) -> list[tuple[str, str]] | None:
    """(state, nodelist) of each run of a requeued job (sacct -D), once the last has ended."""
    out = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", "-j", jobid, "-o", "State,NodeList"], capture_output=True, text=True
    ).stdout
    rows = [tuple(line.split("|")) for line in out.splitlines() if line]
    rows = [(state.split()[0], nodes) for state, nodes in rows]
    return rows if rows and rows[-1][0] not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED") else None


def running_nodelist(jobid: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", jobid, "-o", "%N"], capture_output=True, text=True, check=True)
    return out.stdout.strip()
