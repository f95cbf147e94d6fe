"""The dashboard's job list in real Chromium: a dense table (50 jobs on a 1,000 px screen, the
list first on a phone), counts by state that link to their filter and follow the stream, every
filter and page in the URL (shared links, the back button), search, pages, and a bulk retry
whose confirmation names its count; the stored-template filter, with the bulk actions."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, Page
from yarl import URL

from server.errors import PermanentError
from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.integration.test_job_list import insert
from tests.pdfs import FakeRenderer
from tests.sse import collect

pytestmark = pytest.mark.browser

LIVE = "#conn[data-state=live]"
ROWS = "#jobs tr.job"
WIDTHS = [1280, 390]
#: Where the docs' screenshots are written when DOC_SCREENSHOTS=1 (docs/dashboard.md).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "dashboard"


async def rows(page: Page, count: int) -> list[str]:
    """The ids of the rows once there are `count` of them."""
    await page.wait_for_function(
        f"document.querySelectorAll('{ROWS}').length === {count}", timeout=10_000
    )
    ids: list[str] = await page.eval_on_selector_all(ROWS, "rows => rows.map(r => r.dataset.jobId)")
    return ids


async def count_of(page: Page, state: str) -> str:
    return await page.inner_text(f"#counts .count-{state} .count-n")


async def wait_count(page: Page, state: str, n: int) -> None:
    await page.wait_for_function(
        f"document.querySelector('#counts .count-{state} .count-n')?.textContent === '{n}'",
        timeout=20_000,
    )


def query_of(page: Page) -> dict[str, str]:
    return dict(URL(page.url).query)


async def open_at(browser: Browser, width: int) -> Page:  # noqa: F811
    """A page as wide as a desktop's window or a phone's screen."""
    if width < 500:
        return await browser.new_page(viewport={"width": width, "height": 844}, is_mobile=True)
    return await browser.new_page(viewport={"width": width, "height": 1000})


async def keep_screenshot(page: Page, tmp_path: Path, name: str, selector: str = "body") -> None:
    """A PNG of what a user sees (of one part of the page); kept for the docs when asked to."""
    shot = tmp_path / name
    if selector == "body":
        await page.screenshot(path=str(shot))
    else:
        await page.locator(selector).screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DOC_SCREENSHOTS") == "1":
        shutil.copyfile(shot, SCREENSHOTS / name)


async def some_jobs(pool: asyncpg.Pool) -> None:
    """Jobs of each source and state, as a tenant's list would hold them."""
    await insert(pool, 30, "done", channel="user-1")
    await insert(pool, 20, "done", source="page_url", template="https://shop.example.com/order/7")
    await insert(pool, 12, "done", source="markdown", template="# Notes")
    await insert(pool, 3, "failed", channel="user-1")
    await insert(pool, 2, "cancelled", source="pdfs", template="[]")
    await insert(pool, 5, "failed", tenant="other")  # never listed nor counted here


