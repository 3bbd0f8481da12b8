"""Training checkpoints: atomic writes, validated loads, and a stop request from SLURM's signal.

The pieces under `snakedvc.torch.resume.Resumable`, which most loops use instead.
A checkpoint holds everything a resumed run needs to continue bit for bit:
model, optimizer, epoch and step (data position), RNG states, the user's own
state (early stopping, history...), and the key of the run it belongs to.
Checkpoints live outside the rule's outputs (Snakemake deletes the outputs of a
failed job), in `<root>/<key>/`, where the key hashes the params and the input
files: a checkpoint of other params is never used. One trainer at a time writes
there: `CheckpointStore.lease` (a `CheckpointLease`) makes a second one wait,
then fail with `CheckpointBusy` naming the first (host, pid, SLURM job); the lease itself
is `snakedvc.lease`, which needs no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import random
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

from snakedvc.errors import EXIT_CHECKPOINTED  # noqa: F401 - part of this module's API
from snakedvc.io import atomic_path
from snakedvc.lease import DEFAULT_LEASE_WAIT_S, LEASE_FILE, TAKEOVER_FILE, CheckpointLease

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.pt$")


def run_key(config: Any, inputs: Sequence[str | Path], code: Sequence[Path] = ()) -> str:
    """Identity of a training run: its params (JSON-able; paths as strings), the bytes of its inputs
    and of its ``code`` (see code_files).

    An input is a file or a folder (a folder of shards): a folder gives every file under it, in the
    order of their paths, each path (relative to the folder) with its bytes, so a renamed, added or
    removed shard is another run too."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for file in code:
        digest.update(b"code\0" + file.name.encode() + b"\0")
        _update(digest, file)
    for path in map(Path, inputs):
        if path.is_dir():
            for file in sorted(f for f in path.rglob("*") if f.is_file()):
                digest.update(file.relative_to(path).as_posix().encode() + b"\0")
                _update(digest, file)
        elif path.exists():
            _update(digest, path)
        else:
            raise FileNotFoundError(
                f"Resumable: input {path} does not exist (inputs= names the files or folders "
                "the training reads, to tell one run's checkpoints from another's)"
            )
    return digest.hexdigest()[:20]


def code_files(project: Path | None = None) -> list[Path]:
    """The training's own Python code, as loaded so far: the script (``__main__``) and the modules
    imported from the project's folder (``project``, default the working directory), not installed
    packages nor the kit. A checkpoint of other code is never resumed: its epochs were not this
    code's (an edited train.py resumed from its old self, and the experiment mixed both)."""
    import sys

    root = (project or Path.cwd()).resolve()
    found = set()
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        # (Some extension modules name a file that is not there, relative: torch._classes.)
        if not file or not Path(file).is_absolute() or name == "snakedvc" or name.startswith("snakedvc."):
            continue
        path = Path(file).resolve()
        installed = {"site-packages", "dist-packages"} & set(path.parts)
        mine = name == "__main__" or (path.is_relative_to(root) and not installed)
        if path.suffix == ".py" and mine and path.is_file():
            found.add(path)
    return sorted(found)


def _update(digest: Any, path: Path) -> None:
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def rng_state() -> dict[str, Any]:
    """Every global RNG a loop may draw from (dropout, shuffling, augmentation)."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointStore:
    """The checkpoints of one run, newest first; keeps the last ``keep`` of them."""

    def __init__(self, root: str | Path, key: str, keep: int = 2) -> None:
        self.dir = Path(root) / key
        self.key = key
        self.keep = keep

    def path(self, epoch: int, step: int) -> Path:
        return self.dir / f"ckpt-e{epoch:05d}-s{step:06d}.pt"

    def candidates(self) -> list[Path]:
        found = [(tuple(map(int, m.groups())), p) for p in self.dir.glob("ckpt-*.pt") if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found, reverse=True)]

    def save(self, state: dict[str, Any], epoch: int, step: int) -> Path:
        payload = {"format": FORMAT_VERSION, "key": self.key, "epoch": epoch, "step": step, **state}
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        target = self.path(epoch, step)
        with atomic_path(target) as tmp:  # temp file + fsync + rename: a kill mid-write leaves the old one
            tmp.write_bytes(buffer.getvalue())
        for old in self.candidates()[self.keep :]:
            old.unlink(missing_ok=True)
        return target

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that loads and belongs to this run; warns about each one skipped."""
        for path in self.candidates():
            try:
                payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
            except Exception as error:  # truncated or corrupt files raise many exception types
                log.warning("skipping unreadable checkpoint %s: %s", path, error)
                continue
            if payload.get("format") != FORMAT_VERSION or payload.get("key") != self.key:
                log.warning("skipping checkpoint %s: it belongs to other params or another format", path)
                continue
            payload["path"] = str(path)
            return payload
        return None

    def lease(self, wait_s: float = DEFAULT_LEASE_WAIT_S, **options: float) -> CheckpointLease:
        """An exclusive lease on this run's folder, not yet taken: ``with store.lease(wait_s=5): ...``
        or ``lease.acquire()`` ... ``lease.release()``. ``options``: those of CheckpointLease."""
        return CheckpointLease(self.dir, wait_s=wait_s, **options)

    def remove_all(self) -> None:
        """Remove the checkpoints, and the folder once empty; a lease file stays until its holder releases it."""
        for path in self.dir.glob("*"):
            if path.name not in (LEASE_FILE, TAKEOVER_FILE):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # gone already, or not empty: a lease is still held
            self.dir.rmdir()


def save_state(state: dict[str, Any], path: str | Path) -> Path:
    """Write a run's final state (see Resumable.finish) atomically, for a later continuation."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT_VERSION, **state}, buffer)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())
    return Path(path)


def load_state(path: str | Path) -> dict[str, Any]:
    """Read a state written by save_state; a clear error names the file if it is not one."""
    try:
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as error:  # truncated or corrupt files raise many exception types
        raise ValueError(f"{path} is not a readable training state: {error}") from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION or "model" not in payload:
        raise ValueError(f"{path} is not a snakedvc training state (format {FORMAT_VERSION})")
    payload["path"] = str(path)
    return payload


class StopRequest:
    """Set by SIGTERM (SLURM's warning signal, scancel, preemption, time limit).

    The trainer polls it between steps; on a request it checkpoints and exits.
    SIGUSR1 is left alone: NCCL uses it. The handler stays installed after training:
    a SIGTERM while the outputs are written lets the job complete them.
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.requested = False
        self.signum: int | None = None
        for signum in signals:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signum = signum
        log.warning("received %s: will checkpoint and stop after the current step", signal.Signals(signum).name)
