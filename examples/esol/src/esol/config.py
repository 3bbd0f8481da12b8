"""The ESOL steps' typed config sections, and the one check a JSON schema cannot express.

The workflow's schema (workflow/schemas/config.schema.yaml) holds every key's type and default;
these classes only name the keys, and are built from a validated section (``section``).
"""

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
    method: str
    fractions: tuple[float, float, float]
    seed: int


@dataclass(frozen=True)
class FeaturiseConfig:
    representation: str
    radius: int
    n_bits: int
    max_reject_fraction: float
    engine: str
    shards: int
    chunk_size: int


@dataclass(frozen=True)
class TrainConfig:
    hidden_sizes: tuple[int, ...]
    dropout: float
    lr: float
    weight_decay: float
    batch_size: int
    max_epochs: int
    patience: int
    seed: int
    torch_threads: int
    checkpoint_every: int
    checkpoint_keep: int
    keep_checkpoints: bool


def section(cls: type, values: dict[str, Any]) -> Any:
    """Build a config dataclass from a validated section (every key present), ignoring nothing silently."""
    names = {f.name for f in fields(cls)}
    unknown, missing = set(values) - names, names - set(values)
    if unknown or missing:
        raise ConfigError(
            f"{cls.__name__}: unknown key(s) {', '.join(sorted(unknown)) or '-'}; missing {', '.join(sorted(missing)) or '-'}"
            " (pass the section as the workflow's schema validated it)"
        )
    converted = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**converted)
