"""Open a page in a real headless Chromium (Debian's package) and read what a person would see,
over the DevTools protocol: console errors, every image's loaded size, texts, a screenshot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or ""

# The docs' pictures of what a user sees are the tests' own screenshots: UPDATE_SCREENSHOTS=1 keeps
# them here (docs/images/<name>.png), so a picture in the docs is of a page a test has checked.
DOC_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def keep_for_docs(shot: Path, name: str) -> None:
    """A checked page's screenshot as the docs' picture ``name`` (e.g. "report/run"), when asked."""
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        target = DOC_IMAGES / f"{name}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


IMAGES_DONE = "[...document.images].every(i => i.complete)"

PAGE_STATE = """JSON.stringify({
  images: [...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth})),
  svgs: document.querySelectorAll('svg').length,
  metrics: Object.fromEntries([...document.querySelectorAll('[data-metric]')].map(e => [e.dataset.metric, e.textContent])),
  winner: (document.querySelector('[data-sweep-winner]') || {dataset: {}}).dataset.sweepWinner || null,
  headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
  text: document.body.innerText,
  title: document.title,
})"""


@dataclass
class PageView:
    errors: list[str]
    images: list[dict[str, Any]]
    svgs: int
    metrics: dict[str, str]
    winner: str | None
    headings: list[str]
    text: str
    title: str


def open_page(page: Path, screenshot: Path, timeout: float = 180) -> PageView:
    """The first start on a fresh machine builds font caches: a generous timeout."""
    if not CHROMIUM:
        raise RuntimeError("chromium is not installed (scripts/ensure-apt chromium)")
    # Chromium's helper processes may still write to the profile for a moment after it is stopped.
    with tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True) as profile:
        proc = _start_chromium(profile)
        try:
            port = _devtools_port(proc, timeout)
            return asyncio.run(asyncio.wait_for(_inspect(port, page, screenshot), timeout))
        finally:
            # The whole process group (browser, renderer, utility processes), then wait for the browser.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _start_chromium(profile: str) -> subprocess.Popen[str]:
    """Headless Chromium with a DevTools server on a free port (_devtools_port reads which)."""
    return subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _devtools_port(proc: subprocess.Popen[str], timeout: float) -> int:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if found:
            return int(found.group(1))
    raise RuntimeError("chromium did not start its DevTools server:\n" + "".join(seen[-20:]))


async def _inspect(port: int, page: Path, screenshot: Path) -> PageView:
    errors: list[str] = []
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/json") as response:
            targets = await response.json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with session.ws_connect(url, max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))
            loaded = asyncio.Event()

            async def call(method: str, **params: Any) -> dict[str, Any]:
                number = next(ids)
                await ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
                while True:
                    message = json.loads((await ws.receive()).data)
                    if message.get("id") == number:
                        if "error" in message:
                            raise RuntimeError(f"{method}: {message['error']}")
                        return dict(message.get("result", {}))
                    note(message)

            def note(message: dict[str, Any]) -> None:
                method, params = message.get("method"), message.get("params", {})
                if method == "Page.loadEventFired":
                    loaded.set()
                elif method == "Runtime.exceptionThrown":
                    errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
                elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    errors.append(json.dumps(params.get("args", []))[:500])
                elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                    errors.append(params["entry"].get("text", "")[:500])

            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)
            await call("Page.navigate", url=page.resolve().as_uri())
            while not loaded.is_set():
                note(json.loads((await ws.receive()).data))
            # Images decode asynchronously on a busy machine: wait until each says it is done.
            for _ in range(100):
                done = await call("Runtime.evaluate", expression=IMAGES_DONE, returnByValue=True)
                if done["result"]["value"]:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # late console messages
            state = json.loads(
                (await call("Runtime.evaluate", expression=PAGE_STATE, returnByValue=True))["result"]["value"]
            )
            shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
    return PageView(errors=errors, **state)


class Tab:
    """A live tab of a headless Chromium, driven over the DevTools protocol from synchronous test
    code: each call runs on the tab's own event loop (a thread), so the page keeps running between."""

    def __init__(self, port: int) -> None:
        self.errors: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._ids = iter(range(1, 10**9))
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._run(self._connect(port))

    def _run(self, coroutine: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _connect(self, port: int) -> None:
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json") as response:
            targets = await response.json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self._ws = await self._session.ws_connect(url, max_msg_size=0)
        self._reader = asyncio.ensure_future(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self._call(f"{domain}.enable")
        await self._call(
            "Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False
        )

    async def _read(self) -> None:
        async for message in self._ws:
            body = json.loads(message.data)
            future = self._waiting.pop(body.get("id", -1), None)
            if future is not None:
                future.set_result(body)
            elif body.get("method") == "Runtime.exceptionThrown":
                self.errors.append(json.dumps(body["params"].get("exceptionDetails", {}))[:500])
            elif body.get("method") == "Runtime.consoleAPICalled" and body["params"].get("type") == "error":
                self.errors.append(json.dumps(body["params"].get("args", []))[:500])

    async def _call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._waiting[number] = future
        await self._ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
        body = await future
        if "error" in body:
            raise RuntimeError(f"{method}: {body['error']}")
        return dict(body.get("result", {}))

    def goto(self, url: str) -> None:
        self._run(self._call("Page.navigate", url=url))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self._run(self._call("Runtime.evaluate", expression=expression, returnByValue=True))
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 60) -> Any:
        """Polls ``expression`` until it is truthy; its value. Names ``what`` and the page's text if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):  # the page is loading
                value = self.evaluate(expression)
                if value:
                    return value
            time.sleep(0.2)
        text = self.evaluate("document.body ? document.body.innerText : ''")
        raise AssertionError(f"the page never showed {what} in {timeout:g} s; it shows:\n{str(text)[:3000]}")

    def screenshot(self, path: Path) -> None:
        shot = self._run(self._call("Page.captureScreenshot", format="png", captureBeyondViewport=True))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        async def shut() -> None:
            self._reader.cancel()
            await self._ws.close()
            await self._session.close()

        with contextlib.suppress(Exception):
            self._run(shut(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@contextlib.contextmanager
def chromium_tab(timeout: float = 180) -> Any:
    """A headless Chromium with one tab (Tab), stopped with its whole process group at the end."""
    if not CHROMIUM:
        raise RuntimeError("chromium is not installed (scripts/ensure-apt chromium)")
    with tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True) as profile:
        proc = _start_chromium(profile)
        tab = None
        try:
            tab = Tab(_devtools_port(proc, timeout))
            yield tab
        finally:
            if tab is not None:
                tab.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
