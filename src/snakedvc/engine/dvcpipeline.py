"""An existing DVC pipeline (dvc.yaml) run by Snakemake: one job per stage, recorded as `dvc exp run` records it.

DVC reads the pipeline (its templating, ``vars``, ``foreach``/``matrix``, params, ``wdir``): the kit
never parses DVC's format. DVC decides which stages run (those ``dvc status`` calls changed, and
every stage downstream of one). Snakemake only schedules: each stage is a job of its own (a SLURM
job under a SLURM profile) that runs the stage's commands as DVC would, and on the submit host a
local job then runs ``dvc commit`` of that stage, serialised by the kit's lock, so dvc.lock and the
cache hold what ``dvc repro`` would have written. The jobs are linked by marker files, not by the
stages' outputs: DVC, not Snakemake, decides what is up to date, and Snakemake never deletes or
checks a stage's outputs. At the end one ``dvc exp save`` makes the experiment, committing what
``dvc exp run`` commits: dvc.lock, the params files and the outputs DVC does not cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from snakedvc.engine.env import python_module
from snakedvc.engine.records import ignore_kit_folder
from snakedvc.engine.stage_resources import DEFAULT_FILE, StageResources, read_table, resources_of
from snakedvc.engine.stamps import new_run_id

log = logging.getLogger(__name__)

# What a stage may use that this runner does not reproduce as DVC would: refused before any job.
UNSUPPORTED_OUT_FLAGS = {
    "persist": "Snakemake's jobs start from a clean slate; a persistent output is not supported",
    "checkpoint": "a circular (checkpoint) output is not supported",
}


# Snakemake's options that run no job: the run would then record stages that did not run.
DRY_RUN_OPTIONS = {"-n", "--dry-run", "--dryrun"}


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

    def stage(self, name: str) -> Stage:
        return next(stage for stage in self.stages if stage.name == name)

    def ran(self, name: str) -> str:
        return f"{self.folder}/ran/{self.stage(name).rule}"

    def committed(self, name: str) -> str:
        return f"{self.folder}/committed/{self.stage(name).rule}"

    def log(self, name: str) -> str:
        return f"{self.folder}/logs/{self.stage(name).rule}.log"

    def waits_for(self, name: str) -> list[str]:
        """The markers a stage's job waits for: its upstream stages of this run, committed."""
        return [self.committed(up) for up in self.stage(name).upstream if up in self.run]

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        data = json.loads(Path(path).read_text())
        stages = tuple(_stage_from_json(s) for s in data["stages"])
        return cls(
            stages, tuple(data["run"]), data["folder"], tuple(data["refresh"]), tuple(data.get("wanted", ())),
            tuple(data.get("data", ())),
        )  # fmt: skip


def _stage_from_json(data: dict[str, Any]) -> Stage:
    return Stage(
        name=data["name"], rule=data["rule"], commands=tuple(data["commands"]), wdir=data["wdir"],
        outs=tuple(data["outs"]), uncached=tuple(data["uncached"]), upstream=tuple(data["upstream"]),
        job=StageResources(**data["job"]),
    )  # fmt: skip


def read_plan(
    root: str | Path,
    folder: str,
    resources_file: str | Path | None = None,
    targets: Sequence[str] = (),
    force: bool = False,
) -> Plan:
    """The pipeline of the DVC repository at ``root`` as DVC sees it now, and the stages to run:
    of ``targets`` (stage names, a foreach/matrix stage's name for all its items; default all) and
    the stages they need, those DVC finds changed and those downstream of them, as `dvc repro`
    runs them. ``resources_file``: the stages' resources (default: snakedvc.yaml at ``root``).
    ``force``: every stage involved runs, changed or not (`dvc exp run -f`), frozen ones aside."""
    from dvc.exceptions import DvcException

    root = Path(root).resolve()
    table_file = Path(resources_file) if resources_file else root / DEFAULT_FILE
    table = read_table(table_file)
    try:
        return _read_plan(root, folder, table, str(table_file), targets, force)
    except DvcException as error:  # dvc.yaml's YAML, schema, templating: DVC's message names the place
        cause = f" ({error.__cause__})" if error.__cause__ else ""
        raise PipelineError(f"{root / 'dvc.yaml'}: DVC cannot read the pipeline: {error}{cause}") from None


