"""From a laptop to the cluster over SSH (issue 45): a real OpenSSH server on 127.0.0.1 (tests/sshd.py),
a "laptop" project whose PATH has no SLURM command, the cluster side in a folder of its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import accounted_jobs, git, without_slurm
from tests.sshd import SshServer, keygen, laptop_env, start_sshd
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

PIPELINE = """\
stages:
  prepare:
    cmd: echo ${n} > data.txt
    params: [n]
    outs: [data.txt]
  train:
    cmd: >-
      cat data.txt > model.txt && echo ${lr} >> model.txt && echo '{"score": ${lr}}' > metrics.json
    deps: [data.txt]
    params: [lr]
    outs: [model.txt]
    metrics: [{metrics.json: {cache: false}}]
"""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    server, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    proc.terminate()
    proc.wait(timeout=10)


def run(cwd: Path, env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def laptop_project(tmp_path: Path, env: dict[str, str]) -> Path:
    """A git + DVC project with a directory DVC remote, reproduced and pushed; no git origin."""
    project = tmp_path / "laptop" / "solubility"
    project.mkdir(parents=True)
    (project / "params.yaml").write_text("n: 1\nlr: 0.1\n")
    (project / "dvc.yaml").write_text(PIPELINE)
    git(project, "init", "-q", "-b", "main")
    run(project, env, str(BIN / "dvc"), "init", "-q")
    run(project, env, str(BIN / "dvc"), "remote", "add", "-d", "store", str(tmp_path / "dvc-store"))
    run(project, env, str(BIN / "dvc"), "repro")
    run(project, env, str(BIN / "dvc"), "push", "-q")
    git(project, "add", "-A")
    run(project, env, "git", "commit", "-q", "-m", "a DVC pipeline, reproduced and pushed")
    return project


def experiment(repo: Path, env: dict[str, str], name: str) -> dict:
    shown = json.loads(run(repo, env, str(BIN / "dvc"), "exp", "show", "--json").stdout)
    for baseline in shown:
        for exp in baseline.get("experiments") or []:
            for rev in exp["revs"]:
                if rev["name"] == name:
                    return {"params": rev["data"]["params"], "metrics": rev["data"]["metrics"]}
    raise AssertionError(f"no experiment {name} in dvc exp show: {shown}")


def test_a_dvc_pipeline_submitted_from_a_laptop_runs_on_the_cluster_and_comes_home(
    tmp_path: Path, sshd: SshServer
) -> None:
    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), f"{BIN}:{without_slurm(tmp_path)['PATH']}")
    assert shutil.which("sbatch", path=laptop["PATH"]) is None
    project = laptop_project(tmp_path, laptop)
    cluster_root = tmp_path / "cluster" / "runs"
    kit = [str(BIN / "snakedvc")]
    run(
        project,
        laptop,
        *kit,
        "remote",
        "add",
        "hpc",
        f"ssh://cluster{cluster_root}",
        "--snakedvc",
        str(BIN / "snakedvc"),
        "--profile",
        "local",
    )
    # Checked here, before anything is sent: a -S value Hydra cannot parse, a stage that is not there.
    for wrong, said in ((["-S", "lr=[1,"], "no viable alternative"), (["--target", "nostage"], "nostage")):
        refused = run(project, laptop, *kit, "submit", "--remote", "hpc", *wrong, check=False)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
        assert "(checked here; nothing was sent to remote hpc)" in refused.stderr and "Traceback" not in refused.stderr
    assert not cluster_root.exists()
    # Uncommitted, as a person submits: the code as it is now is what runs.
    (project / "params.yaml").write_text("n: 1\nlr: 0.1\n# tried on the cluster\n")
    submitted = run(project, laptop, *kit, "submit", "--remote", "hpc", "-S", "lr=0.5", "--name", "from-laptop")
    assert "you may disconnect" in submitted.stderr, submitted.stderr
    # The hints the laptop's terminal shows are the laptop's commands (the cluster's said `logs -f ID`).
    assert "`snakedvc logs -f" not in submitted.stderr and "`snakedvc logs --remote hpc -f" in submitted.stderr

    def listed() -> list[dict]:
        return json.loads(run(project, laptop, *kit, "runs", "--remote", "hpc", "--json").stdout)

    wait_until(lambda: [r["state"] for r in listed()] in (["done"], ["failed"]), timeout=300, what="the remote run")
    (remote_run,) = listed()
    assert remote_run["state"] == "done", run(project, laptop, *kit, "logs", "--remote", "hpc", remote_run["id"]).stdout
    assert run(project, laptop, *kit, "pull", "--remote", "hpc", "from-laptop").stdout.split() == ["from-laptop"]

    # The same run made on the cluster directly, in a clone there.
    direct = tmp_path / "cluster" / "direct"
    git(tmp_path, "clone", "-q", str(project), str(direct))
    run(direct, laptop, *kit, "exp", "run", "--pull", "-S", "lr=0.5", "-n", "direct")
    assert experiment(project, laptop, "from-laptop") == experiment(direct, laptop, "direct")
    assert experiment(project, laptop, "from-laptop")["params"]["params.yaml"]["data"]["lr"] == 0.5
    (project / "model.txt").unlink()
    run(project, laptop, str(BIN / "dvc"), "exp", "apply", "from-laptop")
    assert (project / "model.txt").read_bytes() == (direct / "model.txt").read_bytes() == b"1\n0.5\n"

    # A name this laptop's experiments have (here pulled) is refused here, before any trip.
    pushes = git(tmp_path / "cluster" / "runs" / "solubility", "for-each-ref", "refs/snakedvc/incoming")
    taken = run(project, laptop, *kit, "exp", "run", "--remote", "hpc", "-S", "lr=0.6", "-n", "from-laptop",
                check=False)  # fmt: skip
    assert taken.returncode == 255 and "experiment 'from-laptop' exists already" in taken.stderr, taken.stderr
    assert "(checked here; nothing was sent to remote hpc)" in taken.stderr and "--replace" in taken.stderr
    assert git(tmp_path / "cluster" / "runs" / "solubility", "for-each-ref", "refs/snakedvc/incoming") == pushes

    # `exp run --remote`: the same trip, in dvc exp run's words.
    run(project, laptop, *kit, "exp", "run", "--remote", "hpc", "-S", "lr=0.7", "-n", "second")
    wait_until(lambda: all(r["state"] in ("done", "failed") for r in listed()), timeout=300, what="the second run")
    assert [r["state"] for r in listed()] == ["done", "done"]
    assert run(project, laptop, *kit, "pull", "--remote", "hpc", "second").stdout.split() == ["second"]
    assert experiment(project, laptop, "second")["params"]["params.yaml"]["data"]["lr"] == 0.7

    # A pull never overwrites a record: an experiment of this repository's with the remote's name
    # on the same commit (here another run's, in its ref) stays; the remote's comes as second-hpc.
    exp_refs = {
        r.rsplit("/", 1)[1]: r for r in git(project, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    }
    git(project, "update-ref", exp_refs["second"], exp_refs["from-laptop"])
    again = run(project, laptop, *kit, "pull", "--remote", "hpc", "second")
    assert again.stdout.split() == ["second-hpc"] and "comes as second-hpc" in again.stderr, again.stderr
    assert experiment(project, laptop, "second")["params"]["params.yaml"]["data"]["lr"] == 0.5  # from-laptop's
    assert experiment(project, laptop, "second-hpc")["params"]["params.yaml"]["data"]["lr"] == 0.7
    assert run(project, laptop, *kit, "pull", "--remote", "hpc", "second").stdout.split() == ["second-hpc"]
    assert "second-hpc-2" not in git(project, "for-each-ref", "refs/exps")


def test_a_wrong_host_key_a_failed_login_or_a_path_outside_the_root_is_named_and_sends_nothing(
    tmp_path: Path, sshd: SshServer
) -> None:
    path = f"{BIN}:{without_slurm(tmp_path)['PATH']}"
    kit = [str(BIN / "snakedvc")]
    cluster_root = tmp_path / "cluster" / "runs"
    url = f"ssh://cluster{cluster_root}"
    cases = {
        "host key": sshd.laptop_home(tmp_path / "home-wrong-key", known_host_key=keygen(tmp_path / "another_host_key")),
        "login to": sshd.laptop_home(tmp_path / "home-wrong-login", key=keygen(tmp_path / "unknown_client_key")),
    }
    for words, home in cases.items():
        laptop = laptop_env(home, path)
        project = laptop_project(tmp_path / home.name, laptop)
        added = run(
            project, laptop, *kit, "remote", "add", "hpc", url, "--snakedvc", str(BIN / "snakedvc"), check=False
        )
        assert added.returncode == 1 and words in added.stderr and "nothing was sent" in added.stderr, added.stderr
        assert run(project, laptop, *kit, "remote", "list").stdout == ""  # a failed check keeps nothing
        run(project, laptop, *kit, "remote", "add", "hpc", url, "--snakedvc", str(BIN / "snakedvc"), "--no-check")
        submitted = run(project, laptop, *kit, "submit", "--remote", "hpc", check=False)
        assert submitted.returncode == 1 and words in submitted.stderr, submitted.stderr
        assert not cluster_root.exists()  # nothing pushed, nothing started
    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), path)
    project = laptop_project(tmp_path / "ok", laptop)
    # A kit command that is not there is named at `remote add`, which then keeps nothing.
    wrong = run(project, laptop, *kit, "remote", "add", "hpc", url, "--snakedvc", "/nowhere/snakedvc", check=False)
    assert wrong.returncode == 1 and "'/nowhere/snakedvc' not found" in wrong.stderr, wrong.stderr
    assert "--snakedvc" in wrong.stderr and "Traceback" not in wrong.stderr
    assert run(project, laptop, *kit, "remote", "list").stdout == ""
    # Without --profile, the cluster's: slurm where it has sbatch (one trip with the version check).
    added = run(project, laptop, *kit, "remote", "add", "hpc", url, "--snakedvc", str(BIN / "snakedvc"))
    found = "profile slurm (the cluster has sbatch)" if shutil.which("sbatch") else "profile local (no sbatch there)"
    assert found in added.stdout and f"(the kit there: {BIN / 'snakedvc'}, version 0." in added.stdout, added.stdout
    assert run(project, laptop, *kit, "remote", "list").stdout.split()[-1] == found.split()[1]
    outside = run(project, laptop, *kit, "remote", "add", "up", "ssh://cluster/tmp/../etc", check=False)
    assert outside.returncode == 1 and "without '..'" in outside.stderr, outside.stderr
    # Folders SLURM or git cannot take are refused with why, before any trip; nothing is kept.
    for folder, why in (("/tmp/runs %j", "SLURM reads as a pattern"), ("/tmp/a\nb", "control character")):
        refused = run(
            project, laptop, *kit, "remote", "add", "odd", f"ssh://cluster{folder}", "--snakedvc", kit[0], check=False
        )
        assert refused.returncode == 1 and why in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert [line.split()[0] for line in run(project, laptop, *kit, "remote", "list").stdout.splitlines()] == ["hpc"]
    unknown = run(project, laptop, *kit, "runs", "--remote", "nowhere", check=False)
    assert unknown.returncode == 1 and "snakedvc remote add nowhere" in unknown.stderr, unknown.stderr


@pytest.mark.parametrize("profile", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_a_submission_cut_off_midway_and_sent_again_is_one_run(
    tmp_path: Path, sshd: SshServer, profile: str, request: pytest.FixtureRequest
) -> None:
    """The laptop's submit killed (its ssh with it) once the cluster has begun making the run: the
    same command again sends the same run id, and the cluster adopts the run it has, or finishes
    the half-made one: one run, one experiment; under SLURM, one controller job."""
    if profile == "slurm":
        request.getfixturevalue("slurm_cluster")
    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), f"{BIN}:{without_slurm(tmp_path)['PATH']}")
    project = laptop_project(tmp_path, laptop)
    cluster_root = tmp_path / "cluster" / "runs"
    kit = [str(BIN / "snakedvc")]
    run(
        project,
        laptop,
        *kit,
        "remote",
        "add",
        "hpc",
        f"ssh://cluster{cluster_root}",
        "--snakedvc",
        str(BIN / "snakedvc"),
    )
    command = [*kit, "submit", "--remote", "hpc", "--profile", profile, "-S", "lr=0.3", "--name", "cut"]
    first = subprocess.Popen(command, cwd=project, env=laptop, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    runs_dir = cluster_root / project.name / ".snakedvc" / "runs"
    try:
        wait_until(
            lambda: runs_dir.is_dir() and any(runs_dir.iterdir()), timeout=60, what="the run begun on the cluster"
        )
        os.killpg(first.pid, signal.SIGKILL)  # the laptop's kit and its ssh: the connection drops
    finally:
        first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert (project / ".snakedvc" / "remote-submits" / "hpc.json").is_file()  # not confirmed
    again = run(project, laptop, *command)
    assert "sending run" in again.stderr and "again" in again.stderr, again.stderr

    def listed() -> list[dict]:
        return json.loads(run(project, laptop, *kit, "runs", "--remote", "hpc", "--json").stdout)

    wait_until(lambda: all(r["state"] in ("done", "failed") for r in listed()), timeout=300, what="the remote run")
    assert [(r["name"], r["state"]) for r in listed()] == [("cut", "done")]
    assert not (project / ".snakedvc" / "remote-submits" / "hpc.json").exists()
    assert run(project, laptop, *kit, "pull", "--remote", "hpc").stdout.split() == ["cut"]
    if profile == "slurm":
        workspace = runs_dir / listed()[0]["id"] / "workspace"
        controllers = [job for job in accounted_jobs(workspace) if job["name"] == "snakedvc-cut"]
        assert len(controllers) == 1, controllers


def test_a_submission_sent_again_while_its_first_try_still_runs_waits_for_it(tmp_path: Path) -> None:
    """sshd does not stop a command whose client went away: the cluster-side submit of a run id
    sent again waits while the first try of that id is still making the run (its lock held), then
    adopts it; it never makes the same run beside it (CI once saw the second try's workspace
    removed under the first)."""
    import fcntl

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    project = laptop_project(tmp_path, env)
    (project / "params.yaml").write_text("n: 1\nlr: 0.2\n")
    run(project, env, "git", "commit", "-q", "-am", "the code as submitted")
    sent = ["submit", "--commit", git(project, "rev-parse", "HEAD").strip(), "--run-id", "20260101-000000-beef"]
    locks = project / ".snakedvc" / "sent"
    locks.mkdir(parents=True)
    with open(locks / "20260101-000000-beef.lock", "a") as first_try:
        fcntl.flock(first_try, fcntl.LOCK_EX)
        second = subprocess.Popen([str(BIN / "snakedvc"), *sent, "--name", "again"], cwd=project, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                second.wait(timeout=5)
            assert not (project / ".snakedvc" / "runs" / "20260101-000000-beef").exists()
        finally:
            fcntl.flock(first_try, fcntl.LOCK_UN)
        out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert out.split()[0] == "20260101-000000-beef"
    # Sent a third time once made: adopted, the same run, no second controller.
    third = run(project, env, str(BIN / "snakedvc"), *sent, "--name", "again")
    assert third.stdout.split()[0] == "20260101-000000-beef"
    listed = json.loads(run(project, env, str(BIN / "snakedvc"), "runs", "--json").stdout)
    assert [(r["id"], r["name"]) for r in listed] == [("20260101-000000-beef", "again")]
    wait_until(lambda: json.loads(run(project, env, str(BIN / "snakedvc"), "runs", "--json").stdout)[0]["state"]
               in ("done", "failed"), timeout=120, what="the run")  # fmt: skip


@pytest.mark.slurm
def test_a_snakefile_workflow_submitted_from_a_laptop_runs_on_slurm_and_comes_home(
    tmp_path: Path, sshd: SshServer, slurm_cluster: None
) -> None:
    """The tutorial's project, submitted from the laptop with the SLURM profile: on the cluster the
    controller is a SLURM job and so is each step; the experiment comes home with what the same
    run made on the cluster directly, and `dvc exp apply` restores the model's bytes."""
    from tests.test_tutorial import PREPARE, TRAIN, tutorial_blocks

    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), f"{BIN}:{without_slurm(tmp_path)['PATH']}")
    project = tmp_path / "laptop" / "classifier"
    project.mkdir(parents=True)
    git(project, "init", "-q", "-b", "main")
    (project / "prepare.py").write_text(PREPARE)
    (project / "train.py").write_text(TRAIN)
    run(project, laptop, "git", "add", "-A")
    run(project, laptop, "git", "commit", "-q", "-m", "my classifier")
    run(project, laptop, str(BIN / "snakedvc"), "init")
    blocks = tutorial_blocks()
    for name in ("config.yaml", "Snakefile"):
        (project / name).write_text(blocks[name])
    run(project, laptop, str(BIN / "dvc"), "remote", "add", "-d", "store", str(tmp_path / "dvc-store"))
    run(project, laptop, "git", "add", "-A")
    run(project, laptop, "git", "commit", "-q", "-m", "snakedvc")
    kit = [str(BIN / "snakedvc")]
    run(project, laptop, *kit, "remote", "add", "hpc", f"ssh://cluster{tmp_path / 'cluster'}", "--snakedvc", kit[0])
    run(project, laptop, *kit, "submit", "--remote", "hpc", "--profile", "profiles/slurm", "--name", "tut",
        "--", "--config", "train={lr: 0.05}")  # fmt: skip

    def listed() -> list[dict]:
        return json.loads(run(project, laptop, *kit, "runs", "--remote", "hpc", "--json").stdout)

    wait_until(lambda: listed()[0]["state"] in ("done", "failed"), timeout=600, what="the remote run")
    (remote_run,) = listed()
    assert remote_run["state"] == "done", run(project, laptop, *kit, "logs", "--remote", "hpc", "tut").stdout
    assert remote_run["controller"].isdigit()  # a SLURM job id
    assert run(project, laptop, *kit, "pull", "--remote", "hpc").stdout.split() == ["tut"]

    direct = tmp_path / "direct"
    git(tmp_path, "clone", "-q", str(project), str(direct))
    run(direct, {**laptop, "PATH": f"{BIN}:/usr/bin:/bin"}, str(BIN / "snakemake"), "--profile", "profiles/local",
        "--config", "train={lr: 0.05}", "snakedvc={experiment: {name: direct}}")  # fmt: skip
    assert experiment(project, laptop, "tut") == experiment(direct, laptop, "direct")
    run(project, laptop, str(BIN / "dvc"), "exp", "apply", "tut")
    assert (project / "results/model.pt").read_bytes() == (direct / "results/model.pt").read_bytes()


