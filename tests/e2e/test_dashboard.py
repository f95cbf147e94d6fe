"""The dashboard in real Chromium: submit, watch the job go live to done, download, cancel and
retry, a phone-sized screen, and catching up by itself after the server restarts."""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Callable
from io import BytesIO
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, Page, Request
from pypdf import PdfReader
from yarl import URL

from server.errors import PermanentError
from server.queue import jobs
from server.queue.jobs import NewJob
from tests.browser import FixedPortApp, browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.processes import free_port, wait_until

pytestmark = pytest.mark.browser

LIVE = "#conn[data-state=live]"


class NetworkLog:
    """Every request the page makes, to prove it never polls; and any script error."""

    def __init__(self, page: Page) -> None:
        self.requests: list[tuple[str, URL]] = []
        self.errors: list[str] = []
        page.on("request", self._seen)
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    def _seen(self, request: Request) -> None:
        self.requests.append((request.method, URL(request.url)))

    def list_loads(self) -> int:
        """Reads of the list (not the look-up of a job just submitted, for its source)."""
        return sum(
            1
            for method, url in self.requests
            if method == "GET" and url.path == "/v1/jobs" and "q" not in url.query
        )

    def job_reads(self) -> list[URL]:
        """GETs of one job's JSON: what a polling page would do."""
        return [
            url
            for method, url in self.requests
            if method == "GET"
            and url.path.startswith("/v1/jobs/")
            and not url.path.endswith(("/events", "/pdf"))
            and url.path != "/v1/jobs/counts"  # read again after events, not polled
        ]


async def watch_statuses(page: Page) -> None:
    """Record every status each row shows, in order, into window.statuses."""
    await page.evaluate(
        """() => {
        window.statuses = {};
        const note = (row) => {
          const id = row.dataset.jobId, status = row.dataset.status;
          const seen = (window.statuses[id] ||= []);
          if (status && seen[seen.length - 1] !== status) seen.push(status);
        };
        new MutationObserver((changes) => {
          for (const change of changes) {
            const row = change.target.closest ? change.target.closest("tr.job") : null;
            if (row) note(row);
            for (const node of change.addedNodes || []) if (node.matches?.("tr.job")) note(node);
          }
        }).observe(document.getElementById("jobs"),
                   {subtree: true, childList: true, attributes: true,
                    attributeFilter: ["data-status"]});
      }"""
    )


def row(job_id: str, status: str | None = None) -> str:
    where = f'tr.job[data-job-id="{job_id}"]'
    return where + (f'[data-status="{status}"]' if status else "")


async def submitted_id(page: Page) -> str:
    """Submit the form as it is and return the new job's id."""
    async with page.expect_response(
        lambda r: r.request.method == "POST" and URL(r.url).path == "/v1/jobs"
    ) as answer:
        await page.click("#submit")
    response = await answer.value
    assert response.status == 202, await response.text()
    job_id: str = (await response.json())["id"]
    return job_id


def pdf_text(data: bytes) -> str:
    reader = PdfReader(BytesIO(data))
    return unicodedata.normalize("NFKC", "\n".join(page.extract_text() for page in reader.pages))


@pytest.mark.timeout(180)
async def test_submit_shows_the_job_live_until_done_and_offers_the_pdf(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(render_slots=1)  # real Chromium renders
    page = await browser.new_page()
    network = NetworkLog(page)
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)
    await watch_statuses(page)

    job_id = await submitted_id(page)
    await page.wait_for_selector(row(job_id, "done") + " a.download", timeout=90_000)
    statuses = await page.evaluate(f"window.statuses['{job_id}']")
    assert statuses[-1] == "done" and set(statuses) <= {"queued", "running", "done"}, statuses
    assert statuses == sorted(statuses, key=["queued", "running", "done"].index), statuses
    assert (await page.inner_text(row(job_id) + " .job-attempts")).startswith("1/")
    assert await page.inner_text(row(job_id) + " .job-pages") == "1"

    href = await page.get_attribute(row(job_id) + " a.download", "href")
    assert href is not None
    async with app.http.get(href) as resp:
        assert resp.status == 200 and resp.content_type == "application/pdf"
        text = pdf_text(await resp.read())
    assert "Invoice 2024-0042" in text and "Ada Lovelace" in text

    assert network.list_loads() <= 1, "the list is loaded once, then kept live by events"
    assert network.job_reads() == [], "no polling of the job"
    assert network.errors == []
    await page.close()