def _read_plan(
    root: Path, folder: str, table: dict[str, dict[str, Any]], table_file: str, targets: Sequence[str], force: bool
) -> Plan:
    import networkx as nx
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    # DVC names stages relative to the working directory ("sub/dvc.yaml:train" from elsewhere).
    with contextlib.chdir(root), Repo(str(root)) as repo:
        pipeline = [stage for stage in repo.index.stages if isinstance(stage, PipelineStage)]
        if not pipeline:
            raise PipelineError(f"{root}: no dvc.yaml stages to run (dvc stage list shows none)")
        graph = repo.index.graph  # an edge goes from a stage to a stage it depends on
        jobs = resources_of([s.addressing for s in pipeline], table, table_file)
        stages = _stages(pipeline, graph, root, jobs)
        # As `dvc repro`: without targets the stages of this folder's dvc.yaml (and those they need),
        # not every pipeline of the repository: another one, in a subfolder, may never have run.
        own = [s for s in pipeline if Path(s.dvcfile.path).resolve() == root / "dvc.yaml"]
        if not targets and not own:
            raise PipelineError(f"{root / 'dvc.yaml'}: no stages to run (dvc stage list shows none)")
        wanted = _wanted(pipeline, graph, targets) if targets else _wanted(pipeline, graph, [s.addressing for s in own])
        status = set(repo.status(targets=[s.addressing for s in wanted]))
        if force:
            status |= {s.addressing for s in wanted}
        frozen = {s.addressing for s in wanted if s.frozen}
        # A frozen callback stage (no dependencies) is not "always changed": dvc repro leaves it.
        status -= {s.addressing for s in wanted if s.frozen and s.is_callback}
        order = [s.addressing for s in reversed(list(nx.topological_sort(graph))) if s in wanted]
        sources = [s for s in reversed(list(nx.topological_sort(graph))) if s.is_data_source]
        sources = [s for s in sources if any(nx.has_path(graph, w, s) for w in wanted)]
        changed_data = set(repo.status(targets=[s.addressing for s in sources])) if sources else set()
        data = [s.addressing for s in sources if force or s.addressing in changed_data]
        # A frozen stage never runs: dvc repro only records it anew (its command, params and
        # outputs as they are now) when it changed. Its outputs never change in a run, so a change
        # upstream of it stops there.
        unfrozen = graph.subgraph([s for s in graph if s.addressing not in frozen])
        downstream = status - frozen
        for stage in wanted:
            if stage.addressing in status - frozen:
                downstream |= {s.addressing for s in nx.ancestors(unfrozen, stage) if s in wanted}
        to_run = [name for name in order if name in downstream - frozen]
        refresh = [name for name in order if name in status & frozen]
    return Plan(tuple(stages), tuple(to_run), folder, tuple(refresh), tuple(order), tuple(data))


def _wanted(pipeline: list[Any], graph: Any, targets: Sequence[str]) -> list[Any]:
    """The stages a run of ``targets`` involves: the targets and every stage they depend on."""
    import networkx as nx

    if not targets:
        return pipeline
    wanted = set()
    for target in targets:
        named = [s for s in pipeline if target in (s.addressing, s.addressing.split("@")[0])]
        if not named:
            raise PipelineError(
                f"target {target!r} is no stage of dvc.yaml (its stages: {', '.join(s.addressing for s in pipeline)})"
            )
        for stage in named:
            wanted |= {stage, *nx.descendants(graph, stage)}
    return [s for s in pipeline if s in wanted]


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


