"""Runs on a cluster reached over SSH, from a machine without SLURM (a laptop): `snakedvc remote add`,
`submit --remote`, `runs/logs/cancel/resume --remote`, `pull --remote`.

The user's own OpenSSH client does every trip, as git makes it (GIT_SSH_COMMAND or core.sshCommand
where set): their ~/.ssh/config, agent, keys and known_hosts; ``BatchMode``, so no password prompt. A remote is a URL, ``ssh://[user@]host[:port]/root``;
each project has a clone of its git repository under the root, ``<root>/<project>``, which the
kit keeps: the submitted code reaches it by ``git push`` over SSH, and there the run starts as a
local ``snakedvc submit`` starts it on that host (a workspace at the submitted code, the
controller a SLURM job), so the laptop may disconnect. Commands reach the remote shell as one
quoted argument list (``shlex.join``), never as text built from values.

A submission is idempotent: its run id is chosen here, before anything is pushed, and kept in
``.snakedvc/remote-submits/`` until the cluster confirms it; a retry (after SSH dropped) sends the
same id, and the cluster adopts the run it already has instead of starting a second.

Results come home through the remotes the project already has: the run pushes its data to the
DVC remote at its end, and ``snakedvc pull --remote`` fetches the experiment's git refs from the
cluster's clone over SSH, then its data from the DVC remote, so ``dvc exp show`` lists it and
``dvc exp apply`` restores it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from snakedvc.engine.runs.record import RunError, git

# git config of the project (this clone only): [snakedvc-remote "NAME"] url = ..., snakedvc = ...
SECTION = "snakedvc-remote"
PENDING_DIR = Path(".snakedvc") / "remote-submits"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# SSH's own failures (exit 255) are retried this many times; a remote command's exit is not.
SSH_TRIES = 3


class RemoteError(RunError):
    """A remote cannot be named, reached or used; the message says which and what to do."""


@dataclass(frozen=True)
class Remote:
    name: str
    url: str
    snakedvc: str = "snakedvc"  # the kit's command on the cluster (a path into its environment)
    profile: str = "local"  # the profile its runs use unless one is given: slurm, local, or a folder

    @property
    def _parts(self) -> tuple[str, str, int | None, str]:
        return parse_url(self.url)

    @property
    def destination(self) -> str:
        user, host, _, _ = self._parts
        return f"{user}@{host}" if user else host

    @property
    def port(self) -> int | None:
        return self._parts[2]

    @property
    def root(self) -> str:
        return self._parts[3]

    def project_dir(self, project: str) -> str:
        """``<root>/<project>``, a folder of the root and nothing above it."""
        if not _NAME.match(project) or project in (".", ".."):
            raise RemoteError(
                f"project folder name {project!r} cannot be used on remote {self.name}: it must be letters, digits, "
                "'.', '_' or '-' (rename the project's folder)"
            )
        return str(PurePosixPath(self.root) / project)

    def git_url(self, project: str) -> str:
        user, host, port, _ = self._parts
        where = f"{user}@{host}" if user else host
        return f"ssh://{where}{f':{port}' if port else ''}{_url_path(self.project_dir(project))}"


def _url_path(path: str) -> str:
    # git's ssh:// URLs: "/~/x" is relative to the login's home, "/x" absolute.
    return "/" + path if path.startswith("~") else path


def parse_url(url: str) -> tuple[str, str, int | None, str]:
    """(user, host, port, root) of ``ssh://[user@]host[:port]/root``; a RemoteError says what is wrong."""
    # Before urlsplit, which drops tabs and newlines without a word (another folder than named).
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise RemoteError(
            f"remote URL {url!r} holds a control character (a newline or tab); "
            "git, DVC and SLURM's job scripts cannot take it in a folder's name: choose another folder"
        )
    parts = urlsplit(url)
    if parts.scheme != "ssh" or not parts.hostname:
        raise RemoteError(
            f"remote URL {url!r} is not ssh://[user@]host[:port]/path (e.g. ssh://me@login.example/~/runs)"
        )
    path = parts.path[1:] if parts.path.startswith("/~") else parts.path
    if not path or path == "/" or ".." in PurePosixPath(path).parts:
        raise RemoteError(
            f"remote URL {url!r}: give the folder the kit keeps projects in, without '..' (e.g. /~/runs or /scratch/me/runs)"
        )
    if "%" in path:  # sbatch reads %j, %x… in the log paths under it; a URL's %20 is not decoded here
        raise RemoteError(
            f"remote URL {url!r}: the folder holds '%', which SLURM reads as a pattern in the jobs' log paths "
            "(%j: the job id); choose a folder without it (spaces and quotes are fine, written as they are)"
        )
    try:
        port = parts.port
    except ValueError:
        raise RemoteError(f"remote URL {url!r}: the port is not a number") from None
    return parts.username or "", parts.hostname, port, path


