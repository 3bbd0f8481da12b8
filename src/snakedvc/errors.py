"""The kit's exceptions and the resume helpers' exit status, importable without torch or the
engine's packages (a CLI can catch them for every subcommand without paying torch's import, ≈1 s
and ≈300 MB; a step's own config checks raise ConfigError without jsonschema installed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type."""


def config_error_ends_run(error: ConfigError) -> NoReturn:
    """Inside a Snakefile (kit.smk's calls): ``error`` said as one line and the run ended, exit 1.
    Raised there, Snakemake shows it with the kit's file and stack lines, which read as a crash
    of the kit; the message alone names the key and what to do. `snakemake --verbose` raises it."""
    if "--verbose" in sys.argv:
        raise error
    print(f"ConfigError: {error}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None


# Exit status of a trainer that checkpointed and stopped on request (EX_TEMPFAIL):
# non-zero, so Snakemake retries the job, which resumes.
EXIT_CHECKPOINTED = 75


class TrainingStopped(SystemExit):
    """Training checkpointed and stopped on request (SIGTERM); a rerun resumes.

    A SystemExit with code EXIT_CHECKPOINTED: left uncaught, the script exits 75 with nothing
    to write (an ``except Exception`` does not swallow it either). Catch it to say more.
    """

    def __init__(self, checkpoint: Path | None, epoch: int, step: int, signame: str = "request") -> None:
        where = f"checkpoint kept: {checkpoint}" if checkpoint else "no checkpoint store"
        super().__init__(f"stopped on {signame} at epoch {epoch} step {step}; {where}; a rerun resumes from it")
        self.code = EXIT_CHECKPOINTED
        self.checkpoint = checkpoint


class NoProcessGroup(RuntimeError):
    """A trainer started on N processes (torchrun's WORLD_SIZE > 1) reached training without a
    process group: said with what to add, where torch would fail later with its own words."""


class CheckpointBusy(RuntimeError):
    """Another live trainer holds the lease on a checkpoint folder (``holder``: its lease record)."""

    def __init__(self, message: str, lease_file: Path | None = None, holder: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.lease_file = lease_file
        self.holder = holder or {}
