"""Hyperparameter sweeps: search spaces, the successive-halving schedule, promotion and the summary.

A sweep is a set of trials, each the workflow config with a few `train.*` or
`featurise.*` keys overridden. Trials train in rungs: rung r trains every
survivor of rung r-1 on to ``epochs`` by continuing from the state where its
previous rung ended, then the best ``size`` of the next rung (by validation
RMSE, never test) are promoted. Strategy ``full`` is one rung at max_epochs.
The workflow decides promotions at run time (a Snakemake checkpoint per rung);
everything here is pure and tested without it.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snakedvc.config import ConfigError, validate_config
from snakedvc.io import atomic_path

if TYPE_CHECKING:  # pandas is imported where used: every Snakemake start-up (one per job) imports this module
    import pandas as pd

SEARCHABLE_SECTIONS = ("train", "featurise")
# Keys the sweep itself controls, or that change nothing a trial is compared on.
NOT_SEARCHABLE = {
    "train.max_epochs",
    "train.checkpoint_every",
    "train.checkpoint_keep",
    "train.keep_checkpoints",
    "train.torch_threads",
    "featurise.max_reject_fraction",
    "featurise.engine",
    "featurise.shards",
    "featurise.chunk_size",
}
SUMMARY_COLUMNS = (
    "trial", "status", "rung", "epoch", "epochs_trained", "best_epoch", "valid_rmse", "best", "test_rmse", "error",
)  # fmt: skip


@dataclass(frozen=True)
class Rung:
    index: int
    epochs: int  # train survivors up to this epoch
    size: int  # trials trained in this rung


@dataclass(frozen=True)
class Trial:
    id: str
    overrides: dict[str, Any]
    config: dict[str, Any] | None  # validated full config; None where the overrides are invalid
    error: str = ""

    @property
    def valid(self) -> bool:
        return self.config is not None


def schedule(n_trials: int, strategy: str, min_epochs: int, eta: int, max_epochs: int) -> list[Rung]:
    """The rungs of a sweep: epochs min_epochs * eta**r (the last capped at max_epochs), n // eta**r trials."""
    if n_trials < 1:
        raise ConfigError("config key 'sweep.space': the sweep has no trials")
    if strategy == "full":
        return [Rung(0, max_epochs, n_trials)]
    if strategy != "successive_halving":
        raise ConfigError(f"config key 'sweep.strategy': unknown strategy {strategy!r}")
    if min_epochs > max_epochs:
        raise ConfigError(f"config key 'sweep.min_epochs': {min_epochs} is more than train.max_epochs {max_epochs}")
    rungs: list[Rung] = []
    epochs = min_epochs
    while True:
        r = len(rungs)
        rungs.append(Rung(r, min(epochs, max_epochs), max(1, n_trials // eta**r)))
        if epochs >= max_epochs:
            return rungs
        epochs *= eta


def total_epochs(rungs: Sequence[Rung]) -> int:
    """Epochs a sweep trains when no trial stops early: survivors continue, never restart."""
    total, previous = 0, 0
    for rung in rungs:
        total += rung.size * (rung.epochs - previous)
        previous = rung.epochs
    return total


def _check_key(key: str) -> None:
    section, _, name = key.partition(".")
    if section not in SEARCHABLE_SECTIONS or not name or "." in name:
        raise ConfigError(f"config key 'sweep.space.{key}': search keys are 'train.<key>' or 'featurise.<key>'")
    if key in NOT_SEARCHABLE:
        raise ConfigError(f"config key 'sweep.space.{key}': set by the sweep itself, not searchable")


def _sample(key: str, spec: Any, rng: random.Random) -> Any:
    if isinstance(spec, list):
        return copy.deepcopy(rng.choice(spec))
    low, high, log = spec["low"], spec["high"], spec.get("log", False)
    if not low < high or (log and low <= 0):
        raise ConfigError(f"config key 'sweep.space.{key}': need 0 < low < high for log, low < high otherwise")
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if log else rng.uniform(low, high)
    if isinstance(low, int) and isinstance(high, int) and not log:
        return int(round(value))
    return float(f"{value:.6g}")  # readable in `dvc exp show`, and the same on every machine


def expand_space(space: dict[str, Any], method: str, max_trials: int, seed: int) -> list[dict[str, Any]]:
    """The override dicts of every trial: the full grid, or ``max_trials`` random draws."""
    if not space:
        raise ConfigError("config key 'sweep.space': empty; name at least one key to search")
    for key in space:
        _check_key(key)
    keys = list(space)
    if method == "grid":
        for key, spec in space.items():
            if not isinstance(spec, list):
                raise ConfigError(f"config key 'sweep.space.{key}': a grid needs a list of values, got {spec!r}")
        grid = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(space[k] for k in keys))]
        if len(grid) > max_trials:
            raise ConfigError(
                f"config key 'sweep.max_trials': the grid has {len(grid)} trials, more than max_trials {max_trials}"
            )
        return copy.deepcopy(grid)
    if method == "random":
        rng = random.Random(seed)
        return [{key: _sample(key, space[key], rng) for key in keys} for _ in range(max_trials)]
    raise ConfigError(f"config key 'sweep.method': unknown method {method!r}")


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    section, name = key.split(".", 1)
    config.setdefault(section, {})[name] = copy.deepcopy(value)


def build_trials(config: dict[str, Any], schema: dict[str, Any]) -> list[Trial]:
    """Every trial's validated config. A trial whose values are invalid is kept, with the reason."""
    sweep = config["sweep"]
    overrides = expand_space(sweep["space"], sweep["method"], sweep["max_trials"], sweep["seed"])
    # Trials are checked against the user's schema: the kit's own section is not part of it.
    base = {k: v for k, v in config.items() if k not in ("sweep", "snakedvc")}
    trials = []
    for index, values in enumerate(overrides):
        trial_id = f"t{index:03d}"
        candidate = copy.deepcopy(base)
        for key, value in values.items():
            set_dotted(candidate, key, value)
        try:
            validated = validate_config({**candidate, "sweep": {}}, schema)
            validated.pop("sweep")
            trials.append(Trial(trial_id, values, validated))
        except ConfigError as error:
            shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
            trials.append(Trial(trial_id, values, None, f"invalid trial config ({shown}): {error}"))
    return trials


def featurise_key(featurise: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(featurise, sort_keys=True).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class SweepPlan:
    """What the workflow needs to lay out a sweep's jobs."""

    name: str
    trials: list[Trial]
    rungs: list[Rung]
    base_featurise: dict[str, Any]

    @classmethod
    def from_config(cls, config: dict[str, Any], schema: dict[str, Any]) -> SweepPlan:
        sweep = config["sweep"]
        trials = build_trials(config, schema)
        valid = [t for t in trials if t.valid]
        if not valid:
            raise ConfigError(f"config key 'sweep.space': every trial is invalid; first: {trials[0].error}")
        # Invalid trials are known before anything runs: the rungs are sized for the valid ones.
        rungs = schedule(
            len(valid), sweep["strategy"], sweep["min_epochs"], sweep["reduction_factor"],
            config["train"]["max_epochs"],
        )  # fmt: skip
        return cls(sweep["name"], trials, rungs, config["featurise"])

    def trial(self, trial_id: str) -> Trial:
        for trial in self.trials:
            if trial.id == trial_id:
                return trial
        raise KeyError(f"no trial {trial_id!r} in sweep {self.name!r}")

    @property
    def valid_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.valid]

    def features_key(self, trial_id: str) -> str | None:
        """None where the trial uses the workflow's own features (its featurise section is unchanged)."""
        config = self.trial(trial_id).config
        assert config is not None
        if config["featurise"] == self.base_featurise:
            return None
        return featurise_key(config["featurise"])

    def featurise_by_key(self) -> dict[str, dict[str, Any]]:
        found = {}
        for trial in self.valid_trials:
            key = self.features_key(trial.id)
            if key is not None and trial.config is not None:
                found[key] = trial.config["featurise"]
        return found

    def train_section(self, trial_id: str, rung: int) -> dict[str, Any]:
        """The trial's train config for one rung: trains to the rung's epochs, checkpoints removed after."""
        config = self.trial(trial_id).config
        assert config is not None
        return {**config["train"], "max_epochs": self.rungs[rung].epochs, "keep_checkpoints": False}

    def keep_after(self, rung: int) -> int:
        """How many trials rung ``rung`` promotes (1 after the last: the best)."""
        return self.rungs[rung + 1].size if rung + 1 < len(self.rungs) else 1

    def describe(self) -> dict[str, Any]:
        """JSON-ready plan for the summary step."""
        return {
            "name": self.name,
            "rungs": [{"rung": r.index, "epochs": r.epochs, "size": r.size} for r in self.rungs],
            "total_epochs": total_epochs(self.rungs),
            "trials": [{"trial": t.id, "overrides": t.overrides, "error": t.error} for t in self.trials],
        }


# --- trial results and promotion -----------------------------------------------------------


def write_trial_result(
    path: str | Path,
    status: str,
    error: str = "",
    history: pd.DataFrame | None = None,
    epochs_trained: int = 0,
    resumed_from: str | None = None,
) -> None:
    """A trial's outcome at one rung; promotion reads only these files."""
    result: dict[str, Any] = {"status": status, "error": error, "epochs_trained": epochs_trained}
    if history is not None and len(history):
        best = history.loc[history["valid_loss"].idxmin()]
        result.update(
            epoch=int(history["epoch"].iloc[-1]),
            best_epoch=int(best["epoch"]),
            valid_rmse=float(best["valid_rmse"]),
        )
    result["resumed_from"] = resumed_from
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def read_trial_result(trial_dir: str | Path) -> dict[str, Any]:
    path = Path(trial_dir) / "result.json"
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def promote(results: dict[str, dict[str, Any]], keep: int) -> dict[str, Any]:
    """Rank a rung's trials by validation RMSE (ties by trial id); failed ones are excluded."""
    ok = [(r["valid_rmse"], trial) for trial, r in results.items() if r.get("status") == "ok"]
    failed = sorted(trial for trial, r in results.items() if r.get("status") != "ok")
    ranking = [trial for _, trial in sorted(ok)]
    return {"ranking": ranking, "survivors": ranking[:keep], "failed": failed, "results": results}


def rung_trial_dir(sweep_dir: str | Path, trial: str, rung: int) -> Path:
    return Path(sweep_dir) / "trials" / trial / f"rung{rung}"


def summarise(plan: dict[str, Any], sweep_dir: str | Path, final_metrics: dict[str, Any]) -> pd.DataFrame:
    """One row per trial: the furthest rung it reached and its validation RMSE there."""
    import pandas as pd

    rungs = [json.loads(Path(sweep_dir, "rungs", f"rung{r['rung']}.json").read_text()) for r in plan["rungs"]]
    best = rungs[-1]["ranking"][0] if rungs and rungs[-1]["ranking"] else None
    rows = []
    for trial in plan["trials"]:
        tid = trial["trial"]
        row: dict[str, Any] = {c: None for c in SUMMARY_COLUMNS}
        row.update(trial=tid, status="invalid" if trial["error"] else "not run", error=trial["error"], best=False)
        trained = 0
        for index, rung in enumerate(rungs):
            result = rung["results"].get(tid)
            if result is None:
                continue
            trained += result.get("epochs_trained", 0)
            row.update(rung=index, status=result["status"], error=result.get("error", ""))
            if result["status"] == "ok":
                row.update(epoch=result["epoch"], best_epoch=result["best_epoch"], valid_rmse=result["valid_rmse"])
        row["epochs_trained"] = trained
        if tid == best:
            row.update(best=True, test_rmse=final_metrics.get("rmse"))
        for key, value in trial["overrides"].items():
            row[key] = json.dumps(value) if isinstance(value, list) else value
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.sort_values(["rung", "valid_rmse"], ascending=[False, True], na_position="last", kind="stable")


def format_summary(table: pd.DataFrame) -> str:
    import pandas as pd

    shown = table.drop(columns=["error"]).copy()
    shown["valid_rmse"] = shown["valid_rmse"].map(lambda v: "" if pd.isna(v) else f"{v:.4f}")
    shown["test_rmse"] = shown["test_rmse"].map(lambda v: "" if pd.isna(v) else f"{v:.4f}")
    shown["best"] = shown["best"].map(lambda v: "*" if v else "")
    text = shown.fillna("").to_string(index=False)
    errors = [f"  {r.trial}: {r.error}" for r in table.itertuples() if r.error]
    return text + ("\nexcluded:\n" + "\n".join(errors) if errors else "")


def plot_valid_loss(histories: dict[str, pd.DataFrame], best: str | None, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for trial, history in sorted(histories.items()):
        style = {"linewidth": 2.5, "color": "black"} if trial == best else {"linewidth": 1, "alpha": 0.7}
        ax.plot(history["epoch"], history["valid_rmse"], label=trial + (" (best)" if trial == best else ""), **style)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation RMSE (log S)")
    ax.set_title("Validation RMSE per trial")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
