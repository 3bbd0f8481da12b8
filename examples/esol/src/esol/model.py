"""The regression model: a plain MLP over fingerprint bits, plus saving/loading it.

Dropout masks are passed in rather than drawn inside the model: the trainer draws
them for the whole global batch from a generator seeded by (seed, epoch, step),
so 1 or N processes, and a resumed run, see exactly the same masks.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snakedvc import atomic_path


class MLP(nn.Module):
    def __init__(self, n_features: int, hidden_sizes: tuple[int, ...], dropout: float) -> None:
        super().__init__()
        widths = [n_features, *hidden_sizes]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True))
        self.out = nn.Linear(widths[-1], 1)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, masks: list[torch.Tensor] | None = None) -> torch.Tensor:
        for index, layer in enumerate(self.hidden):
            x = torch.relu(layer(x))
            if masks is not None and self.dropout > 0:
                x = x * masks[index] / (1.0 - self.dropout)
        return self.out(x).squeeze(-1)


def dropout_masks(
    batch: int, hidden_sizes: tuple[int, ...], p: float, seed: int, epoch: int, step: int
) -> list[torch.Tensor]:
    """Keep-masks for one global batch, a pure function of (seed, epoch, step)."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_003 + step)
    return [(torch.rand(batch, width, generator=generator) >= p).float() for width in hidden_sizes]


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