async def test_fifty_jobs_fit_a_desktop_screen_and_a_phone_shows_the_list_first(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    await some_jobs(pool)
    timed = await pool.fetchval(
        """UPDATE jobs SET finished_at = started_at + interval '2.4 s'
           WHERE id = (SELECT id FROM jobs WHERE tenant = 'default' AND status = 'done'
                       ORDER BY created_at DESC LIMIT 1)
           RETURNING id"""
    )
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)
    await rows(page, 50)
    last = await page.locator(ROWS).nth(49).bounding_box()
    top = await page.locator(ROWS).first.bounding_box()
    assert last is not None and last["y"] + last["height"] <= 1000, (top, last)
    first = page.locator(ROWS).first
    assert await first.locator(".badge").inner_text() in ("done", "failed", "cancelled")
    sources = await page.eval_on_selector_all(
        f"{ROWS} .job-source", "cells => cells.map(c => c.textContent)"
    )
    assert {"Template", "Markdown", "shop.example.com"} <= set(sources), set(sources)
    created = await first.locator(".job-created time").inner_text()
    assert ":" in created and any(ch.isdigit() for ch in created.split(",")[0]), created
    # A done job's time from its claim to its end.
    assert await page.inner_text(f'{ROWS}[data-job-id="{timed}"] .job-duration') == "2.4 s"
    await wait_count(page, "done", 62)
    await keep_screenshot(page, tmp_path, "list-1280.png", ".jobs-panel")

    phone = await browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    await phone.goto(app.url("/"))
    await phone.wait_for_selector(LIVE)
    await rows(phone, 50)
    jobs_box = await phone.locator("#jobs-heading").bounding_box()
    form_box = await phone.locator("#new-job-heading").bounding_box()
    assert jobs_box and form_box and jobs_box["y"] < form_box["y"], "the list comes first"
    overflow = await phone.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px"
    row_box = await phone.locator(ROWS).first.bounding_box()
    assert row_box is not None and row_box["x"] + row_box["width"] <= 390
    assert await phone.is_visible(f'{ROWS}[data-job-id="{timed}"] .job-duration:text("2.4 s")')
    await wait_count(phone, "done", 62)
    await keep_screenshot(phone, tmp_path, "list-390.png")
    assert errors == []


