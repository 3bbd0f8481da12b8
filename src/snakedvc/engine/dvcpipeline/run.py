"""`snakedvc exp run`: the plan run by Snakemake (one job per stage), then saved as an experiment."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from snakedvc.engine.dvcpipeline.commit import Bookkeeper
from snakedvc.engine.dvcpipeline.console import QUIET, STAGES, VERBOSE, StageOutput
from snakedvc.engine.dvcpipeline.plan import (
    PIPELINE_FOLDER,
    Missing,
    PipelineError,
    Plan,
    Selection,
    dvc_config,
    read_plan,
    set_params,
)
from snakedvc.engine.dvcpipeline.save import Recorded, check_name_is_free, failure, random_experiment_name, save
from snakedvc.engine.env import python_module
from snakedvc.engine.foreground import descendants, started_at
from snakedvc.engine.records import ignore_kit_folder
from snakedvc.engine.stamps import new_run_id
from snakedvc.live import JOBS_BEGAN

log = logging.getLogger(__name__)


# Snakemake's options that run no job: the run would then record stages that did not run.
DRY_RUN_OPTIONS = {"-n", "--dry-run", "--dryrun"}


@dataclass(frozen=True)
class ExpRunOptions:
    """What `snakedvc exp run` is given besides the profile, the name and -f, in `dvc exp run`'s
    words (a submitted run's controller passes them on: ``args()``)."""

    overrides: tuple[str, ...] = ()  # -S
    resources_file: str | None = None  # the kit's own: the stages' resources
    targets: tuple[str, ...] = ()
    pull: bool = False
    allow_missing: bool = False
    recursive: bool = False  # -R
    single_item: bool = False  # -s
    pipeline: bool = False  # -p
    all_pipelines: bool = False  # -P
    downstream: bool = False
    force_downstream: bool = False
    keep_going: bool = False  # -k
    message: str = ""  # -m
    no_hydra: bool = False
    one_at_a_time: bool = False  # the kit's own: stages one at a time, in DVC's order

    # The flags among these, by field, as `dvc exp run` spells them.
    FLAGS = {
        "pull": "--pull", "allow_missing": "--allow-missing", "recursive": "-R", "single_item": "-s",
        "pipeline": "-p", "all_pipelines": "-P", "downstream": "--downstream",
        "force_downstream": "--force-downstream", "keep_going": "-k", "no_hydra": "--no-hydra",
        "one_at_a_time": "--one-at-a-time",
    }  # fmt: skip

    def args(self) -> list[str]:
        args = [arg for override in self.overrides for arg in ("-S", override)]
        args += ["--resources", self.resources_file] if self.resources_file else []
        args += [flag for field, flag in self.FLAGS.items() if getattr(self, field)]
        args += ["-m", self.message] if self.message else []
        return [*args, *self.targets]

    def selection(self) -> Selection:
        return Selection(
            self.targets, self.recursive, self.single_item, self.pipeline, self.all_pipelines, self.downstream
        )

    def missing(self) -> Missing:
        return Missing(pull=self.pull, allow=self.allow_missing)


def exp_run(
    profile: str | None,
    options: ExpRunOptions = ExpRunOptions(),
    name: str = "",
    snakemake_args: Sequence[str] = (),
    root: str | Path = ".",
    force: bool = False,
    console: str = VERBOSE,
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
            check_name_is_free(name, root, replace=force)
        return _exp_run(profile, options, name, snakemake_args, root, force, console)


def prepare_workspace(root: Path, targets: Sequence[str]) -> bool:
    """What `dvc exp run` does before it reproduces: the data the pipeline reads that was changed
    by hand (a `dvc add`ed file) committed, then the stages' outputs put back as dvc.lock records
    them, from the cache where they are missing or were changed by hand (DVC's commit of data
    dependencies and its checkout, both forced, missing cache allowed; the targets with the stages
    they need, or every stage). Whether the checkout changed a file."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    from snakedvc.engine.tracking import repo_lock

    try:
        with repo_lock(root), contextlib.chdir(root), Repo(str(root)) as repo:
            every: list[str | None] = [None]  # DVC's commit takes one target, or None for all
            for target in list(targets) or every:
                repo.commit(
                    target, with_deps=True, force=True, allow_missing=True, data_only=True, relink=False
                )  # fmt: skip
            put_back = repo.checkout(
                targets=list(targets) or None, with_deps=bool(targets), force=True, allow_missing=True
            )  # fmt: skip
    except DvcException as error:
        raise PipelineError(f"{root}: DVC could not prepare the workspace for the run: {error}") from None
    return any(put_back.get(kind) for kind in ("added", "deleted", "modified", "failed"))


def pull_missing(plan: Plan, planned: Callable[[Sequence[str]], Plan], root: Path) -> Plan:
    """--pull, before any job: the data of the stages whose only change is missing data, and the
    missing dependencies of those that run, from the DVC remote (one `dvc pull`); then the plan
    again. A stage whose data could not be pulled runs, as `dvc repro --pull` runs it."""
    from snakedvc.engine.tracking import TrackingError, repo_lock, run_dvc

    # Paths only: `dvc pull` given a stage's name and a path together left the path unpulled.
    stages = {stage.name: stage for stage in plan.stages}
    paths: list[str] = []
    for name in plan.pulled:
        log.info("Pulling data for %s", name)
        paths += stages[name].outs if name in stages else [name]  # a .dvc file's address is its path
    paths += [path for path in plan.pull_paths if path not in paths]
    # .dvc files last: `dvc pull a.dvc out.txt` pulls a.dvc's data alone (DVC 3.67; measured).
    paths.sort(key=lambda path: path.endswith(".dvc"))
    try:
        with repo_lock(root):
            run_dvc(["pull", *paths], root)
    except TrackingError as error:  # some could not be pulled: DVC's words say which
        log.warning("%s", error)
    plan = planned(())
    if plan.pulled:
        for name in plan.pulled:
            log.info("Unable to pull data for %s: it runs", name)
        plan = planned(plan.pulled)
    return plan


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
    options: ExpRunOptions,
    name: str,
    snakemake_args: Sequence[str],
    root: Path,
    force: bool = False,
    console: str = VERBOSE,
) -> str:
    folder = f"{PIPELINE_FOLDER}/{new_run_id()}"
    targets = options.selection()

    def planned(rerun: Sequence[str] = ()) -> Plan:
        missing = replace(options.missing(), rerun=tuple(rerun))
        plan = read_plan(root, folder, options.resources_file, targets, force, missing)
        plan = replace(plan, one_at_a_time=True) if options.one_at_a_time else plan
        # --force-downstream: every stage after one that runs runs too, changed or not
        return replace(plan, changed=plan.run) if options.force_downstream else plan

    plan = planned()
    params_files = set_params(options.overrides, root, hydra_on=not options.no_hydra)
    # DVC's commit and checkout take the targets as exp run does (a folder only with its stages)
    put_back = prepare_workspace(root, [*plan.data, *plan.wanted] if options.recursive else list(options.targets))
    if params_files or put_back or plan.data:
        plan = planned()  # what runs depends on the new values and the restored outputs
    if plan.pulled or plan.pull_paths:
        plan = pull_missing(plan, planned, root)
    if not plan.run and not plan.refresh and not plan.data:
        log.info(
            "nothing to run: DVC reports every stage up to date (dvc status); saving the experiment as dvc exp run does"
        )
    # As `dvc exp run`: the experiment's name is chosen before any stage runs (DVC's own random
    # name where none is given), and every stage sees it and the baseline in its environment.
    name = name or random_experiment_name(root)
    if console == STAGES:
        print(f"Reproducing experiment '{name}'", flush=True)  # DVC's first line
    keep_going = ["--keep-going"] if options.keep_going else []
    recorded = run_plan(plan, profile, [*keep_going, *snakemake_args], root, experiment_env(name, root), console)
    return save(plan, name, root, recorded, replace=force, message=options.message, include=params_files)


def experiment_env(name: str, root: Path) -> dict[str, str]:
    """What `dvc exp run` adds to its stages' environment (DVC_EXP_NAME, DVC_EXP_BASELINE_REV: dvclive
    reads them), and the thread variables as they are here, which each stage's job puts back."""
    from snakedvc.stage import SUBMIT_THREAD_ENV, submit_thread_env

    baseline = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    return {
        **studio_env(root),
        "DVC_EXP_NAME": name,
        "DVC_EXP_BASELINE_REV": baseline.stdout.strip(),
        "DVC_ROOT": str(root),
        SUBMIT_THREAD_ENV: submit_thread_env(),
    }


def studio_env(root: Path) -> dict[str, str]:
    """DVC Studio's settings as `dvc exp run` hands them to its stages (dvclive reads them to send
    live metrics): from the repository's config and DVC_STUDIO_* here, none where Studio is not set up."""
    from dvc.utils.studio import config_to_env
    from dvc_studio_client.post_live_metrics import get_studio_config

    studio = dvc_config(root).get("studio")
    return {key: str(value) for key, value in config_to_env(get_studio_config(dvc_studio_config=studio)).items()}


def run_plan(
    plan: Plan,
    profile: str | None,
    snakemake_args: Sequence[str],
    root: Path,
    env: dict[str, str] | None = None,
    console: str = VERBOSE,
    repo: Any = None,
) -> Recorded:
    """The plan run as `dvc repro` runs it: what changed without running first, then Snakemake's
    jobs, one a stage, while a bookkeeper in this process commits the stages that finish and
    tells the waiting ones whether to run. What was recorded; a PipelineError naming the stages
    that failed, once every stage that finished is committed. ``repo``: an open DVC Repo of root
    to record through (a caller's own, as DVC's API uses the Repo it is called on)."""
    began = root / JOBS_BEGAN  # what DVC checked out or pulled so far is not this run's training
    began.parent.mkdir(parents=True, exist_ok=True)
    began.touch()
    with Bookkeeper(plan, root, repo) as books:
        books.commit_unrun()
        this_pass: Plan | None = plan if plan.run else None
        # A stage that read a file of another before that one finished (undeclared in its deps)
        # was deferred: the next pass runs it, and what follows it, once the first is done.
        while this_pass is not None:
            code = run_jobs(this_pass, profile, snakemake_args, root, env, books, console)
            if code != 0 or books.failed:
                books.close()
                said = "" if console == VERBOSE else str(this_pass.snakemake_log())
                raise PipelineError(failure(this_pass, root, books, said))
            this_pass = books.next_pass()
        books.warn_undeclared()
        return Recorded(tuple(books.committed), tuple(books.skipped), books.experiment_hash())


# Seconds between the bookkeeper's passes while Snakemake runs.
BOOKKEEPING_POLL_S = 0.2
# Seconds a stopped run gives Snakemake to cancel its jobs before it is killed.
STOP_WAIT_S = 60


def run_jobs(
    plan: Plan,
    profile: str | None,
    snakemake_args: Sequence[str],
    root: Path,
    env: dict[str, str] | None,
    books: Bookkeeper,
    console: str = VERBOSE,
) -> int:
    """Snakemake runs the plan's stages, each a job, with ``books`` stepping beside it; its exit
    status. The stages' own output reaches the terminal as DVC shows it (not QUIET); Snakemake's
    lines too where ``console`` is VERBOSE, else only the plan's snakemake.log."""
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
    # A process group of its own: a stop reaches Snakemake and its local jobs as a terminal's
    # Ctrl-C would (Snakemake's local executor waits for its jobs; SLURM jobs it scancels),
    # whether this process got a Ctrl-C or a controller's SIGINT.
    with contextlib.ExitStack() as stack:
        quiet = console != VERBOSE
        said = stack.enter_context(open(root / plan.snakemake_log(), "ab")) if quiet else None
        stream = StageOutput(plan, root) if console != QUIET else None
        options = {"cwd": root, "env": {**os.environ, **(env or {})}, "start_new_session": True, "stdout": said,
                   "stderr": subprocess.STDOUT if quiet else None}  # fmt: skip
        return start_and_follow(command, options, books, stream)


def start_and_follow(
    command: Sequence[str], options: dict[str, Any], books: Bookkeeper, stream: StageOutput | None
) -> int:
    """Start Snakemake (``options``: Popen's) and step ``books`` beside it until it exits; its exit
    status. A stop (Ctrl-C, SIGTERM, a cancel's SIGINT) stops Snakemake and its jobs, also one that
    comes while Snakemake is being started: that one is held until Popen has returned (raised inside
    Popen, it lost the process, which then ran the stages on its own: a cancel over --remote)."""
    snakemake: subprocess.Popen[bytes] | None = None
    try:
        with (
            sigterm_interrupts(),
            heartbeat(books.heartbeat_file()),
        ):  # a SIGTERM (a local run's forced stop) stops Snakemake as Ctrl-C does
            with signals_held() as held:
                snakemake = subprocess.Popen(command, **options)
            if held:
                raise KeyboardInterrupt(f"signal {held[0]}")
            while snakemake.poll() is None:
                books.step()
                if stream is not None:
                    stream.pump()
                time.sleep(BOOKKEEPING_POLL_S)
    except BaseException:  # Ctrl-C, a cancel: Snakemake and its jobs stop too
        books.stop_waiting("snakedvc exp run is stopping")
        if snakemake is not None:
            stop_group(snakemake)
        raise
    books.step()  # the stages that finished since the last pass
    if stream is not None:
        stream.drain()
    return snakemake.returncode


# Seconds between the moves of a run's heartbeat (stage.HEARTBEAT): well below HEARTBEAT_STALE_S.
HEARTBEAT_EVERY_S = 5.0


@contextlib.contextmanager
def heartbeat(path: Path, every_s: float = HEARTBEAT_EVERY_S) -> Iterator[None]:
    """``path``'s mtime moved every ``every_s`` while the body runs, from a thread of its own (the
    bookkeeper's passes can take minutes in a large commit): the stage jobs waiting for this run's
    word see it is alive, and give up soon after it stops (stage.wait_for_decision)."""
    stop = threading.Event()

    def beat() -> None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                path.touch()  # an existing file: its mtime moved to now
            stop.wait(every_s)

    beating = threading.Thread(target=beat, name="snakedvc-heartbeat", daemon=True)
    beating.start()
    try:
        yield
    finally:
        stop.set()
        beating.join()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here, as SIGINT does (in the main thread; elsewhere as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM noted, not acted on, for the body (main thread; elsewhere nothing held)."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {signum: signal.signal(signum, lambda signum, frame: held.append(signum))
                for signum in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_group(process: subprocess.Popen[bytes], wait_s: float = STOP_WAIT_S) -> None:
    """SIGINT to ``process``'s group; SIGKILL if it has not ended after ``wait_s``; then SIGKILL to
    any process that was below it at the stop and outlived it (a stage's command that left the group,
    or one Snakemake, killed before it could stop its jobs, left behind: in CI under load, a stage's
    `sleep 300` kept running, and holding the run's output, after its run was stopped)."""
    below = {pid: started_at(pid) for pid in descendants(process.pid)}
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for pid, started in below.items():
        if started is not None and started_at(pid) == started:  # the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# The profiles the kit ships: `--profile slurm` works in a project that has none of its own.
KIT_PROFILES = ("local", "slurm")

# Where Snakemake looks for a workflow when given no --snakefile.
SNAKEFILES = ("Snakefile", "snakefile", "workflow/Snakefile", "workflow/snakefile")


def is_dvc_pipeline(root: Path, snakemake_args: Sequence[str] = ()) -> bool:
    """A project `snakedvc submit` runs as a DVC pipeline: a dvc.yaml and no Snakemake workflow."""
    if {"-s", "--snakefile"} & set(snakemake_args) or any((root / name).is_file() for name in SNAKEFILES):
        return False
    return (root / "dvc.yaml").is_file()


def module_file() -> Path:
    return Path(__file__).resolve().parents[2] / "modules" / "dvc_pipeline.smk"


def pipeline_profile(profile: str | None, root: Path) -> Path:
    """A profile folder: ``profile`` as a path (relative to ``root``); a bare name is also looked
    for under profiles/ (``slurm``: ./slurm, then ./profiles/slurm, as `snakedvc init` writes it);
    ``local``/``slurm`` where the project has neither: the kit's own (every job on this machine;
    the partitions of its partitions.yaml). None: local."""
    profile = profile or "local"
    path = root / profile
    for folder in (path, root / "profiles" / profile):
        if (folder / "config.yaml").is_file():
            return folder
    if profile in KIT_PROFILES:
        return kit_profile(profile)
    raise PipelineError(
        f"profile {profile!r}: no config.yaml in {path} (a profile is a folder; "
        f"{' and '.join(KIT_PROFILES)} name the project's profiles/local and profiles/slurm, or the kit's own "
        "where the project has no such folder)"
    )


def kit_profile(name: str) -> Path:
    return Path(__file__).resolve().parents[2] / "profiles" / name
