"""The health page in real Chromium at 1280 and 390 px: tiles for now and three charts of the last
hour drawn as inline SVG from GET /v1/stats, following the tenant's stream."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser

from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_dashboard_list import LIVE, keep_screenshot
from tests.integration.test_stats import finished, queued
from tests.tenants import SEED

pytestmark = pytest.mark.browser


#: The minutes (ago) with jobs done, and those with a failure too.
BUSY = range(2, 58, 3)
FAILING = [minute for minute in BUSY if minute % 4 == 0]


async def an_hour(pool: asyncpg.Pool) -> None:
    """An hour of a tenant's jobs: a few done in some minutes, a failure in some of those."""
    for minute in BUSY:
        for n in range(1 + minute % 5):
            await finished(pool, "done", minutes_ago=minute + 0.3, took_s=0.8 + n * 0.6)
        if minute in FAILING:
            await finished(pool, "failed", minutes_ago=minute + 0.3, took_s=2)
    await queued(pool, age_s=75)


@pytest.mark.parametrize("width", [1280, 390])
async def test_the_health_page_draws_the_hour_and_follows_the_queue(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    tmp_path: Path,
    width: int,
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    await an_hour(pool)
    page = await browser.new_page(viewport={"width": width, "height": 1000}, is_mobile=width < 600)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(app.url("/health"))
    await page.wait_for_selector("#health[aria-busy=false]")
    await page.wait_for_selector(LIVE)
    assert await page.inner_text("#tile-depth") == "1"
    assert "min" in await page.inner_text("#tile-oldest")  # 1 min 15 s, and counting
    bars = await page.locator("#chart-done rect.bar").count()
    assert bars == len(BUSY), bars  # one bar per minute with jobs done
    assert await page.locator("#chart-failed rect.bar").count() == len(FAILING)
    assert await page.locator("#chart-latency path.line").count() == 2
    label = await page.text_content("#chart-done-label") or ""
    assert "in all" in label, label
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px"

    # A job submitted now: the stream's event brings the queue's depth up (debounced).
    async with app.http.post(app.url("/v1/jobs"), json=SEED) as resp:
        assert resp.status == 202, await resp.text()
    await page.wait_for_function(
        "document.getElementById('tile-depth').textContent === '2'", timeout=10_000
    )
    await keep_screenshot(page, tmp_path, f"health-{width}.png")
    # Every minute as a table, by keyboard.
    await page.focus(".minutes summary")
    await page.keyboard.press("Enter")
    assert await page.locator("#minutes-body tr").count() == 60
    assert errors == []
