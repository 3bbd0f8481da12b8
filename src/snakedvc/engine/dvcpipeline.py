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
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# What a stage may use that this runner does not reproduce as DVC would: refused before any job.
UNSUPPORTED_OUT_FLAGS = {
    "persist": "Snakemake's jobs start from a clean slate; a persistent output is not supported",
    "checkpoint": "a circular (checkpoint) output is not supported",
}


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


@dataclass(frozen=True)
class Plan:
    """The stages of a pipeline, the ones to run (in DVC's order) and where the run keeps its markers."""

    stages: tuple[Stage, ...]
    run: tuple[str, ...]
    params_files: tuple[str, ...]
    folder: str  # .snakedvc/pipeline/<run id>: markers, logs of the commits

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
        return cls(stages, tuple(data["run"]), tuple(data["params_files"]), data["folder"])


def _stage_from_json(data: dict[str, Any]) -> Stage:
    return Stage(
        name=data["name"], rule=data["rule"], commands=tuple(data["commands"]), wdir=data["wdir"],
        outs=tuple(data["outs"]), uncached=tuple(data["uncached"]), upstream=tuple(data["upstream"]),
    )  # fmt: skip


def read_plan(root: str | Path, folder: str) -> Plan:
    """The pipeline of the DVC repository at ``root`` as DVC sees it now, and the stages to run."""
    import networkx as nx
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    root = Path(root).resolve()
    # DVC names stages relative to the working directory ("sub/dvc.yaml:train" from elsewhere).
    with contextlib.chdir(root), Repo(str(root)) as repo:
        pipeline = [stage for stage in repo.index.stages if isinstance(stage, PipelineStage)]
        if not pipeline:
            raise PipelineError(f"{root}: no dvc.yaml stages to run (dvc stage list shows none)")
        graph = repo.index.graph  # an edge goes from a stage to a stage it depends on
        stages = _stages(pipeline, graph, root)
        changed = set(repo.status(targets=[s.addressing for s in pipeline]))
        params = sorted({_relative(dep.fs_path, root) for s in pipeline for dep in s.deps if _is_params(dep)})
        order = [s.addressing for s in reversed(list(nx.topological_sort(graph))) if isinstance(s, PipelineStage)]
        downstream = set(changed)
        for stage in pipeline:
            if stage.addressing in changed:
                downstream |= {s.addressing for s in nx.ancestors(graph, stage)}
        to_run = [name for name in order if name in downstream and not _frozen(pipeline, name)]
    return Plan(tuple(stages), tuple(to_run), tuple(params), folder)


def _stages(pipeline: list[Any], graph: Any, root: Path) -> list[Stage]:
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
            )
        )
    return stages


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


def _frozen(pipeline: list[Any], name: str) -> bool:
    return any(stage.frozen for stage in pipeline if stage.addressing == name)


def set_params(overrides: Sequence[str], root: str | Path = ".") -> None:
    """Apply ``-S`` overrides to the params files as `dvc exp run -S` does (DVC's own functions:
    ``[file:]key=value``, Hydra's override grammar)."""
    if not overrides:
        return
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides

    for path, changes in to_path_overrides(list(overrides)).items():
        apply_overrides(Path(root) / path, changes)


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
) -> str | None:
    """`dvc exp run`, each stage a Snakemake job: the experiment's name, or None when DVC finds
    nothing to run. A failed stage stops the run before any experiment is saved; the stages that
    finished before it are committed (dvc.lock), the failed one not."""
    from snakedvc.engine.runs.submission import new_run_id

    root = Path(root).resolve()
    if name:
        check_name_is_free(name, root)
    set_params(overrides, root)
    folder = f".snakedvc/pipeline/{new_run_id()}"
    plan = read_plan(root, folder)
    if not plan.run:
        log.info("nothing to run: DVC reports every stage up to date (dvc status)")
        return None
    plan_file = root / folder / "plan.json"
    plan.save(plan_file)
    command = [
        sys.executable, "-m", "snakemake", "--snakefile", str(module_file()), "--directory", str(root),
        "--profile", profile or str(kit_profile("local")), "--config", f"snakedvc_pipeline={plan_file}",
        *snakemake_args,
    ]  # fmt: skip
    log.info("stages to run: %s", ", ".join(plan.run))
    if subprocess.run(command, cwd=root).returncode != 0:
        raise PipelineError(failure(plan, root))
    return save(plan, name, root)


def check_name_is_free(name: str, root: Path) -> None:
    """Before any job, as `dvc exp run -n` checks: a valid name no experiment of this repository has."""
    from snakedvc.engine.names import validate_experiment_name

    validate_experiment_name(name)
    refs = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cwd=root, capture_output=True, text=True
    ).stdout.split()
    if any(ref.rsplit("/", 1)[-1] == name for ref in refs):
        raise PipelineError(
            f"experiment {name!r} exists already (dvc exp show): another -n, or `dvc exp remove {name}`"
        )


def failure(plan: Plan, root: Path) -> str:
    """What a failed run says: the stages that failed, with their logs; what dvc.lock kept."""
    failed = [s for s in plan.run if (root / plan.log(s)).exists() and not (root / plan.ran(s)).exists()]
    done = [s for s in plan.run if (root / plan.committed(s)).exists()]
    where = "; ".join(f"stage {s!r} failed: its log is {plan.log(s)}" for s in failed) or "the pipeline failed"
    return (
        f"{where} (Snakemake's messages above say more). "
        f"Committed to dvc.lock: {', '.join(done) or 'no stage'}; no experiment was saved"
    )


def save(plan: Plan, name: str, root: Path) -> str:
    """One `dvc exp save` with what `dvc exp run` commits: dvc.lock, params, uncached outputs."""
    from snakedvc.engine.tracking import repo_lock, run_dvc, trim_experiment

    args = ["exp", "save"]
    if name:
        args += ["--name", name]
    for path in sorted({out for stage in plan.stages for out in stage.uncached if (root / out).exists()}):
        args += ["--include-untracked", path]
    with repo_lock(root):
        out = run_dvc(args, root)
        match = re.search(r"saved as:\s*(\S+)", out)
        saved = match.group(1) if match else name
        trim_experiment(saved, keep=[], records=[], root=root)  # DVC's scratch files out
    log.info("experiment saved: %s", saved)
    return saved


def module_file() -> Path:
    return Path(__file__).resolve().parent.parent / "modules" / "dvc_pipeline.smk"


def kit_profile(name: str) -> Path:
    return Path(__file__).resolve().parent.parent / "profiles" / name
