"""Pieces of the kit's HTML reports, shared by the run's report and a sweep's section: a figure, a
table, per-epoch curves from a dvclive folder."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snakedvc.live import PLOTS_DIR


def read_curves(folder: Path) -> dict[str, list[tuple[float, float]]]:
    """A dvclive folder's per-step metrics: name -> [(step, value)]."""
    curves = {}
    for tsv in sorted((folder / PLOTS_DIR).rglob("*.tsv")):
        lines = tsv.read_text().splitlines()
        if not lines:
            continue
        header = lines[0].split("\t")
        name = str(tsv.relative_to(folder / PLOTS_DIR).with_suffix(""))
        step, value = header.index("step"), len(header) - 1
        points = []
        for line in lines[1:]:
            cells = line.split("\t")
            try:
                points.append((float(cells[step]), float(cells[value])))
            except (ValueError, IndexError):
                continue
        curves[name] = points
    return curves


def curves_png(series: dict[str, dict[str, list[tuple[float, float]]]], title: str, highlight: str = "") -> bytes:
    """One panel per metric; each panel a line per series (a run, or a sweep's trials)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = sorted({name for curves in series.values() for name in curves})
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for label, curves in sorted(series.items()):
            points = curves.get(name) or []
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            bold = label == highlight
            ax.plot(xs, ys, label=label, linewidth=2.4 if bold else 1.2, alpha=1.0 if bold or not highlight else 0.55)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no epoch 1.5
        ax.grid(alpha=0.3)
    if len(series) > 1:
        axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def figure(data: bytes, mime: str, caption: str) -> str:
    encoded = base64.b64encode(data).decode()
    alt = html.escape(caption)
    return f'<figure><img src="data:{mime};base64,{encoded}" alt="{alt}"><figcaption>{alt}</figcaption></figure>'


def cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""  # absent (a trial that failed has no metric; one that succeeded, no error): never "nan"
    if isinstance(value, float):
        return f"{value:.6g}"
    return html.escape(str(value))


def table(rows: Sequence[dict[str, Any]], highlight: tuple[str, str] = ("", "")) -> str:
    if not rows:
        return "<p>(none)</p>"
    keys = list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in keys)
    body = []
    for row in rows:
        marked = highlight[0] and str(row.get(highlight[0])) == highlight[1]
        cells = "".join(f"<td>{cell(row.get(k, ''))}</td>" for k in keys)
        body.append(f'<tr class="best">{cells}</tr>' if marked else f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
