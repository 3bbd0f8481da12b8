"""Hyperparameter sweeps over any workflow: search spaces, successive halving, promotion, the report.

A sweep (config ``snakedvc.sweep``) is a set of trials, each the workflow's config with a few
dotted keys overridden. Trials train in rungs: rung r trains every survivor of rung r-1 on to
the rung's epochs (the config key named by ``budget``), continuing from the state its previous
rung ended in; the best of a rung by ``metric`` (``direction`` min or max) go on. Strategy
``full`` is one rung at the budget. The workflow decides promotions at run time (a Snakemake
checkpoint per rung, in the kit's ``sweep`` module); everything here is pure and tested alone.

The contract with the workflow's trial rule (``use rule train as sweep_trial with:``): it
writes into its trial folder ``metrics_file`` (JSON with the metric, or ``error``) and
``state_file`` (the state a later rung continues from); see ``SweepPlan.outputs``.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import math
import random
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snakedvc.config import KEY, ConfigError, load_schema, validate_config
from snakedvc.io import atomic_path

if TYPE_CHECKING:  # pandas is imported where used: every Snakemake start-up (one per job) imports this module
    import pandas as pd

SETTINGS = f"{KEY}.sweep"
SUMMARY_COLUMNS = ("trial", "status", "rung", "epochs", "metric", "best", "error")


@dataclass(frozen=True)
class Rung:
    index: int
    epochs: int  # train survivors up to this epoch
    size: int  # trials trained in this rung


@dataclass(frozen=True)
class Trial:
    id: str
    overrides: dict[str, Any]
    config: dict[str, Any] | None  # validated full config (the user's keys); None where the overrides are invalid
    error: str = ""

    @property
    def valid(self) -> bool:
        return self.config is not None


def schedule(n_trials: int, strategy: str, min_epochs: int, eta: int, max_epochs: int) -> list[Rung]:
    """The rungs of a sweep: epochs min_epochs * eta**r (the last capped at max_epochs), n // eta**r trials."""
    if n_trials < 1:
        raise ConfigError(f"config key '{SETTINGS}.space': the sweep has no trials")
    if strategy == "full":
        return [Rung(0, max_epochs, n_trials)]
    if strategy != "successive_halving":
        raise ConfigError(f"config key '{SETTINGS}.strategy': unknown strategy {strategy!r}")
    if min_epochs > max_epochs:
        raise ConfigError(f"config key '{SETTINGS}.min_epochs': {min_epochs} is more than the budget {max_epochs}")
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


# --- dotted config keys --------------------------------------------------------------------


def dotted_keys(config: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key of a nested config, dotted (sections and leaves)."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        yield name
        if isinstance(value, Mapping):
            yield from dotted_keys(value, name + ".")


def get_dotted(config: Mapping[str, Any], key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    *sections, name = key.split(".")
    target = config
    for part in sections:
        target = target.setdefault(part, {})
    target[name] = copy.deepcopy(value)


def check_space_key(key: str, config: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
    """A searchable key: one the config has, not the budget, not the kit's, within `searchable`."""
    where = f"config key '{SETTINGS}.space.{key}'"
    if key == KEY or key.startswith(KEY + "."):
        raise ConfigError(f"{where}: the kit's own settings are not searchable")
    if key == settings["budget"]:
        raise ConfigError(f"{where}: the budget key is set by the sweep itself for every rung, not searchable")
    try:
        get_dotted(config, key)
    except KeyError:
        known = [k for k in dotted_keys(config) if not k.startswith(KEY)]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{where}: the config has no such key{hint}") from None
    allowed = settings["searchable"]
    if allowed and not any(key == a or key.startswith(a + ".") for a in allowed):
        raise ConfigError(f"{where}: not searchable; {SETTINGS}.searchable allows {', '.join(allowed)}")


def _sample(key: str, spec: Any, rng: random.Random) -> Any:
    if isinstance(spec, list):
        return copy.deepcopy(rng.choice(spec))
    low, high, log = spec["low"], spec["high"], spec.get("log", False)
    if not low < high or (log and low <= 0):
        raise ConfigError(f"config key '{SETTINGS}.space.{key}': need 0 < low < high for log, low < high otherwise")
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if log else rng.uniform(low, high)
    if isinstance(low, int) and isinstance(high, int) and not log:
        return int(round(value))
    return float(f"{value:.6g}")  # readable in `dvc exp show`, and the same on every machine


def expand_space(space: Mapping[str, Any], method: str, max_trials: int, seed: int) -> list[dict[str, Any]]:
    """The override dicts of every trial: the full grid, or ``max_trials`` random draws."""
    if not space:
        raise ConfigError(f"config key '{SETTINGS}.space': empty; name at least one key to search")
    keys = list(space)
    if method == "grid":
        for key, spec in space.items():
            if not isinstance(spec, list):
                raise ConfigError(f"config key '{SETTINGS}.space.{key}': a grid needs a list of values, got {spec!r}")
        grid = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(space[k] for k in keys))]
        if len(grid) > max_trials:
            raise ConfigError(
                f"config key '{SETTINGS}.max_trials': the grid has {len(grid)} trials, more than max_trials {max_trials}"
            )
        return copy.deepcopy(grid)
    if method == "random":
        rng = random.Random(seed)
        return [{key: _sample(key, space[key], rng) for key in keys} for _ in range(max_trials)]
    raise ConfigError(f"config key '{SETTINGS}.method': unknown method {method!r}")


def user_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: copy.deepcopy(value) for key, value in config.items() if key != KEY}


