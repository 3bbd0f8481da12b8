"""Faults while a run is recorded, made for real: a git lock held by another process, the DVC cache on
a full filesystem (during `dvc add`, and filled before `dvc exp save`), the controller killed in its
save, an unreachable DVC remote, the user committing mid-run. Each ends with the earlier experiments
intact, no half-saved experiment, a message naming the cause and what to do, and a rerun that
completes. Where a run can be on SLURM, each is made there too (the test cluster)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import dvc, dvc_experiments, git, run_snakemake

SNAKEFILE = """\
import snakedvc

configfile: "config.yaml"
include: snakedvc.module_path("kit")

rule train:
    output: "out/model.bin"
    params: lr=config["train"]["lr"]
    shell: "sleep {config[pause]} && head -c {config[size]} /dev/urandom > {output}"

rule all:
    default_target: True
    input: snakedvc.targets(config, rules.train.output, track=rules.train.output)
"""
CONFIG = """\
size: 1000
pause: 0
train:
  lr: 0.01
snakedvc:
  experiment: {metrics: []}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Snakefile").write_text(SNAKEFILE)
    (project / "config.yaml").write_text(CONFIG)
    (project / "dvc.yaml").write_text("params: [results/params.yaml]\n")
    (project / ".gitignore").write_text("/out/**\n!/out/**/\n!/out/**/*.dvc\n/.snakemake/\n")
    git(project, "init", "-q", "-b", "main")
    dvc(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "project")
    run_snakemake(project, *run_named("first"))  # an earlier experiment, which every fault must leave intact
    return project


def run_named(name: str, lr: float = 0.01) -> list[str]:
    return ["--cores", "1", "--config", f"train={{lr: {lr}}}", f"snakedvc={{experiment: {{name: {name}}}}}"]


ON_SLURM_TOO = pytest.mark.parametrize("where", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])


def profile(where: str, request: pytest.FixtureRequest) -> list[str]:
    """The kit's profile for ``where``: on SLURM the run's train step is a job on the test cluster."""
    if where == "slurm":
        request.getfixturevalue("slurm_cluster")
    return ["--profile", str(Path(__file__).resolve().parents[1] / "src/snakedvc/profiles" / where)]


def experiments(project: Path) -> dict[str, float]:
    return {name: e["params"]["train"]["lr"] for name, e in dvc_experiments(project).items()}


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


@ON_SLURM_TOO
def test_git_index_locked_by_another_process(
    project: Path, monkeypatch: pytest.MonkeyPatch, where: str, request: pytest.FixtureRequest
) -> None:
    on = profile(where, request)
    monkeypatch.setenv("SNAKEDVC_GIT_LOCK_WAIT_S", "2")
    lock = project / ".git/index.lock"
    lock.write_text("")  # as a git command of the user's holds it
    (project / "out/model.bin").unlink()
    failed = run_snakemake(project, *on, *run_named("second", 0.02), check=False)
    assert failed.returncode != 0
    assert f"git's index is locked by another git process ({lock} exists)" in said(failed)
    assert "No experiment was saved, and none was half-saved" in said(failed)
    assert experiments(project) == {"first": 0.01}
    lock.unlink()  # the user's git command ends
    rerun = run_snakemake(project, *on, *run_named("second", 0.02))
    assert "an earlier run's experiment was not saved (its save failed): saving it first" in said(rerun)
    assert experiments(project) == {"first": 0.01, "second": 0.02}
    assert not (project / ".snakedvc/pending-save.json").exists()


@pytest.fixture
def small_cache(project: Path) -> Iterator[Path]:
    """DVC's cache on a 64 KiB filesystem of its own (tmpfs; needs root, as CI has)."""
    mount = project.parent / "cache"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        dvc(project, "cache", "dir", str(mount))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_the_dvc_cache_on_a_full_filesystem(project: Path, small_cache: Path) -> None:
    failed = run_snakemake(project, *run_named("big", 0.03), "size=200000", check=False)
    assert failed.returncode != 0
    log = "logs/snakedvc/track/out/model.bin.log"  # named in Snakemake's error (profiles show it whole)
    assert "Error in rule kit_track" in said(failed) and log in said(failed), said(failed)[-3000:]
    assert "No space left on device" in (project / log).read_text() and "dvc add" in (project / log).read_text()
    assert experiments(project) == {"first": 0.01}
    assert not (project / "out/model.bin.dvc").exists()  # nothing recorded of the half-copied output
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_cache)], check=True)  # space freed
    run_snakemake(project, *run_named("big", 0.03), "size=200000")
    assert experiments(project) == {"first": 0.01, "big": 0.03}
    assert dvc(project, "status", "--quiet", check=False).returncode == 0