def set_params(overrides: Sequence[str], root: str | Path = ".") -> None:
    """Apply ``-S`` overrides to the params files as `dvc exp run -S` does (DVC's own functions:
    ``[file:]key=value``, Hydra's override grammar)."""
    if not overrides:
        return
    from dvc.exceptions import DvcException
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides

    try:
        for path, changes in to_path_overrides(list(overrides)).items():
            apply_overrides(Path(root) / path, changes)
    except DvcException as error:  # DVC's own words follow, as `dvc exp run -S` prints them ("use +key=…")
        cause = f": {error.__cause__}" if error.__cause__ else ""
        raise PipelineError(f"-S {' '.join(overrides)}: {error}{cause}") from None


def commit_stage(name: str, root: str | Path = ".") -> None:
    """`dvc commit` of one stage that has just run: its dvc.lock entry and its outputs in the cache."""
    from snakedvc.engine.tracking import repo_lock, run_dvc

    with repo_lock(root):
        run_dvc(["commit", "--force", "--quiet", name], root)


def exp_run(
    profile: str | None,
    overrides: Sequence[str] = (),
    name: str = "",
    snakemake_args: Sequence[str] = (),
    root: str | Path = ".",
    resources_file: str | Path | None = None,
    targets: Sequence[str] = (),
    force: bool = False,
) -> str:
    """`dvc exp run`, each stage a Snakemake job: the experiment's name. Where DVC finds nothing to
    run, no job runs and the experiment is saved all the same, as `dvc exp run` saves one. A
    failed stage stops the run before any experiment is saved; the stages that finished before it
    are committed (dvc.lock), the failed one not. A pipeline, name or resources file that cannot
    run is refused before the params files change."""
    root = Path(root).resolve()
    if DRY_RUN_OPTIONS & set(snakemake_args):
        raise PipelineError("a dry run is `snakedvc exp run --dry` (Snakemake's --dry-run would record nothing)")
    profile = str(pipeline_profile(profile, root))  # a wrong one fails now, not once a job is due
    ignore_kit_folder(root)  # the plans, markers and logs; and Snakemake's records of the jobs:
    ignore_kit_folder(root, ".snakemake", "Snakemake's records of snakedvc exp run's jobs")
    with workspace_lock(root):
        if name:
            check_name_is_free(name, root)
        return _exp_run(profile, overrides, name, snakemake_args, root, resources_file, targets, force)


@contextlib.contextmanager
def workspace_lock(root: Path) -> Iterator[None]:
    """One exp run at a time in a workspace (its params files and outputs are the run's own), as
    DVC allows one `dvc exp run` there; released when the process ends, however it ends."""
    path = root / ".snakedvc" / "exp-run.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PipelineError(
                f"another snakedvc exp run is running in {root} ({path}); wait for it, or run several "
                "at once with `snakedvc submit`, each in a workspace of its own"
            ) from None
        yield


def _exp_run(
    profile: str | None,
    overrides: Sequence[str],
    name: str,
    snakemake_args: Sequence[str],
    root: Path,
    resources_file: str | Path | None,
    targets: Sequence[str],
    force: bool = False,
) -> str:
    folder = f"{PIPELINE_FOLDER}/{new_run_id()}"
    plan = read_plan(root, folder, resources_file, targets, force)
    if overrides:
        set_params(overrides, root)
        plan = read_plan(root, folder, resources_file, targets, force)  # what runs depends on the new values
    if not plan.run and not plan.refresh and not plan.data:
        log.info(
            "nothing to run: DVC reports every stage up to date (dvc status); saving the experiment as dvc exp run does"
        )
    # As `dvc exp run`: the experiment's name is chosen before any stage runs (DVC's own random
    # name where none is given), and every stage sees it and the baseline in its environment.
    name = name or random_experiment_name(root)
    commit_unrun(plan, root)
    if plan.run:
        run_jobs(plan, profile, snakemake_args, root, experiment_env(name, root))
    return save(plan, name, root)


def commit_unrun(plan: Plan, root: Path) -> None:
    """What `dvc repro` records without running it: `dvc add`ed data that changed, frozen stages
    that changed, each committed anew (before any job: the jobs read them)."""
    for source in plan.data:
        log.info("%s changed: committed anew (as dvc repro does)", source)
        commit_stage(source, root)
    for frozen in plan.refresh:
        log.info("stage %s is frozen: recorded as it is, not run (as dvc repro does)", frozen)
        commit_stage(frozen, root)


