"""Detached runs (`snakedvc submit`, runs, logs, cancel, resume, clean) on real git + DVC repos:
locally here, on the test cluster in test_runs_slurm.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import yaml

from snakedvc.engine.report import slurm_jobs
from snakedvc.engine.runs import RunError, find_run, resume
from snakedvc.engine.runs.state import submitted_slurm_jobs
from snakedvc.engine.runs.submission import sbatch_command
from snakedvc.engine.runs.workspace import controller_settings, earlier_outputs, freeze
from tests.conftest import SMALL_RUN, dvc_experiments, dvc_project, md5, trainers_in, venv_env
from tests.conftest import git as git_output
from tests.waiting import wait_until

SNAKEDVC = [sys.executable, "-m", "snakedvc"]


def snakedvc(repo: Path, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*SNAKEDVC, *args], cwd=repo, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakedvc {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def git(repo: Path, *args: str) -> str:
    return git_output(repo, *args).strip()


def submit(repo: Path, *args: str) -> str:
    return snakedvc(repo, "submit", *args).stdout.strip()


def runs(repo: Path) -> dict[str, dict]:
    return {run["id"]: run for run in json.loads(snakedvc(repo, "runs", "--json").stdout)}


def ended_run(repo: Path, run_id: str) -> dict | None:
    """The run's record once it is neither queued nor running."""
    run = runs(repo)[run_id]
    return run if run["state"] not in ("queued", "running") else None


def run_log(repo: Path, run_id: str) -> str:
    return snakedvc(repo, "logs", run_id).stdout


def wait_until_ended(repo: Path, run_id: str, timeout: float = 600) -> dict:
    explain = partial(run_log, repo, run_id)
    return wait_until(lambda: ended_run(repo, run_id), f"run {run_id} to end", timeout, poll=1, explain=explain)


def git_state(repo: Path) -> tuple[str, ...]:
    """What submit must not change: branch, HEAD, index, and the working tree's status."""
    return (
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "rev-parse", "HEAD"),
        md5(repo / ".git" / "index"),
        git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
    )


def edit_lr(repo: Path, lr: float) -> None:
    config = repo / "config" / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["train"]["lr"] = lr
    config.write_text(yaml.safe_dump(data, sort_keys=False))


SOURCE = "workflow/rules/train.smk"
EDIT = "\n# An edit made after the first submit.\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return dvc_project(tmp_path / "repo", tmp_path / "remote")


