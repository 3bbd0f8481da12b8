"""The sweep's report: a summary table, the rungs' plot, each completed trial's files."""

from __future__ import annotations

import html
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snakedvc.io import atomic_path
from snakedvc.progressbar import progress

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pandas is imported where used: every Snakemake start-up (one per job) imports the plan
    import pandas as pd

SUMMARY_COLUMNS = ("trial", "status", "rung", "epochs", "metric", "best", "error")


def last_rungs_best(decisions: Sequence[Mapping[str, Any]]) -> str | None:
    """The winner of a synchronous sweep: the best of its last rung."""
    return decisions[-1]["ranking"][0] if decisions and decisions[-1]["ranking"] else None


def summarise(plan: Mapping[str, Any], decisions: Sequence[Mapping[str, Any]], best: str | None) -> pd.DataFrame:
    """One row per trial: the furthest rung it reached, its epochs and metric there."""
    import pandas as pd

    rows = []
    for trial in plan["trials"]:
        tid = trial["trial"]
        row: dict[str, Any] = {c: None for c in SUMMARY_COLUMNS}
        row.update(trial=tid, status="invalid" if trial["error"] else "not run", error=trial["error"], best=False)
        for index, decision in enumerate(decisions):
            result = decision["results"].get(tid)
            if result is None:
                continue
            row.update(rung=index, epochs=plan["rungs"][index]["epochs"], status=result["status"])
            row.update(error=result.get("error", ""), metric=result.get("metric"))
        row["best"] = tid == best
        for key, value in trial["overrides"].items():
            row[key] = json.dumps(value) if isinstance(value, list) else value
        rows.append(row)
    table = pd.DataFrame(rows).rename(columns={"metric": plan["metric"]})
    return table.sort_values(
        ["rung", plan["metric"]], ascending=[False, plan["direction"] == "min"], na_position="last", kind="stable"
    )


def format_summary(table: pd.DataFrame, metric: str) -> str:
    import pandas as pd

    shown = table.drop(columns=["error"]).copy()
    shown[metric] = shown[metric].map(lambda v: "" if pd.isna(v) else f"{v:.4f}")
    shown["best"] = shown["best"].map(lambda v: "*" if v else "")
    text = shown.fillna("").to_string(index=False)
    errors = [f"  {r.trial}: {r.error}" for r in table.itertuples() if r.error]
    return text + ("\nexcluded:\n" + "\n".join(errors) if errors else "")


