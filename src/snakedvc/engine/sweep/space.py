"""A sweep's trials: dotted config keys, the search space (grid or random draws), each trial's config."""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from snakedvc.engine.config import KEY, ConfigError, validate_config
from snakedvc.engine.settings import Sweep

SETTINGS = f"{KEY}.sweep"


@dataclass(frozen=True)
class Trial:
    id: str
    overrides: dict[str, Any]
    config: dict[str, Any] | None  # validated full config (the user's keys); None where the overrides are invalid
    error: str = ""

    @property
    def valid(self) -> bool:
        return self.config is not None


# --- dotted config keys --------------------------------------------------------------------


def dotted_keys(config: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key of a nested config, dotted (sections and leaves)."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        yield name
        if isinstance(value, Mapping):
            yield from dotted_keys(value, name + ".")


def get_dotted(config: Mapping[str, Any], key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    *sections, name = key.split(".")
    target = config
    for part in sections:
        target = target.setdefault(part, {})
    target[name] = copy.deepcopy(value)


def check_space_key(key: str, config: Mapping[str, Any], settings: Sweep) -> None:
    """A searchable key: one the config has, not the budget, not the kit's, within `searchable`."""
    where = f"config key '{SETTINGS}.space.{key}'"
    if key == KEY or key.startswith(KEY + "."):
        raise ConfigError(f"{where}: the kit's own settings are not searchable")
    if key == settings.budget:
        raise ConfigError(f"{where}: the budget key is set by the sweep itself for every rung, not searchable")
    try:
        get_dotted(config, key)
    except KeyError:
        known = [k for k in dotted_keys(config) if not k.startswith(KEY)]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{where}: the config has no such key{hint}") from None
    allowed = settings.searchable
    if allowed and not any(key == a or key.startswith(a + ".") for a in allowed):
        raise ConfigError(f"{where}: not searchable; {SETTINGS}.searchable allows {', '.join(allowed)}")


def _sample(key: str, spec: Any, rng: random.Random) -> Any:
    if isinstance(spec, list):
        return copy.deepcopy(rng.choice(spec))
    low, high, log = spec["low"], spec["high"], spec.get("log", False)
    if not low < high or (log and low <= 0):
        raise ConfigError(f"config key '{SETTINGS}.space.{key}': need 0 < low < high for log, low < high otherwise")
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if log else rng.uniform(low, high)
    if isinstance(low, int) and isinstance(high, int) and not log:
        return int(round(value))
    return float(f"{value:.6g}")  # readable in `dvc exp show`, and the same on every machine


def expand_space(space: Mapping[str, Any], method: str, max_trials: int, seed: int) -> list[dict[str, Any]]:
    """The override dicts of every trial: the full grid, or ``max_trials`` random draws."""
    if not space:
        raise ConfigError(f"config key '{SETTINGS}.space': empty; name at least one key to search")
    keys = list(space)
    if method == "grid":
        for key, spec in space.items():
            if not isinstance(spec, list):
                raise ConfigError(f"config key '{SETTINGS}.space.{key}': a grid needs a list of values, got {spec!r}")
        grid = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(space[k] for k in keys))]
        if len(grid) > max_trials:
            raise ConfigError(
                f"config key '{SETTINGS}.max_trials': the grid has {len(grid)} trials, more than max_trials {max_trials}"
            )
        return copy.deepcopy(grid)
    if method == "random":
        rng = random.Random(seed)
        return [{key: _sample(key, space[key], rng) for key in keys} for _ in range(max_trials)]
    raise ConfigError(f"config key '{SETTINGS}.method': unknown method {method!r}")


def user_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: copy.deepcopy(value) for key, value in config.items() if key != KEY}


def build_trials(settings: Sweep, base: Mapping[str, Any], schema: Mapping[str, Any] | None) -> list[Trial]:
    """Every trial's config (``base`` with the trial's overrides), validated with the workflow's schema.
    An invalid trial is kept, with the reason."""
    for key in settings.space:
        check_space_key(key, base, settings)
    overrides = expand_space(settings.space, settings.method, settings.max_trials, settings.seed)
    trials = []
    for index, values in enumerate(overrides):
        trial_id = f"t{index:03d}"
        candidate = copy.deepcopy(dict(base))
        for key, value in values.items():
            set_dotted(candidate, key, value)
        try:
            validated = validate_config(candidate, dict(schema)) if schema else candidate
            trials.append(Trial(trial_id, values, validated))
        except ConfigError as error:
            shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
            trials.append(Trial(trial_id, values, None, f"invalid trial config ({shown}): {error}"))
    return trials


def section_key(section: Any) -> str:
    return hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()[:10]
