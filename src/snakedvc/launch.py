"""`snakedvc launch -- COMMAND`: run the user's own command on 1 process, N local processes
(N GPUs), or N nodes.

1 process runs COMMAND as it is; N processes on one node wrap it in torchrun; K nodes wrap
that in `srun --ntasks-per-node=1`, one torchrun agent per node meeting by c10d rendezvous on
the allocation's first host. torchrun starts COMMAND itself (`--no-python`), so any command
works: `python train.py ...`, `python -m pkg ...`, a console script.

Inside a SLURM allocation but outside any job step (a batch script: where snakedvc-slurm runs a
rule's command), every layout runs as a job step of its own (`srun`): SLURM sends
`--signal=TERM@...` to job steps, not to the batch shell, so that is how a checkpointing trainer
learns of its time limit. The step asks for the allocation's CPUs per task explicitly: since Slurm
22.05 srun no longer takes them from the batch environment.

Command lines are argument lists built by pure functions (compared against reference files in
tests); `run` fills in what only the running job knows (SLURM job id, first host, whether it is
in a step) and replaces itself with the command.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from snakedvc import slurm

log = logging.getLogger(__name__)

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
    own_step: bool = False,
    cpus_per_task: int | None = None,
    rank_logs: str | None = None,
) -> list[str]:
    """The argv that runs ``command`` with this layout.

    ``python``: the interpreter that runs torchrun. ``own_step``: run it as a SLURM job step of its
    own (in a batch script); multi-node layouts always are. ``cpus_per_task``: the allocation's
    CPUs per task, given to that step. ``rank_logs``: with N processes, every line a rank writes is
    shown prefixed ``[default<local rank>]:`` (torchrun's ``--tee``; across nodes srun's ``--label``
    puts the node's index first) and each rank's output is also kept in a file of its own under
    this folder (torchrun's ``--log-dir``: ``<run>/attempt_<n>/<local rank>/stdout.log``).
    """
    if not command:
        raise ValueError("nothing to launch: give the command after `--`")
    torchrun = [python, "-m", "torch.distributed.run"]
    if rank_logs and layout.world_size > 1:
        torchrun += [f"--log-dir={rank_logs}", "--tee=3"]
    if layout.nodes == 1:
        if layout.world_size == 1:
            inner = list(command)
        else:
            inner = [
                *torchrun,
                "--standalone",
                "--nnodes=1",
                f"--nproc-per-node={layout.procs_per_node}",
                "--no-python",
                *command,
            ]
        return [*slurm.step_command(1, cpus_per_task), *inner] if own_step else inner
    if not (slurm_job_id and first_host):
        raise ValueError("multi-node training runs inside a SLURM allocation (SLURM_JOB_ID and its node list)")
    label = ["--label"] if rank_logs else []
    return [
        *slurm.step_command(layout.nodes, cpus_per_task),
        *label,
        *torchrun,
        f"--nnodes={layout.nodes}",
        f"--nproc-per-node={layout.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={first_host}:{rdzv_port(slurm_job_id)}",
        f"--rdzv-id={slurm_job_id}",
        "--no-python",
        *command,
    ]


def here(layout: Layout, command: Sequence[str], log_path: str | None = None) -> list[str]:
    """The argv that runs ``command`` with this layout in this process's place: in or out of a
    SLURM job step, on this allocation's nodes."""
    job_id = slurm.job_id() if layout.nodes > 1 else None
    return launch_command(
        layout,
        command,
        python=sys.executable,
        slurm_job_id=job_id,
        first_host=slurm.first_host() if job_id else None,
        own_step=slurm.in_allocation_outside_steps(),
        cpus_per_task=slurm.cpus_per_task(),
        rank_logs=f"{log_path}.ranks" if log_path else None,
    )


def run(layout: Layout, command: Sequence[str], log_path: str | None = None) -> None:
    """Replace this process with the launch command (so it stays Snakemake's direct child).

    ``log_path``: the rule's log, which already receives this process's stdout and stderr (and so the
    command's); with N processes each rank's output is also kept beside it, in ``<log>.ranks/``.
    """
    argv = here(layout, command, log_path)
    # What ran, in the rule's log: the line a reference file (tests/reference/launch/) is checked against.
    log.info("launch: %s", shlex.join(argv))
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    sys.stdout.flush()
    os.execvp(argv[0], argv)
