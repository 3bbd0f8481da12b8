from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The benchmark scripts' helpers (benchlib: RDKit's shipped SMILES, synthetic splits) serve tests too.
sys.path.insert(0, str(REPO / "scripts"))
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# The ESOL example's step tests (tests/esol) need its step environment (.venv-esol: molflux,
# RDKit, numpy<2); `make test` runs them there and everything else in the engine's .venv.
if importlib.util.find_spec("rdkit") is None:
    collect_ignore = ["esol"]


def tracked_files() -> list[str]:
    """Every file git tracks in this repository, as a clone has them."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [name for name in out.split("\0") if name]


def copy_project(dest: Path, dvc: bool = False) -> Path:
    """A clone of this repository in ``dest``: every tracked file as the working tree has it (so a test
    sees uncommitted edits, and a file anywhere in the repository that breaks a user's run breaks the
    test too), no results. ``dvc``: keep DVC's folder (.dvc/); without it the copy is a project not
    yet under DVC, whose runs record nothing."""
    for name in tracked_files():
        source = REPO / name
        if not dvc and (name.startswith(".dvc/") or name == ".dvcignore"):
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    # The steps' environment (config `python`: .venv-esol/bin/python, relative to the project).
    (dest / ".venv-esol").symlink_to(REPO / ".venv-esol")
    return dest


def venv_env() -> dict[str, str]:
    """This environment with the venv first on PATH: subprocesses call `python -m snakedvc`."""
    import os

    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def run_snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


# Small enough to train in seconds, large enough for a meaningful split.
SMALL_RUN = ["--config", "data={limit: 200}", "train={max_epochs: 4, hidden_sizes: [32]}"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


def slurm_jobs_by_rule(output: str) -> dict[str, list[str]]:
    """Map rule name -> SLURM job ids, from the plugin's 'submitted with SLURM jobid' lines."""
    import re

    jobs: dict[str, list[str]] = {}
    for jobid, rule in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_([A-Za-z0-9_]+)/", output):
        jobs.setdefault(rule, []).append(jobid)
    return jobs


def accounted_jobs(workdir: Path) -> list[dict[str, str]]:
    """Every SLURM job of the last two hours, any user's, that ran in ``workdir`` (sacct, one row a
    job): id, name, partition, workdir, submit, start, end, state."""
    columns = "JobID,JobName%60,Partition,WorkDir%300,Submit,Start,End,State"
    out = subprocess.run(
        ["sacct", "-a", "-X", "-n", "-P", "-S", "now-2hours", "-o", columns], capture_output=True, text=True, check=True
    ).stdout
    names = ("id", "name", "partition", "workdir", "submit", "start", "end", "state")
    rows = [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines()]
    return [row for row in rows if row["workdir"] == str(workdir)]


def running_rule_jobs(rule: str, workdir: Path) -> list[str]:
    """The ids of the running SLURM jobs of ``rule`` (the plugin's comment rule_<rule>) that run in
    ``workdir``: a test picks its own job, never another session's left on the shared test cluster."""
    out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i|%k|%Z"], capture_output=True, text=True).stdout
    rows = [line.split("|", 2) for line in out.splitlines()]
    return [row[0] for row in rows if len(row) == 3 and row[1] == f"rule_{rule}" and row[2] == str(workdir)]


def cluster_up(nodes: int) -> None:
    """The real SLURM test cluster with this many compute nodes (idempotent: starts or reshapes it only if needed)."""
    env = {**os.environ, "SLURM_CLUSTER_NODES": str(nodes)}
    proc = subprocess.run(
        [str(REPO / "scripts" / "slurm-cluster"), "up"], capture_output=True, text=True, timeout=600, env=env
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/slurm-cluster up failed:\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The default test cluster: one node, this host."""
    cluster_up(1)


@pytest.fixture(scope="session")
def multinode_cluster() -> None:
    """The test cluster with two compute nodes (network namespaces node1, node2)."""
    cluster_up(2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Multi-node tests last (the sort is stable): reshaping the cluster restarts its daemons, so
    # it happens once, after every test of the one-node cluster. The slow tests (whole workflows)
    # first: spread over xdist's workers, a long one started late would leave one worker running
    # it alone at the end while the others idle.
    items.sort(
        key=lambda item: (item.get_closest_marker("multinode") is not None, item.get_closest_marker("slow") is None)
    )


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def dvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "dvc"
    proc = subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, env=_dvc_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"dvc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _dvc_env() -> dict[str, str]:
    import os

    return {**os.environ, "DVC_NO_ANALYTICS": "1"}


def dvc_project(dest: Path, remote: Path) -> Path:
    """A git + DVC repo like a clone of this one: the repo's .dvc/config, a directory remote, a bare origin."""
    copy_project(dest, dvc=True)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "config", "user.email", "test@example.com")
    git(dest, "config", "user.name", "snakedvc tests")
    dvc(dest, "remote", "modify", "demo", "url", str(remote))
    origin = dest.parent / "origin.git"
    git(dest.parent, "init", "-q", "--bare", "--initial-branch=main", str(origin))
    git(dest, "remote", "add", "origin", str(origin))
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "project")
    git(dest, "push", "-q", "origin", "main")
    return dest


def md5(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes): folders compared byte for byte."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def dvc_experiments(
    repo: Path, metrics_file: str = "results/metrics.json", params_file: str = "results/params.yaml"
) -> dict[str, dict]:
    """name -> {'params': ..., 'metrics': ...} for every experiment `dvc exp show --json` lists."""
    import json

    shown = json.loads(dvc(repo, "exp", "show", "--json").stdout)
    found = {}
    for commit in shown:
        for exp in commit.get("experiments") or []:
            rev = exp["revs"][0]
            data = rev["data"]
            found[exp.get("name") or rev.get("name")] = {
                "params": data["params"][params_file]["data"],
                "metrics": (data["metrics"].get(metrics_file) or {}).get("data", {}),
            }
    return found


def trainers_in(workdir: Path, *command: bytes) -> list[int]:
    """Pids of trainer processes running in ``workdir``: only the ones this test started.

    A trainer is a process whose arguments include every word of ``command`` (default:
    ESOL's `python -m esol train`)."""
    words = command or (b"esol", b"train")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = (proc / "cwd").resolve()
        except OSError:  # gone, or not ours to read
            continue
        if all(word in argv for word in words) and cwd == workdir.resolve():
            found.append(int(proc.name))
    return sorted(found)


SLURM_TOOLS = {"sbatch", "srun", "squeue", "sacct", "sinfo", "scontrol", "scancel", "sacctmgr", "salloc", "sstat"}


def without_slurm(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has /usr/bin's tools but none of SLURM's (a laptop)."""
    import os

    bindir = tmp_path / "no-slurm-bin"
    bindir.mkdir()
    for entry in Path("/usr/bin").iterdir():
        if entry.name not in SLURM_TOOLS:
            (bindir / entry.name).symlink_to(entry)
    assert shutil.which("sbatch", path=str(bindir)) is None
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": str(bindir)}


@pytest.fixture
def own_signal_handlers():
    """Resumable installs SIGTERM/SIGINT handlers in the test's process: give pytest its own back."""
    import signal

    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


class StopAfter:
    """A stop request (SIGTERM's stand-in for Resumable) that comes after a number of steps."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    @property
    def requested(self) -> bool:
        self.left -= 1
        return self.left < 0
