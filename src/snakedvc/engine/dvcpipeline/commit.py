"""What a run records in dvc.lock as its stages finish (on the submit host, serialised by the kit's lock)."""

from __future__ import annotations

import logging
from pathlib import Path

from snakedvc.engine.dvcpipeline.plan import Plan

log = logging.getLogger(__name__)


def commit_stage(name: str, root: str | Path = ".") -> None:
    """`dvc commit` of one stage that has just run: its dvc.lock entry and its outputs in the cache."""
    from snakedvc.engine.tracking import repo_lock, run_dvc

    with repo_lock(root):
        run_dvc(["commit", "--force", "--quiet", name], root)


def commit_unrun(plan: Plan, root: Path) -> None:
    """What `dvc repro` records without running it: `dvc add`ed data that changed, frozen stages
    that changed, each committed anew (before any job: the jobs read them)."""
    for source in plan.data:
        log.info("%s changed: committed anew (as dvc repro does)", source)
        commit_stage(source, root)
    for frozen in plan.refresh:
        log.info("stage %s is frozen: recorded as it is, not run (as dvc repro does)", frozen)
        commit_stage(frozen, root)
