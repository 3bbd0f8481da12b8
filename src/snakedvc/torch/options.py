"""The command-line options of a resumable trainer, without importing torch (a multi-command CLI
builds its parser for every command)."""

from __future__ import annotations

import argparse

# Where `snakedvc launch --continue-from/--final-state` leaves a sweep trial's states for Resumable.
CONTINUE_FROM_ENV = "SNAKEDVC_CONTINUE_FROM"
FINAL_STATE_ENV = "SNAKEDVC_FINAL_STATE"


def add_resume_arguments(
    parser: argparse.ArgumentParser,
    *,
    checkpoint_dir: str = ".checkpoints",
    continue_from: str = "--continue-from",
    final_state: str = "--final-state",
) -> None:
    """Add --checkpoint-dir, --continue-from, --final-state and --lease-wait, which `Resumable.from_args` reads.

    --continue-from and --final-state may be named otherwise; their values land in
    ``args.continue_from`` and ``args.final_state`` either way.
    """
    parser.add_argument("--checkpoint-dir", default=checkpoint_dir, help="where this run's checkpoints live")
    parser.add_argument(
        "--lease-wait",
        type=float,
        default=60.0,  # checkpoint.DEFAULT_LEASE_WAIT_S (not imported here: it imports torch)
        metavar="SECONDS",
        help="how long to wait for another trainer of the same run that holds the checkpoint folder "
        "(a retried SLURM job whose predecessor still writes its SIGTERM checkpoint) before failing",
    )
    parser.add_argument(
        continue_from,
        dest="continue_from",
        metavar="STATE",
        help="final state of an earlier, shorter run to continue when there is no checkpoint (a sweep's previous rung)",
    )
    parser.add_argument(
        final_state,
        dest="final_state",
        metavar="STATE",
        help="write the final training state here, for a later continuation",
    )
