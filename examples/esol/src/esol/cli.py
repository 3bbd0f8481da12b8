"""One entry point, `python -m esol <step>`, that the ESOL workflow's rules call.

Each step takes its slice of the validated config as JSON (`--params`), its
inputs and outputs as paths, and `--log`: stderr and logging go there first
thing, so a failed rule's log holds the error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

from esol import __version__
from snakedvc.torch import add_resume_arguments

log = logging.getLogger("esol")


class UserError(Exception):
    """An error caused by input or config, reported without a traceback."""


def _setup_logging(log_path: str | None) -> None:
    from snakedvc import log_to

    log_to(log_path)
    warnings.filterwarnings("ignore", message=".*MorganGenerator.*")


def _params(args: argparse.Namespace) -> dict[str, Any]:
    try:
        value: dict[str, Any] = json.loads(args.params)
    except json.JSONDecodeError as error:
        raise UserError(f"--params is not valid JSON: {error}") from error
    return value


def cmd_split(args: argparse.Namespace) -> None:
    from esol.config import SplitConfig, section
    from esol.data import read_molecules, split_molecules, write_split

    params = _params(args)
    data = params["data"]
    table = read_molecules(args.input, data["smiles_column"], data["target_column"], data.get("limit", 0))
    parts = split_molecules(table, section(SplitConfig, params["split"]))
    for name, path in zip(("train", "valid", "test"), (args.train, args.valid, args.test), strict=True):
        write_split(parts[name], path)
        log.info("%s: %d molecules -> %s", name, len(parts[name]), path)


def cmd_featurise(args: argparse.Namespace) -> None:
    from esol.config import FeaturiseConfig, section
    from esol.features import featurise_file, uses_fast_path

    cfg = section(FeaturiseConfig, _params(args))
    if not 0 <= args.shard < args.shards:
        raise UserError(f"--shard {args.shard} is not in 0..{args.shards - 1} (--shards {args.shards})")
    result = featurise_file(
        args.input, args.output, args.rejects, cfg, args.shard, args.shards, cfg.chunk_size, stored=args.stored
    )
    where = str(args.input) if args.shards == 1 else f"{args.input} shard {args.shard + 1} of {args.shards}"
    engine = "RDKit MorganGenerator" if uses_fast_path(cfg) else "molflux"
    n_valid = result.n_input - len(result.rejects)
    log.info(
        "featurised %d of %d molecules (%s via %s) from %s -> %s",
        n_valid,
        result.n_input,
        cfg.representation,
        engine,
        where,
        args.output,
    )


def cmd_gather_features(args: argparse.Namespace) -> None:
    from esol.config import FeaturiseConfig, section
    from esol.features import gather_features

    cfg = section(FeaturiseConfig, _params(args))
    if len(args.features) != len(args.shard_rejects):
        raise UserError(f"{len(args.features)} feature shards but {len(args.shard_rejects)} reject files")
    n_valid, rejects = gather_features(
        args.features, args.shard_rejects, args.output, args.rejects, cfg, args.where, stored=args.stored
    )
    log.info(
        "gathered %d shards: %d molecules, %d rejected -> %s", len(args.features), n_valid, len(rejects), args.output
    )


def cmd_train(args: argparse.Namespace) -> None:
    from esol.config import TrainConfig, section
    from esol.errors import TrainingDivergedError
    from esol.features import FeatureSet, load_features
    from esol.model import save_model
    from esol.streaming import StreamedFeatures, streamed_features
    from esol.train import best_metrics, train_model, write_trial_metrics
    from snakedvc.live import EpochLog
    from snakedvc.torch import Resumable, session

    params = _params(args)
    cfg = section(TrainConfig, params)
    # Keyed by what determines the result: another config or other features never resume from it.
    if not args.stream and (len(args.train) > 1 or len(args.valid) > 1):
        raise UserError("several features files per split need --stream (or gather them into one first)")
    train: FeatureSet | StreamedFeatures
    valid: FeatureSet | StreamedFeatures
    if args.stream:  # every shard checked first: a missing or cut one is named before anything else
        train, valid = (
            streamed_features(p, cfg.seed, args.loader_workers, args.block_rows) for p in (args.train, args.valid)
        )
    resume = Resumable.from_args(
        args, params, [*args.train, *args.valid], keep=cfg.checkpoint_keep, keep_checkpoints=cfg.keep_checkpoints
    )
    with session() as ctx:
        # Every epoch's losses in dvclive's files (rank 0), readable while the job runs.
        live = EpochLog(args.live, main=ctx.is_main, params=params)
        if not args.stream:
            train, valid = load_features(args.train[0]), load_features(args.valid[0])
        try:
            result = train_model(train, valid, cfg, ctx, resume, live=live)
        except TrainingDivergedError as error:
            # A sweep trial that diverges failed on its own values: that is its result (excluded
            # from promotion, the sweep goes on). Any other error fails the job.
            if not args.result:
                raise
            if ctx.is_main:
                log.error("trial failed: %s", error)
                write_trial_metrics(args.result, error=str(error))
                # Snakemake wants every declared output; the kit reads only the error.
                for path in (args.model, args.final_state):
                    if path:
                        Path(path).touch()
                live.finish()
            return
        if not ctx.is_main:
            return
        save_model(args.model, result.model, result.meta)
        live.finish(**best_metrics(result.history))
        log.info("best epoch %d; model -> %s", result.best_epoch, args.model)
        if args.result:
            write_trial_metrics(args.result, result.history, result.epochs_trained)


def cmd_evaluate(args: argparse.Namespace) -> None:
    from esol.evaluate import parity_plot, predict, regression_metrics, write_metrics, write_predictions
    from esol.features import load_features
    from esol.model import load_model

    model, meta = load_model(args.model)
    test = load_features(args.test)
    y_pred = predict(model, meta, test.X)
    metrics = regression_metrics(test.y, y_pred)
    write_metrics(metrics, args.metrics)
    write_predictions(test, y_pred, args.predictions)
    parity_plot(test.y, y_pred, metrics, args.parity)
    log.info("test RMSE %.4f MAE %.4f R2 %.4f (n=%d)", metrics["rmse"], metrics["mae"], metrics["r2"], metrics["n"])


def print_summary(metrics_path: str | Path) -> None:
    path = Path(metrics_path)
    if not path.is_file():
        return
    metrics = json.loads(path.read_text())
    print(
        f"esol: test RMSE {metrics['rmse']:.3f}  MAE {metrics['mae']:.3f}  "
        f"R² {metrics['r2']:.3f}  (n={metrics['n']}, {path})"
    )


def _add_model_steps(step: Any) -> None:
    """The steps that train and evaluate the model."""
    p = step("train", cmd_train, "train the MLP")
    p.add_argument("--params", required=True, help="JSON of the train config section")
    p.add_argument("--train", nargs="+", required=True, help="the training split's features (its shards when --stream)")
    p.add_argument("--valid", nargs="+", required=True, help="the validation split's features (likewise)")
    p.add_argument(
        "--stream",
        action="store_true",
        help="read the splits a batch at a time from their (stored) features files instead of loading them whole",
    )
    p.add_argument("--loader-workers", type=int, default=0, help="with --stream: DataLoader processes reading ahead")
    p.add_argument(
        "--block-rows",
        type=int,
        default=0,
        help="with --stream: 0, the in-memory batch order; N, shuffled blocks of N rows (fewer reads)",
    )
    p.add_argument("--model", required=True)
    p.add_argument("--live", required=True, help="dvclive folder: params and every epoch's losses (rank 0)")
    # --checkpoint-dir, and the sweep's --resume-from (a previous rung's final state) and --state-out.
    add_resume_arguments(
        p, checkpoint_dir=".checkpoints/train", continue_from="--resume-from", final_state="--state-out"
    )
    p.add_argument(
        "--result",
        help="sweep trial mode: write the validation metrics here as JSON (valid_rmse); "
        "a trial that diverges writes its error there and exits 0",
    )

    p = step("evaluate", cmd_evaluate, "test metrics, predictions, parity plot")
    p.add_argument("--model", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--metrics", required=True)
    p.add_argument("--predictions", required=True)
    p.add_argument("--parity", required=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="esol", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)

    def step(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--log", help="file that receives stderr and log lines")
        return p

    p = step("split", cmd_split, "split the raw table into train/valid/test")
    p.add_argument("--params", required=True, help="JSON with the data and split config sections")
    p.add_argument("--input", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--valid", required=True)
    p.add_argument("--test", required=True)

    p = step("featurise", cmd_featurise, "featurise one split; invalid SMILES go to a rejects file")
    p.add_argument("--params", required=True, help="JSON of the featurise config section")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--rejects", required=True)
    p.add_argument("--shard", type=int, default=0, help="which block of rows (0-based)")
    p.add_argument("--shards", type=int, default=1, help="how many blocks the split is cut into")
    p.add_argument("--stored", action="store_true", help="arrays uncompressed: training can stream rows from it")

    p = step("gather-features", cmd_gather_features, "concatenate feature shards in order; check rejects")
    p.add_argument("--params", required=True, help="JSON of the featurise config section")
    p.add_argument("--where", required=True, help="what the shards are of (named in errors)")
    p.add_argument("--features", nargs="+", required=True, help="the shards' features files, in order")
    p.add_argument("--shard-rejects", nargs="+", required=True, help="the shards' rejects files, in order")
    p.add_argument("--output", required=True)
    p.add_argument("--rejects", required=True)
    p.add_argument("--stored", action="store_true", help="arrays uncompressed: training can stream rows from it")

    _add_model_steps(step)

    return parser


def main(argv: list[str] | None = None) -> int:
    from esol.data import DataError
    from esol.errors import TrainingDivergedError
    from esol.features import TooManyRejectsError
    from snakedvc import ConfigError
    from snakedvc.torch import EXIT_CHECKPOINTED, CheckpointBusy, TrainingStopped

    args = build_parser().parse_args(argv)
    _setup_logging(getattr(args, "log", None))
    try:
        args.func(args)
    except TrainingStopped as stopped:
        log.error("%s", stopped)
        # Also on stdout, which is the SLURM job log that the plugin keeps for failed jobs:
        # Snakemake starts the rule's own log afresh when it retries the job.
        print(f"esol {args.command}: {stopped}", flush=True)
        return EXIT_CHECKPOINTED
    except (
        UserError,
        CheckpointBusy,
        ConfigError,
        DataError,
        FileNotFoundError,
        TooManyRejectsError,
        TrainingDivergedError,
        ValueError,
    ) as error:
        log.error("%s", error)
        print(f"esol {args.command}: error: {error}", file=sys.stderr)
        return 1
    return 0