def build_trials(config: Mapping[str, Any], schema: Mapping[str, Any] | None) -> list[Trial]:
    """Every trial's config, validated with the workflow's schema. An invalid trial is kept, with the reason."""
    settings = config[KEY]["sweep"]
    base = user_config(config)
    for key in settings["space"]:
        check_space_key(key, base, settings)
    overrides = expand_space(settings["space"], settings["method"], settings["max_trials"], settings["seed"])
    trials = []
    for index, values in enumerate(overrides):
        trial_id = f"t{index:03d}"
        candidate = copy.deepcopy(base)
        for key, value in values.items():
            set_dotted(candidate, key, value)
        try:
            validated = validate_config(candidate, dict(schema)) if schema else candidate
            trials.append(Trial(trial_id, values, validated))
        except ConfigError as error:
            shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
            trials.append(Trial(trial_id, values, None, f"invalid trial config ({shown}): {error}"))
    return trials


def section_key(section: Any) -> str:
    return hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()[:10]


# --- the plan a workflow lays its jobs out from --------------------------------------------


@dataclass
class SweepPlan:
    """A sweep's trials, rungs and file layout; the input and params functions of its rules."""

    settings: dict[str, Any]
    base: dict[str, Any]  # the workflow's own config (the budget at its full value)
    trials: list[Trial]
    rungs: list[Rung]
    _checkpoint: Any = None  # the `rung` checkpoint of the kit's module, bound when the module loads

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SweepPlan:
        kit = config.get(KEY) or {}
        settings = kit.get("sweep") or {}
        if not settings.get("enabled"):
            return cls(dict(settings), user_config(config), [], [])
        for key in ("metric", "budget"):
            if not settings.get(key):
                raise ConfigError(f"config key '{SETTINGS}.{key}': required when the sweep is enabled")
        base = user_config(config)
        try:
            budget = get_dotted(base, settings["budget"])
        except KeyError:
            raise ConfigError(f"config key '{SETTINGS}.budget': the config has no key {settings['budget']!r}") from None
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ConfigError(
                f"config key '{settings['budget']}' (the sweep's budget): need epochs >= 1, got {budget!r}"
            )
        schema = load_schema(kit["schema"]) if kit.get("schema") else None
        trials = build_trials(config, schema)
        valid = [t for t in trials if t.valid]
        if not valid:
            raise ConfigError(f"config key '{SETTINGS}.space': every trial is invalid; first: {trials[0].error}")
        # Invalid trials are known before anything runs: the rungs are sized for the valid ones.
        rungs = schedule(len(valid), settings["strategy"], settings["min_epochs"], settings["reduction_factor"], budget)
        return cls(dict(settings), base, trials, rungs)

    # -- what is what

    @property
    def enabled(self) -> bool:
        return bool(self.settings.get("enabled"))

    @property
    def name(self) -> str:
        return str(self.settings.get("name", "sweep"))

    @property
    def root(self) -> str:
        return f"{self.settings.get('dir', 'results/sweeps')}/{self.name}"

    @property
    def valid_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.valid]

    def trial(self, trial_id: str) -> Trial:
        for trial in self.trials:
            if trial.id == trial_id:
                return trial
        raise KeyError(f"no trial {trial_id!r} in sweep {self.name!r}")

    def trial_config(self, trial_id: str, rung: int) -> dict[str, Any]:
        """The trial's config for one rung: the budget key set to the rung's epochs."""
        config = self.trial(trial_id).config
        if config is None:
            raise KeyError(f"trial {trial_id!r} of sweep {self.name!r} is invalid: {self.trial(trial_id).error}")
        config = copy.deepcopy(config)
        set_dotted(config, self.settings["budget"], self.rungs[rung].epochs)
        return config

    def keep_after(self, rung: int) -> int:
        """How many trials rung ``rung`` promotes (1 after the last: the best)."""
        return self.rungs[rung + 1].size if rung + 1 < len(self.rungs) else 1

    # -- file layout: patterns with {trial} and {rung} wildcards

    @property
    def trial_dir(self) -> str:
        return f"{self.root}/trials/{{trial,t\\d+}}/rung{{rung,\\d+}}"

    def trial_file(self, name: str) -> str:
        """Pattern of a file in a trial folder (wildcards trial and rung)."""
        return f"{self.trial_dir}/{name}"

    def path(self, trial: str, rung: int, name: str = "") -> str:
        """A trial folder of one rung, or a file in it."""
        folder = f"{self.root}/trials/{trial}/rung{rung}"
        return f"{folder}/{name}" if name else folder

    def outputs(self, **files: str) -> dict[str, str]:
        """The trial rule's outputs: ``metrics`` and ``state`` (the contract), plus the user's named files."""
        return {
            "metrics": self.trial_file(self.settings["metrics_file"]),
            "state": self.trial_file(self.settings["state_file"]),
            **{name: self.trial_file(file) for name, file in files.items()},
        }

    def log(self, name: str = "train") -> str:
        return f"logs/sweeps/{self.name}/{{trial}}/rung{{rung}}/{name}.log"

    def benchmark(self, name: str = "train") -> str:
        return f"logs/benchmarks/sweeps/{self.name}/{{trial}}/rung{{rung}}/{name}.tsv"

    @property
    def report(self) -> str:
        return f"{self.root}/report"

    def targets(self) -> list[str]:
        """What `rule all` asks for while sweeping (nothing when the sweep is off)."""
        return [self.report] if self.enabled else []

    # -- input and params functions of the trial rule (take Snakemake's wildcards)

    def config_of(self, wildcards: Any) -> dict[str, Any]:
        return self.trial_config(wildcards.trial, int(wildcards.rung))

    def section(self, key: str) -> Callable[[Any], str]:
        """Params function: the trial's config section (dotted key) at this rung, as sorted JSON."""

        def section_json(wildcards: Any) -> str:
            return json.dumps(get_dotted(self.config_of(wildcards), key), sort_keys=True)

        return section_json

    def flags(self, key: str) -> Callable[[Any], str]:
        """Params function: the trial's config section (dotted key) at this rung as ``--name value``
        flags (snakedvc.flags), for a script that reads its hyperparameters with argparse."""
        from snakedvc.workflow import flags

        def section_flags(wildcards: Any) -> str:
            return flags(get_dotted(self.config_of(wildcards), key))

        return section_flags

    def previous_state(self, wildcards: Any) -> list[str]:
        """Input function: the state this trial's previous rung ended in (none in rung 0)."""
        rung = int(wildcards.rung)
        if rung == 0:
            return []
        return [self.path(wildcards.trial, rung - 1, self.settings["state_file"])]

    def trial_args(self, continue_flag: str, final_flag: str, metrics_flag: str = "") -> Callable[[Any], str]:
        """Params function: the trial's contract as arguments of the user's script, quoted.

        ``FINAL_FLAG <state>`` (where to write the state a later rung continues from),
        ``CONTINUE_FLAG <previous rung's state>`` after rung 0, and ``METRICS_FLAG <metrics>``
        where the script does not already get its metrics file from the rule's shell.
        """

        def args(wildcards: Any) -> str:
            trial, rung = wildcards.trial, int(wildcards.rung)
            words = [final_flag, self.path(trial, rung, self.settings["state_file"])]
            for previous in self.previous_state(wildcards):
                words += [continue_flag, previous]
            if metrics_flag:
                words += [metrics_flag, self.path(trial, rung, self.settings["metrics_file"])]
            return shlex.join(words)

        return args

    def section_variant(self, trial_id: str, key: str) -> str | None:
        """A short hash of the trial's section ``key`` where it differs from the workflow's, else None.

        For trials that change an upstream step (e.g. features): the workflow builds each variant once.
        """
        config = self.trial(trial_id).config
        assert config is not None
        section = get_dotted(config, key)
        return None if section == get_dotted(self.base, key) else section_key(section)

    def variants(self, key: str) -> dict[str, Any]:
        """Every variant of section ``key`` among the valid trials, by its hash."""
        found = {}
        for trial in self.valid_trials:
            variant = self.section_variant(trial.id, key)
            if variant is not None and trial.config is not None:
                found[variant] = get_dotted(trial.config, key)
        return found

    # -- run-time decisions, through the module's checkpoint

    def bind(self, checkpoint: Any) -> None:
        self._checkpoint = checkpoint

    def decision(self, rung: int) -> dict[str, Any]:
        if self._checkpoint is None:
            raise RuntimeError(
                "the sweep module is not loaded: add `module sweep: snakefile: snakedvc.module_path('sweep')`"
            )
        path = self._checkpoint.get(rung=str(rung)).output.decision
        with open(path) as handle:
            decision: dict[str, Any] = json.load(handle)
        return decision

    def rung_trials(self, rung: int) -> list[str]:
        """The trials trained in a rung: every valid one first, then the previous rung's survivors."""
        if rung == 0:
            return [trial.id for trial in self.valid_trials]
        return list(self.decision(rung - 1)["survivors"])

    def best_trial(self) -> str:
        ranking = self.decision(len(self.rungs) - 1)["ranking"]
        if not ranking:
            raise ConfigError(f"sweep {self.name}: every trial failed; see {self.root}/rungs/")
        return str(ranking[0])

    def best(self, name: str) -> Callable[[Any], str]:
        """Input function: file ``name`` of the winner's last trial folder (known after the last rung)."""

        def best_file(wildcards: Any) -> str:
            return self.path(self.best_trial(), len(self.rungs) - 1, name)

        return best_file

    def describe(self) -> dict[str, Any]:
        """JSON-ready plan for the report."""
        return {
            "name": self.name,
            "metric": self.settings.get("metric"),
            "direction": self.settings.get("direction", "min"),
            "budget": self.settings.get("budget"),
            "rungs": [{"rung": r.index, "epochs": r.epochs, "size": r.size} for r in self.rungs],
            "total_epochs": total_epochs(self.rungs),
            "trials": [{"trial": t.id, "overrides": t.overrides, "error": t.error} for t in self.trials],
        }


