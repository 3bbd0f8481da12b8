"""The plan a workflow lays its sweep's jobs out from: rungs, file layout, the trial rule's functions."""

from __future__ import annotations

import copy
import json
import random
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snakedvc.engine.config import ConfigError, load_schema
from snakedvc.engine.flagwords import flag_words
from snakedvc.engine.settings import Sweep
from snakedvc.engine.settings import settings as kit_settings
from snakedvc.engine.sweep.space import SETTINGS, Trial, build_trials, get_dotted, section_key, set_dotted, user_config


@dataclass(frozen=True)
class Rung:
    index: int
    epochs: int  # train survivors up to this epoch
    size: int  # trials trained in this rung


def schedule(n_trials: int, strategy: str, min_epochs: int, eta: int, max_epochs: int) -> list[Rung]:
    """The rungs of a sweep: epochs min_epochs * eta**r (the last capped at max_epochs), n // eta**r trials
    (for asha the sizes are what synchronous halving would train: ASHA's are known at the end)."""
    if n_trials < 1:
        raise ConfigError(f"config key '{SETTINGS}.space': the sweep has no trials")
    if strategy == "full":
        return [Rung(0, max_epochs, n_trials)]
    if strategy not in ("successive_halving", "asha"):
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


@dataclass
class SweepPlan:
    """A sweep's trials, rungs and file layout; the input and params functions of its rules.

    Public (what a workflow uses; ``PUBLIC`` below, kept equal by a test):
    - what it is: ``enabled``, ``name``, ``root`` (its folder), ``report`` (its report folder),
      ``targets()`` (what `rule all` asks for while sweeping);
    - the trial rule: ``outputs(**files)``, ``trial_file(name)``, ``log()``, ``benchmark()``,
      ``previous_state`` (input), ``section(key)`` / ``flags(key)`` (the trial's hyperparameters),
      ``trial_args(...)`` (its state and metrics files as arguments);
    - the winner: ``best(name)`` (a file of its last rung), ``best_trial()``;
    - an upstream step a trial changes (e.g. features): ``variants(key)``, ``section_variant(trial, key)``.
    Members starting with ``_`` serve the kit's own sweep module and its end-of-sweep save.
    """

    _settings: Sweep
    _base: dict[str, Any]  # the workflow's own config (the budget at its full value)
    _trials: list[Trial]
    _rungs: list[Rung]
    _checkpoint: Any = None  # the `rung` checkpoint of the kit's module, bound when the module loads
    _asha_checkpoints: Any = None  # its `asha_step` and `asha_end` checkpoints

    @classmethod
    def _from_config(cls, config: Mapping[str, Any]) -> SweepPlan:
        kit = kit_settings(config)
        settings = kit.sweep
        if not settings.enabled:
            return cls(settings, user_config(config), [], [])
        for key in ("metric", "budget"):
            if not getattr(settings, key):
                raise ConfigError(f"config key '{SETTINGS}.{key}': required when the sweep is enabled")
        base = user_config(config)
        try:
            budget = get_dotted(base, settings.budget)
        except KeyError:
            raise ConfigError(f"config key '{SETTINGS}.budget': the config has no key {settings.budget!r}") from None
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ConfigError(f"config key '{settings.budget}' (the sweep's budget): need epochs >= 1, got {budget!r}")
        schema = load_schema(kit.schema) if kit.schema else None
        trials = build_trials(settings, base, schema)
        valid = [t for t in trials if t.valid]
        if not valid:
            raise ConfigError(f"config key '{SETTINGS}.space': every trial is invalid; first: {trials[0].error}")
        # Invalid trials are known before anything runs: the rungs are sized for the valid ones.
        rungs = schedule(len(valid), settings.strategy, settings.min_epochs, settings.reduction_factor, budget)
        _check_asha_keys(settings)
        return cls(settings, base, trials, rungs)

    # -- what is what

    @property
    def enabled(self) -> bool:
        return self._settings.enabled

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def root(self) -> str:
        return f"{self._settings.dir}/{self.name}"

    @property
    def _valid_trials(self) -> list[Trial]:
        return [t for t in self._trials if t.valid]

    def _trial(self, trial_id: str) -> Trial:
        for trial in self._trials:
            if trial.id == trial_id:
                return trial
        raise KeyError(f"no trial {trial_id!r} in sweep {self.name!r}")

    def _trial_config(self, trial_id: str, rung: int) -> dict[str, Any]:
        """The trial's config for one rung: the budget key set to the rung's epochs."""
        config = self._trial(trial_id).config
        if config is None:
            raise KeyError(f"trial {trial_id!r} of sweep {self.name!r} is invalid: {self._trial(trial_id).error}")
        config = copy.deepcopy(config)
        set_dotted(config, self._settings.budget, self._rungs[rung].epochs)
        return config

    def _keep_after(self, rung: int) -> int:
        """How many trials rung ``rung`` promotes (1 after the last: the best)."""
        return self._rungs[rung + 1].size if rung + 1 < len(self._rungs) else 1

    # -- file layout: patterns with {trial} and {rung} wildcards

    @property
    def _trial_dir(self) -> str:
        return f"{self.root}/trials/{{trial,t\\d+}}/rung{{rung,\\d+}}"

    def trial_file(self, name: str) -> str:
        """Pattern of a file in a trial folder (wildcards trial and rung)."""
        return f"{self._trial_dir}/{name}"

    def _path(self, trial: str, rung: int, name: str = "") -> str:
        """A trial folder of one rung, or a file in it."""
        folder = f"{self.root}/trials/{trial}/rung{rung}"
        return f"{folder}/{name}" if name else folder

    def outputs(self, **files: str) -> dict[str, str]:
        """The trial rule's outputs: ``metrics`` and ``state`` (the contract), plus the user's named files,
        each in the trial's folder; Snakemake's flags stay on them (``live=directory("live")``)."""
        return {
            "metrics": self.trial_file(self._settings.metrics_file),
            "state": self.trial_file(self._settings.state_file),
            **{name: _flagged_as(file, self.trial_file(str(file))) for name, file in files.items()},
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

    def _config_of(self, wildcards: Any) -> dict[str, Any]:
        return self._trial_config(wildcards.trial, int(wildcards.rung))

    def section(self, key: str) -> Callable[[Any], str]:
        """Params function: the trial's config section (dotted key) at this rung, as sorted JSON."""

        def section_json(wildcards: Any) -> str:
            return json.dumps(get_dotted(self._config_of(wildcards), key), sort_keys=True)

        return section_json

    def flags(self, key: str, fallback: str | None = None) -> Callable[[Any], str]:
        """Params function: the trial's config section (dotted key) at this rung as ``--name value``
        flags (snakedvc.flags), for a script that reads its hyperparameters with argparse.
        With ``fallback``, a job that is not one of this sweep's trials gets ``fallback``."""

        def section_flags(wildcards: Any) -> str:
            if fallback is not None and not self._is_trial(wildcards):
                return fallback
            return flag_words(get_dotted(self._config_of(wildcards), key))

        return section_flags

    def _is_trial(self, wildcards: Any) -> bool:
        """Whether a job's wildcards name one of this sweep's trials at one of its rungs."""
        trial, rung = getattr(wildcards, "trial", None), getattr(wildcards, "rung", None)
        if not self.enabled or trial is None or rung is None:
            return False
        return any(t.id == trial for t in self._trials) and str(rung).isdigit() and int(rung) < len(self._rungs)

    def previous_state(self, wildcards: Any) -> list[str]:
        """Input function: the state this trial's previous rung ended in (none in rung 0)."""
        if not self._is_trial(wildcards) or int(wildcards.rung) == 0:
            return []
        rung = int(wildcards.rung)
        return [self._path(wildcards.trial, rung - 1, self._settings.state_file)]

    def trial_args(
        self, continue_flag: str = "--continue-from", final_flag: str = "--final-state", metrics_flag: str = ""
    ) -> Callable[[Any], str]:
        """Params function: the trial's contract as arguments, quoted; nothing in a job that is no trial.

        ``FINAL_FLAG <state>`` (where to write the state a later rung continues from),
        ``CONTINUE_FLAG <previous rung's state>`` after rung 0, and ``METRICS_FLAG <metrics>``
        where the script does not already get its metrics file from the rule's shell. The
        defaults are ``snakedvc launch``'s options, which hand the states to Resumable (put them
        before launch's ``--``); a script's own flags of that meaning may be named instead.
        """

        def args(wildcards: Any) -> str:
            if not self._is_trial(wildcards):
                return ""
            trial, rung = wildcards.trial, int(wildcards.rung)
            words = [final_flag, self._path(trial, rung, self._settings.state_file)]
            for previous in self.previous_state(wildcards):
                words += [continue_flag, previous]
            if metrics_flag:
                words += [metrics_flag, self._path(trial, rung, self._settings.metrics_file)]
            return shlex.join(words)

        return args

    def section_variant(self, trial_id: str, key: str) -> str | None:
        """A short hash of the trial's section ``key`` where it differs from the workflow's, else None.

        For trials that change an upstream step (e.g. features): the workflow builds each variant once.
        """
        config = self._trial(trial_id).config
        assert config is not None
        section = get_dotted(config, key)
        return None if section == get_dotted(self._base, key) else section_key(section)

    def variants(self, key: str) -> dict[str, Any]:
        """Every variant of section ``key`` among the valid trials, by its hash."""
        found = {}
        for trial in self._valid_trials:
            variant = self.section_variant(trial.id, key)
            if variant is not None and trial.config is not None:
                found[variant] = get_dotted(trial.config, key)
        return found

    # -- run-time decisions, through the module's checkpoint

    def _bind(self, checkpoint: Any, asha_step: Any = None, asha_end: Any = None) -> None:
        self._checkpoint = checkpoint
        self._asha_checkpoints = (asha_step, asha_end)

    def _bound(self) -> None:
        if self._checkpoint is None:
            raise RuntimeError(
                "the sweep module is not loaded: add `module sweep: snakefile: snakedvc.module_path('sweep')`"
            )

    def _decision(self, rung: int) -> dict[str, Any]:
        self._bound()
        path = self._checkpoint.get(rung=str(rung)).output.decision
        with open(path) as handle:
            decision: dict[str, Any] = json.load(handle)
        return decision

    def _rung_trials(self, rung: int) -> list[str]:
        """The trials trained in a rung: every valid one first, then the previous rung's survivors."""
        if rung == 0:
            return [trial.id for trial in self._valid_trials]
        return list(self._decision(rung - 1)["survivors"])

    def _winner(self) -> tuple[str, int]:
        """The best trial and the rung it reached (known once the sweep's last decision is made)."""
        if self._asha:
            self._bound()
            summary = _read_json(self._asha_checkpoints[1].get().output.summary)
            if summary["winner"] is None:
                raise ConfigError(f"sweep {self.name}: every trial failed; see {self._asha_log}")
            return str(summary["winner"]), int(summary["winner_rung"])
        ranking = self._decision(len(self._rungs) - 1)["ranking"]
        if not ranking:
            raise ConfigError(f"sweep {self.name}: every trial failed; see {self.root}/rungs/")
        return str(ranking[0]), len(self._rungs) - 1

    def best_trial(self) -> str:
        return self._winner()[0]

    def best(self, name: str) -> Callable[[Any], str]:
        """Input function: file ``name`` of the winner's last trial folder (known after the last rung)."""

        def best_file(wildcards: Any) -> str:
            return self._path(*self._winner(), name)

        return best_file

    # -- asha: every slot a chain of steps, each step a decision (the module's `asha_step`
    # checkpoint) taken when the trial-rung of the step before has its result

    @property
    def _asha(self) -> bool:
        return self.enabled and self._settings.strategy == "asha"

    @property
    def _slots(self) -> int:
        wanted = self._settings.max_concurrent_trials
        default = self._settings.reduction_factor ** (len(self._rungs) - 1)
        return min(wanted or default, len(self._valid_trials))

    @property
    def _asha_log(self) -> str:
        return f"{self.root}/asha/decisions.jsonl"

    def _asha_step_file(self, slot: int | str, step: int | str) -> str:
        return f"{self.root}/asha/slot{slot}/step{step}.json"

    def _asha_header(self) -> Any:
        from snakedvc.engine.sweep.decisions import Header

        # The trials start in a seeded random order: ASHA's rule assumes results come in no
        # particular order, and a grid's own (its first key varying slowest) feeds it runs of
        # improving results, each promoted at once (measured: 34 promotions of 27 trials, not ~13).
        trials = [t.id for t in self._valid_trials]
        random.Random(self._settings.seed).shuffle(trials)
        epochs = tuple(r.epochs for r in self._rungs)
        return Header(tuple(trials), epochs, self._settings.reduction_factor, self._slots, self._settings.metric,
                      self._settings.direction)  # fmt: skip

    def _asha_step(self, slot: int, step: int) -> dict[str, Any]:
        """A step's decision (IncompleteCheckpointException until it is taken)."""
        self._bound()
        return _read_json(self._asha_checkpoints[0].get(slot=str(slot), step=str(step)).output.decision)

    def _asha_trained(self, wildcards: Any) -> list[str]:
        """Input function of a step k > 0: the metrics and state of the trial-rung step k-1 trained."""
        step = int(wildcards.step)
        if step == 0:
            return []
        before = self._asha_step(int(wildcards.slot), step - 1)
        if before["action"] != "train":
            raise ValueError(f"sweep {self.name}: slot {wildcards.slot} stopped at step {step - 1}")
        trial, rung = before["trial"], int(before["rung"])
        return [
            self._path(trial, rung, self._settings.metrics_file),
            self._path(trial, rung, self._settings.state_file),
        ]

    def _asha_frontier(self, wildcards: Any = None) -> list[str]:
        """Input function of `asha_end`: every slot's steps as far as they are decided, and the next
        one of each slot still going. Asking for all slots' next steps at once is what runs the
        slots side by side; each decision taken brings `asha_end` back here for the next."""
        from snakemake.exceptions import IncompleteCheckpointException

        files = []
        for slot in range(self._slots):
            step = 0
            while True:
                try:
                    decision = self._asha_step(slot, step)
                except IncompleteCheckpointException as undecided:
                    # Flagged as Snakemake flags a checkpoint's target: when a resumed run finds it
                    # decided already, Snakemake comes back here at once for the step after.
                    files.append(undecided.targetfile)
                    break
                files.append(self._asha_step_file(slot, step))
                if decision["action"] != "train":
                    break
                step += 1
        return files

    def _describe(self) -> dict[str, Any]:
        """JSON-ready plan for the report."""
        return {
            "name": self.name,
            "strategy": self._settings.strategy,
            "reduction_factor": self._settings.reduction_factor,
            "slots": self._slots if self._asha else None,
            "metric": self._settings.metric,
            "direction": self._settings.direction,
            "budget": self._settings.budget,
            "rungs": [{"rung": r.index, "epochs": r.epochs, "size": r.size} for r in self._rungs],
            "total_epochs": total_epochs(self._rungs),
            "trials": [{"trial": t.id, "overrides": t.overrides, "error": t.error} for t in self._trials],
        }


def _check_asha_keys(settings: Sweep) -> None:
    """asha's own keys: refused with another strategy (they would do nothing), and a replay's log must exist."""
    if settings.strategy != "asha":
        for key in ("max_concurrent_trials", "replay"):
            if getattr(settings, key):
                raise ConfigError(
                    f"config key '{SETTINGS}.{key}': only strategy asha uses it (this sweep's is {settings.strategy}); "
                    "remove it, or set strategy: asha"
                )
    elif settings.replay and not Path(settings.replay).is_file():
        raise ConfigError(
            f"config key '{SETTINGS}.replay': no file {settings.replay} (an asha sweep's decision log: "
            "<dir>/<name>/asha/decisions.jsonl, or decisions.jsonl in its report)"
        )


def _read_json(path: str) -> dict[str, Any]:
    with open(path) as handle:
        values: dict[str, Any] = json.load(handle)
    return values


PUBLIC = (
    "enabled", "name", "root", "report", "targets", "outputs", "trial_file", "log", "benchmark",
    "previous_state", "section", "flags", "trial_args", "best", "best_trial", "variants", "section_variant",
)  # fmt: skip

# One plan per config: the workflow's SWEEP and the kit's module share it (the module binds its
# checkpoint to it, which the workflow's best() needs).
_PLANS: dict[str, SweepPlan] = {}


def plan(config: Mapping[str, Any]) -> SweepPlan:
    """The sweep of this config; the same object for the workflow and the kit's module."""
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _PLANS:
        _PLANS[key] = SweepPlan._from_config(config)
    return _PLANS[key]


def _flagged_as(given: Any, path: str) -> Any:
    """``path`` with the Snakemake flags ``given`` carries (directory(), temp(), ...): a trial's folder
    output stays a folder. Snakemake is imported only where a flag came from it."""
    flags = getattr(given, "flags", None)
    if not flags:
        return path
    from snakemake.io import flag

    for name, value in flags.items():
        path = flag(path, name, value)
    return path
