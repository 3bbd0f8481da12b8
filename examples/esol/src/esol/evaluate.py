"""Test-set metrics, parity plot and loss-curve table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from esol.data import DataError
from esol.features import FeatureSet, apply_scaling
from esol.model import MLP
from snakedvc import atomic_path


def predict(model: MLP, meta: dict[str, object], X: np.ndarray) -> np.ndarray:
    if "x_mean" in meta:  # descriptor features: the training split's standardisation
        X = apply_scaling(X, np.asarray(meta["x_mean"]), np.asarray(meta["x_std"]))
    with torch.no_grad():
        scaled = model(torch.from_numpy(X)).numpy().astype(np.float64)
    return scaled * float(meta["y_std"]) + float(meta["y_mean"])  # type: ignore[arg-type]


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if len(y_true) == 0:
        raise DataError("no test molecules to evaluate")
    error = y_pred - y_true
    ss_res = float(np.sum(error**2))
    ss_tot = float(np.sum((y_true - y_true.mean()) ** 2))
    return {
        "rmse": math.sqrt(ss_res / len(y_true)),
        "mae": float(np.mean(np.abs(error))),
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "n": int(len(y_true)),
    }


def write_metrics(metrics: dict[str, float], path: str | Path) -> None:
    rounded = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(rounded, indent=2, sort_keys=True) + "\n")


def write_predictions(test: FeatureSet, y_pred: np.ndarray, path: str | Path) -> None:
    table = pd.DataFrame({"row": test.rows, "actual": test.y, "predicted": y_pred})
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")


def parity_plot(y_true: np.ndarray, y_pred: np.ndarray, metrics: dict[str, float], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=100)
    ax.scatter(y_true, y_pred, s=10, alpha=0.7)
    low = float(min(np.min(y_true), np.min(y_pred))) - 0.5
    high = float(max(np.max(y_true), np.max(y_pred))) + 0.5
    ax.plot([low, high], [low, high], color="grey", linewidth=1)
    ax.set(xlim=(low, high), ylim=(low, high), xlabel="measured log S", ylabel="predicted log S")
    ax.set_title(f"test RMSE {metrics['rmse']:.3f}  R² {metrics['r2']:.3f}")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        # No software/version stamp, so the same predictions give the same bytes.
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