def test_the_dvc_cache_filled_between_dvc_add_and_dvc_exp_save(project: Path, small_cache: Path) -> None:
    """Another process fills the cache's filesystem once the output's `dvc add` is done, before the
    run's `dvc exp save`: the save writes nothing there (the outputs are cached), so the run is
    recorded, and the filesystem is as full after it."""
    import sys
    import threading
    import time

    from tests.waiting import wait_until

    pointer, filler, pending = (
        project / "out/model.bin.dvc",
        small_cache / "filler",
        project / ".snakedvc/pending-save.json",
    )
    filled_while: list[bool] = []

    def fill_once_added() -> None:
        wait_until(pointer.is_file, "the output's dvc add", 120, poll=0.01)
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1k"], capture_output=True)  # until ENOSPC
        filled_while.append(pending.exists())  # whether the save had begun: it must not have

    (project / "out/model.bin").unlink()
    pointer.unlink()
    filling = threading.Thread(target=fill_once_added, daemon=True)
    filling.start()
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "snakemake", *run_named("filled", 0.07)], cwd=project,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    filling.join(timeout=60)
    assert filled_while == [False], "the cache was filled only after the save began: nothing was tested"
    assert run.returncode == 0, said(run)[-3000:]
    assert os.statvfs(small_cache).f_bavail == 0 and filler.stat().st_size > 0
    assert experiments(project) == {"first": 0.01, "filled": 0.07}, time.monotonic() - started


