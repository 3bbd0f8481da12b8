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
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from esol.config import TrainConfig
from esol.data import DataError
from esol.errors import TrainingDivergedError
from esol.features import FeatureSet, apply_scaling, fit_scaling
from esol.model import MLP, dropout_masks
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
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Batch order of one epoch, a pure function of (seed, epoch) so a resumed run replays it."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def rank_slice(n: int, ctx: DistContext) -> slice:
    """This rank's contiguous share of n items (shares differ by at most one)."""
    base, extra = divmod(n, ctx.world_size)
    start = ctx.rank * base + min(ctx.rank, extra)
    return slice(start, start + base + (1 if ctx.rank < extra else 0))


def _sum_squared_error(model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch: int = 1024) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(X), batch):
            total += float(((model(X[start : start + batch]) - y[start : start + batch]) ** 2).sum())
    return total


def train_model(
    train: FeatureSet,
    valid: FeatureSet,
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
    y_mean = float(np.mean(train.y))
    y_std = float(np.std(train.y)) or 1.0
    device = ctx.device
    # Descriptor features are standardised with the training split's statistics (kept in the
    # model for prediction); 0/1 fingerprints go in as they are.
    scaling = fit_scaling(train.X)
    if scaling is not None:
        train = replace(train, X=apply_scaling(train.X, *scaling))
        valid = replace(valid, X=apply_scaling(valid.X, *scaling))
    X_train = torch.from_numpy(train.X).to(device)
    y_train = torch.from_numpy(((train.y - y_mean) / y_std).astype(np.float32)).to(device)
    mine = rank_slice(len(valid), ctx)
    X_valid = torch.from_numpy(valid.X[mine]).to(device)
    y_valid = torch.from_numpy(((valid.y[mine] - y_mean) / y_std).astype(np.float32)).to(device)

    model = MLP(X_train.shape[1], cfg.hidden_sizes, cfg.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    # Where training stands beyond model, optimizer and position: a checkpoint's extra state.
    running = 0.0
    best_loss, best_epoch, best_state = math.inf, 0, copy.deepcopy(model.state_dict())
    rows: list[tuple[int, float, float, float]] = []
    stopped_early = False

    def extra() -> dict[str, Any]:
        # The partial epoch loss of every rank (an all-reduce: called on every rank), restored on rank 0 alone.
        (total_running,) = all_sum([running], ctx)
        return {
            "running": total_running,
            "best_loss": best_loss,
            "best_epoch": best_epoch,
            "best_state": best_state,
            "history": rows,
            "config": asdict(cfg),
            "stopped_early": stopped_early,
        }

    start = resume.load(model, optimizer, extra, first_epoch=1)
    if start.resumed:
        state = start.extra
        running = state["running"] if ctx.is_main else 0.0
        best_loss, best_epoch, best_state = state["best_loss"], state["best_epoch"], state["best_state"]
        rows = [tuple(r) for r in state["history"]]
        stopped_early = bool(state.get("stopped_early", False))
    rows_at_start = len(rows)
    if live is not None:
        live.restore(epoch_metrics(row) for row in rows)

    net: nn.Module = model
    if ctx.distributed:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

    started = time.perf_counter()
    epoch = start.epoch
    while epoch <= cfg.max_epochs and not stopped_early:
        net.train()
        order = epoch_order(len(X_train), cfg.seed, epoch)
        for step, first in resume.steps(range(0, len(order), cfg.batch_size), epoch):
            batch = order[first : first + cfg.batch_size]
            share = rank_slice(len(batch), ctx)
            idx = batch[share].to(device)
            masks = dropout_masks(len(batch), cfg.hidden_sizes, cfg.dropout, cfg.seed, epoch, step)
            masks = [m[share].to(device) for m in masks]
            optimizer.zero_grad(set_to_none=True)
            squared = ((net(X_train[idx], masks) - y_train[idx]) ** 2).sum()
            # DDP averages gradients over ranks: scale so the average is the global-batch mean.
            (squared * (ctx.world_size / len(batch))).backward()
            optimizer.step()
            running += float(squared.detach())
        train_sse, valid_sse = all_sum([running, _sum_squared_error(model, X_valid, y_valid)], ctx)
        running = 0.0
        train_loss = train_sse / len(X_train)
        if not math.isfinite(train_loss):
            raise TrainingDivergedError(
                f"training diverged: train loss is {train_loss} at epoch {epoch}; lower train.lr (now {cfg.lr:g})"
            )
        valid_loss = valid_sse / len(valid) if len(valid) else train_loss
        valid_rmse = math.sqrt(valid_loss) * y_std
        rows.append((epoch, train_loss, valid_loss, valid_rmse))
        if live is not None:
            live.epoch(epoch, **epoch_metrics(rows[-1])[1])
        if ctx.is_main:
            log.info(
                "epoch %d train_loss %.4f valid_loss %.4f valid_rmse %.4f", epoch, train_loss, valid_loss, valid_rmse
            )
        if valid_loss < best_loss:
            best_loss, best_epoch, best_state = valid_loss, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= cfg.patience:
            if ctx.is_main:
                log.info("early stop at epoch %d: no better valid loss since epoch %d", epoch, best_epoch)
            stopped_early = True
        if cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0 and epoch < cfg.max_epochs:
            resume.save()
        epoch += 1

    elapsed = time.perf_counter() - started
    # Where training stopped, for a later run with a larger max_epochs; before the best weights are loaded.
    final_state = resume.finish(epoch)
    if ctx.is_main:
        samples = (len(rows) - rows_at_start) * len(X_train)
        log.info(
            "throughput: %d samples in %.2f s = %.0f samples/s (%d process(es), %s)",
            samples, elapsed, samples / max(elapsed, 1e-9), ctx.world_size, device,
        )  # fmt: skip
    model.load_state_dict(best_state)
    model.eval()
    model.cpu()
    meta = {
        "n_features": int(X_train.shape[1]),
        "hidden_sizes": list(cfg.hidden_sizes),
        "dropout": float(cfg.dropout),
        "y_mean": y_mean,
        "y_std": y_std,
        "best_epoch": best_epoch,
        "config": asdict(cfg),
    }
    if scaling is not None:
        meta["x_mean"], meta["x_std"] = (torch.from_numpy(a) for a in scaling)
    history = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
    return TrainResult(
        model=model,
        history=history,
        best_epoch=best_epoch,
        meta=meta,
        final_state=final_state,
        epochs_trained=len(rows) - rows_at_start,
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
