"""The read audit a DVC stage's job puts on its Python processes (snakedvc/reads): what it notes,
that it leaves another sitecustomize working, and how the plan's stages judge the reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from snakedvc import reads


def test_the_hook_notes_reads_under_the_root_and_loads_the_sitecustomize_it_hides(tmp_path: Path) -> None:
    root, other = tmp_path / "repo", tmp_path / "other"
    (root / ".dvc").mkdir(parents=True)
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.stderr.write('the other one ran\\n')\n")
    for name in ("data.txt", ".dvc/config", "outside.txt"):
        (root / name if name != "outside.txt" else tmp_path / name).write_text("x")
    log = tmp_path / "reads.jsonl"
    env = reads.environment(log, root, {**os.environ, "PYTHONPATH": str(other)})
    script = (
        f"open({str(root / 'data.txt')!r}).read(); open({str(root / '.dvc/config')!r}).read();"
        f"open({str(tmp_path / 'outside.txt')!r}).read(); open({str(root / 'new.txt')!r}, 'w').write('y');"
        f"open({str(root / 'missing.txt')!r}) if False else None;"
        "import os; os.open(" + repr(str(root / "data.txt")) + ", os.O_RDONLY)"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "the other one ran\n", proc.stderr
    assert [path for path, _ in reads.read_log(log)] == [str(root.resolve() / "data.txt")]
    failed = subprocess.run(
        [sys.executable, "-c", f"open({str(root / 'missing.txt')!r})"], env=env, capture_output=True, text=True
    )
    assert failed.returncode == 1 and "FileNotFoundError" in failed.stderr  # the attempt counts: noted
    assert str(root.resolve() / "missing.txt") in [path for path, _ in reads.read_log(log)]


def test_a_read_is_judged_by_when_its_writer_finished_and_dvcs_order() -> None:
    run = ["train", "evaluate", "report"]
    outs = {"train": ["/r/model.pt"], "evaluate": ["/r/eval"], "report": ["/r/report.md"]}
    upstream = {"report": ["evaluate"]}
    early, late = {"/r/model.pt": 5.0}, {"/r/model.pt": 20.0}
    finished = {"train": 10.0, "evaluate": None, "report": None}
    premature, undeclared = reads.judge("evaluate", list(early.items()), run, outs, upstream, finished)
    assert premature == {"/r/model.pt": "train"} and undeclared == {}
    premature, undeclared = reads.judge("evaluate", list(late.items()), run, outs, upstream, finished)
    assert premature == {} and undeclared == {"/r/model.pt": "train"}
    # A declared upstream stage's files, and a file inside an output folder of a later stage.
    premature, undeclared = reads.judge("report", [("/r/eval/m.json", 1.0)], run, outs, upstream, finished)
    assert premature == {} and undeclared == {}
    premature, undeclared = reads.judge("train", [("/r/eval/m.json", 1.0)], run, outs, upstream, finished)
    assert premature == {} and undeclared == {"/r/eval/m.json": "evaluate"}  # DVC runs evaluate after train
