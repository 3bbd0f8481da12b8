"""What a user's Snakefile calls: configure the run, name the modules, list tracked targets, finish.

Kept free of Snakemake imports: the workflow object is passed in, and only its public
config settings are read.
"""

from __future__ import annotations

import atexit
import copy
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from snakedvc.engine import settings
from snakedvc.engine.config import (
    KEY,
    ConfigError,
    check_overrides,
    load_schema,
    typed_overrides,
    validate_config,
)
from snakedvc.engine.env import use_this_interpreter
from snakedvc.engine.flagwords import flag_words
from snakedvc.engine.names import (
    EXPERIMENT_NAME_ENV,
    EXPERIMENT_REPLACE_ENV,
    REPLACE_HINT,
    SKIP_SAVE_ENV,
    NameTaken,
    check_name_is_free,
    claim_name,
    experiment_holding_workspace,
    experiment_refs,
    validate_experiment_name,
)
from snakedvc.engine.records import dvc_root, mark_started
from snakedvc.engine.settings import Settings

MODULES = ("kit", "tracking", "sweep")


def module_path(name: str) -> str:
    """The Snakefile of one of the kit's Snakemake modules, for `module x: snakefile: ...`."""
    if name not in MODULES:
        raise ValueError(f"snakedvc has no module {name!r}; modules: {', '.join(MODULES)}")
    return str(resources.files("snakedvc") / "modules" / f"{name}.smk")


def kit_schema() -> dict[str, Any]:
    return settings.schema("snakedvc")


def _merge(target: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def configure(config: dict[str, Any], workflow: Any = None) -> Settings:
    """Validate the config in place, at parse time, before any job runs; return the kit's settings.

    - `--config` values get real types (``workflow`` gives them; Snakemake's own
      ``workflow.config_settings.overwrite_config``);
    - the ``snakedvc`` key is checked against the kit's schema, defaults filled;
    - with ``snakedvc.schema`` set, the rest is checked against the user's schema.
    A bad key or type raises ConfigError naming it. Also puts this interpreter's bin
    folder first on PATH, so rules calling `snakedvc` or `python` use this environment.
    """
    if getattr(workflow, "is_main_process", False):
        mark_started()
    overrides = typed_overrides(workflow)
    if overrides:
        _merge(config, overrides)
    try:
        values = validate_config(config.get(KEY) or {}, kit_schema())
        kit: Settings = settings.build(Settings, values)
        # Names that become git refs: checked now with the rules the end of the run applies.
        if kit.experiment.name:
            validate_experiment_name(kit.experiment.name, "experiment.name")
        if kit.sweep.enabled:
            validate_experiment_name(f"{kit.sweep.name}-t000", "sweep.name (its trials' experiments)")
    except (ConfigError, ValueError) as error:
        raise ConfigError(f"{KEY}: {error}") from None
    if getattr(workflow, "is_main_process", False) and _runs_and_saves(workflow):
        from snakedvc.engine.finish import save_pending

        if kit.tracking:
            _check_a_baseline_commit()

        # An earlier run's save that failed: done first, or this run stops here. Rerunning that run's
        # command is how its save is redone: the name it has just saved is this run's, not a clash.
        _check_names(kit, saved_now=save_pending(experiment=values.get("experiment")))
        atexit.register(_say_if_nothing_was_done, workflow)
    user = {key: value for key, value in config.items() if key != KEY}
    if kit.schema:
        user = validate_config(user, load_schema(kit.schema))
    else:
        _check_without_schema(workflow, {key: value for key, value in overrides.items() if key != KEY})
    config.clear()
    config.update(user)
    config[KEY] = values  # plain data (Snakemake copies the config); read it through settings(config)
    use_this_interpreter()
    return kit


# Snakemake's options that run no job (a dry run, a drawing, a listing, a touch, an unlock): such a
# reading of the Snakefile saves no experiment, so a name in use is no reason to refuse it.
NO_RUN_OPTIONS = frozenset({
    "-n", "--dry-run", "--dryrun", "--dag", "--rulegraph", "--filegraph", "--d3dag", "--summary", "-S",
    "--detailed-summary", "-D", "--list", "-l", "--list-target-rules", "--lt", "--lint", "--unlock", "--touch", "-t",
    "--list-changes", "--lc", "--report", "--cleanup-metadata", "--cm", "--delete-all-output",
    "--delete-temp-output", "--archive", "--containerize", "--export-cwl", "--print-compilation",
})  # fmt: skip


def _runs_and_saves(workflow: Any) -> bool:
    """Whether this invocation runs jobs and may save an experiment (Snakemake says so only once it
    executes, after the Snakefile is read: its command line says so now)."""
    if os.environ.get(SKIP_SAVE_ENV) == "1" or getattr(workflow, "dryrun", False):
        return False
    words = {word.split("=", 1)[0] for word in sys.argv[1:]}
    # Short options run together ("-np") hold -n too.
    together = {word for word in words if re.fullmatch(r"-[A-Za-z]{2,}", word) and "n" in word}
    return not (words & NO_RUN_OPTIONS or together)


# Snakemake's line for a run with nothing to do (snakemake.common.NOTHING_TO_BE_DONE_MSG); it then
# runs no onsuccess, so the kit's end-of-run line would be missing.
NOTHING_TO_BE_DONE = "Nothing to be done (all requested files are present and up to date)."


def _say_if_nothing_was_done(workflow: Any) -> None:
    """At the exit of a run Snakemake found nothing to do (its log says so): the kit's line, which
    experiment already holds these results (the last run's record), as every run ends with one."""
    from snakedvc.engine.finish import say
    from snakedvc.engine.records import read_record

    try:
        logs = [Path(path) for path in workflow.logger_manager.get_logfile()]
        if not any(NOTHING_TO_BE_DONE in path.read_text(errors="replace") for path in logs if path.is_file()):
            return
    except (AttributeError, OSError):  # no log to read: nothing to say
        return
    holding = experiment_holding_workspace(".")
    saved = (read_record(".") or {}).get("experiments") or []
    if holding:
        say(f"nothing to be done: experiment {holding} already holds these results (no new one saved)")
    elif saved:
        say(f"nothing to be done, and no new experiment saved (the last one saved here: {saved[-1]})")
    else:
        say("nothing to be done, and no experiment saved: the outputs were made by no recorded run here; "
            "`snakemake --forceall` (or -R RULE) runs again and records them")  # fmt: skip


def _check_a_baseline_commit(root: str = ".") -> None:
    """Before any job: in a DVC repository, git has a commit (HEAD). An experiment is a commit on top
    of one; without it a stranger's first run failed inside its training job, in dvclive's git calls
    ("SCMError: Empty git repo"), and could save nothing."""
    if dvc_root(root) is None:
        return
    head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0:
        email = subprocess.run(["git", "config", "user.email"], cwd=root, capture_output=True, text=True)
        # A fresh machine's first commit fails for want of an identity: say so, or the fix fails too.
        identity = (
            ""
            if email.stdout.strip()
            else ' (git has no identity here, so a commit fails: git config --global user.name "Your Name" and '
            "git config --global user.email you@example.com first)"
        )
        raise ConfigError(
            "this git repository has no commit yet, and each run is saved as a DVC experiment on top of one: "
            f'commit your code first (git add -A && git commit -m "my project"){identity}, then run again'
        )


def _check_names(kit: Settings, saved_now: Sequence[str] = ()) -> None:
    """Before any job, on the submit host: the run's experiment name (a submitted run's comes from its
    controller) is no existing experiment's, unless replace is asked, nor another live run's; a real run
    claims it. A sweep: no experiment of its trials' names exists."""
    name = os.environ.get(EXPERIMENT_NAME_ENV) or kit.experiment.name
    replace = kit.experiment.replace or os.environ.get(EXPERIMENT_REPLACE_ENV) == "1"
    try:
        if kit.sweep.enabled:
            trials = [name for name in experiment_refs() if name.startswith(f"{kit.sweep.name}-t")]
            if trials and not replace:
                raise NameTaken(
                    f"sweep {kit.sweep.name!r} has saved trial experiments already ({', '.join(trials[:3])}"
                    f"{', ...' if len(trials) > 3 else ''}): choose another sweep.name, or {REPLACE_HINT}"
                )
        elif name and name not in saved_now:
            check_name_is_free(name, ".", replace)
            claim_name(name)
    except NameTaken as error:
        raise ConfigError(f"{KEY}: {error}") from None


def _check_without_schema(workflow: Any, overrides: Mapping[str, Any]) -> None:
    """The `--config` values of a workflow with no schema, against its config files (config.check_overrides)."""
    files = [str(path) for path in getattr(workflow, "configfiles", None) or []]
    if not overrides or not files:
        return
    import yaml

    base: dict[str, Any] = {}
    for path in files:
        with open(path) as handle:
            _merge(base, yaml.safe_load(handle) or {})
    check_overrides(base, overrides, ", ".join(files))


def _paths(outputs: Iterable[Any]) -> list[str]:
    found: list[str] = []
    for item in outputs:
        if isinstance(item, str | os.PathLike):
            found.append(os.fspath(item))
        else:  # a rule's output (a Namedlist) or any list of paths
            found.extend(_paths(item))
    return found


def tracking_enabled(config: Mapping[str, Any], root: str | Path = ".") -> bool:
    return settings.settings(config).tracking and dvc_root(root) is not None


def targets(config: Mapping[str, Any], *outputs: Any, track: Any = ()) -> list[str]:
    """What ``rule all`` asks for: ``outputs``, and the DVC records (`.dvc` files) of ``track``.

    While a sweep runs, its report and the report's record instead: each trial's outputs are
    recorded as its own experiment when the sweep ends.
    ``input: snakedvc.targets(config, rules.fit.output, track=rules.fit.output.model)``.
    """
    from snakedvc.engine.sweep import plan

    sweep = plan(config)
    if sweep.enabled:
        return [sweep.report, *tracked(config, sweep.report)]
    return [*_paths(outputs), *tracked(config, track)]


def tracked(config: Mapping[str, Any], *outputs: Any) -> list[str]:
    """The `.dvc` targets that record these outputs in DVC (none where tracking is off or no DVC repo).

    Pass rules' outputs: ``snakedvc.tracked(config, rules.train.output, rules.prepare.output)``.
    Checked first (preflight): an output DVC would refuse to track stops the run before any job.
    """
    if not tracking_enabled(config):
        return []
    paths = _paths(outputs)
    preflight(paths)
    return [f"{path}.dvc" for path in paths]


def preflight(paths: Sequence[str], root: str | Path = ".") -> None:
    """Raise ConfigError, before any job runs, for an output that `dvc add` would refuse at the end of
    its job: one whose ``.dvc`` file git ignores ("bad DVC file name ... is git-ignored"), or one that
    git already tracks ("already tracked by SCM"). The message names the path, the .gitignore line or
    the git state at fault, and the fix. Outside a git repository there is nothing to check."""
    if not paths or shutil.which("git") is None:
        return  # nothing to check (a compute node without git parses the Snakefile too)
    proc = subprocess.run(
        ["git", "check-ignore", "--stdin", "-z", "-v", "-n"],
        cwd=root,
        input="\0".join(f"{path}.dvc" for path in paths) + "\0",
        capture_output=True,
        text=True,
    )
    if proc.returncode not in (0, 1):
        return  # not a git repository
    problems = []
    fields = proc.stdout.split("\0")
    for source, line, pattern, path in zip(fields[0::4], fields[1::4], fields[2::4], fields[3::4], strict=False):
        if source and not pattern.startswith("!"):
            problems.append(
                f"{path}: git ignores it ({source}:{line}: {pattern!r}) and DVC refuses a .dvc file git ignores. "
                f"Fix: {_ignore_fix(path, pattern, root)}"
            )
    listed = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=root, capture_output=True, text=True)
    for path in sorted(set(listed.stdout.split("\0")) - {""}):
        problems.append(
            f"{path}: git tracks it, and DVC tracks an output only where git does not ('already tracked by SCM'). "
            f"Fix: git rm --cached {shlex.quote(path)} && git commit -m 'track {path} with DVC'"
        )
    if problems:
        raise ConfigError("outputs that DVC cannot track (snakedvc.tracked):\n  " + "\n  ".join(problems))


