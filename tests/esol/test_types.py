"""mypy on the ESOL example's steps, in their own environment (RDKit and molflux installed, so
their `type: ignore` comments are checked against the real stubs)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_mypy_on_the_esol_steps() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "examples/esol/src"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
