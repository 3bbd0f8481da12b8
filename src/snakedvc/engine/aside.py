"""`snakedvc restore` says what it changes, and leaves the untracked files alone (issue 50).

`dvc exp apply` (which restore runs) also removed untracked files the experiment does not hold: a
tutorial user's prepared data (results/data.npz, no rule tracks it) was gone, and `snakemake -n`
then planned the whole pipeline again. Every untracked file (ignored ones too) is moved aside
under .snakedvc/ before the apply (a rename: no copy) and put back where the apply left nothing;
where the experiment has its own version of a path, that version stays. Python environments
(a project's .venv) stay where they are.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

# Folders of git, DVC, Snakemake and the kit: theirs, not the user's files.
NOT_THE_USERS = (".git", ".dvc", ".snakemake", ".snakedvc", ".checkpoints")
ASIDE = Path(".snakedvc") / "restore-aside"


# A file that marks its folder as a Python environment (venv, conda): restore leaves such a folder
# where it is. DVC never touches it, and moving it would pull the running interpreter from under
# restore itself (a project's .venv, as the tutorial makes it) and cost a minute of renames.
ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta/history")


def untracked(root: Path | str) -> list[str]:
    """Files under ``root`` that git does not track (ignored ones too), relative to ``root``; not those
    of Python environments."""
    listed = subprocess.run(["git", "ls-files", "--others", "-z"], cwd=root, capture_output=True, text=True, check=True)
    names = [p for p in listed.stdout.split("\0") if p and p.split("/", 1)[0] not in NOT_THE_USERS]
    environments = tuple(
        name.removesuffix(marker) for name in names for marker in ENVIRONMENT_MARKERS if name.endswith("/" + marker)
    )
    return sorted(name for name in names if not name.startswith(environments))


@contextlib.contextmanager
def untracked_kept(root: Path | str) -> Iterator[list[str]]:
    """Move the untracked files aside for the body, then put back each one whose path the body left
    empty. Yields a list that holds, once the body is done, the files put back."""
    base = Path(root)
    aside = base / ASIDE
    if aside.exists():  # an earlier restore that was killed: put its files back first
        _put_back(base, aside, _files_under(aside))
    moved: list[str] = []
    put_back: list[str] = []
    try:
        for name in untracked(base):
            target = aside / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(base / name, target)
            moved.append(name)
        yield put_back
    finally:
        put_back += _put_back(base, aside, moved)


def _put_back(base: Path, aside: Path, names: list[str]) -> list[str]:
    """Each of ``names`` back where nothing is now; the names put back."""
    back = []
    for name in names:
        source = aside / name
        if not source.exists():
            continue
        if (base / name).exists() or (base / name).is_symlink():
            source.unlink()  # the experiment's own version of it
        else:
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, base / name)
            back.append(name)
    for folder in sorted((p for p in aside.rglob("*") if p.is_dir()), reverse=True) if aside.exists() else []:
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        aside.rmdir()
    return back


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink())
