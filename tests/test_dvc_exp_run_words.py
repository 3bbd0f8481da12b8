"""`snakedvc exp run` against `dvc exp run` on the shapes public projects have: a pipeline in a
subfolder, a params file -S creates, targets given as paths, DVC's stage-selection options and its
one-line errors. Each test runs DVC in one clone and the kit in another, and compares what DVC keeps
(the experiment commit's files, dvc.lock, the outputs)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import git
from tests.test_dvc_pipeline import clone, dvc, dvc_project, experiment_rev, snakedvc

pytestmark = pytest.mark.slow

RUNNERS = {"dvc": dvc, "kit": snakedvc}


def tree(repo: Path, name: str) -> dict[str, str]:
    """The experiment commit's files and their blobs."""
    listing = git(repo, "ls-tree", "-r", experiment_rev(repo, name)).splitlines()
    return {line.split("\t")[1]: line.split()[2] for line in listing}


def both(origin: Path, *args: str, before: tuple[str, ...] = ()) -> dict[str, Path]:
    """``args`` run by `dvc exp run` in one clone and `snakedvc exp run` in another, after ``before``
    (a dvc command) in each."""
    repos = {}
    for runner, command in RUNNERS.items():
        repo = clone(origin, f"by-{runner}")
        if before:
            dvc(repo, *before)
        command(repo, "exp", "run", *args)
        repos[runner] = repo
    return repos


SUBFOLDER = """\
stages:
  count:
    cmd: python3 -c "print(3)" > count.txt
    outs: [count.txt]
"""


def test_a_pipeline_in_a_subfolder_as_a_path_target_records_its_lock_file_with_nothing_to_run(tmp_path: Path) -> None:
    """`src/dvc.yaml` as the target (the kit refused it: "target ... is no stage of dvc.yaml"); with
    nothing to run the experiment holds src/dvc.lock, as DVC's does."""
    origin = dvc_project(tmp_path / "origin", {"src/dvc.yaml": SUBFOLDER})
    repos = both(origin, "-n", "again", "src/dvc.yaml", before=("repro", "src/dvc.yaml"))
    assert tree(repos["kit"], "again") == tree(repos["dvc"], "again")
    assert "src/dvc.lock" in tree(repos["kit"], "again")


def test_a_key_added_with_plus_creates_the_params_file_the_experiment_holds(tmp_path: Path) -> None:
    """-S +key=1 in a project with no params.yaml: DVC creates it and commits it in the experiment."""
    pipeline = "stages:\n  echo:\n    cmd: echo hi > out.txt\n    outs: [out.txt]\n"
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": pipeline})
    repos = both(origin, "-n", "added", "-S", "+extra.k=1")
    assert tree(repos["kit"], "added") == tree(repos["dvc"], "added")
    assert "params.yaml" in tree(repos["kit"], "added")


def test_a_dvc_file_as_the_target_commits_its_changed_data(tmp_path: Path) -> None:
    """A `dvc add`ed file changed by hand, its .dvc file the target: committed anew, as DVC does."""
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": SUBFOLDER})
    (origin / "raw.txt").write_text("one\n")
    dvc(origin, "add", "raw.txt")
    dvc(origin, "remote", "add", "-d", "store", str(tmp_path / "store"))
    dvc(origin, "push")
    git(origin, "add", "-A")
    git(origin, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "raw data")
    repos = {}
    for runner, command in RUNNERS.items():
        repo = clone(origin, f"by-{runner}")
        dvc(repo, "pull", "raw.txt.dvc")
        (repo / "raw.txt").write_text("two\n")
        command(repo, "exp", "run", "-n", "data", "raw.txt.dvc")
        repos[runner] = repo
    assert tree(repos["kit"], "data") == tree(repos["dvc"], "data")
    assert (repos["kit"] / "raw.txt.dvc").read_text() == (repos["dvc"] / "raw.txt.dvc").read_text()
    assert not (repos["kit"] / "count.txt").exists(), "a stage ran that the .dvc target does not involve"


CHAIN = """\
stages:
  first:
    cmd: python3 -c "print(${n})" > first.txt
    params: [n]
    outs: [first.txt]
  second:
    cmd: cat first.txt first.txt > second.txt
    deps: [first.txt]
    outs: [second.txt]
  third:
    cmd: cat second.txt first.txt > third.txt
    deps: [second.txt]
    outs: [third.txt]
  alone:
    cmd: python3 -c "print(${n} + 1)" > alone.txt
    params: [n]
    outs: [alone.txt]
"""


