"""The kit installs on its own: a fresh venv with numpy 2, no molflux, no RDKit, no torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

CHECK = textwrap.dedent(
    """
    import importlib.util, json, pathlib
    import numpy, snakedvc
    from snakedvc.workflow import MODULES, kit_schema, module_path
    modules = {name: pathlib.Path(module_path(name)).is_file() for name in MODULES}
    absent = {name: importlib.util.find_spec(name) is None for name in ("molflux", "rdkit", "torch", "esol")}
    print(json.dumps({"numpy": numpy.__version__, "modules": modules, "absent": absent,
                      "schema": "sweep" in kit_schema()["properties"], "api": sorted(snakedvc.__all__)}))
    """
)


@pytest.mark.slow
def test_kit_installs_in_a_fresh_venv_with_numpy_2_and_no_chemistry(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([python, *args], capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    # The kit without extras, from a copy of its source: no editable link into this checkout, and
    # setuptools' build/ folder lands in the copy.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    run("-m", "pip", "install", "-q", "--disable-pip-version-check", "numpy>=2", str(source))
    import json

    found = json.loads(run("-c", CHECK).stdout)
    assert int(found["numpy"].split(".")[0]) >= 2
    assert found["modules"] == {"tracking": True, "sweep": True}
    assert all(found["absent"].values()), found["absent"]
    assert found["schema"]
    assert "configure" in found["api"] and "sweep_plan" in found["api"]
    run("-m", "pip", "check")
    # The command-line entry point works without torch (launch, track, restore, sweeps).
    help_text = subprocess.run([str(venv / "bin" / "snakedvc"), "--help"], capture_output=True, text=True).stdout
    assert "launch" in help_text and "sweep-promote" in help_text
