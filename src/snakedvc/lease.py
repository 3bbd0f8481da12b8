"""One trainer per checkpoint folder: a lease file that names its holder (host, pid, SLURM job).

A second trainer of the same run waits for the lease, takes it over when its holder is gone (the
process ended on this host, or squeue says its SLURM job runs no more, or no sign of life for
``stale_after_s``), and otherwise fails with ``CheckpointBusy`` naming the holder. Takers serialise
on an O_EXCL takeover file. Needs no torch: ``snakedvc.torch.checkpoint.CheckpointStore.lease``
hands one out.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from snakedvc import slurm
from snakedvc.errors import CheckpointBusy

log = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
TAKEOVER_FILE = "lease.json.takeover"
DEFAULT_LEASE_WAIT_S = 60.0  # a retried SLURM job may start while its predecessor writes its SIGTERM checkpoint
DEFAULT_STALE_AFTER_S = 120.0
HALF_WRITTEN_GRACE_S = 5.0  # an unreadable lease this young may be one its creator is still writing
TAKEOVER_STALE_S = 10.0  # a takeover takes milliseconds; an older takeover file is a crashed taker's
SQUEUE_EVERY_S = 15.0  # at most one squeue call per holder this often: slurmctld serves the whole cluster
SQUEUE_TIMEOUT_S = 10.0


def _describe_holder(holder: dict[str, Any]) -> str:
    """host, pid and SLURM job of a lease record, for messages."""
    text = f"host {holder.get('host')}, pid {holder.get('pid')}"
    if holder.get("slurm_job_id"):
        text += f", SLURM job {holder['slurm_job_id']}"
    if holder.get("slurm_array_task"):
        text += f" (array task {holder['slurm_array_task']})"
    return text


def _lease_record(token: str) -> dict[str, Any]:
    now = time.time()
    record: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": slurm.job_id(),
        "slurm_array_task": slurm.array_task(),
        "token": token,
        "started": now,
        "started_at": datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(timespec="seconds"),
    }
    return record


@dataclass(frozen=True)
class _LeaseFile:
    """One reading of a lease file: its record (None when unreadable: ``problem`` says why), bytes and identity."""

    raw: bytes
    holder: dict[str, Any] | None
    problem: str
    inode: tuple[int, int]
    mtime: float

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.mtime)

    def same_file(self, other: _LeaseFile) -> bool:
        return self.inode == other.inode and self.raw == other.raw


def _read_lease(path: Path) -> _LeaseFile | None:
    """The lease file as it is now, or None when there is none."""
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            raw = handle.read()
    except FileNotFoundError:
        return None
    holder: dict[str, Any] | None = None
    problem = ""
    try:
        record = json.loads(raw)
    except ValueError as error:
        problem = "empty" if not raw else f"not JSON: {error}"
    else:
        valid = (
            isinstance(record, dict)
            and isinstance(record.get("host"), str)
            and type(record.get("pid")) is int  # noqa: E721 - bool is an int, and no pid
            and record["pid"] > 0  # os.kill(0 or less, ...) would signal process groups
            and isinstance(record.get("token"), str)
        )
        if valid:
            holder = record
        else:
            problem = "not a lease record (host, pid, token)"
    return _LeaseFile(raw, holder, problem, (stat.st_dev, stat.st_ino), stat.st_mtime)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _slurm_job_ended(job: str) -> str | None:
    """Why squeue says the job runs no more, or None while it runs or when squeue cannot tell."""
    try:
        return slurm.why_not_running(job, timeout=SQUEUE_TIMEOUT_S)
    except slurm.SlurmUnavailable as error:
        log.warning("squeue could not say whether SLURM job %s runs: %s", job, error)
        return None


# Leases this process holds: the ``atexit`` backstop releases them when training ends some other way.
_HELD: set[CheckpointLease] = set()
_HELD_LOCK = threading.Lock()


@atexit.register
def _release_held_leases() -> None:
    with _HELD_LOCK:
        held = list(_HELD)
    for lease in held:
        lease.release()


class CheckpointLease:
    """An exclusive claim on a checkpoint folder: one live trainer at a time reads and writes it.

    Taking it creates ``<folder>/lease.json`` atomically (``O_CREAT|O_EXCL``) with the holder's
    host, pid, SLURM job (and array task) id, a random token and the start time; a daemon thread
    touches the file every ``refresh_s`` so that other hosts see it alive. An existing lease is
    stale, and taken over with a warning naming the old holder, when its process is gone (same
    host), squeue no longer runs its SLURM job, or its file is older than ``stale_after_s``; an
    unreadable one once it is older than a few seconds. A live one is waited for, polling every
    ``poll_s``, for up to ``wait_s``; then ``acquire`` raises CheckpointBusy. ``release`` removes
    the file only while it is still this lease's (and the folder, if nothing else is in it);
    leases still held at interpreter exit are released then. A SIGKILLed holder leaves its file,
    which the stale rules clear.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        wait_s: float = DEFAULT_LEASE_WAIT_S,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        refresh_s: float = 10.0,
        poll_s: float = 1.0,
    ) -> None:
        self.dir = Path(directory)
        self.path = self.dir / LEASE_FILE
        self.wait_s = wait_s
        self.stale_after_s = stale_after_s
        self.refresh_s = refresh_s
        self.poll_s = poll_s
        self._token: str | None = None
        self._pid: int | None = None
        self._stop_refresh = threading.Event()
        self._refresher: threading.Thread | None = None
        self._squeue_seen: dict[str, tuple[float, str | None]] = {}

    @property
    def held(self) -> bool:
        return self._token is not None and self._pid == os.getpid()

    def __enter__(self) -> CheckpointLease:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> CheckpointLease:
        """Take the lease, waiting up to ``wait_s`` for a live holder; CheckpointBusy if it stays."""
        if self.held:
            raise RuntimeError(f"{self.path} is already held by this lease")
        token = secrets.token_hex(16)
        started = time.monotonic()
        announced = said_unreadable = False
        while not self._create(token):
            current = _read_lease(self.path)
            if current is None:
                continue  # released between our attempt and our look: try again
            if current.holder is None and current.age_s <= HALF_WRITTEN_GRACE_S:
                if not said_unreadable:
                    log.info(
                        "lease %s is unreadable (%s) but new: its creator may be writing it", self.path, current.problem
                    )
                    said_unreadable = True
                time.sleep(0.05)
                continue
            reason = self._why_stale(current)
            if reason is not None:
                if not self._remove_stale(current, reason):
                    time.sleep(0.1)  # another process is taking it over: see who wins
                continue
            waited = time.monotonic() - started
            if waited >= self.wait_s:
                raise self._busy(current, waited)
            if not announced:
                log.warning(
                    "checkpoint folder %s is leased to %s; waiting up to %.0f s for it",
                    self.dir, _describe_holder(current.holder or {}), self.wait_s,
                )  # fmt: skip
                announced = True
            time.sleep(min(self.poll_s, max(0.0, self.wait_s - waited)))
        self._token, self._pid = token, os.getpid()
        with _HELD_LOCK:
            _HELD.add(self)
        self._stop_refresh.clear()
        self._refresher = threading.Thread(target=self._refresh, name=f"lease {self.path}", daemon=True)
        self._refresher.start()
        return self

    def release(self) -> None:
        """Give the lease up: its file goes only if it still holds our token. Safe to call twice."""
        if self._token is None:
            return
        token, owner = self._token, self._pid
        self._token = self._pid = None
        with _HELD_LOCK:
            _HELD.discard(self)
        if owner != os.getpid():
            return  # a forked child (a data loader worker): the lease is its parent's
        self._stop_refresh.set()
        if self._refresher is not None and self._refresher is not threading.current_thread():
            self._refresher.join(timeout=5)
        current = _read_lease(self.path)
        if current is not None and current.holder is not None and current.holder["token"] == token:
            self.path.unlink(missing_ok=True)
        else:
            holder = _describe_holder(current.holder) if current and current.holder else "nobody"
            log.warning("lease %s was no longer ours at release (now held by %s): left alone", self.path, holder)
        with contextlib.suppress(OSError):  # the folder goes too if the lease file was all it held
            self.dir.rmdir()

    def _create(self, token: str) -> bool:
        """Our lease file, if there is none: O_EXCL makes one creator win."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:  # the folder was removed by a releasing holder just now
            return False
        try:
            os.write(fd, json.dumps(_lease_record(token), indent=1).encode() + b"\n")
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return True

    def _why_stale(self, lease: _LeaseFile) -> str | None:
        """Why the lease's holder no longer counts, or None while it may still be training."""
        holder = lease.holder
        if holder is None:
            if lease.age_s > HALF_WRITTEN_GRACE_S:
                return f"its file is unreadable ({lease.problem}) and {lease.age_s:.0f} s old"
            return None  # its creator may be writing it still
        if holder["host"] == socket.gethostname():
            with _HELD_LOCK:
                ours = any(held._token == holder["token"] for held in _HELD)
            if holder["pid"] == os.getpid() and not ours:
                return "it names this process, which does not hold it (an earlier process with the same pid)"
            if not _pid_alive(holder["pid"]):
                return f"process {holder['pid']} no longer runs on {holder['host']}"
        job = holder.get("slurm_array_task") or holder.get("slurm_job_id")
        if isinstance(job, str) and job:
            ended = self._slurm_job_ended(job)
            if ended:
                return f"its SLURM job {job} has ended ({ended})"
        if lease.age_s > self.stale_after_s:
            return f"no sign of life for {lease.age_s:.0f} s (stale after {self.stale_after_s:.0f} s)"
        return None

    def _slurm_job_ended(self, job: str) -> str | None:
        seen_at, ended = self._squeue_seen.get(job, (-math.inf, None))
        if time.monotonic() - seen_at >= SQUEUE_EVERY_S:
            ended = _slurm_job_ended(job)
            self._squeue_seen[job] = (time.monotonic(), ended)
        return ended

    def _remove_stale(self, judged: _LeaseFile, reason: str) -> bool:
        """Remove a stale lease file, unless it changed since it was judged; False if another taker is at it.

        Takers serialise on an O_EXCL takeover file, and remove only the very file they judged
        (same inode and bytes): two takers never both remove a lease, so never both hold one.
        """
        takeover = self.dir / TAKEOVER_FILE
        try:
            fd = os.open(takeover, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            self._clear_abandoned_takeover(takeover)
            return False
        except FileNotFoundError:
            return True
        os.close(fd)
        try:
            current = _read_lease(self.path)
            # The very file judged; if unreadable, still old: a new empty one is a creator's that is writing it.
            if (
                current is not None
                and current.same_file(judged)
                and (current.holder is not None or current.age_s > HALF_WRITTEN_GRACE_S)
            ):
                self.path.unlink(missing_ok=True)
                old = _describe_holder(judged.holder) if judged.holder else "an unknown holder"
                log.warning("took over the lease on %s from %s: %s", self.dir, old, reason)
        finally:
            takeover.unlink(missing_ok=True)
        return True

    def _clear_abandoned_takeover(self, takeover: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            age = time.time() - takeover.stat().st_mtime
            if age > TAKEOVER_STALE_S:
                log.warning("removing %s, left %.0f s ago by a process that died taking over a lease", takeover, age)
                takeover.unlink()

    def _refresh(self) -> None:
        """Touch our lease file now and then, so that other hosts see the holder alive."""
        token = self._token
        while not self._stop_refresh.wait(self.refresh_s):
            current = _read_lease(self.path)
            if current is None or current.holder is None or current.holder["token"] != token:
                holder = _describe_holder(current.holder) if current and current.holder else "nobody"
                log.error(
                    "lost the lease on %s (now held by %s): it was judged stale; another trainer may write here",
                    self.dir, holder,
                )  # fmt: skip
                return
            try:
                os.utime(self.path)
            except OSError as error:
                log.warning("could not refresh lease %s: %s", self.path, error)

    def _busy(self, current: _LeaseFile, waited: float) -> CheckpointBusy:
        holder = current.holder or {}
        started = holder.get("started")
        held = f"for {max(0.0, time.time() - started):.0f} s" if isinstance(started, int | float) else "for a while"
        stop = [f"kill {holder.get('pid')} on {holder.get('host')}"]
        if holder.get("slurm_job_id"):
            stop.insert(0, f"scancel {holder['slurm_job_id']}")
        return CheckpointBusy(
            f"checkpoint folder {self.dir} is in use by another trainer of the same run: {_describe_holder(holder)}, "
            f"holding it {held} (last sign of life {current.age_s:.0f} s ago); waited {waited:.0f} s. "
            f"Lease file: {self.path}. Wait for that trainer to finish, or stop it ({' or '.join(stop)}) and "
            f"rerun: a lease whose holder is gone is taken over.",
            self.path,
            holder,
        )