_PLANS: dict[str, SweepPlan] = {}


def plan(config: Mapping[str, Any]) -> SweepPlan:
    """The sweep of this config; the same object for the workflow and the kit's module."""
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _PLANS:
        _PLANS[key] = SweepPlan.from_config(config)
    return _PLANS[key]


# --- trial results and promotion -----------------------------------------------------------


def read_trial_metrics(path: str | Path, metric: str) -> dict[str, Any]:
    """A trial's outcome from its metrics file: status ok with the metric, or failed with why."""
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        return {"status": "failed", "error": f"unreadable metrics file {path}: {error}"}
    if not isinstance(values, dict):
        return {"status": "failed", "error": f"{path}: expected a JSON object, got {type(values).__name__}"}
    if values.get("error"):
        return {"status": "failed", "error": str(values["error"]), "metrics": values}
    value = values.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return {"status": "failed", "error": f"{path}: metric {metric!r} is {value!r}, not a finite number"}
    return {"status": "ok", "metric": float(value), "metrics": values}


def promote(results: Mapping[str, Mapping[str, Any]], keep: int, direction: str) -> dict[str, Any]:
    """Rank a rung's trials by the metric (best first; ties by trial id); failed ones are excluded."""
    sign = 1.0 if direction == "min" else -1.0
    ok = sorted((sign * r["metric"], trial) for trial, r in results.items() if r.get("status") == "ok")
    ranking = [trial for _, trial in ok]
    failed = sorted(trial for trial, r in results.items() if r.get("status") != "ok")
    return {"ranking": ranking, "survivors": ranking[:keep], "failed": failed, "results": dict(results)}


def summarise(plan: Mapping[str, Any], decisions: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per trial: the furthest rung it reached, its epochs and metric there."""
    import pandas as pd

    best = decisions[-1]["ranking"][0] if decisions and decisions[-1]["ranking"] else None
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


def plot_rungs(plan: Mapping[str, Any], decisions: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """The metric of each trial at the end of each rung it trained in, against epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = decisions[-1]["ranking"][0] if decisions and decisions[-1]["ranking"] else None
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
    ax.set_ylabel(plan["metric"])
    ax.set_title(f"Sweep {plan['name']}: {plan['metric']} at the end of each rung ({plan['direction']} is best)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
