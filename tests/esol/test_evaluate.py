from __future__ import annotations

import json
import math

import numpy as np
import pytest

from esol.evaluate import regression_metrics, write_metrics


def test_metrics_match_hand_computed_values() -> None:
    y_true = np.array([1.0, 2.0, 3.0, 4.0])
    y_pred = np.array([1.5, 2.0, 2.0, 4.5])
    # errors 0.5, 0, -1, 0.5 -> squares 0.25, 0, 1, 0.25 (sum 1.5); |e| sum 2.0
    # mean 2.5 -> ss_tot = 2.25 + 0.25 + 0.25 + 2.25 = 5
    metrics = regression_metrics(y_true, y_pred)
    assert metrics["rmse"] == pytest.approx(math.sqrt(1.5 / 4))
    assert metrics["mae"] == pytest.approx(0.5)
    assert metrics["r2"] == pytest.approx(1 - 1.5 / 5)
    assert metrics["n"] == 4


def test_perfect_prediction() -> None:
    y = np.array([-3.0, 0.0, 2.0])
    metrics = regression_metrics(y, y)
    assert metrics["rmse"] == 0 and metrics["mae"] == 0 and metrics["r2"] == 1


def test_metrics_file(tmp_path) -> None:
    write_metrics({"rmse": 1.23456789, "n": 3}, tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text()) == {"rmse": 1.234568, "n": 3}