@pytest.mark.parametrize(
    "options",
    [["-s", "second"], ["--downstream", "second"], ["-p", "second"], ["-P"], ["--force-downstream", "third"]],
    ids=["single-item", "downstream", "pipeline", "all-pipelines", "force-downstream"],
)
def test_stage_selection_options_run_what_dvc_runs(tmp_path: Path, options: list[str]) -> None:
    """DVC's -s, --downstream, -p, -P and --force-downstream (each refused with exit 2 before): after
    a full run and a change of n, each runs the stages DVC runs: the same dvc.lock and outputs."""
    origin = dvc_project(tmp_path / "origin", {"params.yaml": "n: 1\n", "dvc.yaml": CHAIN})
    locks, outputs = {}, {}
    for runner, command in RUNNERS.items():
        repo = clone(origin, f"by-{runner}")
        dvc(repo, "repro")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "ran")
        (repo / "params.yaml").write_text("n: 2\n")
        (repo / "first.txt").write_text("2\n")  # as if first had run: second and third see a change
        command(repo, "exp", "run", "-n", "picked", *options)
        locks[runner] = yaml.safe_load((repo / "dvc.lock").read_text())
        outputs[runner] = {name: (repo / name).read_text() for name in ("second.txt", "third.txt", "alone.txt")}
    assert locks["kit"] == locks["dvc"]
    assert outputs["kit"] == outputs["dvc"]


def test_a_message_and_a_bad_set_param_are_as_dvcs(tmp_path: Path) -> None:
    """-m is the experiment commit's message; a -S Hydra cannot parse is one error line and exit 255
    (it printed a 29-line traceback and exited 1); an option DVC has and the kit does not is
    refused with a sentence, not argparse's exit 2."""
    origin = dvc_project(tmp_path / "origin", {"params.yaml": "n: 1\n", "dvc.yaml": CHAIN})
    repos = both(origin, "-n", "said", "-m", "a message of my own", "alone")
    for repo in repos.values():
        assert git(repo, "log", "-1", "--format=%s", experiment_rev(repo, "said")).strip() == "a message of my own"
    kit = repos["kit"]
    bad = snakedvc(kit, "exp", "run", "-S", "n=[1", check=False)
    assert bad.returncode == 255 == dvc(kit, "exp", "run", "-S", "n=[1", check=False).returncode
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "no viable alternative at input '[1'" in bad.stderr
    queued = snakedvc(kit, "exp", "run", "--temp", check=False)
    assert queued.returncode == 255 and "--temp" in queued.stderr and "snakedvc submit" in queued.stderr
    assert (kit / "params.yaml").read_text() == "n: 1\n"
    # -v: DVC's and the kit's debug lines, not dulwich's line per git config file read (a detached
    # run's log, which is -v, was more than half of them: issue 51's trial).
    verbose = snakedvc(kit, "exp", "run", "-v", "-S", "n=2", "-n", "loud")
    assert "dulwich" not in verbose.stderr + verbose.stdout and "DEBUG" in verbose.stderr + verbose.stdout


def test_an_unknown_target_is_dvcs_one_line(tmp_path: Path) -> None:
    origin = dvc_project(tmp_path / "origin", {"src/dvc.yaml": SUBFOLDER})
    repo = clone(origin, "by-kit")
    for target, said in (("nope", "does not exist"), ("src/dvc.yaml:nope", "Stage 'nope' not found")):
        refused = subprocess.run(
            [str(Path(snakedvc.__globals__["BIN"]) / "snakedvc"), "exp", "run", target],
            cwd=repo, capture_output=True, text=True,
        )  # fmt: skip
        assert refused.returncode == 255 and said in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


# media's output is also committed to git (a public project's habit); the run's target is count.
COMMITTED_OUTPUT = """\
stages:
  count:
    cmd: python3 -c "print(3)" > count.txt
    outs: [count.txt]
  media:
    cmd: python3 -c "print(4)" > stats.json
    outs: [stats.json]
"""


def test_an_output_the_user_committed_to_git_stays_in_the_experiment_as_in_dvcs(tmp_path: Path) -> None:
    """The kit left a stage's output out of the experiment commit though the baseline commit held it
    (an output that did not run is not this run's): the experiment then deleted the user's file."""
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": COMMITTED_OUTPUT, "stats.json": '{"frames": 7}\n'})
    repos = both(origin, "-n", "counted", "count")
    kit = tree(repos["kit"], "counted")
    assert kit == tree(repos["dvc"], "counted") and "stats.json" in kit, kit


WHICH_PYTHON = """\
stages:
  which:
    cmd: python3 -c "open('which.txt', 'w').write('the kit environment python')"
    outs: [which.txt]
"""


