"""One check for the names that become git refs: DVC experiments (`refs/exps/…/<name>`), detached runs,
sweeps (whose trials are `<sweep>-<trial>` experiments). Used at the start of a run and by every
place that makes such a ref, so a name that would fail at the end fails before any job."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

# Set by a submitted run's controller (snakedvc.engine.controller): the run's experiment name, and
# whether it may replace an experiment of that name (snakedvc submit --replace).
EXPERIMENT_NAME_ENV = "SNAKEDVC_EXPERIMENT_NAME"
EXPERIMENT_REPLACE_ENV = "SNAKEDVC_EXPERIMENT_REPLACE"
# Set where a Snakemake run is no run of the user's (snakedvc restore's touch): no experiment is saved.
SKIP_SAVE_ENV = "SNAKEDVC_SKIP_EXP_SAVE"

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


class NameTaken(ValueError):
    """An experiment name in use: saved already, or claimed by a live run. The message says how to proceed."""


REPLACE_HINT = "replace it on purpose with snakedvc={experiment: {replace: true}} (DVC's `exp save -f`)"


def experiment_refs(root: str | Path = ".") -> dict[str, str]:
    """Every experiment of the repository, name -> ref, as DVC keeps them: refs/exps/<2>/<38>/<name>
    (the baseline commit's hash split, then the name). DVC's own scratch refs (refs/exps/exec/…,
    refs/exps/runs/…) are no experiments. The one reading of the layout: names, saves, restores."""
    proc = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cwd=root, capture_output=True, text=True
    )
    found = {}
    for ref in proc.stdout.split():
        parts = ref.split("/")
        if len(parts) == 5 and len(parts[2]) == 2 and len(parts[3]) == 38:
            found[parts[4]] = ref
    return found


def experiment_ref(name: str, root: str | Path = ".") -> str | None:
    """The ref of the experiment named ``name`` (refs/exps/<baseline>/<name>), or None."""
    return experiment_refs(root).get(name)


def experiment_holding_workspace(root: str | Path = ".", newest: int = 200) -> str | None:
    """The newest experiment whose every change to its baseline (.dvc files, params, metrics) the
    workspace holds byte for byte: the one whose results these are (after a restore, or a sweep, not
    the last one saved). None where none of the ``newest`` experiments is."""
    names = {ref: name for name, ref in experiment_refs(root).items()}
    listed = subprocess.run(
        ["git", "for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/exps"],
        cwd=root, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    refs = [ref for ref in listed if ref in names][:newest]
    top = Path(
        subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True).stdout.strip()
        or root
    )
    changes = {}
    for ref in refs:
        # raw lines: ":<mode> <mode> <blob> <blob> <status>\t<path>" against the experiment's baseline
        diff = subprocess.run(["git", "diff-tree", "-r", f"{ref}^", ref], cwd=top, capture_output=True, text=True)
        changes[ref] = {
            line.split("\t", 1)[1]: line.split()[3]
            for line in diff.stdout.splitlines()
            if line.startswith(":") and "\t" in line
        }
    paths = sorted({path for changed in changes.values() for path in changed if (top / path).is_file()})
    hashed = subprocess.run(
        ["git", "hash-object", "--stdin-paths"], cwd=top, input="\n".join(paths), capture_output=True, text=True
    ).stdout.split()
    workspace = dict(zip(paths, hashed, strict=True)) if len(hashed) == len(paths) else {}
    absent = "0" * 40  # the blob of a file the experiment deleted
    for ref in refs:
        if changes[ref] and all(workspace.get(path, absent) == blob for path, blob in changes[ref].items()):
            return names[ref]
    return None


def describe_experiment(ref: str, root: str | Path = ".") -> str:
    """When and on which commit an experiment was saved, in words."""
    shown = subprocess.run(
        ["git", "log", "-1", "--date=format:%Y-%m-%d %H:%M", "--format=%cd|%h|%p", ref],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    when, commit, parents = (shown.split("|") + ["", "", ""])[:3]
    return f"saved {when} as commit {commit}, on baseline {parents.split()[0] if parents else '?'}"


def check_name_is_free(name: str, root: str | Path = ".", replace: bool = False, how: str = REPLACE_HINT) -> None:
    """Before any job: NameTaken where an experiment ``name`` exists (unless ``replace``) or another live
    run of this repository has claimed it."""
    ref = experiment_ref(name, root)
    if ref and not replace:
        raise NameTaken(
            f"experiment {name!r} exists already ({describe_experiment(ref, root)}; `dvc exp show -A` lists it). "
            f"A run never replaces an experiment unless asked: choose another name, or {how}"
        )
    holder = claim_holder(name, root)
    if holder:
        raise NameTaken(f"experiment name {name!r} is claimed by a run that is going: {holder}. Choose another name")


def _claims(root: str | Path) -> Path | None:
    proc = subprocess.run(
        ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=root, capture_output=True, text=True
    )
    return Path(proc.stdout.strip()) / "snakedvc-names" if proc.returncode == 0 else None


def claim_holder(name: str, root: str | Path = ".") -> str | None:
    """Who holds a live claim on ``name`` (in words), or None; a claim whose process is gone is stale."""
    folder = _claims(root)
    path = folder / name if folder else None
    if path is None or not path.is_file():
        return None
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if held.get("pid") == os.getpid():
        return None
    if held.get("host") == socket.gethostname() and not process_alive(int(held.get("pid", 0))):
        return None
    return (
        f"process {held.get('pid')} on {held.get('host')} since {held.get('since')} ({path}: remove it if that run "
        "is gone)"
    )


def claim_name(name: str, root: str | Path = ".") -> None:
    """Claim ``name`` for this process's run (the repository's git folder, shared by its worktrees), so that
    a second run started at once with the same name is refused; NameTaken if a live run holds it."""
    folder = _claims(root)
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = claim_holder(name, root)
            if holder:
                raise NameTaken(
                    f"experiment name {name!r} is claimed by a run that is going: {holder}. Choose another name"
                ) from None
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(mine)
        return


def release_name(name: str, root: str | Path = ".") -> None:
    folder = _claims(root)
    if folder is None:
        return
    path = folder / name
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (one we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
