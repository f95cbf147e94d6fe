"""The dashboard in keyed mode in real Chromium: the key is asked once, in a dialog, and
exchanged for a dashboard token that this tab keeps in sessionStorage (never the key; nothing
in localStorage); the list loads and goes live with it, a reload keeps working without asking,
and the token is renewed before it expires without asking again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, Page

from server.access import apikeys
from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_dashboard_list import LIVE, ROWS, keep_screenshot, rows
from tests.integration.test_job_list import insert
from tests.tenants import SEED, bearer

pytestmark = pytest.mark.browser

DIALOG = "dialog.key-dialog[open]"
#: Short enough that the test sees a renewal (at four fifths of it), long enough for a slow run.
TOKEN_TTL_S = 8
TOKEN_STORAGE = "pressroom.dashboardToken"


async def storage(page: Page) -> dict[str, Any]:
    found: dict[str, Any] = await page.evaluate(
        "() => ({session: {...sessionStorage}, local: {...localStorage}})"
    )
    return found


async def held_token(page: Page) -> str:
    token: str = await page.evaluate(f"JSON.parse(sessionStorage.getItem('{TOKEN_STORAGE}')).token")
    return token


async def type_key(page: Page, key: str) -> None:
    await page.wait_for_selector(DIALOG)
    # The dialog has the focus: the key is typed, Enter sends it.
    assert await page.evaluate("document.activeElement.id") == "key-dialog-input"
    await page.keyboard.type(key)
    await page.keyboard.press("Enter")


async def give_key(page: Page, key: str) -> None:
    await type_key(page, key)
    await page.wait_for_selector(DIALOG, state="detached")


async def submit(app: RunningApp, key: str) -> str:
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(key)) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["id"]
        return job_id


async def test_the_key_is_asked_once_and_only_a_renewed_token_is_kept(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    _row, key, _secret = await apikeys.create_key_and_tenant(pool, "acme")
    await insert(pool, 3, "done", tenant="acme")
    await insert(pool, 2, "done")  # another tenant's: never shown
    app: RunningApp = await start_app(render_slots=0, dashboard_token_ttl_s=TOKEN_TTL_S)
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(app.url("/"))
    await page.wait_for_selector(DIALOG)
    await keep_screenshot(page, tmp_path, "keyed-1280.png")
    await type_key(page, "prk_not-a-key")  # refused: said in the dialog, which stays
    await page.wait_for_function(
        "document.getElementById('key-dialog-error').textContent.includes('unknown or revoked')"
    )
    await page.fill("#key-dialog-input", key)
    await page.click("dialog.key-dialog button[type=submit]")
    await page.wait_for_selector(DIALOG, state="detached")
    await rows(page, 3)
    await page.wait_for_selector(LIVE)

    kept = await storage(page)
    assert list(kept["session"]) == [TOKEN_STORAGE] and kept["local"] == {}
    assert key not in str(kept), "the key itself is never stored"
    first = await held_token(page)
    assert first.count(".") == 2  # a JWT

    # Live with the token: a job submitted elsewhere shows at once.
    made = await submit(app, key)
    await page.wait_for_selector(f'{ROWS}[data-job-id="{made}"]', timeout=10_000)

    # Renewed before it expires, without asking: the list and its stream go on.
    await page.wait_for_function(
        f"JSON.parse(sessionStorage.getItem('{TOKEN_STORAGE}')).token !== '{first}'",
        timeout=(TOKEN_TTL_S + 5) * 1000,
    )
    assert await page.locator(DIALOG).count() == 0
    again = await submit(app, key)
    await page.wait_for_selector(f'{ROWS}[data-job-id="{again}"]', timeout=15_000)

    # A reload keeps working with the token this tab holds, without asking.
    await page.reload()
    await rows(page, 5)
    await page.wait_for_selector(LIVE)
    assert await page.locator(DIALOG).count() == 0
    assert key not in str(await storage(page))
    assert errors == []


async def test_a_phone_gets_the_same_dialog(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    _row, key, _secret = await apikeys.create_key_and_tenant(pool, "acme")
    await insert(pool, 2, "failed", tenant="acme")
    app: RunningApp = await start_app(render_slots=0)
    phone = await browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    await phone.goto(app.url("/health"))
    await phone.wait_for_selector(DIALOG)
    box = await phone.locator(DIALOG).bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    await keep_screenshot(phone, tmp_path, "keyed-390.png")
    await give_key(phone, key)
    await phone.wait_for_function(
        "document.getElementById('tile-failures-hint').textContent.includes('2 in the hour')",
        timeout=10_000,
    )
    await phone.wait_for_selector(LIVE)
    # The other pages of this tab use the same token: no dialog.
    await phone.goto(app.url("/"))
    await rows(phone, 2)
    assert await phone.locator(DIALOG).count() == 0