async def test_cancel_and_retry_from_the_list(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    renderer = FakeRenderer()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    page = await browser.new_page()
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)

    renderer.gate = asyncio.Event()  # held while rendering
    held = await submitted_id(page)
    await page.click(row(held, "running") + " button.cancel")
    await page.wait_for_selector(row(held, "cancelled"))
    assert await page.locator(row(held) + " .job-actions button").count() == 0
    renderer.gate.set()

    renderer.gate = None
    renderer.fail_with = PermanentError("the page cannot be printed")
    failing = await submitted_id(page)
    await page.wait_for_selector(row(failing, "failed"))
    assert "cannot be printed" in await page.inner_text(row(failing) + " .job-error")
    renderer.fail_with = None
    await page.click(row(failing) + " button.retry")
    await page.wait_for_selector(row(failing, "done") + " a.download")
    await page.close()


async def test_the_channel_filter_shows_one_channels_jobs_live(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(render_slots=0)  # jobs stay queued

    async def submit(channel: str | None) -> str:
        body = {"template": "<p>x</p>", **({"channel": channel} if channel else {})}
        async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
            assert resp.status == 202, await resp.text()
            job_id: str = (await resp.json())["id"]
            return job_id

    before_a, before_b = await submit("user-a"), await submit("user-b")
    page = await browser.new_page()
    network = NetworkLog(page)
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)
    await page.wait_for_selector(row(before_b))

    await page.fill("#channel-filter-input", "user-a")
    await page.click("#channel-filter button[type=submit]")
    await page.wait_for_selector(row(before_b), state="detached")
    await page.wait_for_selector(LIVE)
    assert await page.inner_text(row(before_a) + " .job-channel") == "user-a"
    live_b, live_a = await submit("user-b"), await submit("user-a")
    await page.wait_for_selector(row(live_a, "queued"))
    assert await page.locator(row(live_b)).count() == 0, "another channel's job is not shown"

    # Submitted from the form into the channel shown: it appears; "All" shows everything again.
    await page.fill("#job-channel", "user-a")
    from_form = await submitted_id(page)
    await page.wait_for_selector(row(from_form))
    await page.click("#channel-filter-clear")
    await page.wait_for_selector(row(live_b))
    assert any(url.query.get("channel") == "user-a" for _m, url in network.requests)
    assert network.errors == []
    await page.close()


async def test_phone_sized_screen_has_no_sideways_scroll_and_works(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    page = await browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)
    assert await page.is_hidden("#job-form"), "folded below the list"
    await page.click("#new-job-link")
    job_id = await submitted_id(page)
    link = page.locator(row(job_id, "done") + " a.download")
    await link.wait_for()
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px"
    box = await link.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    await page.close()


async def test_a_job_with_a_thumbnail_shows_its_first_page_in_the_list(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    page = await browser.new_page()
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)
    body = {"template": "<p>x</p>", "options": {"thumbnail": {"width": 64}}}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        job_id = (await resp.json())["id"]
    picture = page.locator(row(job_id, "done") + " .job-thumb img")
    await picture.wait_for()
    # Loaded through its signed URL (an <img> sends no API key), at the width asked for.
    await page.wait_for_function("(img) => img.complete", arg=await picture.element_handle())
    assert await picture.evaluate("(img) => img.naturalWidth") == 64
    assert await picture.get_attribute("alt") == f"First page of job {job_id[:8]}"
    href = await page.get_attribute(row(job_id) + " .job-thumb", "href")
    assert href is not None and "/pdf?" in href
    await page.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_after_a_restart_the_dashboard_catches_up_by_itself(
    make_settings: Callable[..., Any],
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    dsn: str,
    pool: asyncpg.Pool,
) -> None:
    port = free_port()
    first = await FixedPortApp(make_settings(render_slots=1, port=port), FakeRenderer()).start()
    second: FixedPortApp | None = None
    try:
        page = await browser.new_page()
        network = NetworkLog(page)
        await page.goto(first.url("/"))
        await page.wait_for_selector(LIVE)
        before = await submitted_id(page)
        await page.wait_for_selector(row(before, "done"))

        await first.stop()
        await page.wait_for_selector("#conn:not([data-state=live])")
        # While the server is down, another process takes a job through to done.
        [while_down] = await jobs.create(
            pool,
            [
                NewJob(
                    tenant="default",
                    template="<p>made while the dashboard's server was down</p>",
                    data={},
                    options={},
                    metadata={},
                    max_attempts=1,
                )
            ],
        )
        await start_app(renderer=FakeRenderer(), render_slots=1, run_web=False)
        done_query = f"SELECT status FROM jobs WHERE id = '{while_down['id']}'"
        await wait_until(dsn, done_query, "done", timeout_s=30)

        second = await FixedPortApp(make_settings(render_slots=0, port=port)).start()
        await page.wait_for_selector(row(while_down["id"], "done"), timeout=60_000)
        await page.wait_for_selector(LIVE)
        assert await page.locator(row(before, "done")).count() == 1
        assert network.list_loads() <= 1, "caught up from the event stream, not by reloading"
        assert network.job_reads() == []
        assert network.errors == []
        await page.close()
    finally:
        if second is not None:
            await second.stop()
        elif first.runner.server is not None:
            await first.stop()