# --- naming remotes (git config of the project) ----------------------------------------------


def add_remote(root: Path, name: str, url: str, snakedvc: str = "snakedvc", profile: str = "") -> Remote:
    """The remote kept in this clone's git config; ``profile`` empty: probed (see probe()) unless
    the caller checks nothing, then local."""
    if not _NAME.match(name):
        raise RemoteError(f"remote name {name!r}: use letters, digits, '.', '_' or '-'")
    remote = Remote(name, url, snakedvc, profile or "local")
    remote.root  # noqa: B018 (checks the URL)
    for field, value in (("url", url), ("snakedvc", snakedvc), ("profile", remote.profile)):
        git(root, "config", "--local", f"{SECTION}.{name}.{field}", value)
    return remote


# One trip: whether the cluster has sbatch, then the kit's version there ($1: its command, an argument).
_PROBE = 'if command -v sbatch >/dev/null 2>&1; then echo slurm; else echo local; fi; exec "$1" --version'


def probe(remote: Remote) -> tuple[str, str]:
    """(the profile the cluster calls for: slurm where it has sbatch, else local; the kit's version
    there), in one SSH trip that also checks the login; a RemoteError where the kit's command
    is not there."""
    proc = run_ssh(remote, ["sh", "-c", _PROBE, "snakedvc", remote.snakedvc], tries=1)
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) < 2:
        missing = "not found" if proc.returncode == 127 else f"did not run (exit {proc.returncode})"
        raise RemoteError(
            f"remote {remote.name}: the kit's command {remote.snakedvc!r} {missing} on {remote.destination}, so the "
            "remote was not added. Give its path there with --snakedvc (e.g. --snakedvc ~/env/bin/snakedvc, where "
            f"`pip install snakedvc` put it).\n{proc.stderr.strip()}"
        )
    return lines[0], lines[1]


def remove_remote(root: Path, name: str) -> None:
    get_remote(root, name)
    git(root, "config", "--local", "--remove-section", f"{SECTION}.{name}")


