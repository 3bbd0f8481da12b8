"""Static checks run with the tests, so `make test` is the one command CI needs."""

from __future__ import annotations

import subprocess
import sys

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
