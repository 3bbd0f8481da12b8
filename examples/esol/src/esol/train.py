"""Training loop: one code path for 1..N processes (torchrun), deterministic on CPU.

Every rank sees the same global batch order, a pure function of (seed, epoch);
each takes an equal-as-possible slice of every global batch; the loss is scaled
so that DDP's gradient average equals the single-process gradient of the whole
global batch. Dropout masks are drawn per global batch (see model.py). Hence 1
and N processes give the same weights up to floating-point summation order.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch
from torch import nn

from esol.config import TrainConfig
from esol.data import DataError
from esol.errors import TrainingDivergedError
from esol.features import FeatureSet, apply_scaling, fit_scaling
from esol.model import MLP, dropout_masks
from esol.streaming import StreamedFeatures, epoch_order, rank_slice, streamed_data
from snakedvc import atomic_path
from snakedvc.live import EpochLog
from snakedvc.torch import DistContext, Resumable, StopRequest, all_sum

log = logging.getLogger(__name__)

HISTORY_COLUMNS = ("epoch", "train_loss", "valid_loss", "valid_rmse")


@dataclass
class TrainResult:
    model: MLP
    history: pd.DataFrame
    best_epoch: int
    meta: dict[str, object] = field(default_factory=dict)
    # Where training stopped (model, optimizer, data position...): a later run with a larger
    # max_epochs continues from it exactly (successive halving's next rung).
    final_state: dict[str, object] = field(default_factory=dict)
    # Epochs trained by this call (not counting those of a resumed state).
    epochs_trained: int = 0


def make_deterministic(seed: int, threads: int) -> None:
    # cuBLAS is deterministic only with a fixed workspace; without this variable PyTorch's
    # deterministic mode refuses the first matrix product on a GPU (read when cuBLAS starts).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(seed)
    # Unused here, but Resumable keeps Python's and NumPy's generators in every checkpoint:
    # seeded, a run's checkpoints are the same bytes each time (a sweep's replay compares them).
    random.seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def _sum_squared_error(model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch: int = 1024) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(X), batch):
            total += float(((model(X[start : start + batch]) - y[start : start + batch]) ** 2).sum())
    return total


# A step of an epoch: (step, this rank's X and y, the global batch's size, this rank's share of it).
Step = tuple[int, torch.Tensor, torch.Tensor, int, slice]


@dataclass(frozen=True)
class _Tensors:
    """The splits on the device: targets standardised with the training split's mean and spread;
    descriptor features with its scaling (kept in the model); this rank's share of the validation set."""

    X_train: torch.Tensor
    y_train: torch.Tensor
    X_valid: torch.Tensor
    y_valid: torch.Tensor
    n_valid: int
    y_mean: float
    y_std: float
    scaling: tuple[np.ndarray, np.ndarray] | None

    @property
    def n_train(self) -> int:
        return len(self.X_train)

    @property
    def n_features(self) -> int:
        return int(self.X_train.shape[1])

    def batches(self, epoch: int, cfg: TrainConfig, ctx: DistContext, resume: Resumable) -> Iterator[Step]:
        order = epoch_order(self.n_train, cfg.seed, epoch)
        for step, first in resume.steps(range(0, len(order), cfg.batch_size), epoch):
            batch = order[first : first + cfg.batch_size]
            share = rank_slice(len(batch), ctx)
            idx = batch[share].to(ctx.device)
            yield step, self.X_train[idx], self.y_train[idx], len(batch), share

    def valid_sse(self, model: nn.Module, ctx: DistContext) -> float:
        return _sum_squared_error(model, self.X_valid, self.y_valid)


class TrainingData(Protocol):
    """The splits as training reads them: in memory (_Tensors) or streamed from shards (esol.streaming)."""

    @property
    def n_train(self) -> int: ...
    @property
    def n_valid(self) -> int: ...
    @property
    def n_features(self) -> int: ...
    @property
    def y_mean(self) -> float: ...
    @property
    def y_std(self) -> float: ...
    @property
    def scaling(self) -> tuple[np.ndarray, np.ndarray] | None: ...

    def batches(self, epoch: int, cfg: TrainConfig, ctx: DistContext, resume: Resumable) -> Iterator[Step]: ...

    def valid_sse(self, model: nn.Module, ctx: DistContext) -> float: ...


def _tensors(train: FeatureSet, valid: FeatureSet, ctx: DistContext) -> _Tensors:
    y_mean = float(np.mean(train.y))
    y_std = float(np.std(train.y)) or 1.0
    # Descriptor features are standardised with the training split's statistics (kept in the
    # model for prediction); 0/1 fingerprints go in as they are.
    scaling = fit_scaling(train.X)
    if scaling is not None:
        train = replace(train, X=apply_scaling(train.X, *scaling))
        valid = replace(valid, X=apply_scaling(valid.X, *scaling))
    mine = rank_slice(len(valid), ctx)

    def standardised(y: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((y - y_mean) / y_std).astype(np.float32)).to(ctx.device)

    return _Tensors(
        X_train=torch.from_numpy(train.X).to(ctx.device),
        y_train=standardised(train.y),
        X_valid=torch.from_numpy(valid.X[mine]).to(ctx.device),
        y_valid=standardised(valid.y[mine]),
        n_valid=len(valid),
        y_mean=y_mean,
        y_std=y_std,
        scaling=scaling,
    )