@pytest.mark.parametrize("width", WIDTHS)
async def test_counts_filters_search_and_pages_live_in_the_url(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    width: int,
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    await some_jobs(pool)
    [ordered] = await insert(pool, 1, "cancelled")
    await pool.execute(
        "UPDATE jobs SET metadata = '{\"order\": \"A-17\"}', idempotency_key = 'inv-1' "
        "WHERE id = $1",
        ordered,
    )
    [early] = await insert(pool, 1, "done")
    await pool.execute("UPDATE jobs SET created_at = '2020-06-01T12:00:00Z' WHERE id = $1", early)
    page = await open_at(browser, width)
    # A shared link opens its filter.
    await page.goto(app.url("/?state=failed&channel=user-1"))
    await page.wait_for_selector(LIVE)
    failed = await rows(page, 3)
    assert await page.input_value("#filter-status") == "failed"
    assert await page.input_value("#channel-filter-input") == "user-1"
    assert set(await page.eval_on_selector_all(ROWS, "r => r.map(x => x.dataset.status)")) == {
        "failed"
    }
    # The counts ignore the state (each is what its link lists) and never count another tenant.
    await wait_count(page, "failed", 3)
    assert await count_of(page, "done") == "30" and await count_of(page, "all") == "33"

    # A count is a link to its filter; the pages go by cursor, all in the URL.
    await page.click("#counts .count-done")
    await rows(page, 30)
    assert query_of(page) == {"state": "done", "channel": "user-1"}
    await page.click("#channel-filter-clear")
    await rows(page, 50)
    assert query_of(page) == {}
    await page.click("#counts .count-done")
    first_page = await rows(page, 50)
    await page.click("#older")
    older = await rows(page, 13)
    assert "cursor" in query_of(page) and not set(older) & set(first_page)
    await page.click("#newer")
    assert await rows(page, 50) == first_page

    # Back and forward walk the same views.
    await page.go_back()
    assert await rows(page, 13) == older
    await page.go_back()
    assert await rows(page, 50) == first_page
    await page.go_back()
    await rows(page, 50)
    assert query_of(page) == {}
    await page.go_back()
    assert await rows(page, 30) and query_of(page) == {"state": "done", "channel": "user-1"}
    await page.go_back()
    assert await rows(page, 3) == failed
    assert await page.input_value("#filter-status") == "failed"

    # Search: a metadata value, an idempotency key, the start of an id.
    await page.click("#channel-filter-clear")
    await rows(page, 50)
    for text in ("A-17", "inv-1", str(ordered)[:8]):
        await page.fill("#filter-q", text)
        await page.click("#channel-filter button[type=submit]")
        assert await rows(page, 1) == [str(ordered)], text
        assert query_of(page) == {"q": text}
    await page.fill("#filter-q", "nothing-like-it")
    await page.click("#channel-filter button[type=submit]")
    await rows(page, 0)
    assert await page.inner_text("#jobs-message") == "No job matches these filters."

    # A time range from the URL, either end; one the server refuses says so.
    await page.goto(app.url("/?created_from=2999-01-01T00:00:00.000Z"))
    await rows(page, 0)
    assert await page.input_value("#filter-from") != ""
    until = "2021-01-01T00:00:00.000Z"
    await page.goto(app.url(f"/?created_to={until}"))
    assert await rows(page, 1) == [str(early)]
    shown_to = await page.eval_on_selector("#filter-to", "box => new Date(box.value).toISOString()")
    assert shown_to == until, "the box shows the same instant, in this browser's zone"
    # A link made before the state was named state= in the URL still opens its filter.
    await page.goto(app.url("/?status=failed&channel=user-1"))
    assert await rows(page, 3) == failed
    assert await page.input_value("#filter-status") == "failed"
    await page.goto(app.url("/?q=" + "x" * 201))
    await page.wait_for_function(
        "document.getElementById('jobs-message').textContent.startsWith('Could not load jobs')"
    )
    assert "(q: " in await page.inner_text("#jobs-message")
    # A bulk action on a filter the server refuses says why, and asks nothing.
    page.on("dialog", lambda dialog: pytest.fail(f"asked {dialog.message!r}"))
    await page.click("#bulk-retry")
    await page.wait_for_function(
        "document.getElementById('bulk-status').textContent.startsWith('Retry failed')"
    )
    assert "(q: " in await page.inner_text("#bulk-status")
    await page.close()


async def test_the_copy_button_copies_the_full_id_and_the_id_opens_its_page(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    [job_id] = await insert(pool, 1, "done")
    context = await browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    page = await context.new_page()
    await page.goto(app.url("/"))
    await rows(page, 1)
    assert await page.get_attribute(f"{ROWS} a.job-id", "href") == f"/jobs/{job_id}"
    assert len(await page.inner_text(f"{ROWS} a.job-id")) == 8
    await page.click(f"{ROWS} button.copy-id")
    assert await page.evaluate("navigator.clipboard.readText()") == str(job_id)
    await context.close()


@pytest.mark.parametrize("width", WIDTHS)
async def test_bulk_retry_of_a_filter_confirms_its_count_then_the_rows_and_counts_go_live(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: asyncpg.Pool,
    width: int,
) -> None:
    renderer = FakeRenderer()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    failed = await insert(pool, 4, "failed", channel="user-1")
    await insert(pool, 1, "done", channel="user-1")
    await insert(pool, 2, "failed", channel="user-2")
    await insert(pool, 3, "failed", tenant="other")
    page = await open_at(browser, width)
    await page.goto(app.url("/?state=failed&channel=user-1"))
    await page.wait_for_selector(LIVE)
    await rows(page, 4)
    await wait_count(page, "failed", 4)

    asked: list[str] = []

    async def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        await (dialog.accept() if len(asked) > 1 else dialog.dismiss())

    page.on("dialog", lambda dialog: asyncio.ensure_future(answer(dialog)))
    # Dismissed: nothing changes.
    await page.click("#bulk-retry")
    await page.wait_for_function("document.getElementById('bulk-retry').disabled === false")
    assert asked == ["Retry 4 failed jobs?"]
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'failed'") == 9

    renderer.gate = asyncio.Event()  # the first retried job stays running a while
    await page.click("#bulk-retry")
    await page.wait_for_function(
        "document.getElementById('bulk-status').textContent.startsWith('Retried 4')"
    )
    assert asked[1] == "Retry 4 failed jobs?"
    # Live, from the stream: a retried job running, the counts following it.
    await page.wait_for_selector(f"{ROWS}[data-status=running]")
    await wait_count(page, "running", 1)
    await wait_count(page, "failed", 0)
    renderer.gate.set()
    for job_id in failed:
        await page.wait_for_selector(f'{ROWS}[data-job-id="{job_id}"][data-status=done]')
    await wait_count(page, "done", 5)
    others = await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'failed'")
    assert others == 5, "another channel's and another tenant's failed jobs are left"

    # Nothing left to retry: said so, without asking.
    await page.click("#bulk-retry")
    await page.wait_for_function(
        "document.getElementById('bulk-status').textContent.startsWith('No failed job')"
    )
    assert len(asked) == 2
    await page.close()


async def test_the_template_filter_from_the_url_lists_counts_and_retries_one_template(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    renderer = FakeRenderer()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    for name, html in (("invoice", "<p>1</p>"), ("invoice", "<p>2</p>"), ("receipt", "<p>r</p>")):
        body = {"name": name, "html": html, "publish": True}
        async with app.http.post(app.url("/v1/templates"), json=body) as r:
            assert r.status == 201, await r.text()

    async def submit(template_id: str) -> str:
        async with app.http.post(app.url("/v1/jobs"), json={"template_id": template_id}) as r:
            assert r.status == 202, await r.text()
            job_id: str = (await r.json())["id"]
        await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"))  # ends once it is final
        return job_id

    renderer.fail_with = PermanentError("the printer is out of paper")
    failed_invoice, failed_receipt = await submit("invoice@1"), await submit("receipt")
    renderer.fail_with = None
    first, latest = await submit("invoice@1"), await submit("invoice")
    await submit("receipt")

    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    # The link: one state of one template.
    await page.goto(app.url("/?state=failed&template=invoice"))
    assert await rows(page, 1) == [failed_invoice]
    assert await page.input_value("#filter-status") == "failed"
    assert await page.input_value("#filter-template") == "invoice"
    await page.goto(app.url("/?template=invoice"))
    await page.wait_for_selector(LIVE)
    assert set(await rows(page, 3)) == {failed_invoice, first, latest}
    assert await page.input_value("#filter-template") == "invoice"
    await wait_count(page, "done", 2)
    assert await count_of(page, "failed") == "1" and await count_of(page, "all") == "3"
    sources = await page.eval_on_selector_all(
        f"{ROWS} .job-source", "cells => cells.map(c => c.textContent)"
    )
    assert sorted(sources) == ["invoice@1", "invoice@1", "invoice@2"]

    # The filter goes with the bulk action: only this template's failed job is retried.
    asked: list[str] = []

    async def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        await dialog.accept()

    page.on("dialog", lambda dialog: asyncio.ensure_future(answer(dialog)))
    async with page.expect_request(
        lambda r: r.method == "POST" and URL(r.url).path == "/v1/jobs/retry"
    ) as sent:
        await page.click("#bulk-retry")
    assert (await sent.value).post_data_json == {"template": "invoice", "dry_run": True}
    await page.wait_for_function(
        "document.getElementById('bulk-status').textContent.startsWith('Retried 1')"
    )
    assert asked == ["Retry 1 failed job? (2 others match and are left as they are)"]
    await page.wait_for_selector(f'{ROWS}[data-job-id="{failed_invoice}"][data-status=done]')
    assert await _status_of(app, failed_receipt) == "failed", "another template's is left"

    # One version, typed into the box: in the URL like the other filters.
    await page.fill("#filter-template", "invoice@2")
    await page.click("#channel-filter button[type=submit]")
    assert await rows(page, 1) == [latest]
    assert query_of(page) == {"template": "invoice@2"}
    await page.go_back()
    await rows(page, 3)
    assert await page.input_value("#filter-template") == "invoice"
    await page.close()


async def _status_of(app: RunningApp, job_id: str) -> str:
    async with app.http.get(app.url(f"/v1/jobs/{job_id}")) as resp:
        status: str = (await resp.json())["status"]
        return status
