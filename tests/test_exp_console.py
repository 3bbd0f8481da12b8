"""What `snakedvc exp run` shows: each stage's job log streamed as it grows, DVC's lines as they
are, side-by-side stages prefixed with their name; a log moved aside for a retry read on."""

from __future__ import annotations

import io
from pathlib import Path

from snakedvc.engine.dvcpipeline.console import StageOutput
from snakedvc.engine.dvcpipeline.plan import Plan, Stage


def plan(names: list[str]) -> Plan:
    stages = tuple(Stage(name, f"stage_{name}", ("true",), ".", (), (), ()) for name in names)
    return Plan(stages, tuple(names), ".snakedvc/pipeline/run")


def write(root: Path, relative: str, text: str, mode: str = "a") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as handle:
        handle.write(text)


def test_stages_alone_unprefixed_side_by_side_prefixed_and_partial_lines_kept(tmp_path: Path) -> None:
    steps = plan(["a", "b"])
    out = io.StringIO()
    stream = StageOutput(steps, tmp_path, out)
    write(tmp_path, steps.log("a"), "Running stage 'a':\n> true\nhal")
    stream.pump()
    assert out.getvalue() == "Running stage 'a':\n> true\n"  # "hal" waits for the end of its line
    write(tmp_path, steps.log("a"), "f done\n")
    write(tmp_path, steps.log("b"), "Running stage 'b':\n")
    stream.pump()
    assert out.getvalue().splitlines()[2:] == ["a| half done", "b| Running stage 'b':"]
    write(tmp_path, steps.ran("a"), "")
    write(tmp_path, steps.log("b"), "> true\n")
    stream.pump()
    assert out.getvalue().splitlines()[-1] == "> true"  # a has finished: b alone again
    write(tmp_path, steps.log("b"), "no newline at the end")
    stream.drain()
    assert out.getvalue().splitlines()[-1] == "no newline at the end"


def test_a_log_moved_aside_for_a_retry_is_read_on(tmp_path: Path) -> None:
    steps = plan(["a"])
    out = io.StringIO()
    stream = StageOutput(steps, tmp_path, out)
    write(tmp_path, steps.log("a"), "attempt one, a long first line\n")
    stream.pump()
    (tmp_path / steps.log("a")).rename(tmp_path / "moved.log")
    stream.pump()  # no log for a moment: nothing, no error
    write(tmp_path, steps.log("a"), "attempt two\n")
    stream.drain()
    assert out.getvalue() == "attempt one, a long first line\nattempt two\n"
