"""Where this process sits in a run: plain local, torchrun (N processes, M nodes), CUDA or CPU.

The only module that reads rank / world / device from the environment; torchrun
sets RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR/PORT) for every worker.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs progress and writes models and checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def detect(env: dict[str, str] | None = None, cuda: bool | None = None) -> DistContext:
    env = dict(os.environ) if env is None else env
    cuda = torch.cuda.is_available() if cuda is None else cuda
    world = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    backend = ("nccl" if cuda else "gloo") if world > 1 else None
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=device)


@contextlib.contextmanager
def session(timeout_s: int = 600) -> Iterator[DistContext]:
    """Set up the process group when launched by torchrun; always tear it down."""
    ctx = detect()
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    if ctx.distributed and not dist.is_initialized():
        dist.init_process_group(backend=ctx.backend, timeout=datetime.timedelta(seconds=timeout_s))
    log.info(
        "rank %d of %d on %s (local rank %d, backend %s, device %s)",
        ctx.rank,
        ctx.world_size,
        socket.gethostname(),
        ctx.local_rank,
        ctx.backend or "none",
        ctx.device,
    )
    try:
        yield ctx
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def all_sum(values: list[float], ctx: DistContext) -> list[float]:
    """Sum floats over all ranks (identity on one process), in float64."""
    if not ctx.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.cpu()]


def all_gather(value: T, ctx: DistContext) -> list[T]:
    """Every rank's value (any picklable object), in rank order; ``[value]`` on one process."""
    if not ctx.distributed:
        return [value]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered
