"""The pipeline as DVC reads it, and a run's plan: which stages run, in DVC's order, with their resources."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from snakedvc.engine.stage_resources import DEFAULT_FILE, StageResources, read_stages_file, resources_of

log = logging.getLogger(__name__)


# What a stage may use that this runner does not reproduce as DVC would: refused before any job.
UNSUPPORTED_OUT_FLAGS = {
    "persist": "Snakemake's jobs start from a clean slate; a persistent output is not supported",
    "checkpoint": "a circular (checkpoint) output is not supported",
}


# A run's plan, markers and logs: .snakedvc/pipeline/<run id>/.
PIPELINE_FOLDER = ".snakedvc/pipeline"


class PipelineError(ValueError):
    """A dvc.yaml this runner cannot run; the message names the stage and the field."""


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline (one item of a foreach/matrix stage), paths relative to the root."""

    name: str  # DVC's address: "train", "featurize@a"
    rule: str  # the Snakemake rule that runs it
    commands: tuple[str, ...]  # run one after another, each by the shell, as DVC does
    wdir: str
    outs: tuple[str, ...]  # removed before the commands run, as DVC removes them
    uncached: tuple[str, ...]  # outputs git keeps (cache: false), which the experiment commits
    upstream: tuple[str, ...]  # the stages whose outputs it reads
    job: StageResources = StageResources()  # from snakedvc.yaml


@dataclass(frozen=True)
class Plan:
    """The stages of a pipeline, the ones to run (in DVC's order) and where the run keeps its markers."""

    stages: tuple[Stage, ...]
    run: tuple[str, ...]
    folder: str  # .snakedvc/pipeline/<run id>: markers, logs of the commits
    refresh: tuple[str, ...] = ()  # frozen stages that changed: recorded anew, never run
    wanted: tuple[str, ...] = ()  # every stage the run involves (the targets and what they need)
    # `dvc add`ed data the run's stages read whose files changed: committed anew first, as
    # `dvc repro` commits them (their .dvc files), never run
    data: tuple[str, ...] = ()
    # The stages of ``run`` DVC found changed at the start (or forced): they run whatever their
    # upstream stages produce. The others run only if their dependencies come out changed.
    changed: tuple[str, ...] = ()
    # --pull: stages (and `dvc add`ed data) whose only change is missing data, pulled from the DVC
    # remote instead of run; and the missing dependencies of the stages that run
    pulled: tuple[str, ...] = ()
    pull_paths: tuple[str, ...] = ()
    pull: bool = False  # dvc exp run --pull, for the decisions at run time too
    allow_missing: bool = False  # dvc exp run --allow-missing: missing data alone is no change
    # `dvc add`ed data the run involves (changed or not): what the experiment records where no
    # stage of dvc.yaml is involved (a .dvc file as the target)
    sources: tuple[str, ...] = ()
    # snakedvc.yaml's one_at_a_time (--one-at-a-time): each stage's job waits for the one before
    # it in DVC's order, as `dvc repro` runs them
    one_at_a_time: bool = False
    # DVC's run cache: a changed stage whose inputs it has seen gets those outputs back instead
    # of running, as `dvc repro` restores them (not with -f)
    run_cache: bool = True

    @functools.cached_property
    def _by_name(self) -> dict[str, Stage]:
        return {stage.name: stage for stage in self.stages}

    @functools.cached_property
    def _running(self) -> frozenset[str]:
        return frozenset(self.run)

    def stage(self, name: str) -> Stage:
        return self._by_name[name]

    def ran(self, name: str) -> str:
        return f"{self.folder}/ran/{self.stage(name).rule}"

    def decision(self, name: str) -> str:
        """Where a waiting stage's job reads whether to run (engine/dvcpipeline/commit.py writes it)."""
        return f"{self.folder}/decided/{self.stage(name).rule}"

    def waits(self, name: str) -> bool:
        """A stage whose upstream stages run in this run (one at a time: any but the first): it
        waits for them to be recorded, and for the word whether to run."""
        return bool(self.settles_after(name))

    def settles_after(self, name: str) -> list[str]:
        """The stages of this run that must be recorded before this one may start: its upstream
        ones, and one at a time the one before it in DVC's order (recorded, as dvc repro has it,
        before the next stage removes its outputs)."""
        before = [up for up in self.stage(name).upstream if up in self._running]
        index = self.run.index(name) if self.one_at_a_time and name in self._running else 0
        if index > 0 and self.run[index - 1] not in before:
            before.append(self.run[index - 1])
        return before

    def log(self, name: str) -> str:
        return f"{self.folder}/logs/{self.stage(name).rule}.log"

    def snakemake_log(self) -> str:
        """Where Snakemake's own lines go unless exp run is verbose (-v)."""
        return f"{self.folder}/snakemake.log"

    def waits_for(self, name: str) -> list[str]:
        """The markers a stage's job waits for: its upstream stages of this run, finished (and
        one at a time, the stage before it in DVC's order)."""
        markers = [self.ran(up) for up in self.stage(name).upstream if up in self._running]
        index = self.run.index(name) if self.one_at_a_time and name in self._running else 0
        if index > 0 and self.ran(self.run[index - 1]) not in markers:
            markers.append(self.ran(self.run[index - 1]))
        return markers

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        data = json.loads(Path(path).read_text())
        stages = tuple(_stage_from_json(s) for s in data["stages"])
        return cls(
            stages, tuple(data["run"]), data["folder"], tuple(data["refresh"]), tuple(data.get("wanted", ())),
            tuple(data.get("data", ())), tuple(data.get("changed", ())), tuple(data.get("pulled", ())),
            tuple(data.get("pull_paths", ())), bool(data.get("pull")), bool(data.get("allow_missing")),
            tuple(data.get("sources", ())), bool(data.get("one_at_a_time")), bool(data.get("run_cache", True)),
        )  # fmt: skip


def _stage_from_json(data: dict[str, Any]) -> Stage:
    return Stage(
        name=data["name"], rule=data["rule"], commands=tuple(data["commands"]), wdir=data["wdir"],
        outs=tuple(data["outs"]), uncached=tuple(data["uncached"]), upstream=tuple(data["upstream"]),
        job=StageResources(**data["job"]),
    )  # fmt: skip


@dataclass(frozen=True)
class Missing:
    """What a run does about data missing here (in the cache and the workspace), as `dvc exp run`
    does: ``pull`` (--pull) fetches, from the DVC remote, the data of a stage whose only change is
    missing data instead of running it, and a running stage's missing dependencies; ``allow``
    (--allow-missing) counts missing data as no change. ``rerun``: stages whose pull failed, run."""

    pull: bool = False
    allow: bool = False
    rerun: tuple[str, ...] = ()


# The default: as `dvc exp run` without --pull or --allow-missing.
NO_MISSING = Missing()


@dataclass(frozen=True)
class Selection:
    """Which stages a run involves, as `dvc exp run` (`dvc repro`) picks them: ``targets`` are
    stage names, ``file:stage``, paths to dvc.yaml or .dvc files (or folders with ``recursive``;
    globs with ``glob``), default the dvc.yaml here; ``single_item`` (-s) the targets alone;
    ``pipeline`` (-p) the whole pipelines they belong to; ``all_pipelines`` (-P) every stage;
    ``downstream`` the targets and the stages that depend on them."""

    targets: tuple[str, ...] = ()
    recursive: bool = False
    single_item: bool = False
    pipeline: bool = False
    all_pipelines: bool = False
    downstream: bool = False
    glob: bool = False


def selection(targets: Sequence[str] | Selection) -> Selection:
    return targets if isinstance(targets, Selection) else Selection(tuple(targets))


def targets_from_subfolder(targets: Sequence[str], cwd: Path, root: Path, recursive: bool = False) -> tuple[str, ...]:
    """Targets given in a subfolder of the repository (``cwd``), as DVC reads them there (a stage
    name is one of the subfolder's dvc.yaml, a path is relative to it), made relative to ``root``:
    the kit runs from the repository's root, as DVC does from anywhere in it."""
    from dvc.utils import parse_target

    if not _below(cwd, root):
        return tuple(targets)
    here = os.path.relpath(cwd.resolve(), root.resolve())
    moved = []
    for target in targets or ["dvc.yaml"]:  # none: the subfolder's dvc.yaml, as DVC reads it
        path, name = parse_target(target)
        if path is None and recursive and (cwd / name).is_dir():  # -R: a folder
            path, name = name, None
        at_root = os.path.normpath(os.path.join(here, path or "dvc.yaml"))
        moved.append(f"{at_root}:{name}" if name else at_root)
    return tuple(moved)


def _below(cwd: Path, root: Path) -> bool:
    """``cwd`` is a subfolder of the repository at ``root`` (not the root, not outside it)."""
    return cwd.resolve() != root.resolve() and cwd.resolve().is_relative_to(root.resolve())


def overrides_from_subfolder(overrides: Sequence[str], cwd: Path, root: Path) -> tuple[str, ...]:
    """-S values given in a subfolder (``cwd``): their params files are the subfolder's, as DVC
    reads them there (``foo=2`` sets ./params.yaml's foo), named from ``root``."""
    from dvc.utils.cli_parse import to_path_overrides

    if not _below(cwd, root):
        return tuple(overrides)
    here = os.path.relpath(cwd.resolve(), root.resolve())
    by_file = to_path_overrides(list(overrides))
    return tuple(
        f"{os.path.normpath(os.path.join(here, path))}:{o}" for path, changes in by_file.items() for o in changes
    )


def read_plan(
    root: str | Path,
    folder: str,
    resources_file: str | Path | None = None,
    targets: Sequence[str] | Selection = (),
    force: bool = False,
    missing: Missing = NO_MISSING,
) -> Plan:
    """The pipeline of the DVC repository at ``root`` as DVC sees it now, and the stages to run:
    of the ``targets`` (a Selection, or stage names, paths and ``file:stage`` as `dvc exp run`
    takes them; default the dvc.yaml here) and the stages they need, those DVC finds changed and
    those downstream of them, as `dvc repro` runs them. ``resources_file``: the stages' resources
    (default: snakedvc.yaml at ``root``). ``force``: every stage involved runs, changed or not
    (`dvc exp run -f`), frozen ones aside."""
    from dvc.exceptions import DvcException, NoOutputOrStageError
    from dvc.stage.exceptions import StageFileDoesNotExistError, StageNotFound

    root = Path(root).resolve()
    table_file = Path(resources_file) if resources_file else root / DEFAULT_FILE
    settings = read_stages_file(table_file)
    try:
        plan = _read_plan(root, folder, settings["resources"], str(table_file), selection(targets), force, missing)
        return replace(plan, one_at_a_time=plan.one_at_a_time or settings["one_at_a_time"])
    except (NoOutputOrStageError, StageFileDoesNotExistError, StageNotFound) as error:  # a target: DVC's words
        raise PipelineError(f"{error} (`dvc stage list` shows the stages)") from None
    except DvcException as error:  # dvc.yaml's YAML, schema, templating: DVC's message names the place
        cause = f" ({error.__cause__})" if error.__cause__ else ""
        raise PipelineError(f"{root / 'dvc.yaml'}: DVC cannot read the pipeline: {error}{cause}") from None


def _read_plan(
    root: Path,
    folder: str,
    table: dict[str, dict[str, Any]],
    table_file: str,
    select: Selection,
    force: bool,
    missing: Missing,
) -> Plan:
    import networkx as nx
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    # DVC names stages relative to the working directory ("sub/dvc.yaml:train" from elsewhere).
    with contextlib.chdir(root), Repo(str(root)) as repo:
        pipeline = [stage for stage in repo.index.stages if isinstance(stage, PipelineStage)]
        graph = repo.index.graph  # an edge goes from a stage to a stage it depends on
        jobs = resources_of([s.addressing for s in pipeline], table, table_file)
        stages = _stages(pipeline, graph, root, jobs)
        steps, involved, collected = _selected(repo, graph, select)
        imports = [s.addressing for s in collected if s.is_import]  # as a target (one upstream: as before)
        if imports:
            raise PipelineError(
                f"{', '.join(imports)}: an import (dvc import, import-url): snakedvc exp run runs dvc.yaml stages; "
                "bring an import up to date with `dvc update`"
            )
        wanted = [s for s in pipeline if s in involved]
        topological = list(reversed(list(nx.topological_sort(graph))))
        sources = [s for s in topological if s.is_data_source and s in involved]
        if not wanted and not sources:
            raise PipelineError(f"{root / 'dvc.yaml'}: no stages to run (dvc stage list shows none)")
        status, data, only_missing = _what_changed(repo, graph, wanted, sources, force, missing)
        frozen = {s.addressing for s in wanted if s.frozen}
        # A frozen callback stage (no dependencies) is not "always changed": dvc repro leaves it.
        status -= {s.addressing for s in wanted if s.frozen and s.is_callback}
        # DVC's own order (dvc repro's plan: a post-order walk from the targets), then what the
        # run involves besides (upstream of a frozen stage), in dependency order.
        order = [s.addressing for s in steps if s in wanted]
        order += [s.addressing for s in topological if s in wanted and s.addressing not in order]
        to_run, refresh = _to_run(graph, wanted, status, frozen, order)
        pull_paths = _missing_dependencies(wanted, to_run, root) if missing.pull and not force else []
        data_order = [source.addressing for source in sources]
    changed = [name for name in to_run if name in status]
    pulled = [name for name in [*data_order, *order] if name in only_missing and name not in to_run]
    single = select.single_item and not (select.pipeline or select.all_pipelines)
    if single:  # -s: the targets alone, one at a time in the order given, as dvc repro -s runs them
        stages = [replace(stage, upstream=()) if stage.name in to_run else stage for stage in stages]
    return Plan(
        tuple(stages), tuple(to_run), folder, tuple(refresh), tuple(order), tuple(data), tuple(changed),
        tuple(pulled), tuple(pull_paths), missing.pull, missing.allow, tuple(data_order), single and len(to_run) > 1,
        not force,
    )  # fmt: skip


def _selected(repo: Any, graph: Any, select: Selection) -> tuple[list[Any], set[Any], list[Any]]:
    """The stages `dvc repro` walks for ``select``, in its order (DVC's own functions: its target
    resolution and its plan), and every stage the run involves: those and, unless only the targets
    or what follows them was asked for, every stage the targets depend on; and the targets' own stages."""
    import networkx as nx
    from dvc.dvcfile import PROJECT_FILE
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    whole = select.pipeline or select.all_pipelines  # as dvc repro: -p and -P override -s and --downstream
    collected: list[Any] = []
    if not select.all_pipelines:
        targets = list(select.targets) or [PROJECT_FILE]
        collected = collect_stages(repo, targets, recursive=select.recursive, glob=select.glob)
    if select.single_item and not whole:
        return collected, set(collected), collected
    downstream = select.downstream and not whole
    steps = plan_repro(get_active_graph(graph), collected, pipeline=select.pipeline, downstream=downstream)
    involved = set(steps)
    if not downstream:
        for stage in collected:
            involved |= {stage, *nx.descendants(graph, stage)}
    return steps, involved, collected


def _to_run(
    graph: Any, wanted: list[Any], status: set[str], frozen: set[str], order: list[str]
) -> tuple[list[str], list[str]]:
    """The stages that run: the changed ones and every one downstream of them, in ``order``; and
    the frozen ones recorded anew. A frozen stage never runs: dvc repro only records it anew (its
    command, params and outputs as they are now) when it changed. Its outputs never change in a
    run, so a change upstream of it stops there."""
    import networkx as nx

    unfrozen = graph.subgraph([s for s in graph if s.addressing not in frozen])
    downstream = status - frozen
    for stage in wanted:
        if stage.addressing in status - frozen:
            downstream |= {s.addressing for s in nx.ancestors(unfrozen, stage) if s in wanted}
    to_run = [name for name in order if name in downstream - frozen]
    refresh = [name for name in order if name in status & frozen]
    return to_run, refresh


