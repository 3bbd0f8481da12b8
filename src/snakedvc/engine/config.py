"""Config validation against a JSON schema (2020-12, written in YAML).

The schema is the single source of truth for keys, types and defaults: this
module fills defaults, turns `snakemake --config` strings into the types the
schema asks for, validates, and turns the first error into a message that
names the offending key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from snakedvc.errors import ConfigError

# The key of a workflow's config that holds the kit's own settings.
KEY = "snakedvc"


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


def typed(value: Any, wanted: str | None = None) -> Any:
    """A `--config` value with a real type: the schema's ``wanted`` type where one is known, else
    the first of int, float, boolean/null that reads it, as Snakemake types top-level values.

    Snakemake reads nested --config values with YAML's BaseLoader, so `train={epochs: 4}` arrives
    as the string '4': it would be recorded as a string and change the rule's params.
    """
    if isinstance(value, Mapping):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if not isinstance(value, str) or not value.strip():
        return value
    if wanted is not None:
        return _as(value, wanted)
    for parse in (int, float):
        try:
            return parse(value)
        except ValueError:
            pass
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    # Booleans and null; a string that merely looks like a mapping or list stays a string.
    return parsed if isinstance(parsed, bool) or parsed is None else value


def _as(value: str, wanted: str) -> Any:
    try:
        if wanted == "integer" and value.strip().lstrip("+-").isdigit():
            return int(value)
        if wanted == "number":
            return float(value)
    except ValueError:
        pass
    if wanted == "boolean" and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _fill_defaults(value: Any, schema: dict[str, Any], root: dict[str, Any]) -> None:
    schema = _follow_ref(schema, root)
    if isinstance(value, list) and "items" in schema:
        items = _follow_ref(schema["items"], root)
        value[:] = [_coerced(item, items) for item in value]
        return
    if not isinstance(value, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        sub = _follow_ref(sub, root)
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if key in value:
            value[key] = _coerced(value[key], sub)
            _fill_defaults(value[key], sub, root)


def _coerced(value: Any, schema: dict[str, Any]) -> Any:
    wanted = schema.get("type")
    return typed(value, wanted) if isinstance(value, str) and isinstance(wanted, str) else value


def _key_of(error: Any) -> str:  # a jsonschema.ValidationError
    return ".".join(str(p) for p in error.absolute_path) or "<root>"


def _message(error: Any) -> str:  # a jsonschema.ValidationError
    key = _key_of(error)
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        prefix = "" if key == "<root>" else key + "."
        names = ", ".join(f"'{prefix}{name}'" for name in unknown)
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        return f"unknown config key {names} (allowed here: {allowed})"
    return f"config key '{key}': {error.message}"


def validate_config(config: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``config`` with defaults filled in, or raise ConfigError."""
    filled = copy.deepcopy(config) if config is not None else {}
    if not isinstance(filled, dict):
        raise ConfigError("config must be a mapping of keys to values")
    _fill_defaults(filled, schema, schema)
    import jsonschema  # a tenth of a second: only where a config is checked, not in every job's CLI

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(filled), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_message(errors[0]))
    return filled


def check_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any], files: str, prefix: str = "") -> None:
    """A workflow with no schema of its own: each `--config` value must name a key its config files
    have, with a value of the same kind (a number for a number, a list for a list, ...), so that a
    typo or a wrong value stops the run before any job, naming the key, and not in a rule's script
    (after Snakemake removed the outputs it would redo) or as a resource Snakemake cannot read.
    ``base``: the config files merged; ``files``: their names, for the message."""
    for key, value in overrides.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            allowed = ", ".join(sorted(map(str, base))) or "none"
            raise ConfigError(
                f"--config key '{dotted}' is not in the config ({files}); keys allowed "
                f"{'at the top' if not prefix else 'in ' + repr(prefix.rstrip('.'))}: {allowed}. "
                "A new key: add it to the config file first (or check the config with a schema: snakedvc.schema)"
            )
        known = base[key]
        if isinstance(known, Mapping) and isinstance(value, Mapping):
            check_overrides(known, value, files, dotted + ".")
        elif _kind(value) != _kind(known) and not _fits(value, known):
            raise ConfigError(
                f"--config key '{dotted}': {value!r} is not {_kind(known)} like the config's {known!r} ({files})"
            )


def _kind(value: Any) -> str:
    for kind, types in (("a mapping", Mapping), ("a list", list), ("true or false", bool), ("a number", int | float)):
        if isinstance(value, types):
            return kind
    return "a string" if isinstance(value, str) else "null"


def _fits(value: Any, known: Any) -> bool:
    """Where another kind is fine: anything where the config has null or a string (a number or a word
    given for a name), and a number for a number."""
    return known is None or (isinstance(known, str) and not isinstance(value, Mapping | list))


def typed_overrides(workflow: Any) -> dict[str, Any]:
    """The run's ``--config`` values (Snakemake's ``workflow.config_settings.overwrite_config``), typed."""
    overrides = getattr(getattr(workflow, "config_settings", None), "overwrite_config", None)
    return typed(dict(overrides)) if overrides else {}
