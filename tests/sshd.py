"""A real OpenSSH server on 127.0.0.1 for the tests of `snakedvc ... --remote` (issue 45).

Debian's sshd, started by the test session with a configuration, host key and client key of its own
(nothing of the machine's is read or changed), on a free port; the "cluster" side logs in as the
user running the tests. The "laptop" gets a home of its own whose ~/.ssh/config names the server
`cluster`, with the host key in its known_hosts: the kit uses the user's own SSH set-up, as a
person's laptop would have it.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class SshServer:
    port: int
    folder: Path
    host_key: Path
    client_key: Path

    def laptop_home(
        self, home: Path, known_host_key: Path | None = None, key: Path | None = None, user: str | None = None
    ) -> Path:
        """A home whose ~/.ssh/config reaches this server as `cluster` (``known_host_key``: the host
        key its known_hosts trusts, default the server's; ``key``: the login key, default the one
        the server accepts; ``user``: the login, default the tests' user)."""
        ssh = home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        trusted = (known_host_key or self.host_key).with_suffix(".pub").read_text().split()[:2]
        (ssh / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {' '.join(trusted)}\n")
        (ssh / "config").write_text(
            f"Host cluster\n  HostName 127.0.0.1\n  Port {self.port}\n  User {user or getpass.getuser()}\n"
            f"  IdentityFile {key or self.client_key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n"
            f"  UserKnownHostsFile {ssh / 'known_hosts'}\n"
        )
        for name in ("config", "known_hosts"):
            (ssh / name).chmod(0o600)
        return home


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def start_sshd(folder: Path) -> tuple[SshServer, subprocess.Popen[bytes]]:
    subprocess.run([str(REPO / "scripts" / "ensure-apt"), "openssh-server"], check=True)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    host_key, client_key = keygen(folder / "host_key"), keygen(folder / "client_key")
    (folder / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    port = _free_port()
    config = folder / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nAuthorizedKeysFile {folder / 'authorized_keys'}\n"
        f"PidFile {folder / 'sshd.pid'}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
        # The cluster side's commits (dvc exp save) need an identity; a cluster login would have one.
        "SetEnv GIT_AUTHOR_NAME=cluster GIT_AUTHOR_EMAIL=cluster@example.com "
        "GIT_COMMITTER_NAME=cluster GIT_COMMITTER_EMAIL=cluster@example.com\n"
    )
    with open(folder / "sshd.log", "wb") as log:  # the server keeps its own copy of the handle
        proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return SshServer(port, folder, host_key, client_key), proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"sshd did not start: {(folder / 'sshd.log').read_text()}")


def laptop_env(home: Path, path: str) -> dict[str, str]:
    """A laptop's environment: its own home (its SSH set-up), ``path`` (no SLURM), a git identity.
    OpenSSH finds ~ in the password database, not in HOME: GIT_SSH_COMMAND names the home's config,
    as a user who keeps one elsewhere would set it for git (the kit uses git's SSH command)."""
    who = {f"GIT_{kind}_{part}": value for kind in ("AUTHOR", "COMMITTER")
           for part, value in (("NAME", "laptop"), ("EMAIL", "laptop@example.com"))}  # fmt: skip
    return {"HOME": str(home), "PATH": path, "DVC_NO_ANALYTICS": "1", "LANG": os.environ.get("LANG", "C.UTF-8"),
            "GIT_SSH_COMMAND": f"ssh -F {home / '.ssh' / 'config'}", **who}  # fmt: skip