def _what_changed(
    repo: Any, graph: Any, wanted: list[Any], sources: list[Any], force: bool, missing: Missing
) -> tuple[set[str], list[str], set[str]]:
    """The stages DVC finds changed; the `dvc add`ed data to commit anew (changed, in dependency
    order); with --pull, the stages and data whose only change is missing data."""
    if missing.pull or missing.allow:
        status, pulled = _changes(repo, graph, wanted, missing)
        changed_data, pulled_data = _changes(repo, graph, sources, missing)
    else:
        status, pulled = set(repo.status(targets=[s.addressing for s in wanted])), []
        changed_data = set(repo.status(targets=[s.addressing for s in sources])) if sources else set()
        pulled_data = []
    if force:
        status |= {s.addressing for s in wanted}
    data = [s.addressing for s in sources if force or s.addressing in changed_data]
    return status, data, {*pulled, *pulled_data}


def _changes(repo: Any, graph: Any, stages: list[Any], missing: Missing) -> tuple[set[str], list[str]]:
    """As `dvc repro --pull/--allow-missing` decides each stage: those that changed (missing data
    aside), and, with --pull alone, those whose only change is missing data (pulled, not run). A
    missing dependency is a change where the stage it comes from recorded other data for it (a
    stage that never ran, downstream of one that did): DVC passes a stage's upstream for that."""
    from dvc.repo import lock_repo

    changed: set[str] = set(missing.rerun)
    only_missing: list[str] = []
    with lock_repo(repo):
        for stage in stages:
            if stage.addressing in changed:
                continue
            upstream = list(graph.successors(stage))
            if stage.changed(allow_missing=True, upstream=upstream):
                changed.add(stage.addressing)
            elif missing.pull and not missing.allow and stage.changed():
                only_missing.append(stage.addressing)
    return changed, only_missing


def _missing_dependencies(wanted: list[Any], to_run: list[str], root: Path) -> list[str]:
    """What the stages that run read and is missing here, no stage of this run making it: --pull
    fetches it first, as DVC pulls a stage's missing dependencies before running it."""
    made = {out.fs_path for stage in wanted if stage.addressing in to_run for out in stage.outs}
    paths = {
        _relative(dep.fs_path, root)
        for stage in wanted if stage.addressing in to_run
        for dep in stage.deps
        if not _is_params(dep) and dep.fs_path not in made and not os.path.exists(dep.fs_path)
    }  # fmt: skip
    return sorted(paths)


def _stages(pipeline: list[Any], graph: Any, root: Path, jobs: dict[str, StageResources]) -> list[Stage]:
    stages: list[Stage] = []
    rules: set[str] = set()
    for stage in pipeline:
        for out in stage.outs:
            for flag, why in UNSUPPORTED_OUT_FLAGS.items():
                if getattr(out, flag, False):
                    raise PipelineError(f"stage {stage.addressing!r}, output {out.def_path!r}: {flag}: {why}")
        for dep in stage.deps:
            if not _is_params(dep) and not getattr(dep, "is_in_repo", True):
                raise PipelineError(
                    f"stage {stage.addressing!r}: dependency {dep.def_path!r} is outside the repository; "
                    "snakedvc exp run reads the repository's own files (run `dvc import` stages with dvc)"
                )
        rule = _rule_name(stage.addressing, rules)
        commands = stage.cmd if isinstance(stage.cmd, list) else str(stage.cmd).splitlines()
        stages.append(
            Stage(
                name=stage.addressing,
                rule=rule,
                commands=tuple(c for c in commands if c.strip()),
                wdir=_relative(stage.wdir, root),
                outs=tuple(_relative(out.fs_path, root) for out in stage.outs),
                uncached=tuple(_relative(out.fs_path, root) for out in stage.outs if not out.use_cache),
                upstream=tuple(sorted({up.addressing for up in graph.successors(stage)})),
                job=jobs[stage.addressing],
            )
        )
    return stages


def stage_run_launch_args(job: StageResources) -> list[str]:
    """The `snakedvc stage-run` options of a stage that runs its commands through `snakedvc launch`."""
    return ["--nodes", str(job.nodes), "--procs-per-node", str(job.procs_per_node)] if job.procs_per_node else []


def stage_run_options(job: StageResources) -> list[str]:
    """Every `snakedvc stage-run` option the stage's resources give: launch's, and the thread limits
    of a stage that asked for cpus."""
    return [*stage_run_launch_args(job), *(["--keep-thread-limits"] if job.cpus_asked else [])]


