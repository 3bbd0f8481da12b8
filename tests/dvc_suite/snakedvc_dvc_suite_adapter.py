"""DVC's own functional tests, with the kit's runner in place of DVC's: a pytest plugin that
scripts/dvc-suite loads into DVC's test session (`-p snakedvc_dvc_suite_adapter`).

Every `Repo.reproduce` the tests make (by the API, or by `dvc repro` through `dvc.cli.main`, which
calls the same method) runs as `snakedvc exp run` runs a pipeline, and every `Experiments.run` (the
API's `repo.experiments.run`, and `dvc exp run`) is `snakedvc exp run` itself: the kit reads the plan through
DVC, Snakemake runs each stage as a job of its own (`snakedvc stage-run`), and `dvc commit` of each
stage follows on this host. The methods are overridden for the session, not patched inside: DVC's
public `Repo.reproduce` keeps its signature and returns what DVC's returns (the stages that ran,
in order, as objects of the caller's repository), or raises DVC's `ReproductionError`;
`Experiments.run` returns DVC's `{experiment commit: experiment hash}`.

Targets reach the kit as DVC's (names, paths, `file:stage`, .dvc files, folders with `recursive`,
globs) with DVC's stage selection (`single_item`, `pipeline`, `all_pipelines`, `downstream`). A test
that asks for something the kit's runner has no equivalent of (a queued or temporary-folder
experiment, ...) is skipped, its reason naming the option: the script's table lists each with its count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dvc.exceptions import DvcException, InvalidArgumentError, ReproductionError
from dvc.repo import Repo
from dvc.repo.experiments import Experiments
from dvc.repo.experiments.exceptions import ExperimentExistsError

# Options of Repo.reproduce the kit's runner takes as `dvc repro` does (False/None: not asked).
# run_cache: the kit restores a changed stage's outputs from DVC's run cache, as dvc repro does.
TAKEN = {"force", "interactive", "dry", "run_cache", "pull", "allow_missing", "force_downstream"}
# DVC's stage selection, which the kit's runner takes as DVC's (dvcpipeline.Selection).
SELECTION = ("recursive", "single_item", "pipeline", "all_pipelines", "downstream", "glob")
# And those of Experiments.run (jobs: the queue's workers; name: the experiment's, as --name).
TAKEN_BY_EXP_RUN = {*TAKEN, "jobs", "name", "params", "message", "queue", "run_all", "no_hydra"}

# What the kit's runner refuses by design, before any job, in words its error holds.
REFUSED = (
    "a persistent output is not supported", "is outside the repository", "a circular (checkpoint) output",
    "an import (dvc import, import-url)",
)  # fmt: skip

# scripts/dvc-suite's file of the tests that called Repo.reproduce.
CALLS_FILE_ENV = "SNAKEDVC_DVC_SUITE_CALLS"

# The runner: the kit's profile that runs every job on this machine.
PROFILE = "local"


def _asked(options: dict[str, Any], taken: set[str] = TAKEN) -> list[str]:
    return sorted(name for name, value in options.items() if value and name not in taken)


def _missing(options: dict[str, Any]) -> Any:
    from snakedvc.engine import dvcpipeline

    return dvcpipeline.Missing(pull=bool(options.get("pull")), allow=bool(options.get("allow_missing")))


def _listed(targets: Any) -> list[str]:
    return [] if targets is None else [targets] if isinstance(targets, str) else list(targets)


def _selection(targets: Any, options: dict[str, Any]) -> Any:
    """The kit's Selection for DVC's targets and options (None: the project's dvc.yaml)."""
    from snakedvc.engine import dvcpipeline

    return dvcpipeline.Selection(tuple(_listed(targets)), *(bool(options.get(name)) for name in SELECTION))


def kit_reproduce(
    self: Repo,
    targets: Any = None,
    recursive: bool = False,
    pipeline: bool = False,
    all_pipelines: bool = False,
    downstream: bool = False,
    single_item: bool = False,
    glob: bool = False,
    on_error: str | None = "fail",
    **kwargs: Any,
) -> list[Any]:
    from snakedvc.engine import dvcpipeline
    from snakedvc.engine.dvcpipeline.run import pull_missing
    from snakedvc.engine.stamps import new_run_id

    _note_call()
    chosen = {"recursive": recursive, "pipeline": pipeline, "all_pipelines": all_pipelines,
              "downstream": downstream, "single_item": single_item, "glob": glob}  # fmt: skip
    options = dict(kwargs)
    if on_error not in (None, "fail"):
        options[f"on_error={on_error}"] = True
    asked = _asked(options)
    if asked:
        pytest.skip(f"snakedvc exp run has no equivalent of reproduce's {', '.join(asked)}")
    root = Path(self.root_dir)
    targets = dvcpipeline.targets_from_subfolder(_listed(targets), Path.cwd(), root, recursive)
    select = _selection(targets, chosen)
    folder = f"{dvcpipeline.PIPELINE_FOLDER}/{new_run_id()}"

    def planned(rerun: Any = ()) -> Any:
        missing = dataclasses.replace(_missing(kwargs), rerun=tuple(rerun))
        plan = dvcpipeline.read_plan(root, folder, targets=select, force=bool(kwargs.get("force")), missing=missing)
        plan = dataclasses.replace(plan, run_cache=plan.run_cache and kwargs.get("run_cache", True))
        return dataclasses.replace(plan, changed=plan.run) if kwargs.get("force_downstream") else plan

    with _dvc_errors():
        plan = planned()
        if plan.pulled or plan.pull_paths:
            plan = pull_missing(plan, planned, root)
    if kwargs.get("dry"):
        return _stages_of(self, [*plan.data, *plan.refresh, *plan.run])
    try:
        self._reset()  # its index as the files are now (the plan was read through another Repo)
        recorded = dvcpipeline.run_plan(plan, PROFILE, [], root, repo=self)
    except dvcpipeline.PipelineError as error:  # a stage that failed, data gone: DVC's error for it
        raise ReproductionError(str(error)) from None
    # As DVC's: the stages it recorded, not those it found unchanged at run time.
    return _stages_of(self, [*plan.data, *plan.refresh, *(name for name in plan.run if name in recorded.ran)])


@contextlib.contextmanager
def _dvc_errors() -> Iterator[None]:
    """The kit's refusals as skips (by design, named in its error); DVC's own errors as DVC raises them."""
    from snakedvc.engine import dvcpipeline

    try:
        yield
    except dvcpipeline.PipelineError as error:
        if "no dvc.yaml stages" in str(error) or "no stages to run" in str(error):
            pytest.skip("snakedvc exp run runs dvc.yaml pipelines; the test reproduces .dvc files alone")
        for refused in REFUSED:
            if refused in str(error):
                pytest.skip(f"refused by snakedvc exp run by design, and named in its error: {refused}")
        if isinstance(error.__context__, DvcException):  # DVC could not read the pipeline: its own error
            raise error.__context__ from None
        raise


def kit_experiments_run(
    self: Experiments,
    targets: Any = None,
    params: Any = None,
    run_all: bool = False,
    jobs: int = 1,
    tmp_dir: bool = False,
    queue: bool = False,
    copy_paths: Any = None,
    message: str | None = None,
    **kwargs: Any,
) -> dict[str, str]:
    """`dvc exp run` as `snakedvc exp run`: DVC's result, {the experiment's commit: its hash}."""
    from snakedvc.engine import dvcpipeline

    _note_call()
    options = {"run_all": run_all, "tmp_dir": tmp_dir, "queue": queue, "copy_paths": copy_paths,
               "message": message, **kwargs}  # fmt: skip
    asked = _asked(options, TAKEN_BY_EXP_RUN)
    if asked:
        pytest.skip(f"snakedvc exp run has no equivalent of exp run's {', '.join(asked)}")
    if kwargs.get("dry"):
        pytest.skip("snakedvc exp run --dry prints the plan; DVC's dry experiment runs in a temporary folder")
    root = Path(self.repo.root_dir)
    if run_all:
        return _kit_run_all(self.repo, root, jobs)
    if queue:
        _kit_queue(self, targets, params, message, kwargs)
        return {}
    # In a subfolder of the repository, as `snakedvc exp run` reads the targets and -S values there.
    targets = dvcpipeline.targets_from_subfolder(_listed(targets), Path.cwd(), root)
    params = dvcpipeline.overrides_from_subfolder(params or [], Path.cwd(), root)
    select = _selection(targets, {})
    with _dvc_errors():
        try:
            options = dvcpipeline.ExpRunOptions(
                tuple(params or []),
                None,
                select.targets,
                bool(kwargs.get("pull")),
                bool(kwargs.get("allow_missing")),
                message=message or "",
                no_hydra=bool(kwargs.get("no_hydra")),
            )
            name = dvcpipeline.exp_run(
                PROFILE, options, kwargs.get("name") or "", root=root, force=bool(kwargs.get("force"))
            )
        except dvcpipeline.PipelineError as error:
            if "failed" in str(error):  # a stage failed: DVC's error for it, as its executor raises it
                raise ReproductionError(str(error)) from None
            if "exists already" in str(error):  # refused before anything ran: DVC's error for it
                raise ExperimentExistsError(kwargs["name"]) from None
            if "Sweep overrides can't be used" in str(error):
                raise InvalidArgumentError(str(error)) from None
            raise
        except ValueError as error:  # the kit refused the name before anything ran: DVC's error for it
            raise InvalidArgumentError(str(error)) from None
    self.repo._reset()
    return _experiment_result(self.repo, name)


# Seconds a test's queue may take to run (the kit's detached runs, on this machine).
QUEUE_WAIT_S = 600


def kit_queue_one(
    self: Experiments,
    queue: Any,
    params: dict[str, list[str]] | None = None,
    targets: Any = None,
    copy_paths: Any = None,
    message: str | None = None,
    no_hydra: bool = False,
    name: str | None = None,
    **kwargs: Any,
) -> None:
    """One queued experiment (a point of a sweep) as `snakedvc exp run --queue` queues it: a
    detached run, not started. DVC's `Experiments.run` calls this once per point; so does the kit's."""
    from snakedvc.engine import dvcpipeline
    from snakedvc.engine.dvcpipeline.save import random_experiment_name
    from snakedvc.engine.runs import submit

    if copy_paths or kwargs:
        pytest.skip(f"snakedvc exp run has no equivalent of queue_one's {', '.join(['copy_paths', *kwargs])}")
    root = Path(self.repo.root_dir)
    overrides = [f"{path}:{change}" for path, changes in (params or {}).items() for change in changes]
    options = dvcpipeline.ExpRunOptions(
        dvcpipeline.overrides_from_subfolder(overrides, Path.cwd(), root),
        None,
        dvcpipeline.targets_from_subfolder(_listed(targets), Path.cwd(), root),
        message=message or "",
        no_hydra=no_hydra,
    )
    named = name or random_experiment_name(root)
    submit(str(dvcpipeline.kit_profile(PROFILE)), [], name=named, cwd=root, pipeline=options, queued=True)


def _kit_queue(exps: Experiments, targets: Any, params: Any, message: str | None, kwargs: dict[str, Any]) -> None:
    """`dvc exp run --queue`: the points of the -S sweep (the kit's expansion, as `snakedvc exp run
    --queue` makes it), each queued through ``queue_one`` as DVC's `Experiments.run` queues them."""
    from dvc.utils.cli_parse import to_path_overrides

    from snakedvc.engine.runs.queue import sweeps

    points = sweeps(list(params or []))
    name = kwargs.get("name")
    for index, point in enumerate(points):
        named = {"name": f"{name}-{index + 1}" if len(points) > 1 else name} if name else {}
        exps.queue_one(
            None, params=to_path_overrides(list(point)), targets=targets, copy_paths=None, message=message,
            no_hydra=bool(kwargs.get("no_hydra")), **named,
        )  # fmt: skip


def _kit_run_all(repo: Repo, root: Path, jobs: int) -> dict[str, str]:
    """`dvc exp run --run-all`: the kit's queue started, waited for, and its experiments as DVC returns them."""
    import time

    from snakedvc.engine.runs.queue import queued_runs, start

    start(root, jobs or 1)
    deadline = time.monotonic() + QUEUE_WAIT_S
    while any(run.state in ("queued", "running") for run in queued_runs(root)):
        if time.monotonic() > deadline:
            raise AssertionError(f"the kit's queue did not finish in {QUEUE_WAIT_S} s")
        time.sleep(0.5)
    repo._reset()
    results: dict[str, str] = {}
    for run in queued_runs(root):
        for experiment in run.experiments:
            results.update(_experiment_result(repo, experiment, run.baseline))
    return results


def _experiment_result(repo: Repo, name: str, baseline: str | None = None) -> dict[str, str]:
    from dvc.repo.experiments.utils import exp_refs_by_baseline

    baseline = baseline or repo.scm.get_rev()
    for ref in exp_refs_by_baseline(repo.scm, {baseline}).get(baseline, []):
        if ref.name == name:
            rev = repo.scm.get_ref(str(ref))
            subject = repo.scm.resolve_commit(rev).message.splitlines()[0]
            return {rev: subject.rsplit(" ", 1)[-1]}  # "dvc: commit experiment <hash>"
    raise AssertionError(f"snakedvc exp run saved {name!r}, but no experiment of that name has baseline {baseline}")


def _note_call() -> None:
    if os.environ.get(CALLS_FILE_ENV):  # which tests made the kit's runner run (the script counts them)
        with open(os.environ[CALLS_FILE_ENV], "a") as calls:
            calls.write(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0] + "\n")


def _stages_of(repo: Repo, names: list[str]) -> list[Any]:
    """The caller's repository's stage objects for ``names``, in that order (DVC's return value)."""
    repo._reset()  # the commits ran in other processes: dvc.lock changed under this object
    by_name = {stage.addressing: stage for stage in repo.index.stages}
    return [by_name[name] for name in names]


@pytest.fixture(autouse=True)
def kit_runs_every_reproduce(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Repo, "reproduce", kit_reproduce)
    monkeypatch.setattr(Experiments, "run", kit_experiments_run)
    monkeypatch.setattr(Experiments, "queue_one", kit_queue_one)