def test_a_stages_python_is_the_one_first_on_the_users_path_as_under_dvc(tmp_path: Path) -> None:
    """A project's own venv active, the kit and DVC run by their paths: DVC's stage runs the venv's
    `python3`; the kit put its own environment's bin first on PATH, so the stage ran the kit's python
    (found by three public projects whose pinned libraries live in their own venv)."""
    own_venv = tmp_path / "project-venv" / "bin"
    own_venv.mkdir(parents=True)
    (own_venv / "python3").write_text("#!/bin/sh\nprintf 'the project venv python' > which.txt\n")
    (own_venv / "python3").chmod(0o755)
    origin = dvc_project(tmp_path / "origin", {"dvc.yaml": WHICH_PYTHON})
    activated = {**os.environ, "PATH": f"{own_venv}{os.pathsep}{os.environ['PATH']}"}
    for runner in RUNNERS:
        repo = clone(origin, f"by-{runner}")
        exe = str(Path(sys.executable).parent / ("snakedvc" if runner == "kit" else "dvc"))
        subprocess.run([exe, "exp", "run", "-n", "which"], cwd=repo, env=activated, check=True, capture_output=True)
        assert (repo / "which.txt").read_text() == "the project venv python", runner


@pytest.mark.skipif(importlib.util.find_spec("dvc_s3") is not None, reason="needs DVC without its S3 plugin")
def test_a_default_remote_whose_plugin_is_missing_is_dvcs_one_line(tmp_path: Path) -> None:
    """A public project's default remote on S3, dvc-s3 not installed: DVC's checkout fails to build its
    index; DVC says so in one line and exits 255. The kit printed DVC's 40-line traceback and exited 1."""
    origin = dvc_project(tmp_path / "origin", {"params.yaml": "n: 1\n", "dvc.yaml": CHAIN})
    repo = clone(origin, "by-kit")
    dvc(repo, "remote", "add", "-d", "storage", "s3://bucket/project")
    by_dvc = dvc(repo, "exp", "run", check=False)
    refused = snakedvc(repo, "exp", "run", check=False)
    assert refused.returncode == 255 == by_dvc.returncode, refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    said = "requires 'dvc-s3' to be installed: No module named 'dvc_s3'"
    assert said in refused.stderr and said in by_dvc.stderr, (refused.stderr, by_dvc.stderr)
    assert experiment_names(repo) == []  # neither recorded an experiment


def experiment_names(repo: Path) -> list[str]:
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    return [ref.rsplit("/", 1)[-1] for ref in refs if "/exec/" not in ref]


# evaluate reads train's model without naming it in deps: DVC runs them in this order, one at a
# time, so it works there; the kit ran them side by side (FileNotFoundError, or the old model).
UNDECLARED = """\
stages:
  train:
    cmd: python3 train.py
    params: [n]
    outs: [model.txt]
  evaluate:
    cmd: python3 evaluate.py
    params: [n]
    metrics:
      - metrics.json:
          cache: false
"""
SCRIPTS = {
    "train.py": "import time, yaml\ntime.sleep(1)\nopen('model.txt', 'w').write(str(yaml.safe_load(open('params.yaml'))['n']))\n",
    "evaluate.py": (
        "import json, pathlib\ntry:\n    m = int(open('model.txt').read())\nfinally:\n"
        "    pathlib.Path('evaluate-started').touch()\njson.dump({'m': m}, open('metrics.json', 'w'))\n"
    ),
}
# The race made certain, whatever the machine's load: run side by side by the kit (its read audit
# is on), train writes its model only once evaluate has read (or tried to). Run by DVC, one stage
# after the other, it waits for nothing.
RACING_TRAIN = (
    "import os, pathlib, time, yaml\n"
    "if 'SNAKEDVC_READS' in os.environ:\n"
    "    deadline = time.monotonic() + 600\n"
    "    while not pathlib.Path('evaluate-started').exists() and time.monotonic() < deadline:\n"
    "        time.sleep(0.1)\n"
    "open('model.txt', 'w').write(str(yaml.safe_load(open('params.yaml'))['n']))\n"
)


@pytest.mark.parametrize("old_copy", [False, True], ids=["no-model-yet", "an-old-model-present"])
def test_a_stage_reading_anothers_output_undeclared_gets_dvcs_outcome_and_a_warning(
    tmp_path: Path, old_copy: bool
) -> None:
    files = {"params.yaml": "n: 1\n", "dvc.yaml": UNDECLARED, **SCRIPTS, "train.py": RACING_TRAIN}
    origin = dvc_project(tmp_path / "origin", files)
    said = {}
    for runner, command in RUNNERS.items():
        repo = clone(origin, f"by-{runner}")
        if old_copy:
            dvc(repo, "repro")
            (repo / "evaluate-started").unlink()
        said[runner] = command(repo, "exp", "run", "-n", "read", "-S", "n=2")
        assert yaml.safe_load((repo / "metrics.json").read_text()) == {"m": 2}, runner
    kit, by_dvc = tmp_path / "by-kit", tmp_path / "by-dvc"
    assert yaml.safe_load((kit / "dvc.lock").read_text()) == yaml.safe_load((by_dvc / "dvc.lock").read_text())
    assert tree(kit, "read") == tree(by_dvc, "read")
    warning = said["kit"].stderr
    assert "stage 'evaluate' reads model.txt, which stage 'train' writes, without naming it in its deps" in warning
    assert "it ran again after 'train'" in warning and "deps: - model.txt" in warning


