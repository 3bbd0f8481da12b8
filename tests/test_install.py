"""The kit installs on its own, and the environments can be merged.

- Its core, what a step environment needs, is light: no numpy, no Snakemake, no chemistry.
- One environment with both the engine and the ESOL steps (numpy<2: the SLURM plugin left out,
  since 2.8 needs numpy 2) runs the ESOL workflow locally with `python: python`, and produces
  the same bytes as the two-environment setup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_RUN, copy_project, md5

CHECK = textwrap.dedent(
    """
    import importlib.util, json, pathlib
    import snakedvc
    from snakedvc.engine.workflow import MODULES, kit_schema, module_path
    modules = {name: pathlib.Path(module_path(name)).is_file() for name in MODULES}
    absent = {name: importlib.util.find_spec(name) is None
              for name in ("numpy", "snakemake", "dvc", "molflux", "rdkit", "torch", "esol",
                          "snakemake_executor_plugin_slurm")}
    print(json.dumps({"modules": modules, "absent": absent,
                      "schema": "sweep" in kit_schema()["properties"], "api": sorted(snakedvc.__all__)}))
    """
)


def new_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


# pip's byte-compiling of what it installs (torch's 2,300 modules among them) is most of an install's
# CPU on a 2-core machine; these environments live for one test and import a fraction of it.
NO_COMPILE = {**os.environ, "PIP_COMPILE": "0"}


def run(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=1200, cwd=cwd, env=NO_COMPILE)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def source_copy(dest: Path) -> Path:
    """The kit's source without build leftovers: no editable link into this checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


@pytest.mark.slow
def test_kit_core_installs_without_numpy_snakemake_or_chemistry(tmp_path: Path) -> None:
    python = new_venv(tmp_path / "venv")
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source_copy(tmp_path / "source")))
    found = json.loads(run(python, "-c", CHECK).stdout)
    assert found["modules"] == {"kit": True, "tracking": True, "sweep": True}
    assert all(found["absent"].values()), found["absent"]
    assert found["schema"]
    assert "configure" in found["api"] and "sweep_plan" in found["api"]
    run(python, "-m", "pip", "check")
    # The command-line entry point works in a step environment (launch, track, restore, sweeps).
    help_text = run(tmp_path / "venv" / "bin" / "snakedvc", "--help").stdout
    assert "launch" in help_text and "sweep-promote" in help_text


@pytest.mark.slow
def test_one_environment_with_engine_and_steps_runs_esol_with_python_on_path(tmp_path: Path) -> None:
    python = new_venv(tmp_path / "venv")
    # The steps' lock first (numpy<2), then the engine's pins for what the steps' lock lacks.
    steps = (REPO / "requirements/esol.lock.txt").read_text().splitlines()
    names = {line.split("==")[0].lower() for line in steps if "==" in line}
    engine = [
        line
        for line in (REPO / "requirements/engine.lock.txt").read_text().splitlines()
        if "==" in line and line.split("==")[0].lower() not in names
    ]
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join([*steps, *engine]) + "\n")
    pip = ["-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(constraints)]
    run(python, *pip, "torch==2.13.0")
    run(python, *pip, "-e", str(REPO), "-e", f"{REPO / 'examples/esol'}[steps]", "snakemake", "dvc", "pulp")
    run(python, "-m", "pip", "check")

    def outputs(project: Path, snakemake: list[str], *config: str) -> dict[str, str]:
        proc = subprocess.run(
            [*snakemake, "--profile", "profiles/local", *SMALL_RUN, *config, "snakedvc={tracking: false}"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        files = ["results/features/train.npz", "results/model/model.pt", "results/metrics.json"]
        return {name: md5(project / name) for name in files}

    one = outputs(copy_project(tmp_path / "one"), [str(python), "-m", "snakemake"], "python=python")
    two = outputs(copy_project(tmp_path / "two"), [sys.executable, "-m", "snakemake"])
    assert one == two
    # The kit's SLURM executor is installed there too, without the official plugin (numpy<2): local
    # runs above were not disturbed, and asking for it says what to install.
    slurm = subprocess.run(
        [str(python), "-m", "snakemake", "--executor", "snakedvc-slurm", "--jobs", "1", *SMALL_RUN],
        cwd=copy_project(tmp_path / "three"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = slurm.stdout + slurm.stderr
    assert slurm.returncode != 0 and 'pip install "snakedvc[engine]"' in said, said[-3000:]


@pytest.mark.slow
def test_the_tutorials_install_lines_run_as_written_in_a_fresh_venv(tmp_path: Path) -> None:
    """The tutorial's install block, line for line, with the kit cloned where it says (~/snakedvc)."""
    import re

    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["git", "clone", "-q", str(REPO), str(home / "snakedvc")], check=True)
    tutorial = (REPO / "docs" / "tutorial.md").read_text()
    block = re.search(r'^```bash title="install"\n(.*?)^```$', tutorial, re.M | re.S)
    assert block, "the tutorial (docs/tutorial.md) has no install block"
    project = tmp_path / "project"
    project.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.group(1)],
        cwd=project,
        env={**env, "HOME": str(home), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_COMPILE": "0"},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "No broken requirements found" in proc.stdout
    # The engine with the SLURM executor: Snakemake lists it, and the kit's commands are there.
    executors = run(project / ".venv/bin/python", "-m", "snakemake", "--help").stdout
    assert "snakedvc-slurm" in executors
    assert "init" in run(project / ".venv/bin/snakedvc", "--help").stdout
    # The install left nothing in the checkout that git would show.
    assert (
        subprocess.run(["git", "status", "--porcelain"], cwd=home / "snakedvc", capture_output=True, text=True).stdout
        == ""
    )