SLOW = """\
stages:
  slow:
    cmd: sleep 300 && echo done > out.txt
    outs: [out.txt]
"""


@pytest.mark.slurm  # cancel asks SLURM there for the run's jobs: not beside a test that stalls slurmctld
def test_a_remote_run_is_watched_and_cancelled_from_the_laptop(
    tmp_path: Path, sshd: SshServer, slurm_cluster: None
) -> None:
    """runs, logs, cancel and resume --remote show and do on the cluster what they do there; the
    laptop may go away after the submit (its command has returned: the run goes on without it).
    The cluster's folder and the laptop's are named with shell words: none of them runs, anywhere
    on the trip (laptop, ssh, git push, the login node, the SLURM job's script)."""
    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), f"{BIN}:{without_slurm(tmp_path)['PATH']}")
    words = 'it\'s "q" $(touch PWNED1) `touch PWNED2`; touch PWNED3'
    project = tmp_path / f"laptop {words}" / "slow"
    project.mkdir(parents=True)
    (project / "dvc.yaml").write_text(SLOW)
    git(project, "init", "-q", "-b", "main")
    run(project, laptop, str(BIN / "dvc"), "init", "-q")
    git(project, "add", "-A")
    run(project, laptop, "git", "commit", "-q", "-m", "a slow stage")
    kit = [str(BIN / "snakedvc")]
    run(project, laptop, *kit, "remote", "add", "hpc", f"ssh://cluster{tmp_path / 'cluster' / words}", "--snakedvc",
        kit[0])  # fmt: skip
    # The remote's profile: SLURM, as the cluster has sbatch (it ran on the login node, unsaid).
    submitted = run(project, laptop, *kit, "submit", "--remote", "hpc", "--name", "slow")
    assert "(profile slurm)" in submitted.stderr, submitted.stderr

    def state() -> str:
        (listed,) = json.loads(run(project, laptop, *kit, "runs", "--remote", "hpc", "--json").stdout)
        return str(listed["state"])

    wait_until(lambda: state() == "running", timeout=120, what="the remote run running")
    assert "slow" in run(project, laptop, *kit, "runs", "--remote", "hpc").stdout
    assert "(slow), attempt 1" in run(project, laptop, *kit, "logs", "--remote", "hpc", "slow").stdout
    cancelled = run(project, laptop, *kit, "cancel", "--remote", "hpc", "slow")
    assert "cancelled run" in cancelled.stdout, cancelled.stdout
    wait_until(lambda: state() == "cancelled", timeout=120, what="the remote run cancelled")
    assert "resumed run" in run(project, laptop, *kit, "resume", "--remote", "hpc", "slow").stdout
    wait_until(lambda: state() == "running", timeout=120, what="the remote run running again")
    run(project, laptop, *kit, "cancel", "--remote", "hpc", "slow")
    wait_until(lambda: state() == "cancelled", timeout=120, what="the remote run cancelled again")
    sleeping = subprocess.run(["pgrep", "-f", "sleep 300 && echo done"], capture_output=True, text=True).stdout
    assert sleeping.split() == [], sleeping  # nothing of the run is left on the cluster
    assert (tmp_path / "cluster" / words / "slow" / ".git").is_dir()  # the clone is where it was named
    made = [*tmp_path.rglob("PWNED*"), *Path.home().glob("PWNED*"), *Path.cwd().glob("PWNED*")]
    assert made == [], made