@dataclass
class _Progress:
    """Where training stands beyond model, optimizer and position: a checkpoint's extra state."""

    best_state: dict[str, Any]
    running: float = 0.0  # this rank's loss sum of the epoch so far
    best_loss: float = math.inf
    best_epoch: int = 0
    rows: list[tuple[int, float, float, float]] = field(default_factory=list)
    stopped_early: bool = False

    def extra(self, cfg: TrainConfig, ctx: DistContext) -> dict[str, Any]:
        # The partial epoch loss of every rank (an all-reduce: called on every rank), restored on rank 0 alone.
        (total_running,) = all_sum([self.running], ctx)
        return {
            "running": total_running,
            "best_loss": self.best_loss,
            "best_epoch": self.best_epoch,
            "best_state": self.best_state,
            "history": self.rows,
            "config": asdict(cfg),
            "stopped_early": self.stopped_early,
        }

    def restore(self, state: dict[str, Any], ctx: DistContext) -> None:
        self.running = state["running"] if ctx.is_main else 0.0
        self.best_loss, self.best_epoch, self.best_state = state["best_loss"], state["best_epoch"], state["best_state"]
        self.rows = [tuple(r) for r in state["history"]]
        self.stopped_early = bool(state.get("stopped_early", False))


def _training_data(
    train: FeatureSet | StreamedFeatures, valid: FeatureSet | StreamedFeatures, ctx: DistContext
) -> TrainingData:
    if isinstance(train, StreamedFeatures) and isinstance(valid, StreamedFeatures):
        return streamed_data(train, valid, ctx)
    if isinstance(train, FeatureSet) and isinstance(valid, FeatureSet):
        return _tensors(train, valid, ctx)
    raise TypeError("train and valid must both be in memory or both streamed")


def train_model(
    train: FeatureSet | StreamedFeatures,
    valid: FeatureSet | StreamedFeatures,
    cfg: TrainConfig,
    ctx: DistContext | None = None,
    resume: Resumable | None = None,
    initial: dict[str, Any] | None = None,
    live: EpochLog | None = None,
) -> TrainResult:
    """Train; ``resume`` checkpoints, stops on request and resumes (see snakedvc.torch.Resumable).

    Without one, nothing is checkpointed and ``initial``, the ``final_state`` of an earlier,
    shorter run of the same trial (an earlier rung of a sweep), is where training continues.
    ``live`` receives every epoch's losses (dvclive's files, rank 0), those of a resumed or
    continued state first.
    """
    ctx = ctx or (resume.ctx if resume else DistContext())
    if len(train) == 0:
        raise DataError("the training split has no valid molecules")
    if resume is None:
        resume = Resumable(None, root=None, continue_from=initial, stop=StopRequest(signals=()), ctx=ctx)
    elif initial is not None:
        raise ValueError("with a Resumable, give the state to continue from as its continue_from")
    make_deterministic(cfg.seed, cfg.torch_threads)
    data = _training_data(train, valid, ctx)
    model = MLP(data.n_features, cfg.hidden_sizes, cfg.dropout).to(ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    progress = _Progress(best_state=copy.deepcopy(model.state_dict()))
    start = resume.load(model, optimizer, lambda: progress.extra(cfg, ctx), first_epoch=1)
    if start.resumed:
        progress.restore(start.extra, ctx)
    rows_at_start = len(progress.rows)
    if live is not None:
        live.restore(epoch_metrics(row) for row in progress.rows)
    net: nn.Module = model
    if ctx.distributed:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)

    started = time.perf_counter()
    epoch = start.epoch
    while epoch <= cfg.max_epochs and not progress.stopped_early:
        _train_epoch(net, optimizer, data, cfg, ctx, resume, progress, epoch)
        _end_epoch(model, data, cfg, ctx, progress, live, epoch)
        if cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0 and epoch < cfg.max_epochs:
            resume.save()
        epoch += 1
    elapsed = time.perf_counter() - started
    # Where training stopped, for a later run with a larger max_epochs; before the best weights are loaded.
    final_state = resume.finish(epoch)
    trained = len(progress.rows) - rows_at_start
    if ctx.is_main:
        samples = trained * data.n_train
        log.info(
            "throughput: %d samples in %.2f s = %.0f samples/s (%d process(es), %s)",
            samples, elapsed, samples / max(elapsed, 1e-9), ctx.world_size, ctx.device,
        )  # fmt: skip
    return _result(model, data, cfg, progress, final_state, trained)


