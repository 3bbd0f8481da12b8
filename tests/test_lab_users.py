"""Two users on one login node, one DVC cache (issue 52), on the real test cluster: real Unix users
(useradd), each with a SLURM association and a project of their own, sharing one DVC cache as DVC
documents it (`cache.shared group`, a setgid folder of the lab's group). Both run at once through
SLURM; each project holds only its user's files; every file either wrote to the cache is readable
by the other; and one user's command in the other's project is refused, saying whose it is."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from snakedvc.engine.runs.owner import refuse_others_project, refuse_others_run
from snakedvc.engine.runs.record import RunError
from tests.sshd import start_sshd
from tests.waiting import wait_until

BIN = Path(sys.executable).parent
GROUP = "snakedvc-lab"
USERS = ("snakedvc-ana", "snakedvc-ben")
PIPELINE = """\
stages:
  make:
    cmd: mkdir -p out && whoami > out/who.txt && echo {text} > out/made.txt
    outs: [out]
"""
RESOURCES = 'resources:\n  "*": {runtime: 10, mem: 100MB}\n'


def as_user(user: str, command: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``command`` (a shell line, its values quoted by the caller) as ``user``, in a login environment."""
    path = f"{BIN}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    line = f"cd {shlex.quote(str(cwd))} && export PATH={shlex.quote(path)} && {command}"
    proc = subprocess.run(["runuser", "-l", user, "-c", line], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{user}: {command} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def reachable(path: Path) -> Iterator[Path]:
    """The folders above ``path`` that others cannot enter (the interpreter under /root's pyenv)."""
    for folder in path.parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            yield folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None) -> Iterator[dict[str, Path]]:
    if os.geteuid() != 0:
        pytest.skip("making Unix users needs root")
    base = Path(f"/srv/snakedvc-lab-test-{os.getpid()}")
    closed = list(reachable(Path(os.path.realpath(sys.executable))))
    modes = {folder: folder.stat().st_mode for folder in closed}
    try:
        for folder in closed:  # the kit's interpreter, reachable by the lab's users (traverse only)
            folder.chmod(folder.stat().st_mode | stat.S_IXOTH)
        subprocess.run(["groupadd", "-f", GROUP], check=True)
        base.mkdir(mode=0o755)
        cache = base / "dvc-cache"
        cache.mkdir()
        os.chown(cache, 0, _gid(GROUP))
        cache.chmod(0o2775)  # as DVC's docs set up a shared cache: the group's, setgid
        homes = {}
        for user in USERS:
            home = base / user
            subprocess.run(["useradd", "-m", "-d", str(home), "-G", GROUP, "-s", "/bin/bash", user], check=True)
            # useradd's accounts are locked ("!"), and sshd refuses a key login to a locked account
            subprocess.run(["usermod", "-p", "*", user], check=True)
            home.chmod(0o755)  # as on many clusters: others may look, not write
            subprocess.run(["sacctmgr", "-i", "add", "user", user, "account=root"], capture_output=True, check=True)
            homes[user] = home
        wait_until(lambda: all(_associated(user) for user in USERS), "the users' SLURM associations", timeout=60)
        yield {"base": base, "cache": cache, **homes}
    finally:
        for user in USERS:
            subprocess.run(["sacctmgr", "-i", "delete", "user", user], capture_output=True, check=False)
            subprocess.run(["userdel", "-r", user], capture_output=True, check=False)
        subprocess.run(["groupdel", GROUP], capture_output=True, check=False)
        subprocess.run(["rm", "-rf", str(base)], check=False)
        for folder, mode in modes.items():
            folder.chmod(mode)


def _gid(group: str) -> int:
    import grp

    return grp.getgrnam(group).gr_gid


def _associated(user: str) -> bool:
    out = subprocess.run(
        ["scontrol", "show", "assoc_mgr", f"users={user}", "flags=assoc"], capture_output=True, text=True
    )
    return f"UserName={user}(" in out.stdout


