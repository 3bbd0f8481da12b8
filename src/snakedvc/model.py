"""The regression model: a plain MLP over fingerprint bits, plus saving/loading it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snakedvc.io import atomic_path


class MLP(nn.Module):
    def __init__(self, n_features: int, hidden_sizes: tuple[int, ...], dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = n_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def save_model(path: str | Path, model: MLP, meta: dict[str, Any]) -> None:
    """Weights plus what is needed to rebuild and de-standardise, written atomically."""
    payload = {"state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, **meta}
    # Through a buffer: torch.save names the zip's root folder after the file, and a
    # random temp name there would make identical weights differ byte for byte.
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())


def load_model(path: str | Path) -> tuple[MLP, dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model = MLP(int(payload["n_features"]), tuple(payload["hidden_sizes"]), float(payload["dropout"]))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    meta = {k: v for k, v in payload.items() if k != "state_dict"}
    return model, meta