def _ignore_fix(path: str, pattern: str, root: str | Path) -> str:
    """A fix that works for a .gitignore ``pattern`` that hides ``path`` (a .dvc file). Where the pattern
    ignores a folder above the file, no later '!' line can bring the file back (git does not look
    inside an ignored folder): the folder's files must be ignored instead of the folder."""
    parents = [str(PurePosixPath(path).parents[i]) for i in range(len(PurePosixPath(path).parents) - 1)]
    hidden_folder = subprocess.run(
        ["git", "check-ignore", *(f"{folder}/" for folder in parents)], cwd=root, capture_output=True, text=True
    )
    if not parents or not hidden_folder.stdout.strip():
        return f"add a line '!{path}' after it"
    folder = pattern.strip("/")
    fixes = []
    if not path.startswith(folder + "/"):  # meant for a folder of that name elsewhere, e.g. the top one
        fixes.append(f"make that line match only what it means, e.g. '/{folder}/' for the top folder")
    base = f"/{folder}" if pattern.startswith("/") or "/" in folder else f"**/{folder}"
    fixes.append(
        f"replace that line with the three lines '{base}/**', '!{base}/**/' and '!{base}/**/*.dvc' "
        "(git cannot re-include a file inside an ignored folder: these ignore the folder's files, not its "
        "folders and .dvc files)"
    )
    return "; or ".join(fixes)


