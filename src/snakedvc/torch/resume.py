"""Resumable training for any PyTorch loop: checkpoint, stop on SIGTERM, resume bit for bit.

A plain ``train.py`` adopts it in a few lines::

    from snakedvc.torch import Resumable

    resume = Resumable(vars(args), inputs=[args.data])    # keyed by params + input bytes + code; SIGTERM/SIGINT handler
    for epoch in resume.epochs(args.epochs, model, optimizer):   # 1..N, from the newest checkpoint
        for step, batch in resume.steps(batches(epoch), epoch):
            ...                                           # one optimizer step
        resume.log(valid_loss=...)                        # the epoch's metrics (kept in the checkpoint)
    resume.finish(test_loss=...)                          # final state if asked; checkpoints removed

Each epoch ends in a checkpoint (rank 0, atomic). On SIGTERM ``steps`` checkpoints the current
step and raises ``TrainingStopped``, a ``SystemExit`` with ``EXIT_CHECKPOINTED``: the non-zero
exit makes Snakemake retry the job, and the retry resumes. ``load``/``save`` are the same steps
one by one, for a loop that counts epochs its own way. Checkpoints hold the
model, optimizer, every rank's RNG states, the data position (epoch, step) and
the user's ``extra`` state. What a checkpoint cannot hold must be a pure
function of the position for an exact resume: the batch order of an epoch
(seed it with the epoch, e.g. ``DistributedSampler.set_epoch``).

From ``load`` to ``finish`` or the stop, rank 0 holds a lease on the run's
checkpoint folder (``snakedvc.lease.CheckpointLease``): a second
trainer of the same run (an orphan of a dead workflow controller, a retry that
starts while its predecessor writes its SIGTERM checkpoint) waits for it, then
fails with ``CheckpointBusy`` naming the holder's host, pid and SLURM job.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from snakedvc.errors import CheckpointBusy, NoProcessGroup, TrainingStopped
from snakedvc.lease import DEFAULT_LEASE_WAIT_S, CheckpointLease
from snakedvc.live import EpochLog
from snakedvc.torch.checkpoint import (
    CheckpointStore,
    StopRequest,
    code_files,
    load_state,
    rng_state,
    run_key,
    save_state,
    set_rng_state,
)
from snakedvc.torch.distributed import DistContext, all_gather, all_sum, detect
from snakedvc.torch.options import CONTINUE_FROM_ENV, FINAL_STATE_ENV

log = logging.getLogger(__name__)

T = TypeVar("T")

# Keys of a checkpoint that are the helper's own; the user's extra state takes any others.
RESERVED = frozenset({"format", "key", "epoch", "step", "model", "optimizer", "rng", "rng_ranks", "reason", "path"})
METRICS_KEY = "epoch_metrics"  # the rows of Resumable.log, restored with the checkpoint
SUMS_KEY = "epoch_sums_ranks"  # each rank's Resumable.sums at the checkpoint's step


class Stop(Protocol):
    """What ``steps`` polls once per step: a StopRequest, or a test's deterministic stand-in."""

    @property
    def requested(self) -> bool: ...


@dataclass(frozen=True)
class Start:
    """Where a run starts: the epoch and step to run next, and the user's extra state ({} if fresh)."""

    epoch: int
    step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # "checkpoint", "continued" (from continue_from), None: a fresh start
    path: str | None = None

    @property
    def resumed(self) -> bool:
        return self.source is not None


