"""`snakedvc ui`'s web server (aiohttp): the page, its static files, plotly.js from the installed
plotly package (nothing fetched from the internet), and the JSON API, all behind a token.

Bound to 127.0.0.1. The URL it prints carries the token (as Jupyter's does); the first request
with it sets a cookie, so the page's own requests need no token in their URL. A request with
neither gets 403, so another user of a shared login node cannot read the project's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from snakedvc.engine.runs.record import RunError
from snakedvc.engine.ui.api import NotFound

STATIC = Path(str(resources.files("snakedvc.engine.ui") / "static"))
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def plotly_js() -> Path:
    """plotly.js as the installed plotly package ships it (the `ui` extra)."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def make_app(source: Any, token: str, title: str) -> web.Application:
    cookie = "snakedvc-ui-token"

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.query.get("token") or request.cookies.get(cookie, "")
        if not hmac.compare_digest(given.encode(), token.encode()):
            return web.Response(status=403, text="403: open the address `snakedvc ui` printed (it holds the token)\n")
        response = await handler(request)
        if request.query.get("token"):
            response.set_cookie(cookie, token, httponly=True, samesite="Strict")
        return response

    async def page(request: web.Request) -> web.StreamResponse:
        html = (STATIC / "index.html").read_text().replace("{{title}}", title)
        return web.Response(text=html, content_type="text/html")

    async def api(request: web.Request) -> web.StreamResponse:
        query = {key: request.query.getall(key) for key in request.query if key != "token"}
        try:
            answer = await asyncio.to_thread(source.answer, request.path, query)
        except NotFound as e:
            return web.json_response({"error": str(e)}, status=404)
        except RunError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(answer, dumps=lambda value: json.dumps(value, default=str))

    async def plotly(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(plotly_js())

    app = web.Application(middlewares=[check_token])
    app.router.add_get("/", page)
    app.router.add_get("/api/{path:.*}", api)
    app.router.add_get("/static/plotly.min.js", plotly)
    app.router.add_static("/static/", STATIC)
    return app


def serve(source: Any, port: int, title: str, say: Callable[[str], None]) -> None:
    """Serve until Ctrl-C, saying the address (with its token) once the port is open."""
    token = secrets.token_urlsafe(24)
    app = make_app(source, token, title)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        bound = runner.addresses[0][1]
        say(f"snakedvc ui: http://127.0.0.1:{bound}/?token={token}")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