def flags(config: Mapping[str, Any], key: str | None = None) -> Any:
    """A config section as command-line flags for an ordinary argparse script, quoted for a shell:
    ``{"lr": 0.01, "hidden_sizes": [64, 32], "weight_decay": 0}`` gives
    ``--hidden-sizes 64 32 --lr 0.01 --weight-decay 0`` (sorted; ``_`` becomes ``-``, as argparse
    spells options; a list gives one word per item, for ``nargs="+"``; booleans are ``true``/``false``;
    a nested mapping is one JSON word). Use it in ``params:``, so that a changed value reruns the rule.

    ``flags(config, "train")`` (a dotted key of the workflow's config) is a params function: the
    section's flags, or in a sweep trial's job the trial's values at its rung, so a trial rule
    made with ``use rule … with:`` restates no params. ``flags(section)`` gives the words now.
    """
    if key is None:
        return flag_words(config)
    from snakedvc.engine.sweep import plan
    from snakedvc.engine.sweep.space import get_dotted

    return plan(config).flags(key, fallback=flag_words(get_dotted(config, key)))


def training_resources(nodes: int = 1, gpus_per_node: int = 0) -> dict[str, Any]:
    """The resources of a training job of ``nodes`` nodes with ``gpus_per_node`` GPUs on each, as
    snakemake-executor-plugin-slurm reads them: ``resources: **snakedvc.training_resources(K, G)``.

    One node: ``gpu`` (``--gpus``, a count per job). Several: ``gres: gpu:G`` (``--gres`` is per
    node; ``--gpus`` would let SLURM put a job's GPUs on any of its nodes). A CPU job gets one task
    per node: the plugin asks for ``--ntasks=tasks``, and SLURM shrinks ``--nodes=2 --ntasks=1`` to
    one node. A GPU job gets no ``tasks``: the plugin would turn it into ``--ntasks-per-gpu``; SLURM
    then gives it one task per node. ``snakedvc launch`` starts one torchrun agent a node either way.
    """
    if nodes < 1 or gpus_per_node < 0:
        raise ConfigError(f"training needs nodes >= 1 and gpus_per_node >= 0, got {nodes} and {gpus_per_node}")
    if gpus_per_node == 0:
        return {"nodes": nodes, "tasks": nodes, "gpu": 0}
    if nodes == 1:
        return {"nodes": 1, "gpu": gpus_per_node}
    return {"nodes": nodes, "gres": f"gpu:{gpus_per_node}"}