def random_experiment_name(root: Path) -> str:
    """A name as `dvc exp run` gives one (DVC's generator), no experiment of the repository has."""
    from dvc.repo.experiments.utils import gen_random_name

    from snakedvc.engine.names import experiment_refs

    taken = experiment_refs(root)
    while (name := gen_random_name()) in taken:
        pass
    return name


def experiment_env(name: str, root: Path) -> dict[str, str]:
    """What `dvc exp run` adds to its stages' environment (DVC_EXP_NAME, DVC_EXP_BASELINE_REV: dvclive
    reads them), and the thread variables as they are here, which each stage's job puts back."""
    from snakedvc.stage import SUBMIT_THREAD_ENV, submit_thread_env

    baseline = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    return {
        "DVC_EXP_NAME": name,
        "DVC_EXP_BASELINE_REV": baseline.stdout.strip(),
        SUBMIT_THREAD_ENV: submit_thread_env(),
    }


def run_jobs(
    plan: Plan, profile: str | None, snakemake_args: Sequence[str], root: Path, env: dict[str, str] | None = None
) -> None:
    """Snakemake runs the plan's stages, each a job; a PipelineError naming the failed stages."""
    plan_file = root / plan.folder / "plan.json"
    plan.save(plan_file)
    command = [
        *python_module("snakemake"), "--snakefile", str(module_file()), "--directory", str(root),
        "--profile", str(pipeline_profile(profile, root)), "--config", f"snakedvc_pipeline={plan_file}",
        # The workspace lock already keeps this run alone here; Snakemake's own would outlive a
        # killed run (a lost controller) and stop the next.
        "--nolock", *snakemake_args,
    ]  # fmt: skip
    log.info("stages to run: %s", ", ".join(plan.run))
    if subprocess.run(command, cwd=root, env={**os.environ, **(env or {})}).returncode != 0:
        raise PipelineError(failure(plan, root))


# The profiles the kit ships: `--profile slurm` works in a project that has none of its own.
KIT_PROFILES = ("local", "slurm")

# Where Snakemake looks for a workflow when given no --snakefile.
SNAKEFILES = ("Snakefile", "snakefile", "workflow/Snakefile", "workflow/snakefile")


def is_dvc_pipeline(root: Path, snakemake_args: Sequence[str] = ()) -> bool:
    """A project `snakedvc submit` runs as a DVC pipeline: a dvc.yaml and no Snakemake workflow."""
    if {"-s", "--snakefile"} & set(snakemake_args) or any((root / name).is_file() for name in SNAKEFILES):
        return False
    return (root / "dvc.yaml").is_file()


@dataclass(frozen=True)
class ExpRunOptions:
    """What `snakedvc exp run` is given besides the profile and name: -S values, the resources
    file, targets (a submitted run's controller passes them on)."""

    overrides: tuple[str, ...] = ()
    resources_file: str | None = None
    targets: tuple[str, ...] = ()

    def args(self) -> list[str]:
        args = [arg for override in self.overrides for arg in ("-S", override)]
        return [*args, *(["--resources", self.resources_file] if self.resources_file else []), *self.targets]


def dry_run(
    overrides: Sequence[str] = (),
    root: str | Path = ".",
    resources_file: str | Path | None = None,
    targets: Sequence[str] = (),
    force: bool = False,
) -> Plan:
    """What `exp_run` would run, with these ``-S`` values, changing no file (`dvc exp run --dry`)."""
    from dvc.utils.cli_parse import to_path_overrides

    root = Path(root).resolve()
    plan = read_plan(root, "", resources_file, targets, force)
    if not overrides:
        return plan
    saved = {
        path: (root / path).read_bytes() if (root / path).exists() else None
        for path in to_path_overrides(list(overrides))
    }
    try:
        set_params(overrides, root)
        return read_plan(root, "", resources_file, targets, force)
    finally:
        for path, text in saved.items():
            if text is None:
                (root / path).unlink(missing_ok=True)
            else:
                (root / path).write_bytes(text)


