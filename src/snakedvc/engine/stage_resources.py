"""The resources of a DVC pipeline's stages, from snakedvc.yaml beside dvc.yaml.

dvc.yaml says what a stage computes; how big its job is belongs elsewhere, so that the same
dvc.yaml still runs with `dvc repro`. snakedvc.yaml maps stage names and globs to portable
resources (cpus, mem, runtime, gpu, nodes); the profile routes them (partition, account), as it
routes a Snakefile rule's. A stage may opt into `snakedvc launch` (one process, or N per node
under torchrun, across nodes), which also makes its commands job steps that receive SLURM's
time-limit signal.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from snakedvc.engine.config import ConfigError, validate_config
from snakedvc.engine.settings import schema
from snakedvc.engine.workflow import training_resources

DEFAULT_FILE = "snakedvc.yaml"

MEM_UNITS = {"K": 1 / 1000, "M": 1, "G": 1000, "T": 1000**2}
MEM_BINARY_UNITS = {"K": 1024 / 1000**2, "M": 1024**2 / 1000**2, "G": 1024**3 / 1000**2, "T": 1024**4 / 1000**2}
RUNTIME_UNITS = {"d": 24 * 60, "h": 60, "m": 1}


@dataclass(frozen=True)
class StageResources:
    """What one stage's job asks for, in Snakemake's terms; ``procs_per_node`` 0: not launched."""

    threads: int = 1
    resources: dict[str, Any] = field(default_factory=dict)  # mem_mb, runtime, gpu, nodes, tasks, gres
    nodes: int = 1
    procs_per_node: int = 0
    # `cpus` given: the stage's commands get Snakemake's thread limits (OMP_NUM_THREADS=cpus and the
    # like); otherwise the environment `dvc repro` would give them.
    cpus_asked: bool = False


def read_stages_file(path: Path) -> dict[str, Any]:
    """A snakedvc.yaml, validated, its defaults filled in (those alone where there is no such file)."""
    try:
        given = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
        settings: dict[str, Any] = validate_config(given, schema("stages"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return settings


def read_table(path: Path) -> dict[str, dict[str, Any]]:
    """The ``resources`` of a snakedvc.yaml, validated; {} when there is no such file."""
    table: dict[str, dict[str, Any]] = read_stages_file(path)["resources"]
    return table


def resources_of(
    names: Iterable[str], table: Mapping[str, Mapping[str, Any]], source: str
) -> dict[str, StageResources]:
    """Each stage's resources: every entry whose name or glob matches it, globs first, in order."""
    names = list(names)
    for pattern in table:
        if not any(_matches(name, pattern) for name in names):
            raise ConfigError(
                f"{source}: resources entry {pattern!r} matches no stage of dvc.yaml "
                f"(its stages: {', '.join(names)}; a glob such as 'train@*' names a foreach stage's items)"
            )
    result = {}
    for name in names:
        merged: dict[str, Any] = {}
        for pattern in sorted(table, key=lambda p: p == name):  # the exact name last: it wins
            if _matches(name, pattern):
                merged.update(table[pattern])
        result[name] = _stage_resources(merged, f"{source}: stage {name!r}")
    return result


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


def _stage_resources(entry: Mapping[str, Any], where: str) -> StageResources:
    gpu, nodes, launch = entry.get("gpu", 0), entry.get("nodes", 1), entry.get("launch", False)
    if not launch and (nodes > 1 or "tasks" in entry):
        raise ConfigError(
            f"{where}: nodes > 1 and tasks start processes on several nodes or GPUs; "
            "add `launch: true` (snakedvc launch starts them), or drop them"
        )
    resources: dict[str, Any] = {}
    if "mem" in entry:
        resources["mem_mb"] = mem_mb(entry["mem"], where)
    if "runtime" in entry:
        resources["runtime"] = minutes(entry["runtime"], where)
    if launch:
        resources.update(training_resources(nodes, gpu))
        return StageResources(
            entry.get("cpus", 1), resources, nodes, entry.get("tasks", max(gpu, 1)), cpus_asked="cpus" in entry
        )
    if gpu:
        resources["gpu"] = gpu
    return StageResources(entry.get("cpus", 1), resources, cpus_asked="cpus" in entry)


def mem_mb(value: str | int, where: str = "mem") -> int:
    """Megabytes (10**6 bytes, as SLURM's --mem reads Snakemake's mem_mb) of ``4GB``, ``2GiB``, ``500``."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"([0-9.]+)\s*(?:([KMGT])(i?)B?)?", value.strip())
    if not match:
        raise ConfigError(f"{where}: mem {value!r} is not a size such as 4GB, 500MB or 2GiB")
    number, unit, binary = float(match.group(1)), match.group(2) or "M", match.group(3)
    return max(1, round(number * (MEM_BINARY_UNITS if binary else MEM_UNITS)[unit]))


def minutes(value: str | int, where: str = "runtime") -> int:
    """Minutes of ``90``, ``30m``, ``2h``, ``1d``, ``1h30m``."""
    if isinstance(value, int):
        return value
    parts = re.findall(r"([0-9]+)\s*([dhm])", value)
    if not parts or re.sub(r"[0-9]+\s*[dhm]\s*", "", value.strip()):
        if value.strip().isdigit():
            return int(value)
        raise ConfigError(f"{where}: runtime {value!r} is not a duration such as 30m, 2h, 1d or 1h30m")
    return max(1, sum(int(n) * RUNTIME_UNITS[unit] for n, unit in parts))