class Resumable:
    """Checkpoints, stop and resume for one training run; every rank makes one and calls it alike.

    ``key`` (JSON-able params), the bytes of ``inputs`` and the training's own code (the script and
    the project's modules it imported: checkpoint.code_files; ``code=False`` leaves it out) name the
    run's checkpoint folder under ``root``, so a checkpoint of other params, data or code is never used. ``continue_from`` (a
    path, or a state already loaded) is where to start when there is no checkpoint: the final
    state of an earlier, shorter run of the same trial; ``final_state`` is where ``finish`` writes
    the state at the end. Left out, both come from ``snakedvc launch --continue-from/--final-state``
    (a sweep trial's, through the environment). ``root=None`` keeps no checkpoints. ``live``: a
    folder where rank 0 writes the metrics of ``log`` in dvclive's layout (the ``live`` extra).
    ``stop`` defaults to a StopRequest on SIGTERM and SIGINT; ``ctx`` to the torchrun environment. ``lease_wait_s``: how long ``load``
    waits for another trainer that holds the checkpoint folder before it raises CheckpointBusy.
    """

    def __init__(
        self,
        key: Any,
        inputs: Sequence[str | Path] = (),
        *,
        root: str | Path | None = ".checkpoints",
        live: str | Path | None = None,
        keep: int = 2,
        keep_checkpoints: bool = False,
        continue_from: str | Path | Mapping[str, Any] | None = None,
        final_state: str | Path | None = None,
        stop: Stop | None = None,
        ctx: DistContext | None = None,
        lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
        code: bool = True,
    ) -> None:
        self.ctx = ctx or detect()
        if continue_from is None:
            continue_from = os.environ.get(CONTINUE_FROM_ENV) or None
        if final_state is None:
            final_state = os.environ.get(FINAL_STATE_ENV) or None
        self.lease_wait_s = lease_wait_s
        self._lease: CheckpointLease | None = None  # rank 0's, from load to finish or stop
        self.keep_checkpoints = keep_checkpoints
        self.final_state = Path(final_state) if final_state else None
        self.continue_from: dict[str, Any] | None = None
        if isinstance(continue_from, Mapping):
            # A copy: loading an optimizer state shares its tensors, which training then updates in place.
            self.continue_from = copy.deepcopy(dict(continue_from))
        elif continue_from is not None:
            # Read now, so a bad file fails before training; its bytes are part of the run's identity.
            self.continue_from = load_state(continue_from)
            inputs = [*inputs, continue_from]
        code_read = code_files() if code else []
        self.store = CheckpointStore(root, run_key(key, inputs, code_read), keep) if root is not None else None
        self.stop: Stop = stop if stop is not None else StopRequest()
        self._model: nn.Module | None = None
        self._optimizer: Optimizer | None = None
        self._extra: Callable[[], dict[str, Any]] | None = None
        self._next: tuple[int, int] | None = None  # where training continues after the last completed epoch
        self._skip: tuple[int, int] | None = None  # the resumed position, whose steps ``steps`` skips once
        self._epoch: int | None = None  # the epoch ``steps`` or ``epochs`` is in, which ``log`` logs
        # Rank 0 writes dvclive's files; every rank keeps the rows, which travel in the checkpoint.
        params = dict(key) if isinstance(key, Mapping) else None
        if live is not None and self.ctx.is_main:
            self._metrics = EpochLog(live, params=params)
        else:
            self._metrics = EpochLog(".", main=False)  # rows only
        self.start: Start | None = None  # where ``load`` started: epoch, step, the user's extra state
        # What the loop adds up inside an epoch (``add``): kept in a mid-epoch checkpoint and restored
        # with it, so a resumed epoch's loss sum and sample count are the uninterrupted run's.
        self.sums: dict[str, float] = {}

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, key: Any, inputs: Sequence[str | Path] = (), **kwargs: Any
    ) -> Resumable:
        """A Resumable from the options that ``add_resume_arguments`` added to the parser."""
        return cls(
            key,
            inputs,
            root=args.checkpoint_dir,
            continue_from=args.continue_from,
            final_state=args.final_state,
            lease_wait_s=args.lease_wait,
            **kwargs,
        )

    def epochs(
        self,
        last: int,
        model: nn.Module,
        optimizer: Optimizer | None = None,
        *,
        first: int = 1,
        extra: Callable[[], dict[str, Any]] | None = None,
    ) -> Iterator[int]:
        """Epochs ``first``..``last`` of ``model`` (and ``optimizer``), from where the newest
        checkpoint says: ``load`` before the first, ``save`` after each one's body has run
        (a ``break`` saves nothing more; call ``finish``). ``extra`` as for ``load``."""
        start = self.load(model, optimizer, extra, first_epoch=first)
        for epoch in range(start.epoch, last + 1):
            self._epoch = epoch
            yield epoch
            self.save()

    def add(self, **values: float) -> None:
        """Add to this epoch's sums (``resume.add(loss=loss.item() * n, samples=n)`` in the step loop;
        ``resume.sums["loss"] / resume.sums["samples"]`` after it). ``steps`` starts each epoch at
        zero; a checkpoint taken mid-epoch keeps the sums, and the resumed epoch continues them."""
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)

    def log(self, **metrics: float) -> None:
        """The current epoch's metrics (every rank calls it; rank 0's are written): a line in the
        log and, with ``live``, a row of dvclive's files, on disk at once. They are kept in the checkpoints, so a
        resumed run's files hold every epoch once, as a straight run's do."""
        if self._epoch is None:
            raise RuntimeError(
                "Resumable.log logs an epoch's metrics: call it inside resume.epochs(...) or after steps"
            )
        self._metrics.epoch(self._epoch, **metrics)
        if self.ctx.is_main:
            shown = " ".join(f"{name} {value:.6g}" for name, value in metrics.items())
            log.info("epoch %d: %s", self._epoch, shown)

    def load(
        self,
        model: nn.Module,
        optimizer: Optimizer | None = None,
        extra: Callable[[], dict[str, Any]] | None = None,
        first_epoch: int = 0,
    ) -> Start:
        """Restore model, optimizer and RNGs in place from the newest valid checkpoint, else from
        ``continue_from``; say where to start.

        Also registers what later checkpoints hold: ``extra`` returns the user's own state (best so
        far, history...). It is called on every rank at the same point, so it may all-reduce.
        First rank 0 takes the lease on the checkpoint folder (CheckpointBusy if another trainer
        keeps it); the other ranks wait for that, so all read the same newest checkpoint.
        """
        if self.ctx.distributed and not dist.is_initialized():
            raise NoProcessGroup(
                f"rank {self.ctx.rank} of {self.ctx.world_size} (torchrun's RANK, WORLD_SIZE) has no process group: "
                "a script run on N processes sets one up before training, and trains a DistributedDataParallel "
                "model on its share of each batch (the tutorial's 'train.py lines for procs > 1'), or runs its "
                "loop inside `with snakedvc.torch.distributed.session() as ctx:`"
            )
        self._model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        self._optimizer = optimizer
        self._extra = extra
        self._take_lease()
        try:
            self.start = self._restore(self._model, optimizer, first_epoch)
            self._metrics.restore(self.start.extra.pop(METRICS_KEY, []))
            sums = self.start.extra.pop(SUMS_KEY, None)
            if sums and self.start.step > 0:
                self.sums = dict(sums[self.ctx.rank] if len(sums) == self.ctx.world_size else sums[0])
            return self.start
        except BaseException:  # a checkpoint that does not fit the model: no lease left behind
            self._release_lease()
            raise

    def _restore(self, model: nn.Module, optimizer: Optimizer | None, first_epoch: int) -> Start:
        state = self.store.load_latest() if self.store else None
        source = "checkpoint"
        if state is None and self.continue_from is not None:
            state, source = self.continue_from, "continued"
        if state is None:
            start = Start(first_epoch)
        else:
            model.load_state_dict(state["model"])
            if optimizer is not None:
                optimizer.load_state_dict(state["optimizer"])
            set_rng_state(self._rng_of(state))
            mine = {k: v for k, v in state.items() if k not in RESERVED}
            start = Start(state["epoch"], state["step"], mine, source, state.get("path"))
            if self.ctx.is_main and source == "continued":
                log.info("continuing from epoch %d: the final state of an earlier run, %s", start.epoch, start.path)
            elif self.ctx.is_main:
                log.info(
                    "resumed from epoch %d step %d (%s checkpoint %s)",
                    start.epoch, start.step, state.get("reason", "periodic"), start.path,
                )  # fmt: skip
        self._next = self._skip = (start.epoch, start.step)
        return start

    def steps(self, batches: Iterable[T], epoch: int) -> Iterator[tuple[int, T]]:
        """(step, batch) of one epoch, skipping the steps a resumed checkpoint already holds.

        Before each step all ranks agree whether any was asked to stop; if so, rank 0
        checkpoints this position and every rank raises TrainingStopped.
        """
        skip = self._skip[1] if self._skip and self._skip[0] == epoch else 0
        self._skip = None
        self._epoch = epoch
        if skip == 0:
            self.sums = {}  # a new epoch; a resumed one keeps what the checkpoint's steps added
        first = 0
        if skip and hasattr(batches, "starting_at"):
            # Batches that can start at a step (snakedvc.torch.ShardedRows's) read none before it.
            batches, first = batches.starting_at(skip), skip
        for step, batch in enumerate(batches, start=first):
            if step < skip:
                continue
            agreed = self._stop_agreed()
            if agreed is not None:
                signame = signal.Signals(agreed).name if agreed else "request"
                self._checkpoint(epoch, step, signame)
                self._release_lease()  # the stop checkpoint is written: a retry may take over at once
                # Every rank names the file rank 0 writes (it may still be writing it).
                raise TrainingStopped(self.store.path(epoch, step) if self.store else None, epoch, step, signame)
            yield step, batch
        self._next = (epoch + 1, 0)

    def save(self, next_epoch: int | None = None, next_step: int = 0) -> Path | None:
        """A checkpoint (every rank calls it; rank 0 writes, atomically; the last ``keep`` stay).

        A rerun continues at the epoch after the one ``steps`` last completed, or at
        (``next_epoch``, ``next_step``) if given.
        """
        epoch, step = self._position(next_epoch, next_step)
        return self._checkpoint(epoch, step, "periodic")

    def finish(self, next_epoch: int | None = None, **final: float) -> dict[str, Any]:
        """End of training (every rank): the final state, written to ``final_state`` if set; the
        checkpoints removed unless ``keep_checkpoints``; ``final`` metrics (a test score) beside the
        last epoch's in the ``live`` folder. Returns the state on rank 0, {} elsewhere.

        A later run given the state as ``continue_from`` with more epochs continues exactly.
        """
        self._metrics.finish(**final)
        epoch, step = self._position(next_epoch, 0)
        # A copy: the caller may load other weights (its best epoch's) into the model next.
        state = copy.deepcopy(self._state(epoch, step, "end of run"))
        if not self.ctx.is_main:
            return {}
        try:
            if self.final_state:
                save_state(state, self.final_state)
                log.info("final state (epoch %d next): %s", epoch, self.final_state)
            if self.store and not self.keep_checkpoints:
                self.store.remove_all()
        finally:
            self._release_lease()
        return state

    def _position(self, next_epoch: int | None, next_step: int) -> tuple[int, int]:
        if next_epoch is not None:
            return next_epoch, next_step
        if self._next is None:
            raise RuntimeError("call Resumable.load(model, ...) before saving: it says what a checkpoint holds")
        return self._next

    def _take_lease(self) -> None:
        """Rank 0 leases the checkpoint folder; every rank learns the outcome (one all_gather), so a
        refusal fails all ranks alike instead of leaving the others blocked in a later collective."""
        if self.store is None:
            return
        refusal: Exception | None = None
        if self.ctx.is_main and self._lease is None:
            lease = self.store.lease(wait_s=self.lease_wait_s)
            try:
                self._lease = lease.acquire()
            except Exception as error:  # an unwritable folder too: the other ranks must hear of it
                refusal = error
        if self.ctx.distributed:
            busy, message = all_gather((isinstance(refusal, CheckpointBusy), str(refusal or "")), self.ctx)[0]
            if message and refusal is None:
                raise (CheckpointBusy if busy else RuntimeError)(f"rank 0 could not lease the checkpoints: {message}")
        if refusal is not None:
            raise refusal

    def _release_lease(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def _stop_agreed(self) -> int | None:
        """Any rank's request counts for all, so every rank stops at the same step: None (go on),
        or the signal that asked (0: a request without one). The signal is agreed too: a rank whose
        own SIGTERM had not arrived yet named the stop "request", and its checkpoint said so (seen
        on two nodes under load)."""
        wanted = bool(self.stop.requested)
        signum = int(getattr(self.stop, "signum", None) or 0) if wanted else 0
        if not self.ctx.distributed:
            return signum if wanted else None
        asked, signums, signalled = all_sum([1.0 if wanted else 0.0, float(signum), 1.0 if signum else 0.0], self.ctx)
        if asked == 0:
            return None
        agreed = round(signums / signalled) if signalled else 0
        return agreed if agreed in {int(s) for s in signal.Signals} else 0

    def _checkpoint(self, epoch: int, step: int, reason: str) -> Path | None:
        if self.store is None:
            return None
        state = self._state(epoch, step, reason)
        if not self.ctx.is_main:
            return None
        path = self.store.save(state, epoch, step)
        log.info("checkpoint (%s): %s", reason, path)
        return path

    def _state(self, epoch: int, step: int, reason: str) -> dict[str, Any]:
        """Collective: every rank's RNG states and the user's extra state (which may all-reduce)."""
        if self._model is None:
            raise RuntimeError("call Resumable.load(model, ...) before saving: it says what a checkpoint holds")
        extra = self._extra() if self._extra else {}
        clash = (RESERVED | {METRICS_KEY, SUMS_KEY}) & extra.keys()
        if clash:
            raise ValueError(f"extra state may not use the checkpoint's own keys: {', '.join(sorted(clash))}")
        rng = rng_state()
        state = {
            "epoch": epoch,
            "step": step,
            "model": self._model.state_dict(),
            "optimizer": self._optimizer.state_dict() if self._optimizer else None,
            "rng": rng,
            "reason": reason,
            **extra,
        }
        if self._metrics.rows:
            state[METRICS_KEY] = list(self._metrics.rows)
        if step > 0:  # mid-epoch: what the loop has added up so far travels with the position
            state[SUMS_KEY] = all_gather(dict(self.sums), self.ctx) if self.ctx.distributed else [dict(self.sums)]
        if self.ctx.distributed:
            state["rng_ranks"] = all_gather(rng, self.ctx)
        return state

    def _rng_of(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """This rank's RNG states; rank 0's when the state comes from another number of processes."""
        ranks = state.get("rng_ranks")
        if ranks and len(ranks) == self.ctx.world_size:
            return dict(ranks[self.ctx.rank])
        return dict(state["rng"])