def _rule_name(address: str, taken: set[str]) -> str:
    base = "stage_" + re.sub(r"\W", "_", address)
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _relative(path: str, root: Path) -> str:
    return os.path.relpath(path, root)


def _is_params(dep: Any) -> bool:
    from dvc.dependency.param import ParamsDependency

    return isinstance(dep, ParamsDependency)


def set_params(overrides: Sequence[str], root: str | Path = ".", hydra_on: bool = True) -> list[str]:
    """Apply ``-S`` overrides to the params files as `dvc exp run -S` does (DVC's own functions:
    ``[file:]key=value``, Hydra's override grammar). With Hydra enabled in DVC's config, params.yaml
    is composed from the Hydra config with the overrides, as DVC composes it, -S or not (not with
    ``hydra_on`` False: `dvc exp run --no-hydra`). A sweep (``key=a,b``) is refused as `dvc exp
    run` refuses it without --queue. The params files written (relative to ``root``): the
    experiment commits them, as DVC's does, new ones too."""
    root = Path(root)
    hydra = dvc_config(root).get("hydra", {})
    composing = hydra_on and hydra.get("enabled", False)
    if not overrides and not composing:
        return []  # Hydra's import alone takes half a second
    from dvc.exceptions import DvcException
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides, compose_and_dump, to_hydra_overrides
    from hydra.errors import OverrideParseException

    path_overrides = to_path_overrides(list(overrides))
    if composing:
        path_overrides.setdefault(HYDRA_OUTPUT, [])
    if not path_overrides:
        return []
    try:
        sweep = any(o.is_sweep_override() for changes in path_overrides.values() for o in to_hydra_overrides(changes))
        if sweep:
            raise PipelineError(
                f"-S {' '.join(overrides)}: Sweep overrides can't be used without `--queue` (dvc exp run's words): "
                "run one value at a time, or a sweep of the kit's (snakedvc.sweep in a Snakefile's config)"
            )
        for path, changes in path_overrides.items():
            if composing and path == HYDRA_OUTPUT:
                module = hydra.get("config_module")
                config_dir = None if module else str(root / hydra.get("config_dir", "conf"))
                compose_and_dump(
                    str(root / path), config_dir, module, hydra.get("config_name", "config"),
                    str(root / hydra.get("plugins_path", "")), changes,
                )  # fmt: skip
            else:
                apply_overrides(root / path, changes)
    except DvcException as error:  # DVC's own words follow, as `dvc exp run -S` prints them ("use +key=…")
        cause = f": {error.__cause__}" if error.__cause__ else ""
        raise PipelineError(f"-S {' '.join(overrides)}: {error}{cause}") from None
    except OverrideParseException as error:  # Hydra's grammar: its one line, as DVC prints it
        raise PipelineError(f"-S {' '.join(overrides)}: {str(error).splitlines()[0]}") from None
    return [path for path in path_overrides if (root / path).is_file()]


def dvc_config(root: Path) -> Any:
    """The DVC repository's config, as its Repo reads it (the repository's and the user's files),
    without opening the repository: a fraction of a second a run with nothing to do."""
    from dvc.config import Config

    return Config(dvc_dir=str(root / ".dvc"))


# The params file Hydra composes (DVC's default params file).
HYDRA_OUTPUT = "params.yaml"


def dry_run(
    overrides: Sequence[str] = (),
    root: str | Path = ".",
    resources_file: str | Path | None = None,
    targets: Sequence[str] | Selection = (),
    force: bool = False,
    missing: Missing = NO_MISSING,
) -> Plan:
    """What `exp_run` would run, with these ``-S`` values, changing no file (`dvc exp run --dry`)."""
    from dvc.utils.cli_parse import to_path_overrides

    root = Path(root).resolve()
    plan = read_plan(root, "", resources_file, targets, force, missing)
    if not overrides:
        return plan
    saved = {
        path: (root / path).read_bytes() if (root / path).exists() else None
        for path in {*to_path_overrides(list(overrides)), HYDRA_OUTPUT}
    }
    try:
        set_params(overrides, root)
        return read_plan(root, "", resources_file, targets, force, missing)
    finally:
        for path, text in saved.items():
            if text is None:
                (root / path).unlink(missing_ok=True)
            else:
                (root / path).write_bytes(text)
