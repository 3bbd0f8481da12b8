"""DVC's own functional tests of reproduction, run by scripts/dvc-suite with the kit's runner in
place of `dvc repro`: every test DVC's authors wrote for it either passes, is skipped naming what
the runner has no equivalent of, or is a known failure listed with its reason
(tests/dvc_suite/known-failures.txt). A new failure, or a listed one that passes, fails this."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_dvcs_own_repro_tests_pass_with_the_kits_runner_or_are_accounted_for() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "dvc-suite")], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-6000:]
    summary = re.search(r"dvc-suite: (\d+) passed, (\d+) failed.*?, (\d+) not run", said)
    assert summary and int(summary[1]) >= 20, said[-3000:]
