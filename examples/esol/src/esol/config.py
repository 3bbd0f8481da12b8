"""The ESOL steps' typed config sections, and the one check a JSON schema cannot express."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from snakedvc import ConfigError


def check_config(config: dict[str, Any]) -> None:
    """Checks beyond the schema; raises ConfigError naming the key."""
    fractions = config["split"]["fractions"]
    if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise ConfigError(f"config key 'split.fractions': {fractions} sums to {sum(fractions):g}, not 1")


@dataclass(frozen=True)
class SplitConfig:
    method: str = "random"
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    seed: int = 0


@dataclass(frozen=True)
class FeaturiseConfig:
    representation: str = "morgan"
    radius: int = 2
    n_bits: int = 2048
    max_reject_fraction: float = 0.01
    engine: str = "auto"
    shards: int = 1
    chunk_size: int = 10_000


@dataclass(frozen=True)
class TrainConfig:
    hidden_sizes: tuple[int, ...] = (512, 128)
    dropout: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 64
    max_epochs: int = 100
    patience: int = 15
    seed: int = 0
    torch_threads: int = 1
    checkpoint_every: int = 5
    checkpoint_keep: int = 2
    keep_checkpoints: bool = False


def section(cls: type, values: dict[str, Any]) -> Any:
    """Build a config dataclass from a validated section, ignoring nothing silently."""
    names = {f.name for f in fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} key(s): {', '.join(sorted(unknown))}")
    converted = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**converted)
