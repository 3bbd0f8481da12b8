"""snakedvc.yaml: the resources of a dvc.yaml's stages, by name and glob, as Snakemake resources."""

from __future__ import annotations

from pathlib import Path

import pytest

from snakedvc.engine.config import ConfigError
from snakedvc.engine.dvcpipeline import stage_run_launch_args
from snakedvc.engine.stage_resources import StageResources, mem_mb, minutes, read_table, resources_of
from snakedvc.engine.workflow import training_resources

STAGES = ["prepare", "featurize@a", "featurize@b", "train", "evaluate"]


def table(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "snakedvc.yaml"
    path.write_text(text)
    return read_table(path)


def test_globs_apply_in_order_and_the_exact_name_last(tmp_path: Path) -> None:
    given = table(
        tmp_path,
        "resources:\n"
        "  train: {cpus: 4}\n"
        "  '*': {runtime: 30m, mem: 1GB, cpus: 1}\n"
        "  'featurize@*': {cpus: 2, mem: 2GiB}\n",
    )
    jobs = resources_of(STAGES, given, "snakedvc.yaml")
    assert jobs["prepare"] == StageResources(1, {"mem_mb": 1000, "runtime": 30}, cpus_asked=True)  # the glob's cpus
    assert jobs["featurize@b"] == StageResources(2, {"mem_mb": 2147, "runtime": 30}, cpus_asked=True)
    # 'train' comes first in the file, yet its own entry wins over the glob '*' that follows it.
    assert jobs["train"] == StageResources(4, {"mem_mb": 1000, "runtime": 30}, cpus_asked=True)


def test_a_stage_no_entry_names_gets_the_profiles_defaults() -> None:
    assert resources_of(STAGES, {}, "x")["evaluate"] == StageResources()
    assert read_table(Path("/nonexistent/snakedvc.yaml")) == {}


def test_launch_asks_for_a_training_allocation_and_starts_processes_per_node() -> None:
    jobs = resources_of(["train"], {"train": {"launch": True, "gpu": 2, "nodes": 2, "runtime": "1h30m"}}, "x")
    assert jobs["train"] == StageResources(1, {"runtime": 90, **training_resources(2, 2)}, nodes=2, procs_per_node=2)
    assert stage_run_launch_args(jobs["train"]) == ["--nodes", "2", "--procs-per-node", "2"]
    cpu = resources_of(["train"], {"train": {"launch": True, "tasks": 3}}, "x")["train"]
    assert (cpu.nodes, cpu.procs_per_node, cpu.resources) == (1, 3, training_resources(1, 0))
    assert stage_run_launch_args(StageResources()) == []
    assert resources_of(["t"], {"t": {"gpu": 1}}, "x")["t"].resources == {"gpu": 1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("resources:\n  trian: {cpus: 2}\n", "resources entry 'trian' matches no stage of dvc.yaml"),
        ("resources:\n  train: {cpu: 2}\n", "unknown config key 'resources.train.cpu' (allowed here: cpus,"),
        ("resources:\n  train: {cpus: two}\n", "config key 'resources.train.cpus'"),
        ("resources:\n  train: {mem: 4 apples}\n", "config key 'resources.train.mem'"),
        ("resources:\n  train: {runtime: soon}\n", "config key 'resources.train.runtime'"),
        ("resources:\n  train: {nodes: 2}\n", "stage 'train': nodes > 1 and tasks start processes"),
        ("resources:\n  train: {tasks: 2}\n", "add `launch: true`"),
        ("resource:\n  train: {cpus: 2}\n", "unknown config key 'resource'"),
        ("resources: [train\n", "not valid YAML"),
    ],
)
def test_a_wrong_entry_is_refused_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="snakedvc.yaml") as error:
        resources_of(STAGES, table(tmp_path, text), str(tmp_path / "snakedvc.yaml"))
    assert message in str(error.value)


def test_sizes_and_durations() -> None:
    assert [mem_mb(v) for v in ("4GB", "4G", "500MB", "500", "1.5GB", "1GiB", 700)] == [
        4000,
        4000,
        500,
        500,
        1500,
        1074,
        700,
    ]
    assert [minutes(v) for v in ("90", "30m", "2h", "1d", "1h30m", 15)] == [90, 30, 120, 1440, 90, 15]
    with pytest.raises(ConfigError, match="runtime '2 weeks'"):
        minutes("2 weeks")