def test_one_at_a_time_runs_the_stages_in_dvcs_order_with_nothing_to_run_again(tmp_path: Path) -> None:
    """snakedvc.yaml's one_at_a_time: evaluate waits for train, so it reads the new model first time."""
    files = {"params.yaml": "n: 1\n", "dvc.yaml": UNDECLARED, "snakedvc.yaml": "one_at_a_time: true\n", **SCRIPTS}
    repo = clone(dvc_project(tmp_path / "origin", files), "by-kit")
    ran = snakedvc(repo, "exp", "run", "-n", "serial", "-S", "n=2")
    assert yaml.safe_load((repo / "metrics.json").read_text()) == {"m": 2}
    assert "ran again" not in ran.stderr and not list((repo / ".snakedvc").rglob("deferred"))
    # It read the model after train finished: right this time, still undeclared: said all the same.
    assert "stage 'evaluate' reads model.txt, which stage 'train' writes, without naming it" in ran.stderr


# A stage whose output differs each run (a clock): a restore from DVC's run cache shows in the bytes.
CLOCKED = """\
stages:
  stamp:
    cmd: python3 -c "import time; print(${n}, time.time_ns())" > stamp.txt && echo ran >> runs.log
    params: [n]
    outs: [stamp.txt]
  follow:
    cmd: cat stamp.txt stamp.txt > follow.txt && echo ran >> runs.log
    deps: [stamp.txt]
    outs: [follow.txt]
"""


def test_going_back_to_an_earlier_setting_restores_from_dvcs_run_cache(tmp_path: Path) -> None:
    """n=1, n=2, then n=1 again: DVC restores both stages' outputs from its run cache and runs
    nothing (the kit ran them again, and recorded new bytes); the kit does the same."""
    origin = dvc_project(tmp_path / "origin", {"params.yaml": "n: 1\n", "dvc.yaml": CLOCKED})
    kept = {}
    for runner, command in RUNNERS.items():
        repo = clone(origin, f"by-{runner}")
        command(repo, "exp", "run", "-n", "one")
        first = (repo / "stamp.txt").read_text()
        command(repo, "exp", "run", "-n", "two", "-S", "n=2")
        said = command(repo, "exp", "run", "-n", "back", "-S", "n=1")
        assert (repo / "stamp.txt").read_text() == first, f"{runner}: stamp.txt not restored"
        assert (repo / "runs.log").read_text().count("ran") == 4, f"{runner}: a stage ran on going back"
        kept[runner] = (repo, said.stdout + said.stderr)
    (kit, said), (by_dvc, _) = kept["kit"], kept["dvc"]
    assert "Stage 'stamp' is cached - skipping run, checking out outputs" in said
    assert yaml.safe_load((kit / "dvc.lock").read_text())["stages"]["follow"]["outs"] is not None
    assert tree(kit, "back").keys() == tree(by_dvc, "back").keys()
    forced = snakedvc(kit, "exp", "run", "-f", "-n", "forced")  # -f runs, as DVC's -f
    assert "is cached" not in forced.stderr and (kit / "runs.log").read_text().count("ran") == 6


def test_pull_restores_from_the_dvc_remotes_run_cache(tmp_path: Path) -> None:
    """--pull: DVC pulls its run cache from the DVC remote first, and a stage whose inputs it has
    seen elsewhere is restored from it, not run (the kit ran it: DVC's test_restore_pull found it)."""
    origin = dvc_project(tmp_path / "origin", {"params.yaml": "n: 1\n", "dvc.yaml": CLOCKED})
    storage = tmp_path / "storage"
    dvc(origin, "remote", "add", "-d", "store", str(storage))
    git(origin, "commit", "-qam", "a DVC remote")
    dvc(origin, "repro")
    dvc(origin, "push", "--run-cache")
    made = (origin / "stamp.txt").read_text()
    for runner, command in RUNNERS.items():
        repo = clone(origin, f"by-{runner}")  # no outputs, no lock file, no cache: only the remote's
        said = command(repo, "exp", "run", "--pull", "-n", "pulled")
        assert (repo / "stamp.txt").read_text() == made, f"{runner}: stamp.txt ran anew"
        assert not (repo / "runs.log").exists(), f"{runner}: a stage ran"
        assert "Stage 'stamp' is cached - skipping run, checking out outputs" in said.stdout + said.stderr
