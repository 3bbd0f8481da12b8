"""What `snakedvc restore` moves aside around `dvc exp apply`: the user's untracked files, not the
Python environment it runs from (the tutorial makes .venv inside the project)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from snakedvc.engine.aside import untracked, untracked_kept


def repository(root: Path) -> Path:
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / ".gitignore").write_text("results/\n.venv/\nenvs/\n")
    for name in (".venv/pyvenv.cfg", ".venv/lib/site.py", "envs/conda/conda-meta/history", "envs/conda/bin/tool"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / ".venv/bin").mkdir()
    (root / ".venv/bin/python").symlink_to("/usr/bin/python3")
    (root / "results").mkdir()
    (root / "results/data.npz").write_text("prepared")  # ignored, made by no rule: the user's
    (root / "notes.txt").write_text("mine")
    return root


def test_environments_stay_in_place_and_the_users_files_go_aside_and_back(tmp_path: Path) -> None:
    root = repository(tmp_path / "project")
    assert untracked(root) == [".gitignore", "notes.txt", "results/data.npz"]
    with untracked_kept(root) as kept:
        # During `dvc exp apply`: the interpreter of .venv still there, the user's files aside.
        assert (root / ".venv/bin/python").is_symlink() and (root / ".venv/pyvenv.cfg").is_file()
        assert (root / "envs/conda/bin/tool").is_file()
        assert not (root / "results/data.npz").exists() and not (root / "notes.txt").exists()
    assert kept == [".gitignore", "notes.txt", "results/data.npz"]
    assert (root / "results/data.npz").read_text() == "prepared" and (root / "notes.txt").read_text() == "mine"
