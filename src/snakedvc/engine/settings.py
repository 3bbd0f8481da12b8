"""The kit's settings as frozen, typed objects, built from schema-validated values.

Each schema under ``snakedvc/schemas`` is the one place its keys' types and defaults are
written; the classes here only name the keys (a test keeps them equal to the schema's).
``settings(config)`` is what the kit's modules read: ``settings(config).sweep.metric``.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from snakedvc.engine.config import KEY, ConfigError, load_schema, validate_config


@cache
def schema(name: str) -> dict[str, Any]:
    """One of the kit's schemas: ``"snakedvc"`` (a config's `snakedvc` key) or ``"controller"``."""
    return load_schema(str(resources.files("snakedvc") / "schemas" / f"{name}.schema.yaml"))


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    params: str
    metrics: tuple[str, ...]
    files: tuple[str, ...]
    push: bool
    replace: bool


@dataclasses.dataclass(frozen=True)
class Sweep:
    enabled: bool
    name: str
    dir: str
    metric: str
    direction: str
    budget: str
    searchable: tuple[str, ...]
    method: str
    max_trials: int
    seed: int
    space: Mapping[str, Any]  # key -> a list of values, or {low, high, log}
    strategy: str
    min_epochs: int
    reduction_factor: int
    max_concurrent_trials: int
    replay: str
    metrics_file: str
    state_file: str
    final_metrics: str
    trial_metrics: str


@dataclasses.dataclass(frozen=True)
class Settings:
    """A config's `snakedvc` key."""

    schema: str
    tracking: bool
    experiment: Experiment
    sweep: Sweep


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """A SLURM profile's controller.yaml."""

    partition: str | None
    account: str | None
    runtime: int
    mem_mb: int
    cpus: int
    retries: int
    sbatch_extra: tuple[str, ...]


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """A frozen settings object from validated values: lists become tuples, sections their class."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        value, hint = values[field.name], hints[field.name]
        if dataclasses.is_dataclass(hint):
            value = build(typing.cast(type, hint), value)
        elif isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        fields[field.name] = value
    return cls(**fields)


def kit_settings(values: Mapping[str, Any] | None) -> Settings:
    """The `snakedvc` key's settings, validated (defaults filled) and frozen."""
    try:
        return typing.cast(Settings, build(Settings, validate_config(dict(values or {}), schema("snakedvc"))))
    except ConfigError as error:
        raise ConfigError(f"{KEY}: {error}") from None


def settings(config: Mapping[str, Any]) -> Settings:
    """The kit's settings of a workflow config (its `snakedvc` key): validated once per distinct key,
    the same object for every reader (the workflow, the sweep, the end of the run)."""
    try:
        key = json.dumps(config.get(KEY) or {}, sort_keys=True)
    except TypeError:  # a value JSON has no word for: validated as it is
        return kit_settings(config.get(KEY))
    return _settings_of(key)


@cache
def _settings_of(values: str) -> Settings:
    return kit_settings(json.loads(values))


def controller_settings(folder: Path) -> ControllerSettings:
    """A profile folder's controller.yaml (absent: every default). Raises ConfigError naming the file."""
    path = folder / "controller.yaml"
    given = yaml.safe_load(path.read_text()) if path.is_file() else {}
    try:
        return typing.cast(ControllerSettings, build(ControllerSettings, validate_config(given, schema("controller"))))
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
