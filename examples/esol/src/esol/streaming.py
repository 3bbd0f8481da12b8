"""Training on the featurise step's shards without loading them (config `loading.stream`).

Each split stays on disk as its shards (features files written stored, uncompressed); the kit's
`snakedvc.torch.ShardedRows` reads every rank's share of each global batch from them, in a
seeded global order, and unpacks the fingerprint bits per batch. What in-memory training takes
from the whole split first (the targets' mean and spread, descriptor scaling) is computed here
in two streaming passes, a chunk at a time.
"""

from __future__ import annotations

import logging
import math
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from esol.features import apply_scaling
from snakedvc.torch import ShardedRows, ShardError

if TYPE_CHECKING:
    from esol.config import TrainConfig
    from snakedvc.torch import DistContext, Resumable

CHUNK_ROWS = 65536
log = logging.getLogger(__name__)


def _scalar(path: str | Path, name: str) -> np.ndarray:
    if not Path(path).is_file():
        raise ShardError(f"shard {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            if name not in data.files:
                raise ShardError(f"shard {path}: not a features file (no {name!r})")
            return data[name]
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        if isinstance(error, ShardError):
            raise
        raise ShardError(f"shard {path}: not a readable .npz (truncated?): {error}") from None


@dataclass(frozen=True)
class StreamedFeatures:
    """A split's shards, checked and ready to read (fingerprints unpacked per batch)."""

    rows: ShardedRows
    packed: bool
    n_features: int
    workers: int = 0

    def __len__(self) -> int:
        return len(self.rows)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Batch order of one epoch, a pure function of (seed, epoch) so a resumed run replays it."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def rank_slice(n: int, ctx: DistContext) -> slice:
    """This rank's contiguous share of n items (shares differ by at most one): ShardedRows's too."""
    base, extra = divmod(n, ctx.world_size)
    start = ctx.rank * base + min(ctx.rank, extra)
    return slice(start, start + base + (1 if ctx.rank < extra else 0))


def _order(seed: int, epoch: int, n: int) -> np.ndarray:
    return epoch_order(n, seed, epoch).numpy()


def streamed_features(
    paths: Sequence[str | Path], seed: int, workers: int = 0, block_rows: int = 0
) -> StreamedFeatures:
    """Open a split's shards (every one checked: ShardError names a missing, cut or unlike one).
    By default batches come in the order in-memory training takes them (streaming changes how
    rows arrive, not which); ``block_rows`` > 0 takes ShardedRows's shuffled blocks instead."""
    layouts = {(bool(_scalar(p, "packed")), int(_scalar(p, "n_features"))) for p in paths}
    if len(layouts) > 1:
        raise ShardError(f"shards {', '.join(map(str, paths))} disagree on their features: {sorted(layouts)}")
    packed, n_features = layouts.pop()
    unpack = {"X": n_features} if packed else None
    order = None if block_rows else partial(_order, seed)
    rows = ShardedRows(paths, columns=["X", "y"], unpack=unpack, seed=seed, block_rows=block_rows or 64, order=order)
    return StreamedFeatures(rows, packed, n_features, workers)


def _target_stats(train: StreamedFeatures) -> tuple[float, float]:
    """Mean and (population) spread of the training targets, in two passes: numpy's np.mean and
    np.std, bit for bit, while the split fits in one chunk."""
    n = len(train)
    mean = sum(float(np.sum(chunk["y"].numpy())) for chunk in train.rows.chunks(CHUNK_ROWS, columns=["y"])) / n
    spread = sum(
        float(np.sum((chunk["y"].numpy() - mean) ** 2)) for chunk in train.rows.chunks(CHUNK_ROWS, columns=["y"])
    )
    return mean, math.sqrt(spread / n) or 1.0


def _scaling(train: StreamedFeatures) -> tuple[np.ndarray, np.ndarray] | None:
    """As esol.features.fit_scaling over the whole split: per-feature mean and std of the finite
    values, None for 0/1 fingerprints."""
    if train.packed:
        return None
    count = total = None
    binary = True
    for chunk in train.rows.chunks(CHUNK_ROWS, columns=["X"]):
        values = chunk["X"].numpy().astype(np.float64)
        binary = binary and bool(np.isin(values, (0.0, 1.0)).all())
        finite = np.isfinite(values)
        count = finite.sum(axis=0) + (0 if count is None else count)
        total = np.where(finite, values, 0.0).sum(axis=0) + (0 if total is None else total)
    if binary or count is None or total is None:
        return None
    with np.errstate(all="ignore"):
        mean = np.nan_to_num(total / count)
    squares = np.zeros_like(mean)
    for chunk in train.rows.chunks(CHUNK_ROWS, columns=["X"]):
        values = chunk["X"].numpy().astype(np.float64)
        squares += np.where(np.isfinite(values), (values - mean) ** 2, 0.0).sum(axis=0)
    with np.errstate(all="ignore"):
        std = np.nan_to_num(np.sqrt(squares / count))
    std[std == 0] = 1.0
    return mean, std


@dataclass(frozen=True)
class _Streamed:
    """esol.train's TrainingData read from shards: every rank its share of each global batch."""

    train: StreamedFeatures
    valid: StreamedFeatures
    y_mean: float
    y_std: float
    scaling: tuple[np.ndarray, np.ndarray] | None
    device: torch.device

    @property
    def n_train(self) -> int:
        return len(self.train)

    @property
    def n_valid(self) -> int:
        return len(self.valid)

    @property
    def n_features(self) -> int:
        return self.train.n_features

    def _tensors(self, chunk: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        X = chunk["X"]
        if self.scaling is not None:
            X = torch.from_numpy(apply_scaling(X.numpy(), *self.scaling))
        y = ((chunk["y"].double() - self.y_mean) / self.y_std).float()
        return X.to(self.device), y.to(self.device)

    def batches(
        self, epoch: int, cfg: TrainConfig, ctx: DistContext, resume: Resumable
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, int, slice]]:
        rows = self.train.rows
        # Fingerprints go to the GPU packed and are unpacked there; descriptors are scaled here first.
        device = self.device if self.scaling is None else None
        batches = rows.batches(
            epoch, cfg.batch_size, ctx.rank, ctx.world_size, workers=self.train.workers, device=device
        )
        for step, batch in resume.steps(batches, epoch):
            size = min(cfg.batch_size, len(rows) - step * cfg.batch_size)
            X, y = self._tensors(batch)
            yield step, X, y, size, rank_slice(size, ctx)

    def valid_sse(self, model: nn.Module, ctx: DistContext) -> float:
        """This rank's share of the validation split, 1024 rows at a time (as in memory)."""
        model.eval()
        total = 0.0
        with torch.no_grad():
            for chunk in self.valid.rows.chunks(1024, ctx.rank, ctx.world_size):
                X, y = self._tensors(chunk)
                total += float(((model(X) - y) ** 2).sum())
        return total


def streamed_data(train: StreamedFeatures, valid: StreamedFeatures, ctx: DistContext) -> _Streamed:
    if train.n_features != valid.n_features or train.packed != valid.packed:
        raise ShardError("the training and validation shards hold different features")
    if ctx.is_main:
        log.info(
            "streaming %d training rows from %d shards and %d validation rows from %d",
            len(train), train.rows.shards, len(valid), valid.rows.shards,
        )  # fmt: skip
    mean, spread = _target_stats(train)
    return _Streamed(train, valid, mean, spread, _scaling(train), ctx.device)
