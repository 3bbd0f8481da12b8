"""`snakedvc <command>`: the kit's commands, for users and for the kit's own module rules.

`launch` wraps a user's command for 1 process, torchrun or srun + torchrun; `track` and
`restore` talk to DVC (on the submit host only); `sweep-promote`, `sweep-asha-step`,
`sweep-asha-end` and `sweep-report` are what the sweep module's rules run, `sweep-explain` tells
an asha sweep's decision log; `submit`, `runs`, `logs`, `cancel`, `resume` and `clean` start
and control detached runs (`controller` is what a submitted run's controller runs); `exp run`
runs a dvc.yaml as `dvc exp run`, `queue` keeps DVC's experiment queue; `pending` shows or drops
a save an earlier run left pending. Every
command takes `--log`: stderr and logging go there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from snakedvc import __version__

log = logging.getLogger("snakedvc")


def _setup_logging(log_path: str | None) -> None:
    from snakedvc.logs import log_to

    log_to(log_path)


def cmd_launch(args: argparse.Namespace) -> None:
    import os

    from snakedvc.launch import Layout, run
    from snakedvc.torch.options import CONTINUE_FROM_ENV, FINAL_STATE_ENV

    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    # A sweep trial's states reach snakedvc.torch.Resumable in every rank's environment, so the
    # user's script needs no flags of the kit's.
    for name, value in ((CONTINUE_FROM_ENV, args.continue_from), (FINAL_STATE_ENV, args.final_state)):
        if value:
            os.environ[name] = os.path.abspath(value)
    if args.log:  # the command's print()s belong in the rule's log too, not only its stderr
        sys.stdout.flush()
        os.dup2(2, 1)
    run(Layout(nodes=args.nodes, procs_per_node=args.procs_per_node), command, args.log)


def cmd_stage_run(args: argparse.Namespace) -> None:
    from snakedvc.launch import Layout
    from snakedvc.stage import run_stage

    commands = args.commands[1:] if args.commands[:1] == ["--"] else args.commands
    layout = Layout(args.nodes, args.procs_per_node) if args.procs_per_node else None
    code = run_stage(
        args.stage, commands, args.wdir, args.remove, layout=layout, keep_thread_limits=args.keep_thread_limits,
        decision=args.decision, plan=args.plan,
    )  # fmt: skip
    raise SystemExit(code)


# `dvc exp run` exits 255 on any error; `snakedvc exp run` in its place does too.
EXP_ERROR_EXIT = 255


# dvc exp run's options the kit has no equivalent of yet, and why: refused with DVC's exit code.
EXP_RUN_REFUSED = {
    "interactive": "-i asks before each stage, and the kit's stages run side by side as jobs",
    "temp": "--temp: a run in a folder of its own is `snakedvc submit` (a workspace of its own per run)",
    "copy_paths": "-C copies paths into --temp or --queue folders (snakedvc submit --share links them)",
    "ignore_errors": "--ignore-errors: a failed stage fails the run (-k goes on with the stages that do not need it)",
}


def cmd_exp_run(args: argparse.Namespace) -> None:
    from snakedvc.engine.dvcpipeline import ExpRunOptions, dry_run, exp_run
    from snakedvc.engine.dvcpipeline.console import QUIET, STAGES, VERBOSE

    for option, why in EXP_RUN_REFUSED.items():
        if getattr(args, option):
            raise ValueError(f"not supported by snakedvc exp run: {why}")
    _to_repository_root(args)
    options = ExpRunOptions(
        tuple(args.set_param), args.resources, tuple(args.targets), args.pull, args.allow_missing, args.recursive,
        args.single_item, args.pipeline, args.all_pipelines, args.downstream, args.force_downstream,
        args.keep_going, args.message or "", args.no_hydra, args.one_at_a_time,
    )  # fmt: skip
    if args.queue or args.run_all:
        return _exp_run_queue(args, options)
    if args.jobs is not None:
        raise ValueError("-j is the number of queued experiments run at a time: with --run-all (or `snakedvc "
                         "queue start -j N`)")  # fmt: skip
    if args.remote:  # a detached run there: what `snakedvc submit --remote` sends for a dvc.yaml
        if args.dry or args.force:
            raise ValueError("--remote runs the pipeline detached on the cluster: without --dry and -f "
                             "(there: snakedvc submit --replace replaces an experiment of the name)")  # fmt: skip
        sent = argparse.Namespace(**{**vars(args), "target": args.targets, "share": [], "replace": False})
        return _submit_remote(sent, list(args.snakemake_args))
    if args.dry:
        plan = dry_run(
            options.overrides, resources_file=options.resources_file, targets=options.selection(), force=args.force,
            missing=options.missing(),
        )  # fmt: skip
        for name in plan.pulled:
            print(f"{name} (data missing here: pulled from the DVC remote, not run)")
        for name in plan.refresh:
            print(f"{name} (frozen: recorded anew, not run)")
        for source in plan.data:
            print(f"{source} (changed data: committed anew, not run)")
        print(
            "\n".join(plan.run)
            if plan.run or plan.refresh or plan.data
            else "Nothing to be done: every stage is up to date"
        )
        return

    console = VERBOSE if args.verbose else QUIET if args.quiet else STAGES
    saved = exp_run(args.profile, options, args.name or "", args.snakemake_args, force=args.force, console=console)
    if not args.quiet:  # DVC's closing lines
        print(f"\nRan experiment(s): {saved}\nExperiment results have been applied to your workspace.")


def _to_repository_root(args: argparse.Namespace) -> None:
    """Run from the DVC repository's root when started in a subfolder of it, as `dvc exp run` does
    (the kit's folders there, not in the subfolder), the targets read as DVC reads them there."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    from snakedvc.engine.dvcpipeline import overrides_from_subfolder, targets_from_subfolder

    cwd = Path.cwd()
    try:
        root = Path(Repo.find_root(str(cwd)))
    except NotDvcRepoError:
        return  # exp run's own error says so
    if root.resolve() == cwd.resolve():
        return
    args.targets = list(targets_from_subfolder(args.targets, cwd, root, args.recursive))
    args.set_param = list(overrides_from_subfolder(args.set_param, cwd, root))
    for option in ("profile", "resources"):  # paths given here, where they exist
        value = getattr(args, option)
        if value and (cwd / value).exists():
            setattr(args, option, str((cwd / value).resolve()))
    os.chdir(root)


def _exp_run_queue(args: argparse.Namespace, options: Any) -> None:
    """`exp run --queue`: each experiment (one per point of a -S sweep) a detached run waiting in the
    queue; `--run-all [-j N]`: the queue started, as `snakedvc queue start -j N`."""
    from dataclasses import replace

    from snakedvc.engine.dvcpipeline import pipeline_profile
    from snakedvc.engine.dvcpipeline.save import random_experiment_name
    from snakedvc.engine.runs import repository_root, submit
    from snakedvc.engine.runs.queue import start, sweeps

    root = repository_root(".")
    if args.run_all:
        for run in start(root, args.jobs or 1):
            print(f"Started experiment '{run.name}' (run {run.id}); `snakedvc queue status` shows the queue")
        return
    if args.dry:
        raise ValueError("--queue keeps the experiments to run with `snakedvc queue start`: without --dry")
    profile = str(pipeline_profile(args.profile, root)) if not args.remote else ""
    points = sweeps(options.overrides)
    for index, overrides in enumerate(points):
        name = args.name or ""
        name = f"{name}-{index + 1}" if name and len(points) > 1 else name or random_experiment_name(root)
        if args.remote:  # queued on the cluster, through the same trip as submit --remote
            sent = {"set_param": list(overrides), "name": name, "target": args.targets, "share": [],
                    "replace": args.force, "queued": True}  # fmt: skip
            _submit_remote(argparse.Namespace(**{**vars(args), **sent}), list(args.snakemake_args))
            continue
        run = submit(
            profile, list(args.snakemake_args), name=name, pipeline=replace(options, overrides=overrides),
            replace=args.force, queued=True,
        )  # fmt: skip
        if len(points) > 1:
            print(f"Queueing with overrides '{list(overrides)}'.")
        print(f"Queued experiment '{run.name}' for future execution.")


def cmd_queue(args: argparse.Namespace) -> None:
    import time

    from snakedvc.engine.runs import cancel, find_run, follow, repository_root
    from snakedvc.engine.runs.queue import remove, start, status, stop, waiting

    root = repository_root(".")
    if args.remote:  # the same command in the project's clone on the cluster
        forwarded = {"start": ["-j", str(getattr(args, "jobs", 1))], "logs": [getattr(args, "name", "")]}
        forwarded["kill"] = list(getattr(args, "names", []))
        forwarded["remove"] = [*getattr(args, "names", []), *(f"--{kind}" for kind in ("all", "queued", "success",
                               "failed") if getattr(args, kind, False))]  # fmt: skip
        following = ["-f"] if getattr(args, "follow", False) else []
        return _on_remote(args, ["queue", args.action, *forwarded.get(args.action, []), *following])
    if args.action == "start":
        started = start(root, args.jobs)
        print(f"Queue started, {args.jobs} experiment(s) at a time; started now: "
              f"{', '.join(run.name for run in started) or 'none'}")  # fmt: skip
    elif args.action == "stop":
        stop(root)
        print("Queue stopped: no queued experiment starts; the running ones finish (`snakedvc queue kill` stops one)")
    elif args.action == "status":
        rows = status(root)
        print(f"{'Task':<22}{'Name':<26}{'Created':<20}Status")
        for row in rows:
            print(f"{row['run']:<22}{row['name']:<26}{row['created']:<20}{row['status']}")
        if not rows:
            print("No experiments in the queue: snakedvc exp run --queue -S ... adds one")
    elif args.action == "logs":
        run = find_run(root, args.name)
        for line in (
            follow(run.log, run, poll=1.0) if args.follow else [run.log.read_text() if run.log.is_file() else ""]
        ):
            print(line, end="")
    elif args.action == "kill":
        for name in args.names:
            run = find_run(root, name)
            # One never started has nothing running to stop.
            run = run.update(state="cancelled", ended=time.time()) if waiting(run) else cancel(run)
            print(f"{run.name}: {run.state}")
    elif args.action == "remove":
        removed = remove(root, args.names, args.all, args.queued, args.success, args.failed)
        print(f"Removed experiments in queue: {', '.join(removed) or 'none'}")


def cmd_sweep_promote(args: argparse.Namespace) -> None:
    from snakedvc.engine.sweep.promotion import decide

    decide(args.metrics_files, args.rung, args.keep, args.metric, args.direction, args.output)


def cmd_sweep_asha_step(args: argparse.Namespace) -> None:
    from snakedvc.engine.sweep.asha_steps import decide_step
    from snakedvc.engine.sweep.decisions import Header

    header = Header.from_dict(json.loads(args.plan))
    decide_step(args.decisions, header, args.slot, args.step, args.trained, args.output, args.replay)


def cmd_sweep_asha_end(args: argparse.Namespace) -> None:
    from snakedvc.engine.sweep.asha_steps import finish
    from snakedvc.engine.sweep.decisions import Header

    summary = finish(args.decisions, Header.from_dict(json.loads(args.plan)), args.output, args.replay)
    log.info("asha: %d trial-rungs, %d epochs; winner %s (rung %s)", summary["trial_rungs"],
             summary["epochs_trained"], summary["winner"], summary["winner_rung"])  # fmt: skip


def cmd_sweep_explain(args: argparse.Namespace) -> None:
    from snakedvc.engine.sweep.explain import explain

    text, problems = explain(args.decisions)
    print(text)
    if problems:
        raise SystemExit(1)


def cmd_sweep_report(args: argparse.Namespace) -> None:
    from snakedvc.engine.sweep.report import write

    print(write(json.loads(args.plan), args.decisions, Path(args.trials), args.leave_out, Path(args.output)))


def cmd_report(args: argparse.Namespace) -> None:
    from snakedvc.engine.records import read_record
    from snakedvc.engine.report import write_report

    sweep = args.sweep
    if sweep is None:  # the sweep's report folder, if the last run was a sweep
        sweep = (read_record(".") or {}).get("sweep")
    snakemake_args = args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    path = write_report(".", args.out, args.title, snakemake_args, sweep)
    print(f"report: {path}")


def cmd_track(args: argparse.Namespace) -> None:
    from snakedvc.engine.tracking import track

    track(args.paths)
    log.info("recorded in DVC: %s", " ".join(args.paths))


def cmd_restore(args: argparse.Namespace) -> None:
    from snakedvc.engine.tracking import restore

    said = restore(args.name, params_file=args.params)
    print(f"restored {args.name}; {said}")


def cmd_submit(args: argparse.Namespace) -> None:
    from snakedvc.engine.dvcpipeline import ExpRunOptions, is_dvc_pipeline, pipeline_profile
    from snakedvc.engine.runs import repository_root, submit
    from snakedvc.engine.runs.submission import SentCode

    snakemake_args = args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    if args.remote:
        return _submit_remote(args, snakemake_args)
    if bool(args.commit) != bool(args.run_id):
        raise ValueError("--commit and --run-id come together (snakedvc submit --remote sends them)")
    sent = SentCode(args.commit, args.run_id) if args.commit else None
    pipeline, root = None, repository_root(".")
    if is_dvc_pipeline(root, snakemake_args):
        pipeline = ExpRunOptions(
            tuple(args.set_param), args.resources, tuple(args.target), args.pull, args.allow_missing, args.recursive,
            args.single_item, args.pipeline, args.all_pipelines, args.downstream, args.force_downstream,
            args.keep_going, args.message or "", args.no_hydra, args.one_at_a_time,
        )  # fmt: skip
    elif args.set_param or args.resources or args.target or args.pull or args.allow_missing:
        raise ValueError("-S, --resources, --target, --pull and --allow-missing are for a dvc.yaml pipeline; this "
                         "project has a Snakefile (give its config after --: -- --config key=value)")  # fmt: skip
    profile = args.profile or "profiles/local"
    if pipeline is not None:
        profile = str(pipeline_profile(args.profile, root))
    run = submit(
        profile, snakemake_args, name=args.name or "", share=args.share, pipeline=pipeline, replace=args.replace,
        sent=sent, queued=args.queued,
    )  # fmt: skip
    if args.queued:
        print(run.id)
        if not getattr(args, "push", False):  # sent from a laptop: the laptop says it
            print(f"Queued experiment '{run.name}' for future execution (run {run.id})", file=sys.stderr)
        return
    where = f"SLURM job {run.controller_jobs[-1]}" if run.slurm else f"process {run.controller_pid}"
    print(run.id)
    if getattr(args, "push", False):  # sent from a laptop, whose terminal shows this: the laptop names its own commands
        print(f"submitted run {run.id} ({run.name}): controller {where}", file=sys.stderr)
        return
    print(f"submitted run {run.id} ({run.name}): controller {where}; `snakedvc logs -f {run.id}` follows it",
          file=sys.stderr)  # fmt: skip


# dvc exp run's flags that `snakedvc submit` takes for a dvc.yaml pipeline (long forms), by dest.
SUBMIT_EXP_RUN_FLAGS = {
    "recursive": "--recursive", "single_item": "--single-item", "pipeline": "--pipeline",
    "all_pipelines": "--all-pipelines", "downstream": "--downstream", "force_downstream": "--force-downstream",
    "keep_going": "--keep-going", "no_hydra": "--no-hydra", "one_at_a_time": "--one-at-a-time",
}  # fmt: skip


def _submit_remote(args: argparse.Namespace, snakemake_args: list[str]) -> None:
    """`submit --remote NAME`: the same submission, started on the remote's login node over SSH."""
    from snakedvc.engine.dvcpipeline import is_dvc_pipeline
    from snakedvc.engine.remote import get_remote, run_profile, submit_remote
    from snakedvc.engine.runs import repository_root
    from snakedvc.engine.stamps import new_run_id

    root = repository_root(".")
    forwarded: list[str] = []
    remote = get_remote(root, args.remote)
    profile = run_profile(root, args.profile or remote.profile, snakemake_args)
    for flag, value in (("--name", args.name), ("--profile", profile), ("--resources", args.resources)):
        forwarded += [flag, value] if value else []
    forwarded += ["--replace"] if args.replace else []
    forwarded += [flag for dest, flag in SUBMIT_EXP_RUN_FLAGS.items() if getattr(args, dest, False)]
    forwarded += ["--message", args.message] if getattr(args, "message", None) else []
    forwarded += ["--queued"] if getattr(args, "queued", False) else []
    for flag, values in (("-S", args.set_param), ("--target", args.target), ("--share", args.share)):
        for value in values:
            forwarded += [flag, value]
    pipeline = is_dvc_pipeline(root, snakemake_args)
    _check_name_before_sending(args, root, remote.name)
    if pipeline:
        _check_before_sending(args, root, remote.name)
    # The cluster's clone has the code, not the data: a dvc.yaml run pulls what it needs from the DVC remote.
    forwarded += ["--pull"] if args.pull or pipeline else []
    forwarded += ["--allow-missing"] if args.allow_missing else []
    run_id = submit_remote(
        root, remote, [*forwarded, *(["--", *snakemake_args] if snakemake_args else [])], new_run_id()
    )
    if getattr(args, "queued", False):
        print(f"Queued experiment '{args.name}' on remote {remote.name} (run {run_id}); `snakedvc queue start "
              f"--remote {remote.name}` starts the queue there")  # fmt: skip
        return
    print(f"submitted run {run_id} on remote {remote.name} (profile {profile}); you may disconnect. `snakedvc logs --remote {remote.name} "
          f"-f {run_id}` follows it; `snakedvc pull --remote {remote.name}` brings its experiment here",
          file=sys.stderr)  # fmt: skip


def _check_name_before_sending(args: argparse.Namespace, root: Path, remote: str) -> None:
    """The run's name against this laptop's experiments (pulled ones too) and its runs, before any
    trip; the cluster checks its own in the submit's trip."""
    from snakedvc.engine.names import NameTaken, check_name_is_free
    from snakedvc.engine.remote import RemoteError

    if not args.name:
        return
    how = f"replace it on purpose with snakedvc submit --remote {remote} --replace"
    try:
        check_name_is_free(args.name, root, args.replace, how=how)
    except NameTaken as error:
        raise RemoteError(f"{error} (checked here; nothing was sent to remote {remote})") from None


def _check_before_sending(args: argparse.Namespace, root: Path, remote: str) -> None:
    """A dvc.yaml run's -S values, targets and params checked here, as its dry run (with --pull, as
    the cluster runs it): a mistake is said before any code is pushed, not on the cluster after."""
    from snakedvc.engine.dvcpipeline import ExpRunOptions, dry_run
    from snakedvc.engine.remote import RemoteError

    options = ExpRunOptions(
        () if args.no_hydra else tuple(args.set_param), args.resources, tuple(args.target), True, args.allow_missing,
        args.recursive, args.single_item, args.pipeline, args.all_pipelines, args.downstream,
    )  # fmt: skip
    try:
        dry_run(options.overrides, root, options.resources_file, options.selection(), missing=options.missing())
    except Exception as error:  # noqa: BLE001 (whatever it is, it is said, and nothing is sent)
        raise RemoteError(f"{error} (checked here; nothing was sent to remote {remote})") from None


def _on_remote(args: argparse.Namespace, command: list[str]) -> None:
    """A watching command (runs, logs, cancel, resume) run in the project's clone on the remote."""
    from snakedvc.engine.remote import get_remote, project_name, run_kit
    from snakedvc.engine.runs import repository_root

    root = repository_root(".")
    proc = run_kit(get_remote(root, args.remote), project_name(root), command)
    if proc.returncode != 0:
        raise SystemExit(proc.returncode)


def cmd_remote(args: argparse.Namespace) -> None:
    from snakedvc.engine.remote import Remote, add_remote, list_remotes, probe, remove_remote
    from snakedvc.engine.runs import repository_root

    root = repository_root(".")
    if args.action == "add":
        found, said = "local", ""
        if not args.no_check:  # checked before anything is kept: a remote that fails them is not added
            found, version = probe(Remote(args.name, args.url, args.snakedvc))
            said = f", version {version}"
            if not args.profile:
                said += f"; profile {found} ({'the cluster has sbatch' if found == 'slurm' else 'no sbatch there'})"
        remote = add_remote(root, args.name, args.url, args.snakedvc, args.profile or found)
        print(f"remote {remote.name}: {remote.url} (the kit there: {remote.snakedvc}{said}); its runs use profile "
              f"{remote.profile} unless a run gives --profile")  # fmt: skip
    elif args.action == "remove":
        remove_remote(root, args.name)
    else:
        for remote in list_remotes(root):
            print(f"{remote.name}\t{remote.url}\t{remote.snakedvc}\t{remote.profile}")


def cmd_pull(args: argparse.Namespace) -> None:
    from snakedvc.engine.remote import get_remote, pull
    from snakedvc.engine.runs import repository_root

    root = repository_root(".")
    names = pull(root, get_remote(root, args.remote), args.experiments)
    print("\n".join(names) if names else f"no experiments on remote {args.remote} yet")


def cmd_runs(args: argparse.Namespace) -> None:
    if args.remote:
        return _on_remote(args, ["runs", *(["--json"] if args.json else [])])
    from snakedvc.engine.finish import describe_pending, pending_save
    from snakedvc.engine.runs import describe, format_runs, list_runs, repository_root

    root = repository_root()
    runs = list_runs(root)
    if args.json:
        print(json.dumps([describe(run) for run in runs], indent=2))
        return
    print(format_runs(runs) if runs else "no runs (snakedvc submit starts one)")
    left = pending_save(root)
    if left is not None:  # a run in this workspace whose save failed: the next run here does it first
        print(f"pending save in {root}: {describe_pending(left)} (`snakedvc pending` says more)")


def cmd_ui(args: argparse.Namespace) -> None:
    from snakedvc.engine.runs import repository_root

    try:
        import aiohttp  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as e:
        raise SystemExit(
            f"snakedvc ui: error: {e.name} is not installed: the page needs the `ui` extra "
            "(pip install 'snakedvc[ui]', in the environment that runs snakedvc)"
        ) from None
    from snakedvc.engine.ui.api import LocalSource, RemoteSource, serve_stdio
    from snakedvc.engine.ui.server import serve

    root = repository_root(".")
    if args.stdio:  # the far end of `ui --remote`: answers the API over SSH's stdin and stdout
        serve_stdio(LocalSource(root))
        return
    if args.remote:
        from snakedvc.engine.remote import get_remote, make_clone, project_name, ssh_argv

        remote = get_remote(root, args.remote)
        folder = make_clone(remote, project_name(root))  # also the login's check, with its words
        argv = ssh_argv(remote, [remote.snakedvc, "-C", folder, "ui", "--stdio"])
        source: LocalSource | RemoteSource = RemoteSource(argv, f"remote {remote.name}")
        title = f"{project_name(root)} on {remote.name}"
    else:
        source, title = LocalSource(root), root.name
    try:
        serve(source, args.port, title, lambda line: print(line, flush=True))
    finally:
        if isinstance(source, RemoteSource):
            source.close()


def cmd_pending(args: argparse.Namespace) -> None:
    from snakedvc.engine.finish import WAY_OUT, describe_pending, drop_pending, pending_save
    from snakedvc.engine.runs import repository_root

    root = repository_root()
    if args.action == "drop":
        dropped = drop_pending(root)
        print(f"dropped the pending save: {describe_pending(dropped)}" if dropped else "no pending save here")
        return
    left = pending_save(root)
    if left is None:
        print("no pending save here: every run's save completed")
        return
    print(f"pending save: {describe_pending(left)}")
    print("An earlier run's save failed; the next run of the workflow here does it first. " + WAY_OUT)


def cmd_logs(args: argparse.Namespace) -> None:
    if args.remote:
        return _on_remote(args, ["logs", *(["-f"] if args.follow else []), args.run])
    from snakedvc.engine.runs import find_run, follow, repository_root

    run = find_run(repository_root(), args.run)
    if args.follow:
        for text in follow(run.log, run):
            sys.stdout.write(text)
            sys.stdout.flush()
    else:
        sys.stdout.write(run.log.read_text(errors="replace") if run.log.is_file() else "")


def cmd_cancel(args: argparse.Namespace) -> None:
    if args.remote:
        return _on_remote(args, ["cancel", args.run])
    from snakedvc.engine.runs import cancel, find_run, repository_root

    run = cancel(find_run(repository_root(), args.run))
    print(f"cancelled run {run.id} ({run.name})")


def cmd_resume(args: argparse.Namespace) -> None:
    if args.remote:
        return _on_remote(args, ["resume", args.run])
    from snakedvc.engine.runs import find_run, repository_root, resume

    run, started = resume(find_run(repository_root(), args.run))
    where = f"SLURM job {run.controller_jobs[-1]}" if run.slurm else f"process {run.controller_pid}"
    if started:
        print(f"resumed run {run.id} ({run.name}): controller {where}")
    else:
        print(f"run {run.id} ({run.name}) is {run.state}: its controller ({where}) lives; nothing to resume")


def cmd_clean(args: argparse.Namespace) -> None:
    from snakedvc.engine.runs import clean, repository_root

    for run in clean(repository_root()):
        print(f"removed the workspace of run {run.id} ({run.name}, {run.state})")


def cmd_init(args: argparse.Namespace) -> None:
    from snakedvc.engine.init import init

    done = init(".", config=args.config, dry_run=args.dry_run)
    print("\n".join(done) if done else "nothing to do: the project has everything snakedvc init writes")
    if args.dry_run:
        print("(dry run: nothing written)")


def cmd_controller(args: argparse.Namespace) -> None:
    from snakedvc.engine.controller import main as controller_main

    raise SystemExit(controller_main(args.run_dir))


# Adds one subcommand (name, function, help) with the --log every command takes.
Step = Callable[[str, Any, str], argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snakedvc", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("-C", dest="chdir", metavar="DIR", help="run as if started in DIR (as git -C)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def step(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--log", help="file that receives stderr and log lines")
        return p

    _add_step_commands(step)
    _add_sweep_commands(step)
    _add_run_commands(step)

    # Started by `snakedvc submit`, not by hand: hidden from the command list.
    p = sub.add_parser("controller")
    p.set_defaults(func=cmd_controller)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("run_dir")

    return parser


def _add_step_commands(step: Step) -> None:
    """The commands a workflow's rules run."""
    p = step(
        "launch",
        cmd_launch,
        "run a command on 1 process, N processes (torchrun) or N nodes (srun + torchrun); with --log its stdout "
        "and stderr go there, each rank's lines prefixed and also kept in <log>.ranks/",
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes of the SLURM allocation to run on")
    p.add_argument("--procs-per-node", type=int, default=1, help="processes per node (one per GPU)")
    p.add_argument("--continue-from", metavar="STATE", help="a sweep trial's previous rung's state, for Resumable")
    p.add_argument("--final-state", metavar="STATE", help="where Resumable.finish writes the final state")
    p.add_argument("command_args", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- python train.py ...")

    p = step("stage-run", cmd_stage_run, "run one DVC stage's commands as dvc repro runs them (a job of exp run)")
    p.add_argument("--stage", required=True, help="the stage's address (DVC_STAGE)")
    p.add_argument("--wdir", default=".", help="the stage's wdir, relative to the repository")
    p.add_argument("--remove", nargs="*", default=[], help="the stage's outputs, removed first")
    p.add_argument("--nodes", type=int, default=1, help="with --procs-per-node: nodes snakedvc launch runs on")
    p.add_argument("--procs-per-node", type=int, default=0, help="run each command through snakedvc launch")
    p.add_argument(
        "--keep-thread-limits",
        action="store_true",
        help="keep Snakemake's OMP_NUM_THREADS & co. (the stage's cpus in snakedvc.yaml); else the submit's values",
    )
    p.add_argument(
        "--decision",
        metavar="FILE",
        help="wait for this file, written on the submit host once the upstream stages are recorded: "
        "run, skip (the stage's inputs came out unchanged) or stop",
    )
    p.add_argument("--plan", help="the run's plan.json: audit what the stage's Python processes read")
    p.add_argument("commands", nargs=argparse.REMAINDER, help="-- then each command line as one argument")

    p = step("report", cmd_report, "one self-contained HTML page of the run: metrics, curves, plots, DAG, resources")
    p.add_argument("--out", default="results/report.html", help="where to write it (default results/report.html)")
    p.add_argument("--title", default="", help="the page's title (default: the project folder's name)")
    p.add_argument("--sweep", help="a sweep's report folder to include (default: the last run's, if it was a sweep)")
    p.add_argument(
        "snakemake_args", nargs=argparse.REMAINDER, help="-- then the run's config arguments, for its job DAG"
    )

    p = step("track", cmd_track, "dvc add finished outputs (serialised; submit host only)")
    p.add_argument("paths", nargs="+")

    p = step("restore", cmd_restore, "dvc exp apply NAME and mark its outputs up to date for Snakemake")
    p.add_argument("name")
    p.add_argument("--params", default="results/params.yaml", help="the experiment's effective params file")


def _add_sweep_commands(step: Step) -> None:
    """What the sweep module's rules run, and `sweep-explain`, which a person runs."""
    p = step("sweep-promote", cmd_sweep_promote, "rank one rung's trials by their metric; keep the best")
    p.add_argument("--rung", type=int, required=True)
    p.add_argument("--keep", type=int, required=True, help="how many trials go on to the next rung")
    p.add_argument("--metric", required=True, help="the key in each trial's metrics file")
    p.add_argument("--direction", choices=["min", "max"], required=True)
    p.add_argument("--output", required=True)
    p.add_argument("metrics_files", nargs="*", help="the rung's trial metrics files (.../trials/<trial>/rung<r>/...)")

    p = step("sweep-asha-step", cmd_sweep_asha_step, "an asha sweep's slot: record its last result, decide its next")
    p.add_argument("--decisions", required=True, help="the sweep's decision log (JSON lines)")
    p.add_argument("--plan", required=True, help="trials, rungs, eta, slots, metric, direction (JSON)")
    p.add_argument("--slot", type=int, required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--replay", default="", help="an earlier decision log to follow instead of deciding")
    p.add_argument("--output", required=True, help="the step's decision file")
    p.add_argument("trained", nargs="*", help="the metrics file, then the state, of the trial-rung of the step before")

    p = step("sweep-asha-end", cmd_sweep_asha_end, "an asha sweep's end: winner, each rung, timeline")
    p.add_argument("--decisions", required=True, help="the sweep's decision log (JSON lines)")
    p.add_argument("--plan", required=True, help="trials, rungs, eta, slots, metric, direction (JSON)")
    p.add_argument("--replay", default="", help="the decision log the sweep followed, if it was a replay")
    p.add_argument("--output", required=True, help="the summary (JSON)")

    p = step("sweep-report", cmd_sweep_report, "sweep summary table, metric plot, every trial's files")
    p.add_argument("--plan", required=True, help="the sweep plan (JSON)")
    p.add_argument("--trials", required=True, help="the sweep's trials folder")
    p.add_argument("--leave-out", default="state.pt", help="file of a trial folder not copied (its state)")
    p.add_argument("--output", required=True, help="report directory")
    p.add_argument("decisions", nargs="+", help="every rung's decision file, in order")

    p = step(
        "sweep-explain",
        cmd_sweep_explain,
        "an asha sweep's decisions in order: each result, what the rule made of it, the winner; "
        "exits 1 where a decision is not what the results give",
    )
    p.add_argument("decisions", help="the decision log: <sweep folder>/asha/decisions.jsonl or its report's copy")


def _add_missing_data_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """dvc exp run's --pull and --allow-missing."""
    p.add_argument(
        "--pull", action="store_true",
        help=f"{prefix}pull missing data from the DVC remote: a stage whose only change is missing data is pulled, "
        "not run, and a running stage's missing dependencies first (dvc exp run --pull)",
    )  # fmt: skip
    p.add_argument(
        "--allow-missing", action="store_true",
        help=f"{prefix}skip stages whose only change is missing data (dvc exp run --allow-missing)",
    )  # fmt: skip


def _add_exp_run(step: Step) -> None:
    """`snakedvc exp run`: dvc exp run's options, each stage a job."""
    p = step("exp", cmd_exp_run, "exp run: dvc exp run with every stage of dvc.yaml its own Snakemake (SLURM) job")
    p = p.add_subparsers(dest="action", required=True, metavar="ACTION").add_parser(
        "run", help="as dvc exp run does, in this workspace: snakedvc exp run [options] [TARGETS] [-- snakemake args]"
    )
    loudness = p.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true", help="only errors (dvc exp run -q)")
    loudness.add_argument("-v", "--verbose", action="store_true", help="the kit's and DVC's debug lines")
    p.add_argument("--profile", help="a profile folder, or local / slurm: the project's profiles/local or "
                   "profiles/slurm, else the kit's own (default: local)")  # fmt: skip
    p.add_argument("-S", "--set-param", action="append", default=[], metavar="[FILE:]KEY=VALUE",
                   help="change a param first, as dvc exp run -S does (repeatable)")  # fmt: skip
    p.add_argument("-n", "--name", help="the experiment's name (default: DVC's)")
    p.add_argument("-m", "--message", help="the experiment commit's message (dvc exp run -m)")
    p.add_argument("--dry", action="store_true", help="print the stages that would run, in order; change nothing")
    p.add_argument("-f", "--force", action="store_true",
                   help="run every stage involved, changed or not, and replace the experiment named by -n if it "
                        "exists (dvc exp run -f)")  # fmt: skip
    selection = [
        ("-s", "--single-item", "the targets alone, not the stages they need"),
        ("-p", "--pipeline", "the whole pipelines the targets belong to"),
        ("-P", "--all-pipelines", "every pipeline of the repository"),
        ("-R", "--recursive", "every stage in the folders given as targets"),
        ("", "--downstream", "the targets and the stages that depend on them"),
        ("", "--force-downstream", "every stage after one that runs runs too, changed or not"),
        ("-k", "--keep-going", "after a failed stage, go on with the stages that do not need it (the run fails)"),
        ("", "--no-hydra", "leave params.yaml as it is where DVC composes it with Hydra"),
    ]
    for short, long, help_text in selection:
        p.add_argument(*filter(None, [short, long]), action="store_true", help=f"{help_text} (as dvc exp run)")
    p.add_argument("--resources", metavar="FILE",
                   help="the stages' resources (default: snakedvc.yaml beside dvc.yaml, if there is one)")  # fmt: skip
    p.add_argument("--one-at-a-time", action="store_true",
                   help="run the stages one at a time, in DVC's order, as dvc repro does (for stages that read "
                        "each other's files without naming them in deps; snakedvc.yaml: one_at_a_time: true)")  # fmt: skip
    _add_missing_data_options(p)
    p.add_argument("--remote", metavar="NAME",
                   help="run it on that cluster over SSH, detached (snakedvc submit --remote): prints the run id")  # fmt: skip
    # dvc exp run's options the kit refuses (EXP_RUN_REFUSED says why): taken, so the refusal is a sentence.
    p.add_argument("--queue", action="store_true",
                   help="add it to the queue (one per point of a -S sweep: lr=0.1,0.2), run by snakedvc queue start")  # fmt: skip
    p.add_argument("--run-all", action="store_true", help="start the queue (snakedvc queue start)")
    p.add_argument("-j", "--jobs", type=int, help="with --run-all: queued experiments run at a time")
    for flags in (["-i", "--interactive"], ["--temp"], ["--ignore-errors"]):
        p.add_argument(*flags, action="store_true", help=argparse.SUPPRESS)
    p.add_argument("-C", "--copy-paths", action="append", help=argparse.SUPPRESS)
    p.add_argument(
        "targets", nargs="*", metavar="TARGETS",
        help="stages to run, with the ones they need (default: dvc.yaml's): names, file:stage, paths to dvc.yaml "
        "or .dvc files",
    )  # fmt: skip


def _add_remote_commands(step: Step) -> None:
    """A cluster reached over SSH: naming it, and bringing its experiments home."""
    p = step("remote", cmd_remote, "name a cluster reached over SSH: remote add NAME ssh://USER@HOST/~/runs")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("add", help="name a remote (kept in this clone's git config); checks the login")
    q.add_argument("name")
    q.add_argument("url", help="ssh://[user@]host[:port]/folder: the folder the kit keeps this project's clone in")
    q.add_argument("--snakedvc", default="snakedvc",
                   help="the kit's command on the cluster, e.g. /home/me/env/bin/snakedvc (default: snakedvc on PATH)")  # fmt: skip
    q.add_argument("--profile", help="the profile its runs use unless a run gives one: slurm, local or a folder "
                   "of the project (default: slurm where the cluster has sbatch, else local)")  # fmt: skip
    q.add_argument("--no-check", action="store_true", help="do not log in to check it (the profile: local)")
    q = actions.add_parser("remove", help="forget a remote")
    q.add_argument("name")
    actions.add_parser("list", help="the remotes: name, URL, the kit's command there, profile")

    p = step("pull", cmd_pull, "bring a remote's experiments here: git refs over SSH, data from the DVC remote")
    p.add_argument("--remote", required=True, metavar="NAME", help="the remote (snakedvc remote add)")
    p.add_argument("experiments", nargs="*", metavar="NAME", help="experiments to bring (default: every one)")


def _add_run_commands(step: Step) -> None:
    """The commands a person runs: detached runs and set-up."""
    p = step("submit", cmd_submit, "run the workflow detached, on the code as it is now; prints the run id")
    p.add_argument("--name", help="the run's name, and its DVC experiment's (default: the run id)")
    p.add_argument("--replace", action="store_true", help="replace an experiment of that name (else refused)")
    p.add_argument(
        "--profile", help="Snakemake profile: a folder, or a name under profiles/ (a SLURM one: the controller is a "
        "job; default profiles/local, or for a dvc.yaml with no Snakefile the kit's local one)"
    )  # fmt: skip
    p.add_argument(
        "-S",
        "--set-param",
        action="append",
        default=[],
        metavar="[FILE:]KEY=VALUE",
        help="a dvc.yaml pipeline: change a param in the run's workspace, as dvc exp run -S",
    )
    p.add_argument("--resources", metavar="FILE", help="a dvc.yaml pipeline: its stages' resources (snakedvc.yaml)")
    _add_missing_data_options(p, "a dvc.yaml pipeline: ")
    p.add_argument("--target", action="append", default=[], metavar="STAGE",
                   help="a dvc.yaml pipeline: run this stage and what it needs (repeatable; default all)")  # fmt: skip
    for dest, flag in SUBMIT_EXP_RUN_FLAGS.items():
        p.add_argument(flag, dest=dest, action="store_true", help=f"a dvc.yaml pipeline: dvc exp run's {flag}")
    p.add_argument("--message", help="a dvc.yaml pipeline: the experiment commit's message (dvc exp run -m)")
    p.add_argument("--queued", action="store_true", help="made, not started: an experiment of the queue "
                   "(snakedvc queue start runs it)")  # fmt: skip
    p.add_argument("--share", action="append", default=[], metavar="PATH",
                   help="an ignored path of the repository linked into the run's workspace (repeatable; "
                        "Python environments at the top level are linked anyway)")  # fmt: skip
    p.add_argument("--remote", metavar="NAME",
                   help="submit on that cluster over SSH (snakedvc remote add), from a machine without SLURM")  # fmt: skip
    # Sent by `submit --remote` to the cluster's clone: the frozen code, the run id, push at the end.
    p.add_argument("--commit", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    p.add_argument("--push", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="-- then Snakemake arguments, e.g. -- --config ...")

    _add_exp_run(step)

    _add_remote_commands(step)

    _add_queue_commands(step)

    _add_watch_commands(step)

    p = step("init", cmd_init, "set up this git repository for snakedvc: profiles, .gitignore, DVC, dvc.yaml, config")
    p.add_argument("--config", default="config.yaml", help="the workflow's config file (default config.yaml)")
    p.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")


def _add_queue_commands(step: Step) -> None:
    """DVC's experiment queue: `snakedvc queue ACTION`."""
    p = step("queue", cmd_queue, "DVC's experiment queue (snakedvc exp run --queue), each experiment a detached run")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("start", help="run the queue, -j experiments at a time (each ending starts the next)")
    q.add_argument("-j", "--jobs", type=int, default=1, help="experiments at a time (default 1)")
    queue_actions = [q, actions.add_parser("stop", help="start no more queued experiments; the running ones finish")]
    queue_actions.append(actions.add_parser("status", help="the queued, running and finished experiments of the queue"))
    q = actions.add_parser("logs", help="an experiment's log (its run's controller log)")
    q.add_argument("name")
    q.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    q = actions.add_parser("kill", help="stop running experiments (snakedvc cancel)")
    q.add_argument("names", nargs="+", metavar="NAME")
    q = actions.add_parser("remove", help="remove queued or finished experiments from the queue")
    q.add_argument("names", nargs="*", metavar="NAME")
    for flag, what in (("--all", "every one not running"), ("--queued", "those not started"),
                       ("--success", "those that succeeded"), ("--failed", "those that failed")):  # fmt: skip
        q.add_argument(flag, action="store_true", help=what)
    for q in [*queue_actions, *(actions.choices[name] for name in ("logs", "kill", "remove"))]:
        q.add_argument("--remote", metavar="NAME", help="the queue on that cluster, over SSH (snakedvc remote add)")


def _add_watch_commands(step: Step) -> None:
    """What a person runs to watch and control detached runs, and a pending save."""
    remote_help = "on that remote, over SSH (snakedvc remote add)"
    p = step("runs", cmd_runs, "list submitted runs")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.add_argument("--remote", metavar="NAME", help=remote_help)

    p = step("ui", cmd_ui, "serve a live page of the project's runs, sweeps and experiments (with its token)")
    p.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
    p.add_argument("--remote", metavar="NAME", help="the runs on that remote, over one SSH connection")
    p.add_argument("--stdio", action="store_true", help=argparse.SUPPRESS)

    p = step("logs", cmd_logs, "show a run's controller log")
    p.add_argument("run", help="run id, id prefix or name")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the run ends")
    p.add_argument("--remote", metavar="NAME", help=remote_help)

    p = step("cancel", cmd_cancel, "stop a run: its controller and every SLURM job it submitted")
    p.add_argument("run", help="run id, id prefix or name")
    p.add_argument("--remote", metavar="NAME", help=remote_help)

    p = step("resume", cmd_resume, "restart a lost or failed run's controller; finished steps are kept")
    p.add_argument("run", help="run id, id prefix or name")
    p.add_argument("--remote", metavar="NAME", help=remote_help)

    step("clean", cmd_clean, "remove finished runs' workspaces (their results are in DVC)")

    p = step("pending", cmd_pending, "the save an earlier run left pending (its save failed): show it, or drop it")
    p.add_argument("action", nargs="?", choices=["show", "drop"], default="show",
                   help="show (default), or drop: give the save up (the outputs stay in the workspace)")  # fmt: skip


def _activate_own_environment() -> None:
    """Started by its path from a virtual or conda environment that is not active (by ssh from
    `snakedvc ... --remote`, by cron), the kit puts that environment's bin first on PATH, as
    `activate` would: the workflow's `python`, `snakemake` and `snakedvc` are then that
    environment's, in the kit's processes and in every job they start."""
    prefix = Path(sys.prefix)
    if sys.prefix == sys.base_prefix and not (prefix / "conda-meta").is_dir():
        return  # a system interpreter: PATH is the user's business
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [bindir, os.environ.get("PATH", "")]))


def _not_printed_by_dvc(record: logging.LogRecord) -> bool:
    """False for a record of DVC's packages (dvc, dvc_data, ...) whose top logger has DVC's handlers."""
    top = record.name.partition(".")[0]
    return not (top.startswith("dvc") and logging.getLogger(top).handlers)


def _exp_run_logging(quiet: bool, verbose: bool) -> None:
    """exp run's terminal: the kit's notes with -v (and DVC's debug lines), errors alone with -q,
    else warnings, in DVC's shape ("WARNING: ...")."""
    root = logging.getLogger()
    for handler in root.handlers:  # DVC prints its own records through its own handlers: once, not twice
        handler.addFilter(_not_printed_by_dvc)
    if verbose:
        root.setLevel(logging.DEBUG)
        # Not their debug lines, which `dvc exp run -v` does not show either: dulwich logs each git
        # config file it reads (271 of a remote run's 434 log lines), fsspec each memory file.
        for chatty in ("dulwich", "fsspec"):
            logging.getLogger(chatty).setLevel(logging.INFO)
        return
    root.setLevel(logging.ERROR if quiet else logging.WARNING)
    for handler in root.handlers:
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))


def _user_errors() -> tuple[type[BaseException], ...]:
    """The errors a command reports in one line (imported when one happens: a stage's job starts
    the CLI once per stage, and these modules take a quarter of a second to import)."""
    from snakedvc.engine.config import ConfigError
    from snakedvc.engine.init import InitError
    from snakedvc.engine.runs import RunError
    from snakedvc.engine.sweep.decisions import DecisionLogError
    from snakedvc.engine.tracking import TrackingError

    # PipelineError (dvc.yaml) is a ValueError.
    return (ConfigError, DecisionLogError, FileNotFoundError, InitError, RunError, TrackingError, ValueError)


def _hear_sigint() -> None:
    """SIGINT stops the command (KeyboardInterrupt), also where it came ignored: started in the
    background by a non-interactive shell (`cmd &`, a CI script, nohup), a process inherits SIGINT
    ignored and Python keeps it so, but SIGINT is the kit's stop (a cancel sends it to a run)."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Commands that work in a project (its runs, its DVC experiments): refused in another user's
# (snakedvc.engine.runs.owner), which git and DVC refuse with words that do not say so.
PROJECT_COMMANDS = frozenset(
    {"submit", "runs", "logs", "cancel", "resume", "clean", "pending", "exp", "queue", "pull", "init", "ui"}
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    passed_on = []  # `exp run ... -- ARGS`: ARGS go to Snakemake (argparse cannot split them from TARGETS)
    start = 2 if argv[:1] == ["-C"] else 0
    if argv[start : start + 2] == ["exp", "run"] and "--" in argv:
        argv, passed_on = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = build_parser().parse_args(argv)
    _hear_sigint()
    if args.chdir:
        os.chdir(args.chdir)
    if args.command not in ("exp", "stage-run"):  # DVC's drop-in: stages see the user's PATH, as under DVC
        _activate_own_environment()
    args.snakemake_args = getattr(args, "snakemake_args", passed_on)
    _setup_logging(getattr(args, "log", None))
    if args.command == "exp" and not getattr(args, "log", None):  # DVC's console: its words, not the kit's notes
        _exp_run_logging(args.quiet, args.verbose)
    try:
        if args.command in PROJECT_COMMANDS:
            from snakedvc.engine.runs.owner import refuse_others_project

            refuse_others_project(Path.cwd(), args.command)
        args.func(args)
    except KeyboardInterrupt:  # Ctrl-C or a cancel's SIGINT: what ran is said above; no traceback
        print(f"snakedvc {args.command}: stopped (interrupted)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `snakedvc runs | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit fails too
        return 141
    except Exception as error:
        said = _one_line(error, args)
        if said is None:
            raise
        # One line, as DVC's "ERROR: ..." (the log file too).
        if getattr(args, "log", None):
            log.error("%s", said)
        print(f"snakedvc {args.command}: error: {said}", file=sys.stderr)
        return EXP_ERROR_EXIT if args.command == "exp" else 1
    return 0


def _one_line(error: Exception, args: argparse.Namespace) -> str | None:
    """What an error says in one line, or None where its traceback is shown instead. `exp` answers
    as DVC does: every error one line and exit 255 (e.g. a remote whose filesystem plugin is not
    installed, raised from DVC's own checkout), its causes after it (DVC's "msg: cause"); the
    traceback only with -v."""
    if isinstance(error, _user_errors()):
        return str(error)
    if args.command != "exp" or getattr(args, "verbose", False):
        return None
    try:
        from dvc.exceptions import DvcException
    except ImportError:  # the kit's core alone, without DVC
        DvcException = OSError  # noqa: N806

    parts: list[str] = []
    cause: BaseException | None = error
    while cause is not None and len(parts) < 5:
        text = str(cause) or type(cause).__name__
        if text not in parts:
            parts.append(text)
        cause = cause.__cause__ or cause.__context__
    expected = isinstance(error, (DvcException, ImportError, OSError))
    return ": ".join(parts) if expected else f"unexpected error - {': '.join(parts)} (-v shows where)"
