"""The page's one JSON API, answered from a project here (LocalSource) or on a remote's clone
through one SSH connection (RemoteSource, which talks to `snakedvc ui --stdio` there).

Requests are paths: ``/api/runs``, ``/api/runs/<id>``, ``/api/runs/<id>/dag`` (SVG),
``/api/runs/<id>/jobs/<SLURM job>`` (its log's end), ``/api/sweeps``, ``/api/sweeps/<name>``,
``/api/experiments``, ``/api/compare?rev=A&rev=B``. Over --stdio one JSON line asks
(``{"path": ..., "query": {...}}``) and one JSON line answers (``{"ok": ...}`` or ``{"error": ...}``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from snakedvc.engine.runs.record import RunError
from snakedvc.engine.ui import data

Query = dict[str, list[str]]


class NotFound(RunError):
    """No such page of the API."""


class LocalSource:
    """The API answered from the project at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.experiments = data.Experiments(root)

    def answer(self, path: str, query: Query) -> Any:
        parts = [part for part in path.split("/") if part][1:]  # after "api"
        routes: dict[tuple[str, int], Callable[[list[str]], Any]] = {
            ("runs", 1): lambda p: data.runs(self.root),
            ("runs", 2): lambda p: data.run(self.root, p[1]),
            ("runs", 3): lambda p: self._run_part(p[1], p[2]),  # /api/runs/<id>/dag
            ("runs", 4): lambda p: data.job_log(self.root, p[1], p[3]),  # /api/runs/<id>/jobs/<jobid>
            ("sweeps", 1): lambda p: data.sweeps(self.root),
            ("sweeps", 2): lambda p: data.sweep(self.root, p[1]),
            ("experiments", 1): lambda p: self.experiments.listing(),
            ("compare", 1): lambda p: self.experiments.compare(query.get("rev", [])),
        }
        route = routes.get((parts[0], len(parts))) if parts else None
        if route is None:
            raise NotFound(f"no API page {path} (the page asks for /api/runs, /api/sweeps, /api/experiments, ...)")
        return route(parts)

    def _run_part(self, run_id: str, part: str) -> Any:
        if part != "dag":
            raise NotFound(f"no API page /api/runs/{run_id}/{part} (a run has /dag and /jobs/<SLURM job>)")
        return data.run_dag(self.root, run_id)


def serve_stdio(source: LocalSource, stdin: IO[str] = sys.stdin, stdout: IO[str] = sys.stdout) -> None:
    """`snakedvc ui --stdio`: answer one JSON line per request line until stdin ends."""
    for line in stdin:
        try:
            request = json.loads(line)
            reply = {"ok": source.answer(request["path"], request.get("query", {}))}
        except NotFound as e:
            reply = {"error": str(e), "status": 404}
        except Exception as e:  # noqa: BLE001 - the page shows it; the server goes on
            reply = {"error": f"{type(e).__name__}: {e}", "status": 500}
        stdout.write(json.dumps(reply, default=str) + "\n")
        stdout.flush()


class RemoteError(RunError):
    pass


class RemoteSource:
    """The API answered on a remote's clone: `snakedvc ui --stdio` there, over one SSH connection
    kept open (started again once if it drops)."""

    def __init__(self, argv: list[str], where: str) -> None:
        self.argv, self.where = argv, where
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        return self._proc

    def answer(self, path: str, query: Query) -> Any:
        with self._lock:
            for _ in range(2):
                proc = self._start()
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    proc.stdin.write(json.dumps({"path": path, "query": query}) + "\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    line = ""
                if line:
                    reply = json.loads(line)
                    if "error" in reply:
                        raise (NotFound if reply.get("status") == 404 else RemoteError)(reply["error"])
                    return reply["ok"]
                self.close()
            raise RemoteError(f"{self.where}: `snakedvc ui --stdio` did not answer ({self._stderr()})")

    def _stderr(self) -> str:
        return (self._proc.stderr.read()[-2000:] if self._proc and self._proc.stderr else "").strip() or "no message"

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
