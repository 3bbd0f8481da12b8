"""Training helpers for PyTorch loops (the `torch` extra): resumable training and the distributed context.

`Resumable` is what a training loop adopts (see `snakedvc.torch.resume`); the rest are its parts.
It is imported on first use, so `add_resume_arguments` and the exception cost no torch import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snakedvc.errors import EXIT_CHECKPOINTED, TrainingStopped
from snakedvc.torch.options import add_resume_arguments

if TYPE_CHECKING:
    from snakedvc.torch.resume import Resumable, Start

__all__ = ["EXIT_CHECKPOINTED", "Resumable", "Start", "TrainingStopped", "add_resume_arguments"]


def __getattr__(name: str) -> Any:
    if name in ("Resumable", "Start"):
        from snakedvc.torch import resume

        return getattr(resume, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
