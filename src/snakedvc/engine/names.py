"""One check for the names that become git refs: DVC experiments (`refs/exps/…/<name>`), detached runs,
sweeps (whose trials are `<sweep>-<trial>` experiments). Used at the start of a run and by every
place that makes such a ref, so a name that would fail at the end fails before any job."""

from __future__ import annotations

import re
import shutil
import subprocess

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def validate_experiment_name(name: str, what: str = "experiment name") -> str:
    """Return ``name`` if git (and so DVC) accepts it as an experiment's ref name, else raise ValueError
    naming it and the rule it breaks."""
    if not _NAME.match(name):
        raise ValueError(
            f"{what} {name!r} is not allowed: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    if ".." in name or name.endswith((".lock", ".")):
        raise ValueError(f"{what} {name!r} is not allowed: git refuses '..', a trailing '.' and a '.lock' ending")
    if shutil.which("git"):  # git's own rules are the authority (DVC checks experiment refs with them)
        checked = subprocess.run(["git", "check-ref-format", f"refs/exps/{name}"], capture_output=True)
        if checked.returncode != 0:
            raise ValueError(f"{what} {name!r} is not a valid git ref name (git check-ref-format refused it)")
    return name
