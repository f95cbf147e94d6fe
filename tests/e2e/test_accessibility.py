"""axe-core (pinned in tests/js, installed by `make install`) on every dashboard page in real
Chromium, at 1280 and 390 px, and on keyed mode's key dialog: no serious or critical violation.
A page listed here that the server does not serve fails the test."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, Page

from server.access import apikeys
from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_dashboard_keyed import DIALOG
from tests.integration.test_job_list import insert

pytestmark = pytest.mark.browser

AXE = Path(__file__).resolve().parents[1] / "js" / "node_modules" / "axe-core" / "axe.min.js"
#: Each page, and what shows it has drawn what it reads (axe then sees the filled page).
PAGES = {
    "/": "#jobs tr.job",
    "/jobs/{job}": "#story[aria-busy=false]",
    "/health": "#health[aria-busy=false]",
    "/batches": "#view[aria-busy=false]",
    "/batches/{batch}": "#view[aria-busy=false] #batch-view:not([hidden])",
    "/templates": "#view[aria-busy=false]",
    "/templates/{template}": "#view[aria-busy=false]",
    "/assets": "#view[aria-busy=false]",
}
WIDTHS = (1280, 390)
SERIOUS = {"serious", "critical"}


def describe(violations: list[dict[str, Any]]) -> str:
    return json.dumps(
        [
            {
                "id": v["id"],
                "impact": v["impact"],
                "help": v["help"],
                "nodes": [n["target"] for n in v["nodes"][:5]],
            }
            for v in violations
        ],
        indent=1,
    )


async def something_to_show(app: RunningApp, pool: asyncpg.Pool) -> dict[str, str]:
    """Jobs, a template and a batch (its item queued) for the pages to show; the ids PAGES'
    paths name."""
    [job, *_] = await insert(pool, 3, "done")
    await insert(pool, 1, "failed")
    async with app.http.post(
        app.url("/v1/templates"), json={"name": "invoice", "html": "<h1>{{ n }}</h1>"}
    ) as resp:
        assert resp.status in (200, 201), await resp.text()
    async with app.http.post(
        app.url("/v1/batches"), json={"items": [{"key": "march", "template": "<p>m</p>"}]}
    ) as resp:
        assert resp.status in (200, 201, 202), await resp.text()
        batch = (await resp.json())["id"]
    return {"job": str(job), "template": "invoice", "batch": batch}


async def violations(page: Page) -> list[dict[str, Any]]:
    """axe-core's serious and critical findings on the page as it is now."""
    await page.add_script_tag(path=str(AXE))
    result = await page.evaluate("() => axe.run(document, {resultTypes: ['violations']})")
    return [v for v in result["violations"] if v["impact"] in SERIOUS]


async def open_at(browser: Browser, width: int) -> Page:  # noqa: F811
    return await browser.new_page(viewport={"width": width, "height": 900}, is_mobile=width < 600)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", list(PAGES))
async def test_no_serious_or_critical_violation(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    path: str,
    width: int,
) -> None:
    assert AXE.is_file(), f"{AXE} is missing: run `make install` (npm ci in tests/js)"
    app: RunningApp = await start_app(render_slots=0)
    url = app.url(path.format(**await something_to_show(app, pool)))
    async with app.http.get(url) as resp:
        assert resp.status == 200, f"{path} is not served ({resp.status})"
    page = await open_at(browser, width)
    await page.goto(url)
    await page.wait_for_selector(PAGES[path], timeout=15_000)
    bad = await violations(page)
    assert not bad, describe(bad)


@pytest.mark.parametrize("width", WIDTHS)
async def test_the_key_dialog_has_no_serious_or_critical_violation(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    width: int,
) -> None:
    assert AXE.is_file(), f"{AXE} is missing: run `make install` (npm ci in tests/js)"
    await apikeys.create_key_and_tenant(pool, "acme")
    app: RunningApp = await start_app(render_slots=0)
    page = await open_at(browser, width)
    await page.goto(app.url("/"))
    await page.wait_for_selector(DIALOG, timeout=15_000)
    bad = await violations(page)
    assert not bad, describe(bad)
    # A key refused: said in the dialog, which stays.
    await page.fill("#key-dialog-input", "prk_not-a-key")
    await page.keyboard.press("Enter")
    await page.wait_for_function(
        "document.getElementById('key-dialog-error').textContent.includes('unknown or revoked')"
    )
    bad = await violations(page)
    assert not bad, describe(bad)
