"""`snakedvc launch -- COMMAND`: run the user's own command on 1 process, N local processes
(N GPUs), or N nodes.

1 process runs COMMAND as it is; N processes on one node wrap it in torchrun; K nodes wrap
that in `srun --ntasks-per-node=1`, one torchrun agent per node meeting by c10d rendezvous on
the allocation's first host. torchrun starts COMMAND itself (`--no-python`), so any command
works: `python train.py ...`, `python -m pkg ...`, a console script. Command lines are argument
lists built by pure functions (compared against reference files in tests); `run` fills in what
only the running job knows (SLURM job id, first host) and replaces itself with the command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RDZV_PORT_BASE = 29500
RDZV_PORT_SPAN = 20000


@dataclass(frozen=True)
class Layout:
    nodes: int = 1
    procs_per_node: int = 1

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.procs_per_node < 1:
            raise ValueError(f"nodes and processes per node must be >= 1, got {self.nodes} x {self.procs_per_node}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def rdzv_port(job_id: str) -> int:
    """A rendezvous port derived from the job id, so jobs sharing a node do not collide."""
    return RDZV_PORT_BASE + int(job_id) % RDZV_PORT_SPAN


def launch_command(
    layout: Layout,
    command: Sequence[str],
    python: str = "python",
    slurm_job_id: str | None = None,
    first_host: str | None = None,
) -> list[str]:
    """The argv that runs ``command`` with this layout (``python``: the interpreter that runs torchrun)."""
    if not command:
        raise ValueError("nothing to launch: give the command after `--`")
    if layout.world_size == 1:
        return list(command)
    torchrun = [python, "-m", "torch.distributed.run"]
    if layout.nodes == 1:
        return [
            *torchrun,
            "--standalone",
            "--nnodes=1",
            f"--nproc-per-node={layout.procs_per_node}",
            "--no-python",
            *command,
        ]
    if not (slurm_job_id and first_host):
        raise ValueError("multi-node training runs inside a SLURM allocation (SLURM_JOB_ID and its node list)")
    return [
        "srun",
        f"--nodes={layout.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *torchrun,
        f"--nnodes={layout.nodes}",
        f"--nproc-per-node={layout.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={first_host}:{rdzv_port(slurm_job_id)}",
        f"--rdzv-id={slurm_job_id}",
        "--no-python",
        *command,
    ]


def first_host_of_allocation(env: Mapping[str, str]) -> str:
    nodelist = env["SLURM_JOB_NODELIST"]
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def run(layout: Layout, command: Sequence[str]) -> None:
    """Replace this process with the launch command (so it stays Snakemake's direct child)."""
    env = os.environ
    job_id = env.get("SLURM_JOB_ID") if layout.nodes > 1 else None
    host = first_host_of_allocation(env) if job_id else None
    argv = launch_command(layout, command, python=sys.executable, slurm_job_id=job_id, first_host=host)
    sys.stderr.flush()
    os.execvp(argv[0], argv)
