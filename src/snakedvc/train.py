"""Training loop: seeded, deterministic on CPU, early stopping on validation loss."""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from snakedvc.config import TrainConfig
from snakedvc.data import DataError
from snakedvc.features import FeatureSet
from snakedvc.io import atomic_path
from snakedvc.model import MLP, save_model

log = logging.getLogger(__name__)

HISTORY_COLUMNS = ("epoch", "train_loss", "valid_loss", "valid_rmse")


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    model: MLP
    history: pd.DataFrame
    best_epoch: int
    meta: dict[str, object] = field(default_factory=dict)


def make_deterministic(seed: int, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Batch order of one epoch, a pure function of (seed, epoch) so a resumed run replays it."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def _mean_loss(model: MLP, X: torch.Tensor, y: torch.Tensor, batch: int = 1024) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(X), batch):
            pred = model(X[start : start + batch])
            total += float(((pred - y[start : start + batch]) ** 2).sum())
    return total / max(len(X), 1)


def train_model(train: FeatureSet, valid: FeatureSet, cfg: TrainConfig) -> TrainResult:
    if len(train) == 0:
        raise DataError("the training split has no valid molecules")
    make_deterministic(cfg.seed, cfg.torch_threads)
    y_mean = float(np.mean(train.y))
    y_std = float(np.std(train.y)) or 1.0
    X_train = torch.from_numpy(train.X)
    y_train = torch.from_numpy(((train.y - y_mean) / y_std).astype(np.float32))
    X_valid = torch.from_numpy(valid.X)
    y_valid = torch.from_numpy(((valid.y - y_mean) / y_std).astype(np.float32))

    model = MLP(X_train.shape[1], cfg.hidden_sizes, cfg.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = nn.MSELoss()

    best_loss, best_epoch, best_state = math.inf, 0, copy.deepcopy(model.state_dict())
    rows = []
    for epoch in range(1, cfg.max_epochs + 1):
        model.train()
        order = epoch_order(len(X_train), cfg.seed, epoch)
        seen, running = 0, 0.0
        for start in range(0, len(order), cfg.batch_size):
            idx = order[start : start + cfg.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(X_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            running += float(loss.detach()) * len(idx)
            seen += len(idx)
        train_loss = running / seen
        if not math.isfinite(train_loss):
            raise TrainingDivergedError(
                f"training diverged: train loss is {train_loss} at epoch {epoch}; lower train.lr (now {cfg.lr:g})"
            )
        valid_loss = _mean_loss(model, X_valid, y_valid) if len(X_valid) else train_loss
        valid_rmse = math.sqrt(valid_loss) * y_std
        rows.append((epoch, train_loss, valid_loss, valid_rmse))
        log.info("epoch %d train_loss %.4f valid_loss %.4f valid_rmse %.4f", epoch, train_loss, valid_loss, valid_rmse)
        if valid_loss < best_loss:
            best_loss, best_epoch, best_state = valid_loss, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= cfg.patience:
            log.info("early stop at epoch %d: no better valid loss since epoch %d", epoch, best_epoch)
            break

    model.load_state_dict(best_state)
    model.eval()
    meta = {
        "n_features": int(X_train.shape[1]),
        "hidden_sizes": list(cfg.hidden_sizes),
        "dropout": float(cfg.dropout),
        "y_mean": y_mean,
        "y_std": y_std,
        "best_epoch": best_epoch,
        "config": asdict(cfg),
    }
    history = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
    return TrainResult(model=model, history=history, best_epoch=best_epoch, meta=meta)


def write_history(history: pd.DataFrame, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        history.to_csv(tmp, index=False, float_format="%.6g")


def save_result(result: TrainResult, model_path: str | Path, history_path: str | Path) -> None:
    save_model(model_path, result.model, result.meta)
    write_history(result.history, history_path)
