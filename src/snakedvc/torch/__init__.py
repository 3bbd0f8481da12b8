"""Training helpers for PyTorch loops (the `torch` extra): resumable training and the distributed context.

`Resumable` is what a training loop adopts (see `snakedvc.torch.resume`); `session`,
`DistContext` and `all_sum` are what a loop needs under torchrun (process group, rank,
summed metrics); `StopRequest` is the SIGTERM flag Resumable polls; `ShardedRows` streams
rows from array shards larger than memory, each rank its share of every global batch. They are imported on
first use, so `add_resume_arguments` and the exception cost no torch import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snakedvc.errors import EXIT_CHECKPOINTED, CheckpointBusy, NoProcessGroup, TrainingStopped
from snakedvc.logs import show_kit_messages
from snakedvc.torch.options import add_resume_arguments

# "resumed from epoch k", "checkpoint (…): path": in the rule's log even where train.py sets up no logging.
show_kit_messages()

if TYPE_CHECKING:
    from snakedvc.torch.checkpoint import StopRequest
    from snakedvc.torch.distributed import DistContext, all_sum, session
    from snakedvc.torch.resume import Resumable, Start
    from snakedvc.torch.shards import ShardedRows, ShardError

__all__ = [
    "EXIT_CHECKPOINTED",
    "CheckpointBusy",
    "NoProcessGroup",
    "DistContext",
    "Resumable",
    "ShardError",
    "ShardedRows",
    "Start",
    "StopRequest",
    "TrainingStopped",
    "add_resume_arguments",
    "all_sum",
    "session",
]
_LAZY = {
    "Resumable": "resume",
    "Start": "resume",
    "ShardedRows": "shards",
    "ShardError": "shards",
    "StopRequest": "checkpoint",
    "DistContext": "distributed",
    "all_sum": "distributed",
    "session": "distributed",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"snakedvc.torch.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