def list_remotes(root: Path) -> list[Remote]:
    proc = subprocess.run(
        ["git", "config", "--local", "--get-regexp", rf"^{SECTION}\."], cwd=root, capture_output=True, text=True
    )
    found: dict[str, dict[str, str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        name, _, field = key[len(SECTION) + 1 :].rpartition(".")  # a name may hold dots: the key's last part
        found.setdefault(name, {})[field] = value
    return [
        Remote(name, v["url"], v.get("snakedvc", "snakedvc"), v.get("profile", "local"))
        for name, v in sorted(found.items())
        if "url" in v
    ]


def get_remote(root: Path, name: str) -> Remote:
    remotes = {remote.name: remote for remote in list_remotes(root)}
    if name not in remotes:
        known = ", ".join(remotes) or "none yet"
        raise RemoteError(
            f"no remote named {name!r} in this project (remotes: {known}): "
            f"snakedvc remote add {name} ssh://USER@HOST/~/runs"
        )
    return remotes[name]


def run_profile(root: Path, profile: str, snakemake_args: Sequence[str]) -> str:
    """The --profile a remote run is sent with: a dvc.yaml pipeline takes ``profile`` as it is (its
    own folder of that name, else the kit's); a Snakefile project's ``slurm`` or ``local`` is its
    folder profiles/<name> (what `snakedvc init` writes), checked here before anything is sent."""
    from snakedvc.engine.dvcpipeline import is_dvc_pipeline

    if is_dvc_pipeline(root, snakemake_args) or (root / profile / "config.yaml").is_file():
        return profile
    folder = f"profiles/{profile}"
    if (root / folder / "config.yaml").is_file():
        return folder
    raise RemoteError(
        f"profile {profile!r}: this project has neither {profile}/config.yaml nor {folder}/config.yaml, so nothing "
        "was sent (`snakedvc init` writes profiles/local and profiles/slurm; or give --profile FOLDER)"
    )


# --- SSH -------------------------------------------------------------------------------------


def ssh_command() -> list[str]:
    """The SSH client as git uses it (GIT_SSH_COMMAND, else git's core.sshCommand, else ssh),
    split into words (no shell), with BatchMode: a password prompt would hang a detached call."""
    said = (
        os.environ.get("GIT_SSH_COMMAND")
        or subprocess.run(["git", "config", "core.sshCommand"], capture_output=True, text=True).stdout.strip()
    )
    return [*(shlex.split(said) if said else ["ssh"]), "-o", "BatchMode=yes"]


def git_ssh_env() -> dict[str, str]:
    """git's environment for the kit's pushes and fetches: the same SSH client, quoted for git's shell."""
    return {**os.environ, "GIT_SSH_COMMAND": shlex.join(ssh_command())}


def ssh_argv(remote: Remote, argv: Sequence[str]) -> list[str]:
    """The ssh call that runs ``argv`` on the remote: the remote shell gets it quoted, word by word."""
    command = ssh_command()
    if remote.port:
        command += ["-p", str(remote.port)]
    return [*command, "--", remote.destination, shlex.join(argv)]


def _ssh_failure(remote: Remote, stderr: str) -> RemoteError:
    said = stderr.strip()
    if "Host key verification failed" in said or "REMOTE HOST IDENTIFICATION HAS CHANGED" in said:
        return RemoteError(
            f"remote {remote.name}: the host key of {remote.destination} is unknown here or has changed, so nothing "
            f"was sent. Check it with the cluster's admins, then `ssh {remote.destination}` once to add it to "
            f"~/.ssh/known_hosts.\n{said}"
        )
    if "Permission denied" in said or "Too many authentication failures" in said:
        return RemoteError(
            f"remote {remote.name}: the login to {remote.destination} failed, so nothing was sent. The kit uses your "
            f"SSH keys and agent without prompting: `ssh {remote.destination}` must log in without a password.\n{said}"
        )
    return RemoteError(f"remote {remote.name}: ssh to {remote.destination} failed (exit 255).\n{said}")


def run_ssh(
    remote: Remote, argv: Sequence[str], capture: bool = True, tries: int = SSH_TRIES
) -> subprocess.CompletedProcess[str]:
    """``argv`` on the remote; SSH's own failures (exit 255: no connection, dropped) are retried,
    then a RemoteError naming them. The remote command's exit status is the caller's to read."""
    for attempt in range(1, tries + 1):
        proc = subprocess.run(
            ssh_argv(remote, argv), capture_output=capture, text=True, stdin=subprocess.DEVNULL
        )  # fmt: skip
        if proc.returncode != 255:
            return proc
        error = _ssh_failure(remote, proc.stderr or "")
        if "host key" in str(error) or "login" in str(error) or attempt == tries:
            raise error
        print(f"snakedvc: ssh to {remote.destination} failed; trying again ({attempt}/{tries})", file=sys.stderr)
    raise AssertionError("unreachable")


def run_kit(
    remote: Remote, project: str, args: Sequence[str], capture: bool = False
) -> subprocess.CompletedProcess[str]:
    """`snakedvc ARGS` in the project's clone on the remote, its output shown here as it comes."""
    return run_ssh(remote, [remote.snakedvc, "-C", remote.project_dir(project), *args], capture=capture)


# --- submitting ------------------------------------------------------------------------------


def project_name(root: Path) -> str:
    return root.name


def _pending_file(root: Path, remote: Remote) -> Path:
    return root / PENDING_DIR / f"{remote.name}.json"


def claim_run_id(
    root: Path, remote: Remote, commit: str, tree: str, args: Sequence[str], new_id: str
) -> tuple[str, str]:
    """The run id and frozen commit of this submission: an unconfirmed earlier one of the same code
    and arguments (SSH dropped before the cluster's answer came back) is the same submission, sent
    again, with the commit it sent."""
    pending = _pending_file(root, remote)
    if pending.is_file():
        earlier = json.loads(pending.read_text())
        kept = subprocess.run(["git", "cat-file", "-e", f"{earlier.get('commit')}^{{commit}}"], cwd=root)
        if earlier.get("tree") == tree and earlier.get("args") == list(args) and kept.returncode == 0:
            print(f"snakedvc: sending run {earlier['run_id']} again (its submission was not confirmed)",
                  file=sys.stderr)  # fmt: skip
            return str(earlier["run_id"]), str(earlier["commit"])
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(json.dumps({"run_id": new_id, "commit": commit, "tree": tree, "args": list(args)}))
    return new_id, commit


# The clone's folder ($1) made where missing, only where the login may write: the folder itself
# (when it is there) must be the login's, else the nearest folder above it that exists must be
# writable. Exit 96, its owner printed, where it is not (another user's home on a shared login node).
_MAKE_CLONE = """\
folder=$1 probe=$1
while [ ! -e "$probe" ]; do probe=$(dirname -- "$probe"); done
if { [ -e "$folder" ] && [ ! -O "$folder" ]; } || [ ! -w "$probe" ]; then
  printf '%s\\n%s\\n' "$probe" "$(stat -c %U -- "$probe")"; exit 96
fi
exec git init -q -- "$folder"
"""
NOT_YOURS = 96


def make_clone(remote: Remote, project: str) -> str:
    """The project's clone on the remote, made where missing: the first trip, so also the login's
    check (a RemoteError naming the host key or the login) before anything is frozen or pushed."""
    folder = remote.project_dir(project)
    made = run_ssh(remote, ["sh", "-c", _MAKE_CLONE, "sh", folder])
    if made.returncode == NOT_YOURS:
        where, _, owner = made.stdout.strip().partition("\n")
        host = remote.destination.rpartition("@")[2]
        raise RemoteError(
            f"remote {remote.name}: {where} on {host} is {owner}'s, and you may not write there, so the project's "
            f"clone {folder} cannot be made; nothing was sent. A remote's folder must be one of your own: "
            f"`snakedvc remote remove {remote.name}`, then add it again with a folder of yours "
            f"(`snakedvc remote add {remote.name} ssh://{remote.destination}/<a folder of yours>`)."
        )
    if made.returncode != 0:
        raise RemoteError(f"remote {remote.name}: cannot make the project's clone {folder}: {made.stderr.strip()}")
    return folder


def push_code(root: Path, remote: Remote, project: str, commit: str, baseline: str, run_id: str) -> None:
    """The frozen commit (and its history) into the project's clone on the remote."""
    proc = subprocess.run(
        ["git", "push", "-q", "--no-verify", remote.git_url(project),
         f"{commit}:refs/snakedvc/incoming/{run_id}", f"{baseline}:refs/snakedvc/baselines/{run_id}"],
        cwd=root, capture_output=True, text=True, env=git_ssh_env(),
    )  # fmt: skip
    if proc.returncode != 0:
        raise RemoteError(
            f"remote {remote.name}: git push of the code to {remote.git_url(project)} failed:\n{proc.stderr}"
        )


# One trip after the push: the clone's working tree at the baseline (the commit the run's
# experiment hangs on), its origin the laptop's where it has one (the cluster pushes the
# experiment's refs there), then the kit's submit. $1 folder, $2 baseline, $3 origin or "".
_CHECKOUT_AND_SUBMIT = """\
git -C "$1" checkout -q --detach "$2" || exit 97
if [ -n "$3" ]; then
  git -C "$1" remote remove origin 2>/dev/null
  git -C "$1" remote add origin "$3" || exit 98
fi
shift 3
exec "$@"
"""


def submit_remote(root: Path, remote: Remote, submit_args: Sequence[str], run_id: str) -> str:
    """Freeze the code, push it, start the run on the remote (`snakedvc submit --commit`); the run id.
    Three SSH connections: the clone made, the push, its checkout with the submit."""
    from snakedvc.engine.records import ignore_kit_folder
    from snakedvc.engine.runs.workspace import earlier_outputs, freeze, head_commit

    project = project_name(root)
    folder = make_clone(remote, project)
    ignore_kit_folder(root)  # the pending submission's record is no code
    baseline = head_commit(root)
    commit, tree = freeze(root, f"snakedvc run for remote {remote.name}: the code as submitted", earlier_outputs(root))
    run_id, commit = claim_run_id(root, remote, commit, tree, submit_args, run_id)
    push_code(root, remote, project, commit, baseline, run_id)
    origin = subprocess.run(["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True)
    url = origin.stdout.strip() if origin.returncode == 0 else ""
    submit = [remote.snakedvc, "-C", folder, "submit", "--commit", commit, "--run-id", run_id, "--push", *submit_args]
    started = run_ssh(remote, ["sh", "-c", _CHECKOUT_AND_SUBMIT, "sh", folder, baseline, url, *submit], capture=False)
    if started.returncode == 97:
        raise RemoteError(
            f"remote {remote.name}: the clone {folder} cannot check out the baseline {baseline[:12]} "
            "(changed by hand there?); see git's words above"
        )
    if started.returncode == 98:
        raise RemoteError(f"remote {remote.name}: the clone {folder} cannot take the origin {url}; see above")
    if started.returncode != 0:
        raise RemoteError(f"remote {remote.name}: snakedvc submit there failed (exit {started.returncode}); see above")
    _pending_file(root, remote).unlink(missing_ok=True)
    return run_id


# --- results home ----------------------------------------------------------------------------


def pull(root: Path, remote: Remote, names: Sequence[str] = ()) -> list[str]:
    """The experiments of the project's clone on the remote (``names``, or every one whose
    baseline this repository has) fetched here: their git refs over SSH, their data from the DVC
    remote. Returns their names."""
    project = project_name(root)
    url = remote.git_url(project)
    env = git_ssh_env()
    listed = subprocess.run(["git", "ls-remote", url, "refs/exps/*"], cwd=root, capture_output=True, text=True, env=env)
    if listed.returncode != 0:
        raise RemoteError(f"remote {remote.name}: cannot list the experiments of {url}:\n{listed.stderr.strip()}")
    refs = {}
    for line in listed.stdout.splitlines():
        rev, ref = line.split("\t")
        parts = ref.split("/")
        if len(parts) == 5 and len(parts[2]) == 2 and len(parts[3]) == 38:  # refs/exps/<2>/<38>/<name>
            known = subprocess.run(["git", "cat-file", "-e", parts[2] + parts[3]], cwd=root, capture_output=True)
            if (parts[4] in names or not names) and known.returncode == 0:
                refs[ref] = (parts[4], rev)
    missing = [name for name in names if name not in {n for n, _ in refs.values()}]
    if missing:
        raise RemoteError(
            f"remote {remote.name}: no experiment {', '.join(missing)} on a commit this repository has "
            f"(`snakedvc runs --remote {remote.name}` shows the runs; a run still going has none yet)"
        )
    landing = _landing_refs(root, refs, remote.name)
    wanted = {ref: local for ref, local in landing.items() if _local_rev(root, local) != refs[ref][1]}
    if wanted:  # no "+": a ref that moved here meanwhile is refused by git, not overwritten
        fetched = subprocess.run(
            ["git", "fetch", "-q", url, *[f"{ref}:{local}" for ref, local in wanted.items()]], cwd=root,
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if fetched.returncode != 0:
            raise RemoteError(f"remote {remote.name}: git fetch of the experiments failed:\n{fetched.stderr.strip()}")
        _fetch_data(root, [refs[ref][1] for ref in wanted])
    return sorted(local.rsplit("/", 1)[1] for local in landing.values())


def _local_rev(root: Path, ref: str) -> str | None:
    found = subprocess.run(["git", "rev-parse", "-q", "--verify", ref], cwd=root, capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def _landing_refs(root: Path, refs: dict[str, tuple[str, str]], remote: str) -> dict[str, str]:
    """Where each of the remote's experiment refs lands here: under its own name, unless this
    repository has another experiment of that name on that commit (a run made here): then under
    NAME-<remote> (or NAME-<remote>-2, …), said. A pull never overwrites a record."""
    landing = {}
    for ref, (name, rev) in refs.items():
        local, tries = ref, 1
        while (_local_rev(root, local) or rev) != rev:
            tries += 1
            local = f"{ref}-{remote}" if tries == 2 else f"{ref}-{remote}-{tries - 1}"
        if local != ref:
            print(
                f"snakedvc pull: experiment {name} here is another run's; remote {remote}'s {name} comes as "
                f"{local.rsplit('/', 1)[1]}",
                file=sys.stderr,
                flush=True,
            )
        landing[ref] = local
    return landing


def _fetch_data(root: Path, revs: Sequence[str]) -> None:
    """The experiments' data from the DVC remote into this cache (so `dvc exp apply` restores it)."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    from snakedvc.engine.tracking import repo_lock

    try:
        with repo_lock(root), Repo(str(root)) as repo:
            repo.fetch(revs=list(revs), workspace=False)
    except DvcException as error:
        raise RemoteError(
            f"the experiments' refs are here, but their data could not be fetched from the DVC remote: {error} "
            "(`dvc remote list`; the run pushes its data there when it ends)"
        ) from None
