"""Whose project this is: on a login node a lab shares, the kit works only in the user's own.

Why: git refuses a repository that another user owns ("dubious ownership"), and DVC cannot take
the project's locks there, so another user's project failed with "is not in a git repository" or
"Permission denied: .../.dvc/tmp/lock", and `snakedvc cancel` in a colleague's project said the
same. Here such a command is refused first, saying whose project it is and what to do instead.
root (a cluster's admin) is not refused.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from snakedvc.engine.runs.record import RunError


def project_folder(start: Path) -> Path | None:
    """The folder of the git working tree that holds ``start`` (found by its `.git`, without git,
    which refuses another user's), or None outside one."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (a container's, an NFS mount's)
        return f"uid {uid}"


def writable_by(folder: Path, uid: int) -> bool:
    """Whether user ``uid`` may write in ``folder`` (ourselves: as the kernel says; another: by its mode)."""
    if uid == os.geteuid():
        return os.access(folder, os.W_OK)
    mode, gid = folder.stat().st_mode, folder.stat().st_gid
    try:
        name = pwd.getpwuid(uid)
        groups = {name.pw_gid} | {group.gr_gid for group in grp.getgrall() if name.pw_name in group.gr_mem}
    except KeyError:
        groups = set()
    return bool(mode & stat.S_IWOTH or (mode & stat.S_IWGRP and gid in groups))


def refuse_others_project(start: Path, command: str, uid: int | None = None) -> None:
    """Raise RunError if the project holding ``start`` belongs to another user than ``uid`` (ours)
    and we may not write there. (A project a lab shares on purpose, writable by its group, passes:
    git then asks for `safe.directory`, and cancel and resume still refuse the others' runs.)"""
    uid = os.geteuid() if uid is None else uid
    folder = project_folder(start.resolve())
    if uid == 0 or folder is None:
        return
    owner = folder.stat().st_uid
    if owner == uid or writable_by(folder, uid):
        return
    whose, me = user_name(owner), user_name(uid)
    raise RunError(
        f"{folder} is {whose}'s project, not yours ({me}): snakedvc {command} works only in your own projects, "
        f"and lists, cancels and resumes only your own runs. To run its pipeline yourself, clone it "
        f"(git clone {folder} ~/{folder.name}); to stop one of {whose}'s runs, ask {whose} (or a SLURM admin)."
    )


def refuse_others_run(run_dir: Path, run_id: str, verb: str, uid: int | None = None) -> None:
    """Raise RunError if the run whose record is ``run_dir`` was submitted by another user."""
    uid = os.geteuid() if uid is None else uid
    owner = run_dir.stat().st_uid
    if uid == 0 or owner == uid:
        return
    whose = user_name(owner)
    raise RunError(
        f"run {run_id} is {whose}'s, not yours ({user_name(uid)}): only {whose} (or a SLURM admin) can {verb} it."
    )
