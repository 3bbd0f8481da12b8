"""The tutorial (docs/tutorial.md, "Use snakedvc in your own project"), followed as a stranger would.

A new project in a temporary directory: its own prepare.py and plain PyTorch train.py (written
here, not shipped in the repository), `snakedvc init`, then the tutorial's blocks as written
(config.yaml, Snakefile, sweep.yaml) and every step of "Run it": a local run, a retrain with
another param, 2 processes, SIGTERM and resume, a sweep, a detached run after the sweep, the
report, and the SLURM profile on the test cluster. No step edits anything the tutorial does not.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from snakedvc.engine.names import experiment_ref
from tests.conftest import REPO, dvc, folder_files, git, slurm_jobs_by_rule, trainers_in
from tests.test_records import shown_experiments
from tests.waiting import text_of, wait_until

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
# The environment's bin first on PATH, as after `. .venv/bin/activate`.
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}

PREPARE = '''\
"""Synthetic tabular data: two classes in 8 features, split into train, valid and test."""
import argparse

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--output", required=True)
args = parser.parse_args()
rng = np.random.default_rng(args.seed)
X = rng.normal(size=(900, 8)).astype("float32")
y = (X @ rng.normal(size=8) + 0.5 * rng.normal(size=900) > 0).astype("int64")
np.savez(args.output, X_train=X[:600], y_train=y[:600], X_valid=X[600:750], y_valid=y[600:750],
         X_test=X[750:], y_test=y[750:])
print(f"wrote {args.output}")
'''

TUTORIAL = REPO / "docs" / "tutorial.md"


def tutorial_blocks() -> dict[str, str]:
    """The tutorial page's fenced blocks that carry a title (```lang title="NAME"), by title."""
    text = TUTORIAL.read_text()
    return dict(re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```$', text, re.MULTILINE | re.DOTALL))


# The tutorial's own train.py (its block titled "train.py"): the file a reader copies is the one
# tested. A plain loop with argparse flags; the lines its "train.py lines" block names are the kit's.
TRAIN = tutorial_blocks()["train.py"]


def run(project: Path, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), cwd=project, capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def snakemake(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(project, str(BIN / "snakemake"), *args, check=check)


def experiments(project: Path) -> dict[str, dict]:
    """Every experiment, on any commit (-A): step 7 commits the first run's pointers, a new HEAD."""
    return shown_experiments(project, "-A")


def test_the_tutorials_train_py_lines_are_the_ones_the_tutorial_project_uses() -> None:
    lines = {line.strip() for line in TRAIN.splitlines()}
    shown = [line.strip() for line in tutorial_blocks()["train.py lines"].splitlines() if line.strip()]
    assert shown and [line for line in shown if line not in lines] == []
    # The lines that make N processes one training, which procs=2 below runs.
    distributed = [line.strip() for line in tutorial_blocks()["train.py lines for procs > 1"].splitlines()]
    assert distributed and [line for line in distributed if line and line not in lines] == []
    # The tutorial's counts of the kit's lines are what its blocks hold.
    snakefile = tutorial_blocks()["Snakefile"]
    assert sum("# kit" in line for line in snakefile.splitlines()) == 11
    assert len(shown) == 8


def test_the_tutorials_train_py_resumed_mid_epoch_logs_what_an_uninterrupted_run_logs(tmp_path: Path) -> None:
    """The tutorial's train.py, with the `live=` its text offers: SIGTERM mid-epoch, rerun, and the
    printed and logged metrics, the dvclive folder, the model and the metrics file are byte-equal
    to a run that was never stopped."""
    train = TRAIN.replace(
        "resume = Resumable(vars(args), inputs=[args.data])",
        'resume = Resumable(vars(args), inputs=[args.data], live="live")',
    )
    assert train != TRAIN
    (tmp_path / "prepare.py").write_text(PREPARE)
    run(tmp_path, sys.executable, "prepare.py", "--output", "data.npz")

    def trainer(folder: Path) -> subprocess.Popen[str]:
        folder.mkdir(exist_ok=True)
        (folder / "train.py").write_text(train)
        # A wider layer than the default: an epoch of ~20 ms, long enough to stop it in the middle.
        command = [sys.executable, "train.py", "--epochs", "300", "--hidden", "1024", "--data", str(tmp_path / "data.npz"),
                   "--model", "model.pt", "--metrics", "metrics.json"]  # fmt: skip
        return subprocess.Popen(command, cwd=folder, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def outcome(folder: Path, printed: str, logged: str) -> dict[str, object]:
        return {
            "printed": printed,
            "logged": re.findall(r"epoch \d+: loss [\d.]+", logged),  # resume.log's lines, time stamps aside
            "live": folder_files(folder / "live"),
            "model": (folder / "model.pt").read_bytes(),
            "metrics": (folder / "metrics.json").read_bytes(),
        }

    straight = trainer(tmp_path / "straight")
    seen = [(time.monotonic(), line) for line in straight.stdout]  # when each epoch ended
    printed = "".join(line for _, line in seen)
    logged = straight.communicate(timeout=300)[1]
    assert straight.returncode == 0, logged[-2000:]
    expected = outcome(tmp_path / "straight", printed, logged)
    assert len(expected["logged"]) == 300 and len(printed.splitlines()) == 300

    # A SIGTERM lands at a step; one that lands between epochs is tried again in a fresh folder.
    # Sent right at a print it always would (the print ends an epoch): a few ms later, mid-epoch.
    epoch_s = (seen[-1][0] - seen[50][0]) / (len(seen) - 51)
    for attempt in range(5):
        folder = tmp_path / f"stopped{attempt}"
        stopped = trainer(folder)
        first_lines = []
        for line in stopped.stdout:  # train.py prints each epoch: stop it while epoch 6 or later runs
            first_lines.append(line)
            if line.startswith("epoch 5 "):
                time.sleep(epoch_s * (0.3 + 0.1 * attempt))
                stopped.send_signal(signal.SIGTERM)
                break
        rest, first_logged = stopped.communicate(timeout=120)
        assert stopped.returncode == 75, first_logged[-2000:]
        again = trainer(folder)
        second_printed, second_logged = again.communicate(timeout=300)
        assert again.returncode == 0, second_logged[-2000:]
        where = re.search(r"resumed from epoch (\d+) step (\d+)", second_logged)
        assert where, second_logged[-2000:]
        if int(where[2]) > 0:
            break
    else:
        raise AssertionError("five SIGTERMs each landed between two epochs")
    resumed = outcome(folder, "".join(first_lines) + rest + second_printed, first_logged + second_logged)
    assert resumed["printed"] == expected["printed"]
    assert resumed["logged"] == expected["logged"]
    assert resumed["live"] == expected["live"] and "metrics.json" in expected["live"]
    assert resumed["model"] == expected["model"] and resumed["metrics"] == expected["metrics"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tutorial_project(tmp_path_factory.mktemp("tutorial") / "classifier")


def tutorial_project(project: Path) -> Path:
    """The tutorial's project: its files as the page gives them, committed, after `snakedvc init`."""
    blocks = tutorial_blocks()
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    git(project, "config", "user.email", "user@example.com")
    git(project, "config", "user.name", "a user")
    (project / "prepare.py").write_text(PREPARE)
    (project / "train.py").write_text(TRAIN)
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "my classifier")
    run(project, str(BIN / "snakedvc"), "init")
    for name in ("config.yaml", "Snakefile", "sweep.yaml"):
        (project / name).write_text(blocks[name])
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "snakedvc")
    return project


def test_the_tutorial_runs_locally_end_to_end(project: Path) -> None:
    # A run: one experiment, with the metrics the run wrote; git sees only the .dvc files of outputs.
    snakemake(project, "--profile", "profiles/local")
    first = json.loads((project / "results/metrics.json").read_text())
    (record,) = experiments(project).values()
    assert record["metrics"]["results/metrics.json"] == first and record["params"]["train"]["lr"] == 0.1
    seen = git(project, "status", "--porcelain", "--untracked-files=all").split()
    assert [p for p in seen if p != "??"] == ["results/model.pt.dvc"], seen
    # Step 7, as written: `git add -A` stages the outputs' .dvc files (and DVC's .gitignore files),
    # nothing else of results/; committing them is harmless: the next run records as before.
    staged = [line.split(" ", 1)[1].strip("'") for line in git(project, "add", "-A", "--dry-run").splitlines()]
    assert staged and all(p.endswith(".dvc") or p.endswith("/.gitignore") for p in staged), staged
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "the first run's pointers")
    fit_log = (project / "logs/fit.log").read_text()
    assert "epoch 10 loss" in fit_log  # train.py's print()s reach the log
    assert re.search(r"epoch 10: loss \d", fit_log), fit_log[-2000:]  # and resume.log's line

    # Another learning rate retrains (params: reach the command) and is a second experiment.
    snakemake(project, "--profile", "profiles/local", "--config", "train={lr: 0.3}")
    assert sorted(e["params"]["train"]["lr"] for e in experiments(project).values()) == [0.1, 0.3]

    # 2 processes under torchrun, with the curves the tutorial's text offers (live=, nothing else
    # changed), stopped by SIGTERM mid-training, then the rerun resumes.
    with_live = 'resume = Resumable(vars(args), inputs=[args.data], live="results/live")'
    (project / "train.py").write_text(TRAIN.replace("resume = Resumable(vars(args), inputs=[args.data])", with_live))
    git(project, "commit", "-q", "-am", "curves")
    long = ["--profile", "profiles/local", "--config", "procs=2", "train={lr: 0.3, epochs: 400}"]
    first_try = subprocess.Popen([str(BIN / "snakemake"), *long], cwd=project, env=ENV,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    log = project / "logs/fit.log"
    rank1_epoch5 = "[default1]:epoch 5 loss"
    wait_until(
        lambda: rank1_epoch5 in text_of(log), repr(rank1_epoch5), 120, explain=lambda: text_of(log), proc=first_try
    )
    # As SLURM does at a time limit: TERM to every process of the step (torchrun's agent and both ranks).
    trainers = trainers_in(project, b"train.py")
    assert len(trainers) == 3, (trainers, log.read_text()[-2000:] if log.exists() else "")
    for pid in trainers:
        subprocess.run(["kill", "-TERM", str(pid)], check=False)
    output, _ = first_try.communicate(timeout=120)
    assert first_try.returncode != 0, output[-2000:]
    stopped = log.read_text()
    assert "[default0]:" in stopped and "will checkpoint and stop" in stopped, stopped[-3000:]
    snakemake(project, *long)
    resumed = log.read_text()
    assert re.search(r"\[default0\]:.* resumed from epoch \d+ step \d+", resumed), resumed[-3000:]
    assert "[default1]:epoch 400 loss" in resumed and (project / "logs/fit.log.ranks").is_dir()
    # The report draws them, though no rule declares results/live (its jobs wrote it while it ran).
    run(project, str(BIN / "snakedvc"), "report")
    assert 'alt="dvclive: results/live"' in (project / "results/report.html").read_text()
    (project / "train.py").write_text(TRAIN)  # the sweep's trials would share one live folder
    git(project, "commit", "-q", "-am", "no curves")

    # A sweep: one experiment per trial, holding its own trial.json and no plain run's metrics.
    snakemake(project, "--profile", "profiles/local", "--configfile", "sweep.yaml")
    trials = {name: e for name, e in experiments(project).items() if name.startswith("first-")}
    assert len(trials) == 4
    for trial in trials.values():
        assert trial["metrics"]["results/metrics.json"] is None and trial["metrics"]["results/trial.json"]
        # Every metric the trial wrote, not only the ranked one (the others showed `!` in dvc exp show).
        assert {"valid_accuracy", "test_accuracy", "rung", "best"} <= set(trial["metrics"]["results/trial.json"])
    # Rung 1 (4 epochs) continued each survivor from its rung-0 state (2 epochs): launch handed it on.
    later = sorted((project / "logs/sweeps/first").glob("*/rung1/train.log"))
    assert len(later) == 2 and all("continuing from epoch 3" in text_of(p) for p in later), [text_of(p) for p in later]
    # Restoring a trial says where its model is, and stamps no plain output with the trial's params
    # (with --touch it did: a later plain run with them planned nothing, the old model taken for the trial's).
    trial = sorted(trials)[0]
    said = run(project, str(BIN / "snakedvc"), "restore", trial).stdout
    assert f"restored {trial}; {trial} is trial {trial.removeprefix('first-')} of sweep first" in said, said
    plan = snakemake(project, "--profile", "profiles/local", "-n", "--configfile", "results/params.yaml")
    assert re.search(r"^fit\s+1$", plan.stdout, re.MULTILINE), plan.stdout[-3000:]

    # A detached run after the sweep: trains with its param and saves its experiment.
    run_id = run(
        project, str(BIN / "snakedvc"), "submit", "--name", "lr-low", "--", "--config", "train={lr: 0.03}"
    ).stdout.strip()

    def ended() -> dict | None:
        listed = json.loads(run(project, str(BIN / "snakedvc"), "runs", "--json").stdout)
        (state,) = [r for r in listed if r["id"] == run_id]
        return state if state["state"] not in ("queued", "running") else None

    state = wait_until(ended, f"run {run_id} to end", timeout=300, poll=1)
    assert state["state"] == "done" and state["experiments"] == ["lr-low"], state
    assert experiments(project)["lr-low"]["params"]["train"]["lr"] == 0.03

    # The report: the last run in this repository (the sweep), said in its header.
    run(project, str(BIN / "snakedvc"), "report")
    page = (project / "results/report.html").read_text()
    header = dict(re.findall(r'data-run="([^"]+)">([^<]*)<', page))
    assert header["sweep"] == "results/sweeps/first/report" and header["outcome"] == "done", header
    assert 'id="sweep"' in page


@pytest.mark.slurm
def test_the_tutorial_runs_on_the_test_cluster(project: Path, slurm_cluster: None) -> None:
    proc = snakemake(project, "--profile", "profiles/slurm", "--config", "train={lr: 0.05}")
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    assert jobs.get("fit"), jobs  # a SLURM job (prepare is up to date from the local runs)
    found = {e["params"]["train"]["lr"]: e for e in experiments(project).values() if e["params"]}
    assert found[0.05]["metrics"]["results/metrics.json"] == json.loads((project / "results/metrics.json").read_text())
    assert dvc(project, "status").returncode == 0
    assert yaml.safe_load((project / "profiles/slurm/partitions.yaml").read_text())["partitions"]


def test_restore_names_what_it_changes_and_leaves_untracked_files_alone(tmp_path: Path) -> None:
    """`snakedvc restore` says which files it puts back, keeps the untracked files the experiment
    holds no version of (the prepared data no rule tracks, a file of the user's), and `snakemake -n`
    with the experiment's config plans nothing (issue 50: `dvc exp apply` removed results/data.npz,
    and the dry run planned prepare and fit again)."""
    project = tutorial_project(tmp_path / "classifier")
    for name, lr in (("low", 0.11), ("high", 0.12)):
        snakemake(project, "--profile", "profiles/local", "--config", f"train={{lr: {lr}}}",
                  f"snakedvc={{experiment: {{name: {name}}}}}")  # fmt: skip
    data = (project / "results/data.npz").read_bytes()
    (project / "notes.txt").write_text("mine\n")
    # A file committed after the experiments (as a sweep's config): apply removed it, and a later
    # `git add -A` committed its deletion (issue 50's trial); restore keeps it and says so.
    (project / "later.yaml").write_text("added: after\n")
    git(project, "add", "later.yaml")
    git(project, "commit", "-q", "-m", "a file added after the experiments")
    # An edit not committed: apply would put back the experiment's prepare.py and lose the edit;
    # restore keeps it in git's stash and says so.
    (project / "prepare.py").write_text(PREPARE + "# tried something\n")
    # A pointer that low's experiment lacks, not committed (as a later sweep's report.dvc): DVC's
    # checkout failed on it ("Did you mean `git checkout results/extra.txt.dvc`?"), the restore half done.
    (project / "results/extra.txt").write_text("data added later\n")
    dvc(project, "add", "results/extra.txt")
    restored = run(project, str(BIN / "snakedvc"), "restore", "low")
    said = restored.stderr
    assert (project / "results/extra.txt.dvc").is_file()
    assert (project / "results/extra.txt").read_text() == "data added later\n"
    put_back = re.search(r"snakedvc restore: low put back its files: (.*)", said)
    listed = set(put_back.group(1).split(", ")) if put_back else set()
    # (results/metrics.json only where low's differs from high's: two close rates may score the same)
    assert {"results/model.pt.dvc", "results/params.yaml"} <= listed, said
    # (results/.gitignore: `dvc add` added a line to it, which low's commit lacks)
    assert listed <= {
        "results/model.pt.dvc",
        "results/params.yaml",
        "results/metrics.json",
        ".gitignore",
    }, said
    assert (project / "prepare.py").read_text() == PREPARE
    assert "your uncommitted edits of prepare.py are kept in git's stash" in said, said
    assert "and the outputs they record: results/model.pt" in said
    assert "left as they were: your untracked files" in said and "results/data.npz" in said
    # Each named, a folder of many (the runs' logs) as one entry: a user's file was lost among 113.
    assert re.search(r"left as they were: your untracked files that low holds no version of \(.*notes\.txt.*"
                     r"logs/ \(\d+ files\)", said), said  # fmt: skip
    assert (project / "results/data.npz").read_bytes() == data
    assert (project / "notes.txt").read_text() == "mine\n"
    assert (project / "later.yaml").read_text() == "added: after\n"
    assert "kept your committed files that low has none of (added since): later.yaml" in said, said
    assert "removed those" not in said, said
    assert (
        json.loads((project / "results/metrics.json").read_text())
        == experiments(project)["low"]["metrics"]["results/metrics.json"]
    )
    plan = snakemake(project, "-n", "--profile", "profiles/local", "--config", "train={lr: 0.11}")
    assert "Nothing to be done" in plan.stdout + plan.stderr, plan.stdout[-2000:]
    # low ran with --config, which the config file lacks: restore names the config that plans nothing.
    assert "with its own config, `--configfile results/params.yaml`, it plans nothing" in restored.stdout
    plan = snakemake(project, "-n", "--profile", "profiles/local", "--configfile", "results/params.yaml")
    assert "Nothing to be done" in plan.stdout + plan.stderr, plan.stdout[-2000:]
    git(project, "stash", "pop", "-q")  # the edit comes back
    assert (project / "prepare.py").read_text() == PREPARE + "# tried something\n"
    # ... and, the scripts being inputs, an edit of one makes its rule run again (issue 50's trial:
    # an edited train.py left the old model standing, "experiment ... already holds these results").
    plan = snakemake(project, "-n", "--profile", "profiles/local", "--config", "train={lr: 0.11}")
    assert re.search(r"^prepare\s+1$", plan.stdout, re.MULTILINE), plan.stdout[-2000:]


@pytest.mark.slow
def test_the_curves_lines_keep_the_curves_in_the_experiment_and_give_each_trial_a_folder(tmp_path: Path) -> None:
    """The block "curves in each experiment", put in the tutorial's Snakefile where its lines go, with
    the train.py and config lines its text names: the run's experiment holds results/live, and a
    sweep plans each trial its own live folder."""
    project = tutorial_project(tmp_path / "project")
    block = [line for line in tutorial_blocks()["curves in each experiment"].splitlines() if line.strip()]
    replaced = [
        '    output: model="results/model.pt", metrics="results/metrics.json"',
        '        " {params.hp} --data {input.data:q} --model {output.model:q} --metrics {output.metrics:q}"',
        '    output: **SWEEP.outputs(model="model.pt")  # kit',
    ]
    snakefile = (project / "Snakefile").read_text()
    for old, new in zip(replaced, block, strict=True):
        assert old in snakefile, old
        snakefile = snakefile.replace(old, new)
    (project / "Snakefile").write_text(snakefile)
    train = TRAIN.replace('    parser.add_argument("--metrics", required=True)\n',
                          '    parser.add_argument("--metrics", required=True)\n    parser.add_argument("--live")\n')  # fmt: skip
    (project / "train.py").write_text(train.replace("inputs=[args.data])", "inputs=[args.data], live=args.live)"))
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["snakedvc"]["experiment"]["files"] = ["results/live"]
    (project / "config.yaml").write_text(yaml.safe_dump(config))
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "curves")
    snakemake(project, "--profile", "profiles/local", "--config", "train={epochs: 2}")
    (name,) = experiments(project)
    held = git(project, "ls-tree", "-r", "--name-only", experiment_ref(name, project) or "")
    assert "results/live/metrics.json" in held.split(), held
    planned = snakemake(project, "-n", "--configfile", "sweep.yaml")
    assert re.search(r"trials/t000/rung0/live\b", planned.stdout + planned.stderr), planned.stdout[-3000:]
