"""The experiment a run ends in: one `dvc exp save` of what `dvc exp run` commits; a failed run's message."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from snakedvc.engine.dvcpipeline.commit import Bookkeeper
from snakedvc.engine.dvcpipeline.plan import PipelineError, Plan

log = logging.getLogger(__name__)


def check_name_is_free(name: str, root: Path, replace: bool = False) -> None:
    """Before any job, as `dvc exp run -n` checks: a valid name no experiment of this repository has,
    unless ``replace`` (`-f`, as DVC's: the experiment of that name is replaced)."""
    from snakedvc.engine.names import experiment_refs, validate_experiment_name

    validate_experiment_name(name)
    if name in experiment_refs(root) and not replace:
        raise PipelineError(
            f"experiment {name!r} exists already (dvc exp show): another -n, `dvc exp remove {name}`, "
            "or -f to replace it"
        )


def random_experiment_name(root: Path) -> str:
    """A name as `dvc exp run` gives one (DVC's generator), no experiment of the repository has."""
    from dvc.repo.experiments.utils import gen_random_name

    from snakedvc.engine.names import experiment_refs

    taken = experiment_refs(root)
    while (name := gen_random_name()) in taken:
        pass
    return name


@dataclass(frozen=True)
class Recorded:
    """What a run recorded: the stages that ran and were committed, those found unchanged at run
    time, and the hash `dvc exp run` would put in the experiment's commit message."""

    ran: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    experiment_hash: str = ""


def failure(plan: Plan, root: Path, books: Bookkeeper, snakemake_log: str = "") -> str:
    """What a failed run says: the stages that failed, with their logs; what dvc.lock kept."""
    failed = [s for s in plan.run if (root / plan.log(s)).exists() and not (root / plan.ran(s)).exists()]
    said = [
        f"stage {s!r} failed: its log is {plan.log(s)} (its command: {' && '.join(plan.stage(s).commands)})"
        for s in failed
    ]
    said += [f"stage {s!r} ran, but DVC cannot record it: {why}" for s, why in books.failed.items()]
    where = "; ".join(said) or "the pipeline failed"
    return (
        f"{where} (Snakemake's messages {'in ' + snakemake_log if snakemake_log else 'above'} say more). "
        f"Committed to dvc.lock: {', '.join(books.committed) or 'no stage'}; no experiment was saved"
    )


def save(
    plan: Plan,
    name: str,
    root: Path,
    recorded: Recorded,
    replace: bool = False,
    message: str = "",
    include: Sequence[str] = (),
) -> str:
    """One `dvc exp save` with what `dvc exp run` commits: the lock files of the stages the run
    involves (those that ran already committed), the params files (``include``: those -S wrote,
    new ones too), the uncached outputs of the stages that ran; DVC's commit message, or
    ``message`` (-m). ``replace``: an experiment of the same name is replaced (`dvc exp run -f -n NAME`)."""
    from snakedvc.engine.tracking import EXPERIMENT_PUSH_ENV, note_saved, push, repo_lock, trim_experiment

    message = message or f"dvc: commit experiment {recorded.experiment_hash}"
    # Nothing ran: the experiment holds what the run involves, as `dvc exp run`'s does.
    involved = recorded.ran if recorded.ran or plan.refresh or plan.data else plan.wanted
    produced = {out for stage in involved for out in plan.stage(stage).uncached if (root / out).exists()}
    # The lock files too: `dvc exp save` adds an untracked dvc.lock itself only at the top of the
    # git repository, not in a DVC repository in a subfolder of it (a subrepo).
    locks = {_lock_file(stage) for stage in [*plan.data, *plan.refresh, *recorded.ran, *involved]}
    untracked = sorted(produced | set(include) | {lock for lock in locks if (root / lock).is_file()})
    # One target, already committed (its commit again changes nothing): every stage the run
    # recorded is in dvc.lock by now. Without targets `dvc exp save` commits every stage, and would
    # record a stage this run did not run (a target's neighbour, a frozen one) as up to date with
    # new inputs; with each as a target it takes minutes at a thousand stages.
    # (--allow-missing: a stage whose outputs are all here.)
    present = [name for name in plan.wanted if all((root / out).exists() for out in plan.stage(name).outs)]
    committed = [*plan.data, *plan.refresh, *recorded.ran, *present, *plan.sources]
    if not committed:
        raise PipelineError(
            "nothing ran, and no stage the run involves has its outputs here (--allow-missing): no experiment "
            "to save; `dvc pull` them first, or run with --pull"
        )
    with repo_lock(root):
        saved = _exp_save(root, committed[0], name, replace, untracked, message)
        # DVC's scratch files out, and the outputs DVC caches: `dvc exp save` force-adds a cached
        # metrics or plots file, which `dvc exp run`'s commit never holds (git would then track an
        # output DVC tracks: `dvc repro` on a branch of the experiment refuses it).
        trim_experiment(saved, keep=[], records=cached_outputs(plan), root=root, as_baseline=True)
    log.info("experiment saved: %s", saved)
    note_saved(saved)
    if os.environ.get(EXPERIMENT_PUSH_ENV) == "1":  # submitted from another machine: results go home
        with repo_lock(root):
            push(saved, root)
    return saved


def _exp_save(root: Path, target: str, name: str, replace: bool, untracked: list[str], message: str) -> str:
    """`dvc exp save` in this process (DVC's own function, as its command calls it): the name saved.
    A process of its own would start DVC again, a second of a short run's time."""
    import contextlib

    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    log.info("dvc exp save %s -n %s (untracked: %s)", target, name, ", ".join(untracked) or "none")
    try:
        with contextlib.chdir(root), Repo(str(root), _wait_for_lock=True) as repo:
            ref = repo.experiments.save(
                targets=[target], name=name or None, force=replace, include_untracked=untracked, message=message
            )  # fmt: skip
            if ref is None:
                raise PipelineError(f"{root}: dvc exp save made no experiment")
            return str(repo.experiments.get_exact_name([ref])[ref] or name)
    except DvcException as error:
        cause = f": {error.__cause__}" if error.__cause__ else ""
        raise PipelineError(f"{root}: dvc exp save failed: {error}{cause}") from None


def _lock_file(stage: str) -> str:
    """The lock file that records a stage: dvc.lock, or sub/dvc.lock for "sub/dvc.yaml:train"."""
    dvcfile, _, _ = stage.rpartition(":")
    return str(Path(dvcfile).with_suffix(".lock")) if dvcfile.endswith(".yaml") else "dvc.lock"


def cached_outputs(plan: Plan) -> list[str]:
    """Every output of the pipeline DVC caches (git never holds them)."""
    outs = {out for stage in plan.stages for out in stage.outs}
    return sorted(outs - {out for stage in plan.stages for out in stage.uncached})
