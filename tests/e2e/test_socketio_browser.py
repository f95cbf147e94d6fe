"""A single-page app using the official socket.io-client (installed from the npm registry by
this test's set-up, never committed) gets the same events as SSE, and resumes by `since`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, Page

from server import events
from tests.browser import browser, socketio_client_js  # noqa: F401 (fixtures)
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

pytestmark = pytest.mark.browser

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}

# A same-origin page: subscribe on every (re)connect, from the last event seen (the README's
# cross-origin snippet runs in tests/e2e/test_browser_origin.py).
SNIPPET = """
  window.received = [];
  window.acks = [];
  let lastEventId = null;
  const socket = io({ autoConnect: false, auth: {} });
  socket.on("connect", () => {
    const target = lastEventId === null ? { all: true } : { all: true, since: lastEventId };
    socket.emit("subscribe", target, (ack) => window.acks.push(ack));
  });
  socket.on("job", (event) => {
    lastEventId = event.event_id;
    window.received.push(event);
  });
  window.socket = socket;
"""


async def open_page(browser: Browser, app: RunningApp, client_js: Path) -> Page:  # noqa: F811
    """A document of the app's own origin, with the official client and the snippet in it.
    (Socket.IO answers its own origin by default; and Chromium lets only a page that really
    came from a local address open a websocket to one, so the page is not a stub.)"""
    page = await browser.new_page()
    await page.goto(app.url("/healthz"))
    await page.add_script_tag(path=client_js)
    await page.add_script_tag(content=SNIPPET)
    return page


async def submit(app: RunningApp) -> dict[str, Any]:
    async with app.http.post(app.url("/v1/jobs"), json=SEED) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


def without_url(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "job": {k: v for k, v in payload["job"].items() if k != "url"}}


async def test_official_client_gets_the_sse_events_and_resumes_without_gap(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    socketio_client_js: Path,  # noqa: F811
    pool: asyncpg.Pool,
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    page = await open_page(browser, app, socketio_client_js)
    await page.evaluate("window.socket.connect()")
    await page.wait_for_function("window.acks.length === 1")
    assert await page.evaluate("window.acks[0]") == {"ok": True}

    for _ in range(3):
        await submit(app)
    await page.wait_for_function("window.received.length >= 9", timeout=30_000)
    sse = await collect(app.http, app.url("/v1/events?last_event_id=0"), count=9)
    received = await page.evaluate("window.received")
    assert [e["event_id"] for e in received] == [int(m.id or 0) for m in sse]
    assert [without_url(e) for e in received] == [without_url(m.json) for m in sse]
    transport = await page.evaluate("window.socket.io.engine.transport.name")
    assert transport == "websocket", "the client upgraded from polling"

    # Offline for a while: a job runs start to finish meanwhile.
    await page.evaluate("window.socket.disconnect()")
    missed = await submit(app)
    await collect(app.http, app.url(f"/v1/jobs/{missed['id']}/events"), until="job.done")
    await page.evaluate("window.socket.connect()")
    await page.wait_for_function("window.acks.length === 2")
    await page.wait_for_function("window.received.length >= 12", timeout=30_000)

    log, _ = await events.after(pool, events.START)
    received = await page.evaluate("window.received")
    assert [e["event_id"] for e in received] == [e.id for e in log], "no gap, no duplicate"
    assert [e["type"] for e in received[-3:]] == ["job.queued", "job.running", "job.done"]
    assert received[-1]["job"]["id"] == missed["id"]
    await page.close()
