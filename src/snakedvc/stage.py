"""A DVC stage's commands run as `dvc repro` runs them, inside a job: no DVC command, no lock.

DVC runs each command line by the user's shell (``$SHELL --noprofile --norc -c`` for bash and
zsh) in the stage's wdir, with ``DVC_ROOT`` and ``DVC_STAGE`` set, one after another, stopping at
the first that fails; before that it removes the stage's outputs. So does this.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from snakedvc import launch
from snakedvc.launch import Layout

log = logging.getLogger(__name__)

# Options DVC passes to these shells so that no start-up file changes the command's environment.
QUIET_SHELL_OPTIONS = {"bash": ["--noprofile", "--norc"], "zsh": ["--no-rcs"]}


def shell_command(command: str, shell: str | None = None) -> list[str]:
    shell = shell or os.environ.get("SHELL") or "/bin/sh"
    return [shell, *QUIET_SHELL_OPTIONS.get(Path(shell).name, []), "-c", command]


def run_stage(
    name: str,
    commands: Sequence[str],
    wdir: str | Path,
    remove: Sequence[str],
    root: str | Path = ".",
    layout: Layout | None = None,
) -> int:
    """Remove ``remove`` (paths under ``root``), then run ``commands`` in ``wdir``; the first
    failing command's exit status, or 0. With a ``layout`` each command runs through `snakedvc
    launch` (N processes, N nodes, a job step of its own)."""
    root = Path(root).resolve()
    for path in remove:
        target = root / path
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    env = {**os.environ, "DVC_ROOT": str(root), "DVC_STAGE": name}
    for command in commands:
        log.info("stage %s: > %s", name, command)
        argv = shell_command(command)
        if layout:
            argv = launch.here(layout, argv)
            log.info("stage %s: launch: %s", name, shlex.join(argv))
        code = subprocess.run(argv, cwd=root / wdir, env=env).returncode
        if code != 0:
            log.error("stage %s: the command exited with status %d: %s", name, code, command)
            return code
    return 0