def make_project(user: str, home: Path, cache: Path, name: str = "proj") -> Path:
    project = home / name
    setup = [
        f"mkdir {shlex.quote(str(project))} && cd {shlex.quote(str(project))}",
        "git init -q -b main",
        f"git config user.name {user} && git config user.email {user}@lab",
        f"printf %s {shlex.quote(PIPELINE.format(text=user))} > dvc.yaml",
        f"printf %s {shlex.quote(RESOURCES)} > snakedvc.yaml",
        "dvc init -q",
        f"dvc cache dir {shlex.quote(str(cache))} && dvc config cache.shared group && dvc config cache.type copy",
        "git add -A && git commit -qm 'a pipeline'",
    ]
    as_user(user, " && ".join(setup), home)
    return project


def others_files(project: Path, user: str) -> list[str]:
    owner = pwd.getpwnam(user).pw_uid
    return [str(p) for p in project.rglob("*") if p.lstat().st_uid != owner]


@pytest.mark.slurm
def test_two_users_run_at_once_into_one_shared_cache_and_keep_to_their_own(lab: dict[str, Path]) -> None:
    ana, ben = USERS
    projects = {user: make_project(user, lab[user], lab["cache"]) for user in USERS}
    # Both at once, through SLURM: each stage a SLURM job that runs as its user.
    running = {
        user: subprocess.Popen(
            [
                "runuser",
                "-l",
                user,
                "-c",
                f"cd {shlex.quote(str(projects[user]))} && PATH={shlex.quote(str(BIN))}:$PATH "
                f"snakedvc exp run --profile slurm -n {user}-run",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for user in USERS
    }
    said = {user: proc.communicate(timeout=600)[0] for user, proc in running.items()}
    for user, proc in running.items():
        assert proc.returncode == 0, f"{user}:\n{said[user][-3000:]}"
        assert (projects[user] / "out/who.txt").read_text() == f"{user}\n"  # the job ran as its user
        assert others_files(projects[user], user) == [], f"another user's files in {user}'s project"
        shown = as_user(user, "dvc exp show --no-pager --json", projects[user]).stdout
        assert f"{user}-run" in shown
    # Every file either wrote to the shared cache, the other can read (DVC's cache.shared group).
    for user in USERS:
        unreadable = as_user(user, f"find {shlex.quote(str(lab['cache']))} ! -readable", lab[user]).stdout
        assert unreadable == "", f"{user} cannot read: {unreadable}"
    written = {p.stat().st_uid for p in lab["cache"].rglob("*") if p.is_file()}
    assert written == {pwd.getpwnam(user).pw_uid for user in USERS}, "both wrote to the shared cache"
    # The other's project: refused, saying whose it is, without a traceback; nothing written there.
    before = sorted((str(p), p.stat().st_mtime_ns) for p in projects[ben].rglob("*"))
    for command in ("snakedvc runs", "snakedvc exp run", "snakedvc cancel 20260101-000000-abcd", "snakedvc submit"):
        refused = as_user(ana, command, projects[ben], check=False)
        assert refused.returncode != 0, command
        assert f"{projects[ben]} is {ben}'s project, not yours ({ana})" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr + refused.stdout
    assert sorted((str(p), p.stat().st_mtime_ns) for p in projects[ben].rglob("*")) == before


def ben_laptop(lab: dict[str, Path], user: str) -> tuple[Path, subprocess.Popen[bytes]]:
    """``user``'s "laptop": a project in their home, a DVC remote of theirs, and an ~/.ssh/config
    that reaches a real sshd (started here, in a folder every user can read) as `cluster`, as them."""
    home = lab[user]
    folder = lab["base"] / "sshd"
    folder.mkdir(mode=0o755)
    server, sshd = start_sshd(folder)
    key = home / "laptop-key"
    key.write_bytes(server.client_key.read_bytes())
    key.chmod(0o600)
    server.laptop_home(home, key=key, user=user)
    subprocess.run(["chown", "-R", f"{user}:", str(key), str(home / ".ssh")], check=True)
    project = home / "laptop" / "proj"
    setup = [
        f"mkdir -p {shlex.quote(str(project))} && cd {shlex.quote(str(project))}",
        "git init -q -b main",
        f"git config user.name {user} && git config user.email {user}@laptop",
        f"printf %s {shlex.quote(PIPELINE.format(text='from-the-laptop'))} > dvc.yaml",
        f"printf %s {shlex.quote(RESOURCES)} > snakedvc.yaml",
        f"dvc init -q && dvc remote add -d store {shlex.quote(str(home / 'dvc-store'))}",
        "git add -A && git commit -qm 'a pipeline'",
    ]
    as_user(user, " && ".join(setup), home)
    return project, sshd


@pytest.mark.slurm
def test_one_user_submits_over_ssh_while_another_runs_and_neither_reaches_the_others(lab: dict[str, Path]) -> None:
    ana, ben = USERS
    ana_project = make_project(ana, lab[ana], lab["cache"], "alongside")
    laptop, sshd = ben_laptop(lab, ben)
    try:
        kit = shlex.quote(str(BIN / "snakedvc"))
        clones = lab[ben] / "cluster"
        as_user(ben, f"snakedvc remote add hpc ssh://cluster{clones} --snakedvc {kit} --profile slurm", laptop)
        anas_run = subprocess.Popen(
            ["runuser", "-l", ana, "-c", f"cd {shlex.quote(str(ana_project))} && PATH={shlex.quote(str(BIN))}:$PATH "
             "snakedvc exp run --profile slurm -n ana-run"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        as_user(ben, "snakedvc submit --remote hpc --name ben-remote", laptop)
        said = anas_run.communicate(timeout=600)[0]
        assert anas_run.returncode == 0, said[-3000:]

        def bens_runs() -> list[dict]:
            return json.loads(as_user(ben, "snakedvc runs --remote hpc --json", laptop).stdout)

        wait_until(lambda: [r["state"] for r in bens_runs()] in (["done"], ["failed"]), "ben's remote run", 300)
        (bens_run,) = bens_runs()
        assert bens_run["state"] == "done", as_user(ben, f"snakedvc logs --remote hpc {bens_run['id']}", laptop).stdout
        as_user(ben, "snakedvc pull --remote hpc ben-remote && dvc exp apply ben-remote", laptop)
        assert (laptop / "out/who.txt").read_text() == f"{ben}\n"  # its SLURM job ran as ben
        clone = clones / "proj"
        assert others_files(clone, ben) == [], f"another user's files in {ben}'s clone"
        # Ana sees only her own run, and may not cancel his.
        listed = json.loads(as_user(ana, "snakedvc runs --json", ana_project).stdout)
        assert bens_run["id"] not in {run["id"] for run in listed}
        refused = as_user(ana, f"snakedvc cancel {bens_run['id']}", clone, check=False)
        assert refused.returncode != 0 and f"is {ben}'s project, not yours ({ana})" in refused.stderr, refused.stderr
        # A remote whose folder is in ana's home: refused at the first trip, nothing made there.
        theirs = lab[ana] / "runs"
        as_user(ben, f"snakedvc remote add theirs ssh://cluster{theirs} --snakedvc {kit} --profile slurm", laptop)
        refused = as_user(ben, "snakedvc submit --remote theirs", laptop, check=False)
        said = refused.stderr
        assert refused.returncode != 0 and "Traceback" not in said, said
        assert f"{lab[ana]} on cluster is {ana}'s, and you may not write there" in said, said
        assert "nothing was sent" in said and "snakedvc remote remove theirs" in said
        assert not theirs.exists()
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def test_a_run_or_project_of_another_user_is_refused_naming_the_owner(tmp_path: Path) -> None:
    """Without making users: a folder owned by root, looked at as a user id that is not root's."""
    if os.geteuid() != 0:
        pytest.skip("needs files owned by another user than the test's")
    (tmp_path / ".git").mkdir()
    (tmp_path / "sub").mkdir()
    other = 4242  # no passwd entry: named by its uid
    with pytest.raises(RunError, match=r"is root's project, not yours \(uid 4242\).*git clone"):
        refuse_others_project(tmp_path / "sub", "runs", uid=other)
    refuse_others_project(tmp_path / "sub", "runs", uid=0)  # root, a cluster's admin: allowed
    with pytest.raises(RunError, match=r"run 20260101-000000-abcd is root's, not yours \(uid 4242\): only root"):
        refuse_others_run(tmp_path, "20260101-000000-abcd", "cancel", uid=other)
    refuse_others_run(tmp_path, "20260101-000000-abcd", "cancel", uid=0)