def plot_rungs(
    plan: Mapping[str, Any], decisions: Sequence[Mapping[str, Any]], best: str | None, path: str | Path
) -> None:
    """The metric of each trial at the end of each rung it trained in, against epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    curves: dict[str, tuple[list[int], list[float]]] = {}
    for index, decision in enumerate(decisions):
        for trial, result in decision["results"].items():
            if result.get("status") == "ok":
                xs, ys = curves.setdefault(trial, ([], []))
                xs.append(plan["rungs"][index]["epochs"])
                ys.append(result["metric"])
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for trial, (xs, ys) in sorted(curves.items()):
        style = {"linewidth": 2.5, "color": "black"} if trial == best else {"linewidth": 1, "alpha": 0.7}
        ax.plot(xs, ys, marker="o", label=trial + (" (best)" if trial == best else ""), **style)
    ax.set_xlabel("epochs")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(plan["metric"])
    ax.set_title(f"Sweep {plan['name']}: {plan['metric']} at the end of each rung ({plan['direction']} is best)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def plot_timeline(
    plan: Mapping[str, Any], timeline: Sequence[Mapping[str, Any]], best: str | None, path: str | Path
) -> None:
    """An asha sweep's slots against time: each trial-rung a bar from the decision that gave it
    to its slot until its result (rung by colour, trial by label, the winner outlined)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slots = int(plan.get("slots") or 1)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.55 * slots), dpi=100)
    colours = plt.get_cmap("viridis")
    n_rungs = max(len(plan["rungs"]) - 1, 1)
    for row in timeline:
        end = row["end"] if row["end"] is not None else row["start"]
        edge = {"edgecolor": "black", "linewidth": 2} if row["trial"] == best else {"edgecolor": "white"}
        ax.barh(row["slot"], end - row["start"], left=row["start"], height=0.8,
                color=colours(row["rung"] / n_rungs), **edge)  # fmt: skip
        label = f"{row['trial']}" + ("" if row["status"] == "ok" else " x")
        ax.text(row["start"] + (end - row["start"]) / 2, row["slot"], label, ha="center", va="center", fontsize=6,
                color="white" if row["rung"] < n_rungs / 2 else "black")  # fmt: skip
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(r / n_rungs)) for r in range(len(plan["rungs"]))]
    labels = [f"rung {r['rung']} ({r['epochs']} epochs)" for r in plan["rungs"]]
    ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(labels))
    ax.set_yticks(range(slots), [f"slot {s}" for s in range(slots)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the sweep's first decision")
    ax.set_title(f"Sweep {plan['name']}: which trial-rung ran in which slot when (x: failed; outlined: winner)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def read_decisions(decision_files: Sequence[str]) -> tuple[list[dict[str, Any]], str | None, dict[str, Any] | None]:
    """Each rung's decision, the winner, and for asha its summary. An asha sweep's files are its
    decision log (``.jsonl``) and its end's summary; a synchronous one's, one decision per rung."""
    if decision_files and str(decision_files[0]).endswith(".jsonl"):
        summary = json.loads(Path(decision_files[1]).read_text())
        return summary["rungs"], summary["winner"], summary
    decisions = [json.loads(Path(d).read_text()) for d in decision_files]
    return decisions, last_rungs_best(decisions), None


def write(plan: Mapping[str, Any], decision_files: Sequence[str], trials: Path, leave_out: str, out: Path) -> str:
    """The report folder (the sweep module's `report` rule): summary.csv and .txt, rungs.png,
    plan.json and each completed trial's folder from the furthest rung it reached (without
    ``leave_out``, the state file); for asha also timeline.png, asha.json (its summary) and
    decisions.jsonl (its decision log). Returns the summary's text."""
    decisions, best, asha = read_decisions(decision_files)
    table = summarise(plan, decisions, best)
    out.mkdir(parents=True, exist_ok=True)
    rows = progress(table.itertuples(), total=len(table), desc=f"sweep {plan['name']} report", unit="trials")
    for row in rows:
        if row.status != "ok":
            continue
        source = trials / str(row.trial) / f"rung{int(row.rung)}"
        shutil.copytree(source, out / "trials" / str(row.trial), ignore=shutil.ignore_patterns(leave_out))
    plot_rungs(plan, decisions, best, out / "rungs.png")
    with atomic_path(out / "summary.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    if asha is not None:
        plan = {**plan, "total_epochs": asha["epochs_trained"], "trial_rungs": asha["trial_rungs"]}
        plot_timeline(plan, asha["timeline"], best, out / "timeline.png")
        shutil.copyfile(decision_files[0], out / "decisions.jsonl")
        (out / "asha.json").write_text(json.dumps(asha, indent=2, sort_keys=True) + "\n")
    (out / "plan.json").write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")
    text = format_summary(table, plan["metric"])
    (out / "summary.txt").write_text(text + "\n")
    log.info("sweep %s (%s):\n%s", plan["name"], epochs_note(plan), text)
    return text


def epochs_note(plan: Mapping[str, Any]) -> str:
    if plan.get("strategy") == "asha":
        return (f"asha on {plan.get('slots')} slots: {plan.get('total_epochs', '?')} epochs trained in "
                f"{plan.get('trial_rungs', '?')} trial-rung jobs")  # fmt: skip
    return f"{plan.get('total_epochs', '?')} epochs scheduled"


def html_section(report_dir: Path) -> str:
    """Rungs, every trial's curves (the winner bold), the summary table with the winner marked."""
    import pandas as pd

    from snakedvc.engine.page import curves_png, figure, read_curves, table

    summary = pd.read_csv(report_dir / "summary.csv")
    plan = json.loads((report_dir / "plan.json").read_text())
    best = summary.loc[summary["best"].astype(bool), "trial"].astype(str).tolist()
    winner = best[0] if best else ""
    series = {}
    for folder in sorted((report_dir / "trials").glob("*/live")):
        series[folder.parent.name] = read_curves(folder)
    parts = [f'<h2 id="sweep">Sweep {html.escape(str(plan.get("name", "")))}</h2>']
    parts.append(
        f'<p>Winner: <strong data-sweep-winner="{html.escape(winner)}">{html.escape(winner) or "none"}</strong>; '
        f"{len(summary)} trials, metric {html.escape(str(plan.get('metric', '')))} "
        f"({html.escape(str(plan.get('direction', '')))}), {html.escape(epochs_note(plan))}.</p>"
    )
    parts.append(table(summary.to_dict("records"), highlight=("trial", winner)))
    rungs = report_dir / "rungs.png"
    if rungs.is_file():
        parts.append(figure(rungs.read_bytes(), "image/png", "Rungs: each trial's metric per rung"))
    timeline = report_dir / "timeline.png"
    if timeline.is_file():
        caption = "Promotion timeline: which trial-rung ran in which slot when (decisions.jsonl has every decision)"
        parts.append(figure(timeline.read_bytes(), "image/png", caption))
    if series:
        png = curves_png(series, "Every trial's curves (winner bold)", highlight=winner)
        parts.append(figure(png, "image/png", "Every trial's curves"))
    return "\n".join(parts)
