"""tests/waiting.py: the tests' one wait helper."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest

from tests.waiting import wait_until


def test_returns_the_conditions_first_truthy_value() -> None:
    answers = iter([None, 0, "", {"state": "done"}])
    assert wait_until(lambda: next(answers), "a state", timeout=10, poll=0.01) == {"state": "done"}


def test_times_out_naming_what_it_waited_for_and_explaining() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError) as timed_out:
        wait_until(lambda: False, "the log line 'epoch 3'", timeout=0.2, poll=0.05, explain=lambda: "the log's tail")
    assert 0.2 <= time.monotonic() - started < 5
    assert str(timed_out.value) == "timed out after 0.2 s waiting for the log line 'epoch 3'\nthe log's tail"


def test_fails_at_once_with_the_output_of_a_process_that_ended() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('it said this'); raise SystemExit(3)"], stdout=subprocess.PIPE, text=True
    )
    proc.wait(timeout=60)
    started = time.monotonic()
    with pytest.raises(AssertionError) as ended:
        wait_until(lambda: False, "a checkpoint", timeout=60, proc=proc)
    assert time.monotonic() - started < 5
    message = str(ended.value)
    assert f"process {proc.pid} ended (exit code 3) while waiting for a checkpoint" in message
    assert "it said this" in message


def test_a_condition_that_came_true_as_the_process_ended_counts() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    assert wait_until(lambda: "last words", "its last words", timeout=1, proc=proc) == "last words"


def test_a_costly_condition_is_asked_less_often_than_poll_says() -> None:
    # Each ask costs 0.1 s (a subprocess's worth): with a pause of 3x its cost, at most one ask per
    # 0.4 s, where poll=0.01 alone would ask about a hundred times in 1.2 s. A busy machine only
    # makes asks slower, so fewer.
    asked = []

    def costly() -> bool:
        asked.append(time.monotonic())
        time.sleep(0.1)
        return False

    with pytest.raises(AssertionError):
        wait_until(costly, "never", timeout=1.2, poll=0.01)
    gaps = [later - earlier for earlier, later in itertools.pairwise(asked)]
    assert len(asked) <= 4 and all(gap >= 0.4 for gap in gaps), gaps