def _train_epoch(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: TrainingData,
    cfg: TrainConfig,
    ctx: DistContext,
    resume: Resumable,
    progress: _Progress,
    epoch: int,
) -> None:
    """One epoch's steps (from where a resumed epoch stopped); adds this rank's loss to ``progress.running``."""
    net.train()
    for step, X, y, size, share in data.batches(epoch, cfg, ctx, resume):
        # Drawn for the whole global batch, so N ranks drop what 1 rank does.
        masks = dropout_masks(size, cfg.hidden_sizes, cfg.dropout, cfg.seed, epoch, step)
        masks = [m[share].to(ctx.device) for m in masks]
        optimizer.zero_grad(set_to_none=True)
        squared = ((net(X, masks) - y) ** 2).sum()
        # DDP averages gradients over ranks: scale so the average is the global-batch mean.
        (squared * (ctx.world_size / size)).backward()
        optimizer.step()
        progress.running += float(squared.detach())


def _end_epoch(
    model: nn.Module,
    data: TrainingData,
    cfg: TrainConfig,
    ctx: DistContext,
    progress: _Progress,
    live: EpochLog | None,
    epoch: int,
) -> None:
    """The epoch's losses (every rank's summed), its history row and log line, the best weights, early stopping."""
    train_sse, valid_sse = all_sum([progress.running, data.valid_sse(model, ctx)], ctx)
    progress.running = 0.0
    train_loss = train_sse / data.n_train
    if not math.isfinite(train_loss):
        raise TrainingDivergedError(
            f"training diverged: train loss is {train_loss} at epoch {epoch}; lower train.lr (now {cfg.lr:g})"
        )
    valid_loss = valid_sse / data.n_valid if data.n_valid else train_loss
    valid_rmse = math.sqrt(valid_loss) * data.y_std
    progress.rows.append((epoch, train_loss, valid_loss, valid_rmse))
    if live is not None:
        live.epoch(epoch, **epoch_metrics(progress.rows[-1])[1])
    if ctx.is_main:
        log.info("epoch %d train_loss %.4f valid_loss %.4f valid_rmse %.4f", epoch, train_loss, valid_loss, valid_rmse)
    if valid_loss < progress.best_loss:
        progress.best_loss, progress.best_epoch = valid_loss, epoch
        progress.best_state = copy.deepcopy(model.state_dict())
    elif epoch - progress.best_epoch >= cfg.patience:
        if ctx.is_main:
            log.info("early stop at epoch %d: no better valid loss since epoch %d", epoch, progress.best_epoch)
        progress.stopped_early = True


def _result(
    model: MLP, data: TrainingData, cfg: TrainConfig, progress: _Progress, final_state: Any, trained: int
) -> TrainResult:
    """The best epoch's model on the CPU, with what prediction needs (meta) and the history."""
    model.load_state_dict(progress.best_state)
    model.eval()
    model.cpu()
    meta = {
        "n_features": data.n_features,
        "hidden_sizes": list(cfg.hidden_sizes),
        "dropout": float(cfg.dropout),
        "y_mean": data.y_mean,
        "y_std": data.y_std,
        "best_epoch": progress.best_epoch,
        "config": asdict(cfg),
    }
    if data.scaling is not None:
        meta["x_mean"], meta["x_std"] = (torch.from_numpy(a) for a in data.scaling)
    return TrainResult(
        model=model,
        history=pd.DataFrame(progress.rows, columns=list(HISTORY_COLUMNS)),
        best_epoch=progress.best_epoch,
        meta=meta,
        final_state=final_state,
        epochs_trained=trained,
    )


def epoch_metrics(row: tuple[int, float, float, float] | list[Any]) -> tuple[int, dict[str, float]]:
    """A history row as (epoch, metrics) for snakedvc.live.EpochLog."""
    epoch, *values = row
    return int(epoch), dict(zip(HISTORY_COLUMNS[1:], map(float, values), strict=True))


def best_metrics(history: pd.DataFrame) -> dict[str, float]:
    """The best epoch's validation figures, for the end of dvclive's summary."""
    best = history.loc[history["valid_loss"].idxmin()]
    return {"best_epoch": int(best["epoch"]), "best_valid_rmse": float(best["valid_rmse"])}


def write_trial_metrics(
    path: str | Path, history: pd.DataFrame | None = None, epochs_trained: int = 0, error: str = ""
) -> None:
    """A sweep trial's result, the file the kit ranks trials by: the best validation RMSE, or the error."""
    import json

    values: dict[str, Any] = {"error": error}
    if history is not None and len(history):
        best = history.loc[history["valid_loss"].idxmin()]
        values = {
            "valid_rmse": float(best["valid_rmse"]),
            "best_epoch": int(best["epoch"]),
            "epoch": int(history["epoch"].iloc[-1]),
            "epochs_trained": epochs_trained,
        }
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