def test_with_a_git_origin_the_run_pushes_its_experiment_there_for_plain_dvc_exp_pull(
    tmp_path: Path, sshd: SshServer
) -> None:
    """A project with a git origin: the cluster's clone gets it, and the run's end pushes the
    experiment there (dvc exp push) and its data to the DVC remote; the laptop's own `dvc exp pull
    origin NAME` then brings it, no kit command needed."""
    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), f"{BIN}:{without_slurm(tmp_path)['PATH']}")
    project = laptop_project(tmp_path, laptop)
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(project, "remote", "add", "origin", str(origin))
    run(project, laptop, "git", "push", "-q", "origin", "main")
    kit = [str(BIN / "snakedvc")]
    run(project, laptop, *kit, "remote", "add", "hpc", f"ssh://cluster{tmp_path / 'cluster'}", "--snakedvc", kit[0],
        "--profile", "local")  # fmt: skip
    run(project, laptop, *kit, "submit", "--remote", "hpc", "-S", "lr=0.9", "--name", "via-origin")

    def states() -> list[str]:
        return [r["state"] for r in json.loads(run(project, laptop, *kit, "runs", "--remote", "hpc", "--json").stdout)]

    wait_until(lambda: states() in (["done"], ["failed"]), timeout=300, what="the remote run")
    assert states() == ["done"]
    run(project, laptop, str(BIN / "dvc"), "exp", "pull", "origin", "via-origin")
    assert experiment(project, laptop, "via-origin")["params"]["params.yaml"]["data"]["lr"] == 0.9
    (project / "model.txt").unlink()
    run(project, laptop, str(BIN / "dvc"), "exp", "apply", "via-origin")
    assert (project / "model.txt").read_bytes() == b"1\n0.9\n"


