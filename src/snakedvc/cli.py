"""`snakedvc <command>`: what a workflow's rules and a user call.

Each step takes its slice of the validated config as JSON (`--params`), its
inputs and outputs as paths, and `--log`: stderr and logging go there first
thing, so a failed rule's log holds the error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from snakedvc import __version__

log = logging.getLogger("snakedvc")


class UserError(Exception):
    """An error caused by input or config, reported without a traceback."""


def _setup_logging(log_path: str | None) -> None:
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    warnings.filterwarnings("ignore", message=".*MorganGenerator.*")


def _params(args: argparse.Namespace) -> dict[str, Any]:
    try:
        value: dict[str, Any] = json.loads(args.params)
    except json.JSONDecodeError as error:
        raise UserError(f"--params is not valid JSON: {error}") from error
    return value


def cmd_launch(args: argparse.Namespace) -> None:
    from snakedvc.launch import Layout, run

    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    run(Layout(nodes=args.nodes, procs_per_node=args.procs_per_node), command)


def cmd_sweep_promote(args: argparse.Namespace) -> None:
    from snakedvc.io import atomic_path
    from snakedvc.sweep import promote, read_trial_result

    # Each input is .../trials/<trial>/rung<r>.
    results = {Path(d).parent.name: read_trial_result(d) for d in args.trial_dirs}
    decision = {"rung": args.rung, **promote(results, args.keep)}
    with atomic_path(args.output) as tmp:
        tmp.write_text(json.dumps(decision, indent=2, sort_keys=True) + "\n")
    for trial in decision["failed"]:
        log.warning("rung %d: trial %s failed and is excluded: %s", args.rung, trial, results[trial].get("error"))
    log.info("rung %d ranking %s; promoted %s", args.rung, decision["ranking"], decision["survivors"])


def cmd_sweep_report(args: argparse.Namespace) -> None:
    import shutil

    import pandas as pd

    from snakedvc.io import atomic_path
    from snakedvc.sweep import format_summary, plot_valid_loss, summarise

    plan = json.loads(Path(args.plan).read_text())
    final = Path(args.final)
    metrics = json.loads((final / "metrics.json").read_text())
    table = summarise(plan, args.sweep_dir, metrics)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.json", "predictions.csv", "parity.png", "loss.csv"):
        shutil.copyfile(final / name, out / name)
    histories = {}
    for row in table.itertuples():
        if row.status != "ok":
            continue
        trial_dir = Path(args.sweep_dir) / "trials" / str(row.trial) / f"rung{int(row.rung)}"
        (out / "trials" / str(row.trial)).mkdir(parents=True, exist_ok=True)
        for name in ("model.pt", "history.csv"):
            shutil.copyfile(trial_dir / name, out / "trials" / str(row.trial) / name)
        histories[str(row.trial)] = pd.read_csv(trial_dir / "history.csv")
    best = next((str(r.trial) for r in table.itertuples() if r.best), None)
    plot_valid_loss(histories, best, out / "valid_loss.png")
    with atomic_path(out / "summary.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    shutil.copyfile(args.plan, out / "plan.json")
    text = format_summary(table)
    (out / "summary.txt").write_text(text + "\n")
    log.info("sweep %s (%d epochs scheduled):\n%s", plan["name"], plan["total_epochs"], text)
    print(text)


def cmd_track(args: argparse.Namespace) -> None:
    from snakedvc.tracking import track

    track(args.paths)
    log.info("recorded in DVC: %s", " ".join(args.paths))


def cmd_restore(args: argparse.Namespace) -> None:
    from snakedvc.tracking import restore

    restore(args.name, params_file=args.params)
    print(f"restored {args.name}; `snakemake -n` now plans only what differs from it")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snakedvc", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)

    def step(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--log", help="file that receives stderr and log lines")
        return p

    p = step("launch", cmd_launch, "run a command on 1 process, N processes (torchrun) or N nodes (srun + torchrun)")
    p.add_argument("--nodes", type=int, default=1, help="nodes of the SLURM allocation to run on")
    p.add_argument("--procs-per-node", type=int, default=1, help="processes per node (one per GPU)")
    p.add_argument("command_args", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- python train.py ...")

    p = step("sweep-promote", cmd_sweep_promote, "rank one rung's trials by validation RMSE; keep the best")
    p.add_argument("--rung", type=int, required=True)
    p.add_argument("--keep", type=int, required=True, help="how many trials go on to the next rung")
    p.add_argument("--output", required=True)
    p.add_argument("trial_dirs", nargs="*", help="the rung's trial directories (.../trials/<trial>/rung<r>)")

    p = step("sweep-report", cmd_sweep_report, "sweep summary table, validation-loss plot, best model's files")
    p.add_argument("--plan", required=True, help="the sweep plan (JSON file)")
    p.add_argument("--sweep-dir", required=True)
    p.add_argument("--final", required=True, help="directory with the best trial's test evaluation")
    p.add_argument("--output", required=True, help="report directory")

    p = step("track", cmd_track, "dvc add finished outputs (serialised; submit host only)")
    p.add_argument("paths", nargs="+")

    p = step("restore", cmd_restore, "dvc exp apply NAME and mark its outputs up to date for Snakemake")
    p.add_argument("name")
    p.add_argument("--params", default="results/params.yaml", help="the experiment's effective params file")

    return parser


def main(argv: list[str] | None = None) -> int:
    from snakedvc.config import ConfigError
    from snakedvc.tracking import TrackingError

    args = build_parser().parse_args(argv)
    _setup_logging(getattr(args, "log", None))
    try:
        args.func(args)
    except (UserError, ConfigError, FileNotFoundError, TrackingError, ValueError) as error:
        log.error("%s", error)
        print(f"snakedvc {args.command}: error: {error}", file=sys.stderr)
        return 1
    return 0
