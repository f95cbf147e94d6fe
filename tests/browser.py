"""Real Chromium for the browser tests; apps served on a fixed port so a test can stop one and
start another in its place (a server restart, as the browser sees it); the official
socket.io-client from npm; and a second origin, the single-page app's own server."""

from __future__ import annotations

import collections
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from playwright.async_api import Browser, Playwright, async_playwright
from yarl import URL

from server.render.browsers import CHROMIUM_ARGS, choose_chromium
from server.settings import Settings
from server.web.app import create_app
from server.web.protocol import AppRunner
from tests.processes import free_port


async def launch(playwright: Playwright) -> Browser:
    """Playwright's Chromium, else the system one (as the renderer does)."""
    executable = choose_chromium(playwright.chromium.executable_path)
    return await playwright.chromium.launch(executable_path=executable, args=list(CHROMIUM_ARGS))


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await launch(playwright)
        yield chromium
        await chromium.close()


class FixedPortApp:
    """The app on 127.0.0.1:port through AppRunner/TCPSite, so it can be restarted in place."""

    def __init__(self, settings: Settings, renderer: Any = None) -> None:
        factory = (lambda _settings: renderer) if renderer is not None else None
        self.app = create_app(settings, renderer_factory=factory)
        self.port = settings.port
        self.runner = AppRunner(self.app, shutdown_timeout=10)
        self.http = ClientSession()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> FixedPortApp:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()
        return self

    async def stop(self) -> None:
        await self.http.close()
        await self.runner.cleanup()


NPM_DIR = Path(__file__).resolve().parents[1] / ".cache" / "npm"  # git-ignored node_modules
SOCKETIO_JS = NPM_DIR / "node_modules" / "socket.io-client" / "dist" / "socket.io.min.js"


@pytest.fixture(scope="session")
def socketio_client_js() -> Path:
    """socket.io-client@4 from the npm registry, cached in .cache/npm (ignored by git)."""
    if not SOCKETIO_JS.exists():
        npm = shutil.which("npm")
        assert npm is not None, "npm is needed to fetch socket.io-client"
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(NPM_DIR), "--no-save", "--no-package-lock",
             "--no-audit", "--no-fund", "socket.io-client@4"],
            check=True, timeout=300, capture_output=True,
        )  # fmt: skip
    assert SOCKETIO_JS.exists()
    return SOCKETIO_JS


# The app's page: what the README's snippets call (showEvent, showBatch, reloadJobs,
# offerDownload) records what they are given, for the test to read.
APP_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>An app on another origin</title>
<script>
  window.received = [];
  window.batches = [];
  window.resets = [];
  window.downloads = [];
  window.showEvent = (event) => window.received.push(event);
  window.showBatch = (batch) => window.batches.push(batch);
  window.reloadJobs = () => window.resets.push(Date.now());
  window.offerDownload = (job) => window.downloads.push(job);
</script></head><body></body></html>
"""


class SecondOrigin:
    """A single-page app's own server, on a port of its own: another origin than Pressroom's.
    It serves the app's page, its copy of socket.io-client, and its backend's token route,
    which asks Pressroom for a subscription token with the app's API key (`token_body` is
    what it asks for) and counts the tokens it gave, by the page's `?client=`. The same app
    listens on a second port as well: an origin of its own, for Pressroom to refuse.

    (Ports, not host names, tell the origins apart: the test browser resolves no name.)"""

    def __init__(self, socketio_js: Path | None = None) -> None:
        self.port = free_port()
        self.other_port = free_port()
        self.api_url = ""  # Pressroom's origin, once it listens
        self.api_key = ""
        self.token_body: dict[str, Any] = {}
        self.tokens: collections.Counter[str] = collections.Counter()
        app = web.Application()
        app.router.add_get("/app", self._page)
        app.router.add_get("/api/pressroom-token", self._token)
        self.socketio_js = socketio_js
        if socketio_js is not None:
            app.router.add_get("/socket.io.min.js", self._socketio_js)
        self.runner = web.AppRunner(app)
        self.http = ClientSession()

    def origin(self, *, other: bool = False) -> str:
        return f"http://127.0.0.1:{self.other_port if other else self.port}"

    def page(self, client: str, *, other: bool = False, **query: str) -> str:
        return str(URL(f"{self.origin(other=other)}/app").with_query(client=client, **query))

    async def start(self) -> SecondOrigin:
        await self.runner.setup()
        for port in (self.port, self.other_port):
            await web.TCPSite(self.runner, "127.0.0.1", port).start()
        return self

    async def stop(self) -> None:
        await self.http.close()
        await self.runner.cleanup()

    async def _page(self, _request: web.Request) -> web.Response:
        return web.Response(text=APP_PAGE, content_type="text/html")

    async def _socketio_js(self, _request: web.Request) -> web.FileResponse:
        assert self.socketio_js is not None
        return web.FileResponse(self.socketio_js)

    async def _token(self, request: web.Request) -> web.Response:
        client = URL(request.headers.get("Referer", "")).query.get("client", "")
        async with self.http.post(
            f"{self.api_url}/v1/tokens",
            json=self.token_body,
            headers={"Authorization": f"Bearer {self.api_key}"},
        ) as resp:
            body = await resp.json()
            if resp.status == 200:
                self.tokens[client] += 1
            return web.json_response(body, status=resp.status)
