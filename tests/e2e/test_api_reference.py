"""The API reference (/docs) in real Chromium that can reach Pressroom and nothing else: the
operations and webhooks are shown with no console error, and "Try it out" sends the key the
dashboard keeps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, Route
from yarl import URL

from server.access import apikeys
from server.web import openapi
from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer

pytestmark = pytest.mark.browser

SUBMIT = "#operations-jobs-postJobs"
LIST = "#operations-jobs-getJobs"


class OnlyPressroom:
    """A page whose requests reach the app's origin only (any other is refused and noted), and
    what its console and scripts report as errors."""

    def __init__(self, page: Page, origin: URL) -> None:
        self.origin = origin
        self.elsewhere: list[str] = []
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    async def start(self, page: Page) -> None:
        await page.route("**/*", self._route)

    async def _route(self, route: Route) -> None:
        url = URL(route.request.url)
        if url.scheme in ("data", "blob") or url.origin() == self.origin:
            await route.continue_()
        else:
            self.elsewhere.append(str(url))
            await route.abort("blockedbyclient")

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":  # a refused script or style (CSP) is one too
            self.errors.append(message.text)


async def open_reference(chromium: Browser, app: RunningApp) -> tuple[Page, OnlyPressroom]:
    page = await chromium.new_page()
    guard = OnlyPressroom(page, URL(app.url("/")).origin())
    await guard.start(page)
    return page, guard


async def test_the_reference_shows_the_operations_and_webhooks_offline(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0)
    page, guard = await open_reference(browser, app)
    # The dashboard links to it.
    await page.goto(app.url("/"))
    await page.click("a:has-text('API reference')")
    await page.wait_for_url(app.url("/docs"))

    summary = page.locator(f"{SUBMIT} .opblock-summary-description")
    await summary.wait_for()
    [submit] = [op for op in openapi.OPERATIONS if (op.method, op.path) == ("post", "/v1/jobs")]
    assert await summary.inner_text() == submit.summary
    webhooks = page.locator(".webhooks")
    for kind in ("job.done", "job.failed", "job.cancelled", "batch.done"):
        await webhooks.locator(f".opblock-summary-path[data-path='{kind}']").wait_for()
    # An operation opens with its text/event-stream response.
    await page.click("#operations-events-getJobsJobIdEvents .opblock-summary")
    stream = page.locator("#operations-events-getJobsJobIdEvents tr.response[data-code='200']")
    await stream.locator("option[value='text/event-stream']").wait_for(state="attached")
    assert guard.elsewhere == []
    assert guard.errors == []


async def test_try_it_out_sends_the_dashboards_key(
    start_app: Callable[..., Any],
    pool: asyncpg.Pool,
    browser: Browser,  # noqa: F811
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0)
    page, guard = await open_reference(browser, app)
    await page.goto(app.url("/docs"))
    await page.evaluate("key => localStorage.setItem('pressroom.apiKey', key)", key)
    await page.reload()

    await page.click(f"{LIST} .opblock-summary")
    await page.click(f"{LIST} button.try-out__btn")
    async with page.expect_response(
        lambda r: r.request.method == "GET" and URL(r.url).path == "/v1/jobs"
    ) as answer:
        await page.click(f"{LIST} button.execute")
    response = await answer.value
    assert response.status == 200
    assert await response.request.header_value("Authorization") == f"Bearer {key}"
    await page.locator(f"{LIST} .live-responses-table .response-col_status").first.wait_for()
    assert "200" in await page.locator(f"{LIST} .live-responses-table").inner_text()
    assert guard.elsewhere == []
    assert guard.errors == []
