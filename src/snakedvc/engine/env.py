"""Process-environment helpers used by the workflow at parse time."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def use_this_interpreter() -> None:
    """Put the running interpreter's bin folder first on PATH.

    Rules call `python -m snakedvc`; this makes that the venv running Snakemake,
    locally and inside SLURM jobs (which re-parse the workflow), activated or not.
    """
    bindir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bindir]:
        os.environ["PATH"] = os.pathsep.join([bindir, *[p for p in parts if p and p != bindir]])


def python_module(module: str) -> list[str]:
    """`python -m MODULE` with the running interpreter, without the working directory on sys.path
    (-P): `-m` puts it first, and a project's own copy.py or logging.py then shadows the standard
    library's module of that name inside Snakemake or DVC (found by DVC's own tests, whose
    projects have a copy.py)."""
    return [sys.executable, "-P", "-m", module]
