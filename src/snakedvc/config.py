"""Config validation against a JSON schema (2020-12, written in YAML).

The schema is the single source of truth for keys, types and defaults: this
module fills defaults, turns `snakemake --config` strings into the types the
schema asks for, validates, and turns the first error into a message that
names the offending key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# The key of a workflow's config that holds the kit's own settings.
KEY = "snakedvc"


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type."""


def load_schema(path: str | Path) -> dict[str, Any]:
    with open(path) as handle:
        schema: dict[str, Any] = yaml.safe_load(handle)
    return schema


def _follow_ref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    target: Any = root
    for part in ref.lstrip("#/").split("/"):
        target = target[part]
    merged = dict(target)
    merged.update({k: v for k, v in schema.items() if k != "$ref"})
    return merged


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    """Turn numeric strings into numbers where the schema wants one.

    `snakemake --config 'train={lr: 0.01}'` hands nested values over as strings.
    """
    if not isinstance(value, str):
        return value
    wanted = schema.get("type")
    try:
        if wanted == "integer" and value.strip().lstrip("+-").isdigit():
            return int(value)
        if wanted == "number":
            return float(value)
        if wanted == "boolean" and value.lower() in ("true", "false"):
            return value.lower() == "true"
    except ValueError:
        pass
    return value


def _fill_defaults(value: Any, schema: dict[str, Any], root: dict[str, Any]) -> None:
    schema = _follow_ref(schema, root)
    if isinstance(value, list) and "items" in schema:
        items = _follow_ref(schema["items"], root)
        value[:] = [_coerce(item, items) for item in value]
        return
    if not isinstance(value, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        sub = _follow_ref(sub, root)
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if key in value:
            value[key] = _coerce(value[key], sub)
            _fill_defaults(value[key], sub, root)


def _key_of(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<root>"


def _message(error: jsonschema.ValidationError) -> str:
    key = _key_of(error)
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        prefix = "" if key == "<root>" else key + "."
        names = ", ".join(f"'{prefix}{name}'" for name in unknown)
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        return f"unknown config key {names} (allowed here: {allowed})"
    return f"config key '{key}': {error.message}"


def validate_config(config: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``config`` with defaults filled in, or raise ConfigError."""
    filled = copy.deepcopy(config) if config is not None else {}
    if not isinstance(filled, dict):
        raise ConfigError("config must be a mapping of keys to values")
    _fill_defaults(filled, schema, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(filled), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_message(errors[0]))
    return filled