def test_an_unreachable_dvc_remote_keeps_the_saved_experiment_and_says_how_to_push(
    project: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "disk"
    blocker.write_text("not a folder")  # the remote's disk is not there (root may write anywhere else)
    gone = blocker / "remote"
    dvc(project, "remote", "add", "-d", "--local", "store", str(gone))
    bare = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    git(project, "remote", "add", "origin", str(bare))
    push_on = "snakedvc={experiment: {name: pushed, push: true}}"
    failed = run_snakemake(project, *run_named("pushed", 0.04), push_on, check=False)
    assert failed.returncode != 0
    assert "experiment pushed is saved, but pushing it failed (DVC remotes: store " in said(failed)
    assert "push it again: dvc push && dvc exp push origin pushed" in said(failed)
    assert experiments(project) == {"first": 0.01, "pushed": 0.04}
    assert not (project / ".snakedvc/pending-save.json").exists()  # saved: nothing left to redo
    blocker.unlink()  # the disk is back
    dvc(project, "push")
    dvc(project, "exp", "push", "origin", "pushed")
    assert "pushed" in git(bare, "for-each-ref", "--format=%(refname)")
    assert os.listdir(gone)  # the data reached the remote


def submit_held_in_its_save(project: Path, profile_args: list[str], name: str, *config: str) -> tuple[str, Path]:
    """A detached run (lr 0.05) whose save has begun and waits on git's index lock: (run id, the lock)."""
    import sys

    from tests.waiting import wait_until

    submitted = subprocess.run(
        [sys.executable, "-m", "snakedvc", "submit", *profile_args, "--name", name, "--",
         "--config", "train={lr: 0.05}", *config],
        cwd=project, capture_output=True, text=True, check=True,
    )  # fmt: skip
    run_id = submitted.stdout.strip()
    workspace = project / ".snakedvc/runs" / run_id / "workspace"
    lock = workspace / git(workspace, "rev-parse", "--git-path", "index.lock").strip()
    lock.write_text("")
    wait_until((workspace / ".snakedvc/pending-save.json").is_file, "the run's save to begin", 120, poll=0.2)
    return run_id, lock


@ON_SLURM_TOO
def test_the_controller_killed_while_saving_then_resumed(
    project: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """A detached run's controller (its machine) is lost in the middle of its save; `snakedvc resume`
    then saves that run's experiment, once. On SLURM the controller is a job, and its train step
    another: the controller's job is killed (SIGKILL to every process of it, as a node lost)."""
    import json
    import signal
    import sys
    import time

    from tests.waiting import text_of, wait_until

    # The controller is killed in the middle of the save, which waits on git's index lock.
    run_id, lock = submit_held_in_its_save(project, profile(where, request), "lost", "pause=4")
    run_dir = project / ".snakedvc/runs" / run_id
    pending = run_dir / "workspace/.snakedvc/pending-save.json"
    record = json.loads((run_dir / "run.json").read_text())
    if where == "slurm":
        (job,) = record["controller_jobs"]
        subprocess.run(["scancel", "--signal=KILL", "--full", job], check=True)
        queued = ["squeue", "-h", "-j", job, "-o", "%i"]

        def gone() -> bool:  # a squeue that failed (a busy slurmctld) says nothing: not gone
            said = subprocess.run(queued, capture_output=True, text=True)
            return (said.returncode == 0 and not said.stdout.strip()) or "Invalid job id" in said.stderr

        wait_until(gone, f"controller job {job} gone", 60, poll=0.5)
    else:
        os.killpg(record["controller_pid"], signal.SIGKILL)
        time.sleep(1)
    assert "lost" not in experiments(project)  # asked while the lock still holds every save back
    lock.unlink()
    resumed = subprocess.run([sys.executable, "-m", "snakedvc", "resume", run_id], cwd=project, capture_output=True,
                             text=True)  # fmt: skip
    # SLURM may deliver a TERM to the controller's job before the KILL (seen in CI under load): the
    # controller then starts its own successor, as on a time limit, and that one saves; resume then
    # finds the run finished. Either way the run's experiment is saved once, as checked below.
    assert resumed.returncode == 0 or "has finished" in resumed.stderr, resumed.stderr

    def ended() -> dict | None:
        listed = json.loads(subprocess.run([sys.executable, "-m", "snakedvc", "runs", "--json"], cwd=project,
                                           capture_output=True, text=True, check=True).stdout)  # fmt: skip
        (state,) = [r for r in listed if r["id"] == run_id]
        return state if state["state"] not in ("queued", "running") else None

    state = wait_until(ended, f"run {run_id} to end", 180, poll=1)
    assert state["state"] == "done" and state["experiments"] == ["lost"], (
        state,
        text_of(run_dir / "controller.log")[-3000:],
    )
    assert experiments(project) == {"first": 0.01, "lost": 0.05}
    assert not pending.exists()
    if where == "slurm":  # two controller jobs (the killed one, resume's), the train step a SLURM job too
        after = json.loads((run_dir / "run.json").read_text())
        assert len(after["controller_jobs"]) == 2 and after["controller_jobs"][0] == job, after
        assert state["slurm_jobs"], state


@ON_SLURM_TOO
def test_the_user_commits_to_the_branch_while_a_run_is_going(
    project: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """`dvc exp save` builds on HEAD: the record said the run ran on the user's new commit, code it
    never saw. It is put on the commit the run started from."""
    import sys

    from tests.waiting import wait_until

    start = git(project, "rev-parse", "HEAD").strip()
    run = subprocess.Popen(
        [sys.executable, "-m", "snakemake", *profile(where, request), *run_named("during", 0.06), "pause=6"],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    claim = project / ".git/snakedvc-names/during"  # made as the run starts (its Snakefile read)
    wait_until(claim.is_file, "the run to start", 60, poll=0.2, proc=run)
    (project / "NOTES.md").write_text("a note the user commits while the run goes on\n")
    git(project, "add", "NOTES.md")
    git(project, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "notes")
    moved = git(project, "rev-parse", "HEAD").strip()
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 0, output[-3000:]
    assert f"experiment during is put on {start[:12]}, the commit the run started from" in output, output[-2500:]
    refs = git(project, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    (ref,) = [r for r in refs if r.endswith("/during")]
    assert ref == f"refs/exps/{start[:2]}/{start[2:]}/during"
    assert git(project, "rev-parse", f"{ref}^").strip() == start
    files = git(project, "ls-tree", "-r", "--name-only", ref).split()
    assert "NOTES.md" not in files and "out/model.bin.dvc" in files and "results/params.yaml" in files
    assert git(project, "rev-parse", "HEAD").strip() == moved  # the user's branch is left as it is
    assert experiments_all(project) == {"first": 0.01, "during": 0.06}


def experiments_all(project: Path) -> dict[str, float]:
    """name -> lr of every experiment, on any commit (`dvc exp show -A`)."""
    import json

    found = {}
    for commit in json.loads(dvc(project, "exp", "show", "-A", "--json").stdout):
        for exp in commit.get("experiments") or []:
            rev = exp["revs"][0]
            found[exp.get("name") or rev["name"]] = rev["data"]["params"]["results/params.yaml"]["data"]["train"]["lr"]
    return found


def kit(project: Path, *args: str) -> str:
    import sys

    command = [str(Path(sys.executable).parent / "snakedvc"), *args]
    return subprocess.run(command, cwd=project, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("way_out", ["the config corrected", "the save dropped"])
def test_a_save_that_cannot_succeed_is_no_trap(project: Path, way_out: str) -> None:
    """experiment.files naming a path the run does not write (inside its output, so the check
    before any job lets it by): the save fails and stays pending, and the next run with the same
    config is refused saying the way out (before, every later run was refused, the corrected
    config too: the pending save kept the old settings). Corrected, the next run does the pending
    save with the new settings first; or `snakedvc pending drop` gives it up."""
    broken = CONFIG.replace("experiment: {metrics: []}", "experiment: {metrics: [], files: [out/model.bin/live]}")
    (project / "config.yaml").write_text(broken)
    failed = run_snakemake(project, *run_named("second", lr=0.02), check=False)
    assert failed.returncode != 0
    assert "experiment not saved: the run did not produce out/model.bin/live" in said(failed)
    refused = run_snakemake(project, *run_named("third", lr=0.03), check=False)
    assert refused.returncode != 0 and "experiment second" in said(refused)
    assert "snakedvc pending drop" in said(refused) and "Traceback" not in said(refused)[-1500:]
    assert "snakedvc/engine/" not in said(refused)  # the message, not the kit's stack lines (read as a crash)
    assert "pending save" in kit(project, "runs") and "experiment second" in kit(project, "pending")
    if way_out == "the config corrected":
        (project / "config.yaml").write_text(CONFIG)
        run_snakemake(project, *run_named("third", lr=0.03))
        assert experiments(project) == {"first": 0.01, "second": 0.02, "third": 0.03}
    else:
        assert "dropped the pending save: experiment second" in kit(project, "pending", "drop")
        (project / "config.yaml").write_text(CONFIG)
        run_snakemake(project, *run_named("third", lr=0.03))
        assert experiments(project) == {"first": 0.01, "third": 0.03}
    assert "no pending save" in kit(project, "pending")


def test_experiment_files_no_job_writes_stop_the_run_before_any_job(project: Path) -> None:
    """A `files:` entry that no job of the run writes is a config mistake: said before any job, with
    what to do; nothing trained, no save left pending (issue 50: it trained, then the save failed)."""
    model = project / "out/model.bin"
    before = model.read_bytes()
    broken = CONFIG.replace("experiment: {metrics: []}", "experiment: {metrics: [], files: [out/live]}")
    (project / "config.yaml").write_text(broken)
    refused = run_snakemake(project, *run_named("second", lr=0.02), check=False)
    message = said(refused)
    assert refused.returncode != 0
    assert "snakedvc.experiment: out/live (in metrics / files) is not an output of any job of this run" in message
    assert "No job was started" in message and "snakedvc/engine/" not in message, message[-3000:]
    assert model.read_bytes() == before and not (project / ".snakedvc/pending-save.json").exists()
    assert experiments(project) == {"first": 0.01}


def test_a_save_still_in_progress_is_not_taken_for_a_pending_one(tmp_path: Path) -> None:
    """A second run started while the first is saving found the first's mark and took it for a
    failed earlier save: it saved that experiment again beside the first (found by CI). The mark
    names its saver; a live saver on this host means no save is pending."""
    import json
    import socket
    import sys

    from snakedvc.engine.finish import PENDING_FILE, pending_save

    mark = tmp_path / PENDING_FILE
    mark.parent.mkdir(parents=True)
    saver = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    left = {"config": {}, "outputs": ["out/model.bin"], "pid": saver.pid, "host": socket.gethostname()}
    mark.write_text(json.dumps(left))
    try:
        assert pending_save(tmp_path) is None
    finally:
        saver.communicate(b"")
    assert pending_save(tmp_path) == left  # its saver gone, the save is pending


def test_a_cancel_while_the_run_saves_leaves_no_process_and_no_half_record(
    project: Path, request: pytest.FixtureRequest
) -> None:
    """`snakedvc cancel` in the last phase of a run, its save (held here on git's index lock):
    the controller and its processes stop, `runs` says cancelled, and the record is whole or
    absent: no experiment half-saved, no save left pending to be done by a later run (a cancel
    means no experiment), and the next run saves its own (issue 51: a cancel in every phase)."""
    import json
    import sys

    from tests.test_stop_group import alive

    run_id, lock = submit_held_in_its_save(project, profile("local", request), "stopped")
    run_dir = project / ".snakedvc/runs" / run_id
    workspace = run_dir / "workspace"
    pid = json.loads((run_dir / "run.json").read_text())["controller_pid"]
    cancelled = subprocess.run([sys.executable, "-m", "snakedvc", "cancel", run_id], cwd=project,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    lock.unlink()
    assert cancelled.returncode == 0 and "cancelled run" in cancelled.stdout, said(cancelled)
    listed = json.loads(subprocess.run([sys.executable, "-m", "snakedvc", "runs", "--json"], cwd=project,
                                       capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert [r["state"] for r in listed if r["id"] == run_id] == ["cancelled"]
    assert not alive(pid)
    assert not processes_in(workspace)
    assert experiments(project) == {"first": 0.01}
    run_snakemake(project, *run_named("after", lr=0.03))
    assert experiments(project) == {"first": 0.01, "after": 0.03}


def processes_in(folder: Path) -> list[str]:
    """Live processes working in ``folder`` (their cwd under it), as 'pid command'."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (
                Path(os.readlink(proc / "cwd")).is_relative_to(folder)
                and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{proc.name} {command[:200]}")
        except OSError:
            continue
    return found