def test_freeze_holds_uncommitted_and_untracked_files_and_touches_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / ".gitignore").write_text("ignored/\n")
    (repo / "code.py").write_text("v1\n")
    (repo / "gone.py").write_text("old\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    (repo / "code.py").write_text("v2\n")  # modified, unstaged
    (repo / "staged.py").write_text("staged\n")
    git(repo, "add", "staged.py")  # staged
    (repo / "new.py").write_text("untracked\n")
    (repo / "gone.py").unlink()
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_text("not code\n")
    before = git_state(repo)

    commit, tree = freeze(repo, "frozen")

    assert git_state(repo) == before
    assert git(repo, "rev-parse", f"{commit}^") == git(repo, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", f"{commit}^{{tree}}") == tree
    files = set(git(repo, "ls-tree", "-r", "--name-only", commit).split())
    assert files == {".gitignore", "code.py", "staged.py", "new.py"}
    assert git(repo, "show", f"{commit}:code.py") == "v2"


TRACKED_SWEEP = """
rule all:
    input: "results/sweeps/s1/t1/out.txt.dvc"
rule make:
    output: "results/sweeps/s1/t1/out.txt"
    shell: "echo trial > {output}"
rule track:
    input: "{path}"
    output: "{path}.dvc"
    shell: "dvc add -q {input}"
"""


def test_a_run_is_frozen_without_what_an_earlier_sweep_left_dvcs_gitignore_included(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"]):
        git(repo, *args)
    (repo / "Snakefile").write_text(TRACKED_SWEEP)
    (repo / ".gitignore").write_text(".snakemake/\n")
    subprocess.run(["dvc", "init", "-q"], cwd=repo, check=True, env=venv_env())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    # An earlier sweep, tracked by DVC as the kit's track rule does: out.txt.dvc and DVC's .gitignore.
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--quiet"], cwd=repo, check=True, env=venv_env())
    sweep_ignore = "results/sweeps/s1/t1/.gitignore"
    assert (repo / sweep_ignore).read_text() == "/out.txt\n"
    (repo / "notes").mkdir()  # the user's own, untracked: code, kept
    (repo / "notes" / ".gitignore").write_text("*.tmp\n")
    (repo / "mixed").mkdir()  # DVC's line beside the user's: kept
    (repo / "mixed" / ".gitignore").write_text("/out.txt\n*.tmp\n")

    left_out = earlier_outputs(repo)
    commit, _ = freeze(repo, "frozen", left_out)

    files = set(git(repo, "ls-tree", "-r", "--name-only", commit).split())
    assert sweep_ignore in left_out and "results/sweeps/s1/t1/out.txt.dvc" in left_out
    assert not any(f.startswith("results/") for f in files), files
    assert {"notes/.gitignore", "mixed/.gitignore", "Snakefile"} <= files


@pytest.mark.slow
def test_local_runs_are_pinned_to_their_submit_and_outlive_the_submitting_shell(repo: Path) -> None:
    before = git_state(repo)
    original_source = (repo / SOURCE).read_text()
    # The first run is submitted from a shell that is killed right after (a dropped SSH session).
    shell = subprocess.Popen(
        ["bash", "-c", '"$0" -m snakedvc submit --name first -- "$@" && sleep 600', sys.executable, *SMALL_RUN],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    first = shell.stdout.readline().strip() if shell.stdout else ""
    assert first, shell.stderr.read() if shell.stderr else ""
    os.killpg(shell.pid, signal.SIGKILL)
    shell.wait()
    assert git_state(repo) == before  # submit leaves branch, index and files as they were

    # Edited while the first run is queued or running: the first run must not see it.
    edit_lr(repo, 0.002)
    (repo / SOURCE).write_text(original_source + EDIT)
    # A profile named as `--remote` names it: `local` is the project's profiles/local.
    second = submit(repo, "--name", "second", "--profile", "local", "--", *SMALL_RUN)

    assert wait_until_ended(repo, first)["state"] == "done", snakedvc(repo, "logs", first).stdout[-3000:]
    assert wait_until_ended(repo, second)["state"] == "done", snakedvc(repo, "logs", second).stdout[-3000:]

    exps = dvc_experiments(repo)  # in the user's repository, where they work
    assert exps["first"]["params"]["train"]["lr"] == 0.001
    assert exps["second"]["params"]["train"]["lr"] == 0.002
    refs = dict(
        line.split()
        for line in git(repo, "for-each-ref", "--format=%(refname:lstrip=-1) %(objectname)", "refs/exps").splitlines()
    )
    assert git(repo, "show", f"{refs['first']}:{SOURCE}") + "\n" == original_source
    assert git(repo, "show", f"{refs['second']}:{SOURCE}") + "\n" == original_source + EDIT
    # Each experiment's baseline is the user's HEAD.
    assert git(repo, "rev-parse", f"{refs['first']}^") == git(repo, "rev-parse", "HEAD")

    listed = runs(repo)
    assert {listed[first]["experiments"][0], listed[second]["experiments"][0]} == {"first", "second"}
    assert listed[first]["jobs"].split("/")[0] == listed[first]["jobs"].split("/")[1]  # every step done
    assert json.loads((repo / ".snakedvc/runs" / second / "run.json").read_text())["profile"] == "profiles/local"
    assert "run " + first in snakedvc(repo, "logs", first).stdout

    # The shared DVC cache holds the runs' outputs; the workspaces link them (no copies).
    workspace = repo / ".snakedvc" / "runs" / first / "workspace"
    assert (workspace / "results/model/model.pt").stat().st_nlink > 1
    assert snakedvc(repo, "clean").stdout.count("removed the workspace") == 2
    assert not workspace.exists()
    assert "worktree" not in git(repo, "worktree", "list").split("\n", 1)[-1]
    assert runs(repo)[first]["state"] == "done"  # the record stays


@pytest.mark.slow
def test_cancelling_a_local_run_stops_it_and_saves_no_experiment(repo: Path) -> None:
    run_id = submit(
        repo, "--name", "doomed", "--", *SMALL_RUN, "train={max_epochs: 500, patience: 1000, hidden_sizes: [32]}"
    )
    logs = partial(run_log, repo, run_id)
    wait_until(lambda: "rule train" in logs(), "'rule train' in the run's log", timeout=120, poll=1, explain=logs)
    # The run list shows the running training's latest epoch, read from its dvclive folder, growing.
    epochs: list[int] = []

    def three_epochs_seen() -> bool:
        training = runs(repo)[run_id]["training"]
        if training:
            (live,) = training
            assert live["log"] == "results/model/live" and set(live["metrics"]) >= {"train_loss", "valid_rmse"}
            epochs.append(live["epoch"])
        return len(set(epochs)) >= 3

    what = "three epochs of the training in `runs`"
    wait_until(three_epochs_seen, what, timeout=120, poll=0.5, explain=lambda: snakedvc(repo, "runs").stdout)
    assert epochs == sorted(epochs), epochs
    listed = snakedvc(repo, "runs").stdout
    assert re.search(
        r"\n    results/model/live: epoch \d+ train_loss [\d.]+ valid_loss [\d.]+ \(\d+ s ago\)", listed
    ), listed
    pid = json.loads((repo / ".snakedvc/runs" / run_id / "run.json").read_text())["controller_pid"]
    # SLURM not answering (here: a slurm.conf naming a controller nobody runs; on CI the test
    # cluster's daemons once restarted at that moment) does not stop the cancel of a run whose jobs
    # are local: SLURM has none of them and is not asked ("cancel asked, but SLURM did not answer").
    dead = repo.parent / "dead-slurm.conf"
    dead.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\n")
    cancelled = subprocess.run(
        [*SNAKEDVC, "cancel", run_id], cwd=repo, capture_output=True, text=True, timeout=300,
        env={**os.environ, "SLURM_CONF": str(dead)},
    )  # fmt: skip
    assert cancelled.returncode == 0 and "cancelled run" in cancelled.stdout, cancelled.stderr
    assert runs(repo)[run_id]["state"] == "cancelled"
    # Only the controller was signalled; its Snakemake stopped the steps: no error block per stopped step.
    said = snakedvc(repo, "logs", run_id).stdout
    assert "Terminating processes on user request" in said and "Error in rule" not in said, said[-3000:]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "doomed" not in dvc_experiments(repo)
    # A cancelled run can be resumed; a second cancel says it has ended.
    assert "already ended as cancelled" in snakedvc(repo, "cancel", run_id, check=False).stderr


# A stand-in controller: on the first SIGTERM it goes on for a while (its Snakemake finishing local
# jobs: a line every 0.5 s, or nothing at all when hung), then exits; a second SIGTERM is the
# cancel stopping everything at once.
FAKE_CONTROLLER = """
import signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
hung = sys.argv[2] == "hung"
told = []
def on_term(signum, frame):
    if told:
        log.write("killed\\n")
        sys.exit(143)
    told.append(time.monotonic())
signal.signal(signal.SIGTERM, on_term)
log.write("ready\\n")
while not told:
    time.sleep(0.05)
for i in range(12):
    time.sleep(0.5)
    if not hung:
        log.write(f"Finished job {i}.\\n")
log.write("stopped by itself\\n")
"""


@pytest.mark.parametrize("hung", [False, True], ids=["winding-down", "hung"])
def test_cancel_waits_while_the_controller_winds_down_and_stops_a_quiet_one(tmp_path: Path, hung: bool) -> None:
    from snakedvc.engine.runs import control
    from snakedvc.engine.runs.record import RUNS_DIR, Run, this_host

    run = Run(
        id="20260101-000000-0000", name="doomed", root=str(tmp_path), commit="", baseline="", profile="local",
        snakemake_args=[], slurm=False, created=0.0, state="running", controller_host=this_host(),
    )  # fmt: skip
    run.dir.mkdir(parents=True)
    assert run.dir == tmp_path / RUNS_DIR / run.id
    fake = subprocess.Popen(
        [sys.executable, "-c", FAKE_CONTROLLER, str(run.log), "hung" if hung else "busy"], start_new_session=True
    )
    # Reaped as soon as it exits, as a controller that is not the test's child would be.
    reaper = threading.Thread(target=fake.wait, daemon=True)
    reaper.start()
    try:
        wait_until(lambda: run.log.is_file() and "ready" in run.log.read_text(), "the controller ready", timeout=30)
        run.controller_pid = fake.pid
        run.save()
        started = time.monotonic()
        # 6 s of winding down, each line 0.5 s after the last: longer than the quiet time in all,
        # never that long without a line.
        cancelled = control.cancel(run, quiet_s=2, wait_s=60)
        took = time.monotonic() - started
        reaper.join(timeout=10)
    finally:
        if fake.poll() is None:
            fake.kill()
    said = run.log.read_text()
    assert cancelled.state == "cancelled"
    if hung:  # nothing for 2 s: everything stopped, well before the 6 s it would have taken
        assert "killed" in said and "stopped by itself" not in said and 2 <= took < 6, (took, said)
    else:
        assert "stopped by itself" in said and "killed" not in said and took >= 6, (took, said)


def test_bad_input_names_the_thing_at_fault(repo: Path, tmp_path: Path) -> None:
    bad = snakedvc(repo, "submit", "--name", "a;rm -rf /", check=False)
    assert bad.returncode == 1 and "'a;rm -rf /'" in bad.stderr
    missing = snakedvc(repo, "submit", "--profile", "profiles/nope", check=False)
    assert missing.returncode == 1 and "profiles/nope" in missing.stderr and "snakedvc init" in missing.stderr
    unknown = snakedvc(repo, "logs", "20990101-000000-beef", check=False)
    assert unknown.returncode == 1 and "20990101-000000-beef" in unknown.stderr
    for command in ("logs", "cancel"):  # an empty id is no prefix of every run
        empty = snakedvc(repo, command, "", check=False)
        assert empty.returncode == 1 and "give a run" in empty.stderr, empty.stderr
    # The workflow is loaded before anything is frozen: a missing config file or a bad key stops here.
    nofile = snakedvc(repo, "submit", "--", "--configfile", "config/nope.yaml", check=False)
    assert nofile.returncode == 1 and "config/nope.yaml" in nofile.stderr and "Traceback" not in nofile.stderr
    badkey = snakedvc(repo, "submit", "--", "--config", "train={lr: fast}", check=False)
    assert badkey.returncode == 1 and "train" in badkey.stderr and "lr" in badkey.stderr, badkey.stderr
    assert git(repo, "for-each-ref", "refs/snakedvc") == ""  # nothing frozen
    outside = snakedvc(repo, "submit", "--share", "../../../../../tmp", check=False)
    assert outside.returncode == 1 and "only paths inside the project" in outside.stderr, outside.stderr
    assert not list((tmp_path.parent).glob("**/workspace/tmp"))
    assert not (repo / ".snakedvc" / "runs").exists() or not list((repo / ".snakedvc" / "runs").iterdir())
    profile = tmp_path / "p"
    profile.mkdir()
    (profile / "controller.yaml").write_text("partition: cpu\nruntim: 10\n")
    with pytest.raises(RunError, match=r"controller.yaml: unknown config key .runtim."):
        controller_settings(profile)
    (profile / "controller.yaml").write_text("mem_mb: lots\n")
    with pytest.raises(RunError, match="mem_mb.*not of type .integer."):
        controller_settings(profile)


def test_submitted_slurm_jobs_are_read_from_the_executors_log_lines() -> None:
    # The lines as snakemake-executor-plugin-slurm 2.8.0 logs them (its __init__.run_job), with a
    # Snakemake progress line between them; a rule with wildcards, one without, a group job.
    log = (
        "Job 2 has been submitted with SLURM jobid 41 (log: /p/.snakemake/slurm_logs/rule_sweep_trial/lr_0.01/41.log).\n"
        "2 of 6 steps (33%) done\n"
        "Job 5 has been submitted with SLURM jobid 42 (log: /p/.snakemake/slurm_logs/rule_featurise/valid/42.log).\n"
        "Job 9 has been submitted with SLURM jobid 43 (log: /p/.snakemake/slurm_logs/group_shards/43.log).\n"
        "Job 3 has been submitted with SLURM jobid 44 (log: /p/.snakemake/slurm_logs/rule_train/44.log).\n"
        "Job 7 has been submitted with SLURM jobid 45\n"
    )
    assert list(submitted_slurm_jobs(log)) == ["41", "42", "43", "44", "45"]
    assert submitted_slurm_jobs(log)["42"] == "/p/.snakemake/slurm_logs/rule_featurise/valid/42.log"
    assert slurm_jobs(log) == {
        "41": "sweep_trial lr_0.01",
        "42": "featurise valid",
        "43": "group shards",
        "44": "train",
        "45": "",
    }


def test_the_controller_job_matches_its_reference_command_line() -> None:
    """The controller's sbatch call for profiles/slurm (tests/reference/runs/), paths made stable."""
    import shlex

    from snakedvc.engine.runs import Run
    from tests.conftest import REPO

    run = Run(id="20260101-000000-abcd", name="lr-3e-4", root="/home/me/project", commit="c", baseline="b",
              profile="profiles/slurm", snakemake_args=[], slurm=True, created=0.0)  # fmt: skip
    command = sbatch_command(run, controller_settings(REPO / "profiles" / "slurm"), run.dir / "controller.sh")
    text = shlex.join(command) + "\n"
    reference = REPO / "tests" / "reference" / "runs" / "controller-sbatch.txt"
    if os.environ.get("SNAKEDVC_UPDATE_REFERENCES") == "1":
        reference.parent.mkdir(exist_ok=True)
        reference.write_text(text)
    assert text == reference.read_text(), f"the controller's sbatch call differs from {reference}"


def test_packages_installed_editable_from_the_repository_are_imported_from_the_workspace(tmp_path: Path) -> None:
    from snakedvc.engine.runs.workspace import source_paths
    from tests.conftest import REPO

    workspace = tmp_path / "workspace"
    for folder in ("src", "examples/esol/src"):
        (workspace / folder).mkdir(parents=True)
    # This environment installs the kit (with its SLURM executor) and ESOL's steps editable from here.
    assert source_paths(REPO, workspace) == sorted(str(workspace / f) for f in ("src", "examples/esol/src"))
    assert source_paths(tmp_path, workspace) == []  # nothing is installed from tmp_path


# A training long enough to be killed mid-run (tens of seconds on 2 cores), checkpointing every 50 epochs.
LONG_TRAIN = [
    "--config",
    "data={limit: 200}",
    "train={max_epochs: 2500, patience: 100000, hidden_sizes: [64], checkpoint_every: 50}",
]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_lost_local_run_resumes_from_its_checkpoint_and_saves_its_experiment(repo: Path) -> None:
    run_id = submit(repo, "--name", "interrupted", "--", *LONG_TRAIN)
    run_dir = repo / ".snakedvc" / "runs" / run_id
    workspace = run_dir / "workspace"
    train_log = workspace / "logs" / "train.log"

    def training() -> str:
        return train_log.read_text() if train_log.exists() else ""

    def logs() -> str:
        return snakedvc(repo, "logs", run_id).stdout[-2000:] + "\n--- train.log:\n" + training()[-2000:]

    def record() -> dict:
        return json.loads((run_dir / "run.json").read_text())

    def training_shows(text: str) -> bool:
        assert record()["state"] in ("queued", "running"), logs()  # ended early: no point waiting
        return text in training()

    try:
        # Killed between two periodic checkpoints, well after the first.
        shows = "checkpoint (periodic): "
        wait_until(lambda: training_shows(shows), "a periodic checkpoint", timeout=300, poll=0.5, explain=logs)
        wait_until(lambda: training_shows("epoch 170 "), "epoch 170", timeout=300, poll=0.5, explain=logs)
        first = record()["controller_pid"]
        trainers = trainers_in(workspace)
        assert trainers, logs()
        # The machine is lost: the controller's process group (Snakemake, the trainer) dies at once.
        os.killpg(first, signal.SIGKILL)
        for pid in trainers_in(workspace):  # (it dies with the group; this is a backstop)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gone = "the end of the killed processes"
        wait_until(lambda: not any(map(alive, [first, *trainers])), gone, timeout=30, poll=0.5, explain=logs)
        reached = max(int(n) for n in re.findall(r"esol.train: epoch (\d+) ", training()))
        assert runs(repo)[run_id]["state"] == "lost"
        assert "interrupted" not in dvc_experiments(repo)

        resumed = snakedvc(repo, "resume", run_id)
        second = record()["controller_pid"]
        assert f"resumed run {run_id} (interrupted): controller process {second}" in resumed.stdout
        assert second != first and record()["attempt"] == 2
        ended = wait_until_ended(repo, run_id)
        assert ended["state"] == "done", logs()
    finally:  # nothing of this run outlives a failed test
        if record()["state"] in ("queued", "running"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record()["controller_pid"], signal.SIGKILL)
        for pid in trainers_in(workspace):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    log = train_log.read_text()
    # The new trainer took the dead one's lease over and went on from its last periodic checkpoint.
    takeover = re.search(
        r"WARNING .* took over the lease on \S+ from host \S+, pid (\d+): process \1 no longer runs", log
    )
    assert takeover and int(takeover.group(1)) in trainers, log[-3000:]
    restart = re.search(r"resumed from epoch (\d+) step (\d+) \(periodic checkpoint", log)
    assert restart, log[-3000:]
    epoch, step = int(restart.group(1)), int(restart.group(2))
    assert epoch % 50 == 1 and 151 <= epoch <= reached + 1 and step == 0, (epoch, step, reached)
    assert "epoch 2500 " in log
    assert ended["experiments"] == ["interrupted"]
    exps = dvc_experiments(repo)
    assert exps["interrupted"]["params"]["train"]["max_epochs"] == 2500
    assert exps["interrupted"]["metrics"] == json.loads((workspace / "results" / "metrics.json").read_text())

    finished = snakedvc(repo, "resume", run_id, check=False)
    assert finished.returncode == 1 and f"run {run_id} has finished" in finished.stderr
    with pytest.raises(RunError, match="has finished"):
        resume(find_run(repo, run_id))


def test_a_listing_cut_off_by_its_reader_ends_without_a_traceback(tmp_path: Path) -> None:
    """`snakedvc runs | head` (here: a pipe closed before the listing): no Python traceback."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    read_end, write_end = os.pipe()
    os.close(read_end)
    listed = subprocess.run([*SNAKEDVC, "runs", "--json"], cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE,
                            text=True, timeout=120)  # fmt: skip
    os.close(write_end)
    assert listed.returncode == 141 and "Traceback" not in listed.stderr, listed.stderr


def test_a_run_whose_first_step_has_not_ended_counts_its_planned_jobs(tmp_path: Path) -> None:
    """JOBS in `snakedvc runs` read '-' until a first step ended (issue 50's trial): Snakemake's job
    stats give the total first; a controller started again (resume) counts from its own table."""
    from types import SimpleNamespace

    from snakedvc.engine.runs.state import progress

    log = tmp_path / "controller.log"
    stats = "Job stats:\njob      count\n-----  -------\nfit          1\nall          1\ntotal        2\n"
    log.write_text("Building DAG of jobs...\n" + stats + "rule fit:\n")
    assert progress(SimpleNamespace(log=log)) == (0, 2)
    log.write_text(log.read_text() + "Finished jobid: 1 (Rule: fit)\n1 of 2 steps (50%) done\n")
    assert progress(SimpleNamespace(log=log)) == (1, 2)
    log.write_text(log.read_text() + "total 12\n")  # a stage's `ls -l`, not Snakemake's table
    assert progress(SimpleNamespace(log=log)) == (1, 2)
    log.write_text(
        log.read_text() + "[snakedvc controller] attempt 2\n" + stats.replace("total        2", "total        1")
    )
    assert progress(SimpleNamespace(log=log)) == (0, 1)
