"""The engine's and the ESOL steps' environments: each is exactly its lock, `pip check` is clean,
and the lock agrees with the pyproject and conda files that describe the same environment."""

from __future__ import annotations

import subprocess
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

KIT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
ESOL = tomllib.loads((REPO / "examples/esol/pyproject.toml").read_text())["project"]

# name -> (venv, lock, conda file, the pyproject requirements that environment installs)
ENVIRONMENTS = {
    "engine": (
        ".venv",
        "requirements/engine.lock.txt",
        "environment.yml",
        [
            *KIT["dependencies"],
            *KIT["optional-dependencies"]["engine"],
            *KIT["optional-dependencies"]["torch"],
            *KIT["optional-dependencies"]["live"],
        ],
    ),
    "esol-steps": (
        ".venv-esol",
        "requirements/esol.lock.txt",
        "examples/esol/environment.yml",
        [
            *KIT["dependencies"],
            *KIT["optional-dependencies"]["torch"],
            *KIT["optional-dependencies"]["live"],
            *ESOL["optional-dependencies"]["steps"],
        ],
    ),
}


def pins(lines: list[str]) -> dict[str, Version]:
    """name -> version of `name==version` lines (a local version such as +cpu dropped)."""
    found = {}
    for line in lines:
        line = line.strip()
        if line and not line.startswith(("#", "-e")):
            name, version = line.split("==")
            found[canonicalize_name(name)] = Version(Version(version).public)
    return found


def lock(name: str) -> dict[str, Version]:
    return pins((REPO / ENVIRONMENTS[name][1]).read_text().splitlines())


def conda_requirements(name: str) -> list[Requirement]:
    deps = yaml.safe_load((REPO / ENVIRONMENTS[name][2]).read_text())["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    conda = [d for d in deps if isinstance(d, str) and not d.startswith(("python=", "pip", "graphviz"))]
    return [Requirement(d) for d in [*conda, *pip] if not d.startswith("-e")]


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_environment_is_exactly_its_lock_and_pip_check_is_clean(name: str) -> None:
    python = REPO / ENVIRONMENTS[name][0] / "bin" / "python"
    freeze = subprocess.run(
        [python, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    )
    assert pins(freeze.stdout.splitlines()) == lock(name)
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_engine_has_numpy_2_and_the_latest_engine_while_the_steps_keep_numpy_1() -> None:
    engine, steps = lock("engine"), lock("esol-steps")
    assert engine["numpy"].major == 2 and steps["numpy"].major == 1
    assert engine["snakemake"] >= Version("9.27.1")
    assert engine["snakemake-executor-plugin-slurm"] >= Version("2.8.0")
    assert "molflux" in steps and "molflux" not in engine
    assert "snakemake" not in steps  # the steps never need the engine


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_lock_satisfies_the_pyproject_and_conda_files(name: str) -> None:
    locked = lock(name)
    conda = {canonicalize_name(r.name): r for r in conda_requirements(name)}
    for text in ENVIRONMENTS[name][3]:
        requirement = Requirement(text)
        key = canonicalize_name(requirement.name)
        if key == "snakedvc":
            continue  # the kit itself, installed from this checkout
        assert key in locked, f"{name}: {text} (pyproject) is not in {ENVIRONMENTS[name][1]}"
        assert requirement.specifier.contains(locked[key]), f"{name}: lock has {key} {locked[key]}, pyproject {text}"
        assert key in conda, f"{name}: {text} (pyproject) is missing from {ENVIRONMENTS[name][2]}"
    for key, requirement in conda.items():
        assert key in locked, f"{name}: {requirement} ({ENVIRONMENTS[name][2]}) is not in the lock"
        assert requirement.specifier.contains(locked[key]), f"{name}: lock has {key} {locked[key]}, conda {requirement}"
