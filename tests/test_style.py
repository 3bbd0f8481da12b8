"""Static checks run with the tests, so `make test` is the one command CI needs."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_lint_and_format() -> None:
    lint = _run("ruff", "check", "src", "tests", "scripts", "examples")
    assert lint.returncode == 0, lint.stdout
    fmt = _run("ruff", "format", "--check", "src", "tests", "examples")
    assert fmt.returncode == 0, fmt.stdout


def test_mypy_on_the_kit() -> None:
    # The ESOL example's steps are checked in their own environment (tests/esol/test_types.py).
    proc = _run("mypy", "src")
    assert proc.returncode == 0, proc.stdout


# SLURM's client commands, and where the kit may name them or read SLURM_* variables.
SLURM_COMMANDS = frozenset({"sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun", "salloc", "sstat"})
SLURM_ROOM = "src/snakedvc/slurm.py"
# The kit's SLURM executor keeps two of its own: the account guess (sacct, where the official
# plugin's guess is replaced) and the batch script's line that leaves $SLURM_JOB_ID's exit code.
ALLOWED_OUTSIDE = {("src/snakemake_executor_plugin_snakedvc_slurm/executor.py", "sacct"),
                   ("src/snakemake_executor_plugin_snakedvc_slurm/executor.py", "SLURM_JOB_ID")}  # fmt: skip


def slurm_names_outside_the_room(files: list[Path], root: Path = REPO) -> list[str]:
    """``path:line: constant`` for each string constant outside SLURM_ROOM that runs a SLURM command
    (an argument list's first word: the constant is the command's name) or reads a SLURM_* variable
    (an environment key: the constant is its name; shell text: $SLURM_...). Prose that mentions
    them, as error messages do, is not counted."""
    found = []
    for path in files:
        relative = path.relative_to(root).as_posix()
        if relative == SLURM_ROOM:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            names = {text} & SLURM_COMMANDS | set(re.findall(r"^SLURM_[A-Z_]+$", text))
            names |= set(re.findall(r"\$\{?(SLURM_[A-Z_]+)", text))
            if any((relative, name) not in ALLOWED_OUTSIDE for name in names):
                found.append(f"{relative}:{node.lineno}: {node.value!r}")
    return found


def test_only_the_slurm_room_runs_slurm_commands_or_reads_slurm_variables() -> None:
    files = sorted({*REPO.glob("src/**/*.py"), *REPO.glob("examples/**/*.py")} - set(REPO.glob("**/.venv*/**")))
    assert len(files) > 20
    assert slurm_names_outside_the_room(files) == [], "ask snakedvc.slurm instead"


def test_the_slurm_room_check_finds_a_command_and_a_variable(tmp_path: Path) -> None:
    sneaky = tmp_path / "src" / "snakedvc" / "sneaky.py"
    sneaky.parent.mkdir(parents=True)
    sneaky.write_text('import os, subprocess\nsubprocess.run(["squeue", "-h"])\nos.environ.get("SLURM_JOB_ID")\n')
    found = slurm_names_outside_the_room([sneaky], root=tmp_path)
    assert sorted(line.split(": ", 1)[1] for line in found) == ["'SLURM_JOB_ID'", "'squeue'"]
    room = tmp_path / SLURM_ROOM
    room.write_text(sneaky.read_text())
    assert slurm_names_outside_the_room([room], root=tmp_path) == []


MAX_FUNCTION_LINES = 60


def long_functions(files: list[Path], root: Path = REPO) -> list[str]:
    """``path:line name (N lines)`` for every function longer than MAX_FUNCTION_LINES."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_60_lines(tmp_path: Path) -> None:
    files = sorted({*REPO.glob("src/**/*.py"), *REPO.glob("examples/**/*.py")} - set(REPO.glob("**/.venv*/**")))
    assert long_functions(files) == [], "split it: a function should fit on a screen"
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert long_functions([long], root=tmp_path) == [f"long.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
