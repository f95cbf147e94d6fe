"""Every page of the dashboard loads everything from the server that serves it, no CDN: each
request a page makes in Chromium, from its load until it has drawn what it reads, goes to the
server's own origin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, Request, Route
from yarl import URL

from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_accessibility import PAGES, something_to_show

pytestmark = pytest.mark.browser

#: URLs that name their bytes instead of a server to fetch them from.
INLINE_SCHEMES = {"data", "blob"}


def origin(url: str) -> tuple[str, str | None, int | None]:
    parsed = URL(url)
    return parsed.scheme, parsed.host, parsed.port


@pytest.mark.parametrize("path", list(PAGES))
async def test_a_dashboard_page_asks_nothing_of_another_origin(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    path: str,
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    url = app.url(path.format(**await something_to_show(app, pool)))
    own = origin(url)

    def foreign(url: str) -> bool:
        return URL(url).scheme not in INLINE_SCHEMES and origin(url) != own

    async def refuse(route: Route) -> None:
        await route.abort()  # recorded all the same; the test needs no network

    context = await browser.new_context()
    asked: list[str] = []

    def seen(request: Request) -> None:
        asked.append(request.url)

    context.on("request", seen)
    await context.route(foreign, refuse)
    page = await context.new_page()
    await page.goto(url)
    await page.wait_for_selector(PAGES[path], timeout=15_000)
    await page.wait_for_load_state("load")
    assert any(URL(u).path.startswith("/static/") for u in asked), asked
    assert [u for u in asked if foreign(u)] == []
    await context.close()
