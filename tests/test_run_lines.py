"""Every run of a workflow that includes the kit ends with one kit line: the experiment it saved,
or why none; a run Snakemake finds nothing to do in too (Snakemake runs no onsuccess then)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_snakemake
from tests.test_save_faults import project, run_named, said  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def test_a_run_with_nothing_to_do_names_the_experiment_that_holds_its_results(project: Path) -> None:  # noqa: F811
    again = run_snakemake(project, "--cores", "1")
    assert "Nothing to be done" in said(again)
    assert "snakedvc: nothing to be done: experiment first already holds these results" in said(again)
    dry = run_snakemake(project, "--cores", "1", "-n")  # a dry run saves nothing and says nothing of it
    assert "snakedvc: nothing to be done" not in said(dry)
    ran = run_snakemake(project, *run_named("second", lr=0.02))
    assert "snakedvc: saved experiment second" in said(ran) and "nothing to be done" not in said(ran)
    # Back to the first: its results are in the workspace again, and the line names it, not the
    # last experiment saved (second).
    subprocess.run([sys.executable, "-m", "snakedvc", "restore", "first"], cwd=project, check=True, capture_output=True)
    back = run_snakemake(project, "--cores", "1", "--config", "train={lr: 0.01}")
    assert "snakedvc: nothing to be done: experiment first already holds these results" in said(back), said(back)


def test_a_run_in_a_repository_with_no_commit_stops_before_any_job_saying_commit_first(tmp_path: Path) -> None:
    """A stranger's first run (a fresh HOME: git had no identity, so the commit failed) went on, and
    its training job failed in dvclive's git calls ("SCMError: Empty git repo")."""
    from tests.conftest import dvc, git
    from tests.test_save_faults import CONFIG, SNAKEFILE

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "Snakefile").write_text(SNAKEFILE)
    (repo / "config.yaml").write_text(CONFIG)
    git(repo, "init", "-q", "-b", "main")
    dvc(repo, "init", "-q")
    stopped = run_snakemake(repo, "--cores", "1", check=False)
    assert stopped.returncode != 0
    assert "this git repository has no commit yet" in said(stopped) and "git add -A && git commit" in said(stopped)
    assert not (repo / "out").exists(), "a job ran"


def test_with_no_commit_and_no_git_identity_the_message_says_to_set_one(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The stranger's case: a fresh HOME, no user.email, so the commit the message asks for fails too."""
    from snakedvc.engine.workflow import _check_a_baseline_commit
    from snakedvc.errors import ConfigError
    from tests.conftest import dvc, git

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    dvc(repo, "init", "-q")
    with pytest.raises(ConfigError, match="git has no identity here") as raised:
        _check_a_baseline_commit(str(repo))
    assert "git config --global user.email" in str(raised.value)
    git(repo, "config", "user.email", "a@b")
    with pytest.raises(ConfigError) as raised:
        _check_a_baseline_commit(str(repo))
    assert "identity" not in str(raised.value) and "commit your code first" in str(raised.value)
