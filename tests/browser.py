"""Real Chromium for the dashboard tests, and apps served on a fixed port so a test can stop
one and start another in its place (a server restart, as the browser sees it)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession, web
from playwright.async_api import Browser, Playwright, async_playwright

from server.app import create_app
from server.protocol import AppRunner
from server.render import CHROMIUM_ARGS, choose_chromium
from server.settings import Settings


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