def test_a_queue_made_from_a_laptop_runs_on_the_cluster_and_comes_home(tmp_path: Path, sshd: SshServer) -> None:
    """exp run --queue --remote (a sweep), queue start/status --remote, pull: each point its own
    experiment, made from the laptop's code as it was when queued."""
    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), f"{BIN}:{without_slurm(tmp_path)['PATH']}")
    project = laptop_project(tmp_path, laptop)
    kit = [str(BIN / "snakedvc")]
    cluster_root = tmp_path / "cluster" / "runs"
    run(project, laptop, *kit, "remote", "add", "hpc", f"ssh://cluster{cluster_root}", "--snakedvc", kit[0],
        "--profile", "local")  # fmt: skip
    queued = run(project, laptop, *kit, "exp", "run", "--queue", "--remote", "hpc", "-S", "lr=0.2,0.3", "-n", "rq")
    assert "Queued experiment 'rq-1' on remote hpc" in queued.stdout and "'rq-2'" in queued.stdout, queued.stdout

    def statuses() -> list[str]:
        shown = run(project, laptop, *kit, "queue", "status", "--remote", "hpc").stdout
        return [line.split()[-1] for line in shown.splitlines()[1:]]

    assert statuses() == ["Queued", "Queued"]
    run(project, laptop, *kit, "queue", "start", "--remote", "hpc", "-j", "2")
    wait_until(lambda: statuses() == ["Success", "Success"], timeout=300, what="the queue on the cluster")
    assert sorted(run(project, laptop, *kit, "pull", "--remote", "hpc").stdout.split()) == ["rq-1", "rq-2"]
    for name, lr in (("rq-1", 0.2), ("rq-2", 0.3)):
        recorded = experiment(project, laptop, name)
        assert recorded["params"]["params.yaml"]["data"]["lr"] == lr
        assert recorded["metrics"]["metrics.json"]["data"]["score"] == lr