def check_name_is_free(name: str, root: Path) -> None:
    """Before any job, as `dvc exp run -n` checks: a valid name no experiment of this repository has."""
    from snakedvc.engine.names import experiment_refs, validate_experiment_name

    validate_experiment_name(name)
    if name in experiment_refs(root):
        raise PipelineError(
            f"experiment {name!r} exists already (dvc exp show): another -n, or `dvc exp remove {name}`"
        )


def failure(plan: Plan, root: Path) -> str:
    """What a failed run says: the stages that failed, with their logs; what dvc.lock kept."""
    failed = [s for s in plan.run if (root / plan.log(s)).exists() and not (root / plan.ran(s)).exists()]
    done = [s for s in plan.run if (root / plan.committed(s)).exists()]
    where = (
        "; ".join(
            f"stage {s!r} failed: its log is {plan.log(s)} (its command: {' && '.join(plan.stage(s).commands)})"
            for s in failed
        )
        or "the pipeline failed"
    )
    return (
        f"{where} (Snakemake's messages above say more). "
        f"Committed to dvc.lock: {', '.join(done) or 'no stage'}; no experiment was saved"
    )


def save(plan: Plan, name: str, root: Path) -> str:
    """One `dvc exp save` with what `dvc exp run` commits: dvc.lock (the stages that ran), params,
    the uncached outputs of the stages that ran."""
    from snakedvc.engine.tracking import note_saved, repo_lock, run_dvc, trim_experiment

    args = ["exp", "save"]
    if name:
        args += ["--name", name]
    # Nothing ran: the experiment holds what the run involves, as `dvc exp run`'s does.
    involved = plan.run if plan.run or plan.refresh or plan.data else plan.wanted
    produced = {out for stage in involved for out in plan.stage(stage).uncached if (root / out).exists()}
    for path in sorted(produced):
        args += ["--include-untracked", path]
    # Its stages only: without targets `dvc exp save` commits every stage, and would record a
    # stage this run did not run (a target's neighbour, a frozen one) as up to date with new inputs.
    # Nothing ran: the stages the run involves, all up to date (their commit changes nothing).
    args += ["--", *(plan.data + plan.refresh + plan.run or plan.wanted)]
    with repo_lock(root):
        out = run_dvc(args, root)
        match = re.search(r"saved as:\s*(\S+)", out)
        saved = match.group(1) if match else name
        # DVC's scratch files out, and the outputs DVC caches: `dvc exp save` force-adds a cached
        # metrics or plots file, which `dvc exp run`'s commit never holds (git would then track an
        # output DVC tracks: `dvc repro` on a branch of the experiment refuses it).
        trim_experiment(saved, keep=[], records=cached_outputs(plan), root=root)
    log.info("experiment saved: %s", saved)
    note_saved(saved)
    return saved


def cached_outputs(plan: Plan) -> list[str]:
    """Every output of the pipeline DVC caches (git never holds them)."""
    outs = {out for stage in plan.stages for out in stage.outs}
    return sorted(outs - {out for stage in plan.stages for out in stage.uncached})


def module_file() -> Path:
    return Path(__file__).resolve().parent.parent / "modules" / "dvc_pipeline.smk"


def pipeline_profile(profile: str | None, root: Path) -> Path:
    """A profile folder: ``profile`` as a path (relative to ``root``), or ``local``/``slurm`` where
    the project has no such folder: the kit's own (every job on this machine; the partitions of
    its partitions.yaml). None: local."""
    profile = profile or "local"
    path = root / profile
    if (path / "config.yaml").is_file():
        return path
    if profile in KIT_PROFILES:
        return kit_profile(profile)
    raise PipelineError(
        f"profile {profile!r}: no config.yaml in {path} (a profile is a folder; "
        f"{' and '.join(KIT_PROFILES)} name the kit's own where the project has no such folder)"
    )


def kit_profile(name: str) -> Path:
    return Path(__file__).resolve().parent.parent / "profiles" / name
