"""ESOL step configs for tests: the workflow schema's defaults (the one place they are written), with overrides."""

from __future__ import annotations

from functools import cache
from typing import Any

from esol.config import FeaturiseConfig, SplitConfig, TrainConfig, section
from snakedvc.engine.config import load_schema, validate_config
from tests.conftest import SCHEMA

SECTIONS: dict[type, str] = {SplitConfig: "split", FeaturiseConfig: "featurise", TrainConfig: "train"}


@cache
def defaults() -> dict[str, Any]:
    return validate_config({}, load_schema(SCHEMA))


def config_of(cls: type, **overrides: Any) -> Any:
    """``cls`` (SplitConfig, FeaturiseConfig, TrainConfig) as the schema's defaults give it, with ``overrides``."""
    return section(cls, {**defaults()[SECTIONS[cls]], **overrides})
