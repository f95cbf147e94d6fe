"""HTML and Office jobs share a worker's render slots, in queue order, on real Chromium and real
LibreOffice: with one slot, interleaved jobs of both kinds start in the order they were queued,
none before the render ahead of it ends; with two, a render held in Chromium leaves the other
slot converting Office files, and a LibreOffice held mid-conversion leaves it printing pages.

A render is held by its own page: its picture comes from a site here that answers only when
the test says so (loopback is allowed through PRESSROOM_ALLOW_HOSTS); a conversion, by
stopping its LibreOffice (SIGSTOP) and letting it go on (SIGCONT)."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer as SiteServer

from server.keys import WORKERS
from tests.conftest import RunningApp
from tests.e2e.test_office import DOCX, upload, word
from tests.pdfs import small_image
from tests.sse import collect

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # Chromium, and LibreOffice's start

WAIT_S = 90.0
#: What a job may take while the other slot is held: well inside the render time limit, so
#: that a job kept waiting on the held one fails here, not after the held one timed out.
BESIDE_S = 30.0
RENDER_TIMEOUT_S = 60


class Pictures:
    """A site whose picture /held/NAME.png is answered only once `let(NAME)` is called."""

    def __init__(self) -> None:
        self.asked: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.answer: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.port = 0

    async def picture(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.asked[name].set()
        await self.answer[name].wait()
        return web.Response(body=small_image("png"), content_type="image/png")

    def page(self, name: str) -> str:
        """An HTML template whose render waits for the picture `name`."""
        return f'<h1>Page {name}</h1><img src="http://127.0.0.1:{self.port}/held/{name}.png">'

    async def held(self, name: str) -> None:
        """Until Chromium asks for the picture: its render of that page is under way."""
        await asyncio.wait_for(self.asked[name].wait(), WAIT_S)

    def let(self, name: str) -> None:
        self.answer[name].set()


@pytest.fixture
async def pictures() -> AsyncIterator[Pictures]:
    site = Pictures()
    app = web.Application()
    app.router.add_get("/held/{name}.png", site.picture)
    server = SiteServer(app, host="127.0.0.1")
    await server.start_server()
    assert server.port is not None
    site.port = server.port
    yield site
    for answer in site.answer.values():
        answer.set()
    await server.close()


async def start(start_app: Callable[..., Any], slots: int) -> RunningApp:
    app: RunningApp = await start_app(
        render_slots=slots,
        allow_hosts=("127.0.0.1",),
        env={"PRESSROOM_RENDER_TIMEOUT_S": str(RENDER_TIMEOUT_S)},
    )
    return app


async def submit(app: RunningApp, body: dict[str, Any]) -> str:
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["id"]
        return job_id


async def final(app: RunningApp, job_id: str, within_s: float = WAIT_S) -> dict[str, Any]:
    """The job once its stream has ended (with its final event), done."""
    url = app.url(f"/v1/jobs/{job_id}/events")
    messages = await collect(app.http, url, timeout_s=within_s)
    job: dict[str, Any] = messages[-1].json["job"]
    assert job["status"] == "done", job
    return job


async def status(app: RunningApp, job_id: str) -> str:
    async with app.http.get(app.url(f"/v1/jobs/{job_id}")) as resp:
        found: str = (await resp.json())["status"]
        return found


async def test_one_slot_starts_html_and_office_jobs_in_the_order_they_were_queued(
    start_app: Callable[..., Any], pictures: Pictures
) -> None:
    app = await start(start_app, slots=1)
    office = await upload(app, word(1), DOCX)
    first = await submit(app, {"template": pictures.page("first")})
    await pictures.held("first")  # the one slot is printing it: what follows waits in line
    queued = []
    for n in (1, 2):
        queued.append(await submit(app, {"office": office, "options": {"title": f"Word {n}"}}))
        queued.append(await submit(app, {"template": f"<h1>HTML {n}</h1>"}))
    released = dt.datetime.now(dt.UTC)
    pictures.let("first")

    jobs = {job_id: await final(app, job_id) for job_id in [first, *queued]}
    started = sorted(jobs, key=lambda job_id: dt.datetime.fromisoformat(jobs[job_id]["started_at"]))
    assert started == [first, *queued], "in queue order, whatever their kind"
    for job_id in queued:
        assert dt.datetime.fromisoformat(jobs[job_id]["started_at"]) > released
    assert [jobs[job_id]["provenance"]["engine"] for job_id in queued[::2]] == ["LibreOffice"] * 2


async def test_two_slots_let_neither_kind_wait_for_the_other(
    start_app: Callable[..., Any], pictures: Pictures
) -> None:
    app = await start(start_app, slots=2)
    pool = app.app[WORKERS].office
    office = await upload(app, word(1), DOCX)

    # A LibreOffice stopped mid-conversion holds one slot: pages print in the other.
    stuck = await submit(app, {"office": office})
    await asyncio.wait_for(pool.converting.wait(), WAIT_S)
    [converting] = pool.processes()
    os.killpg(converting.pid, signal.SIGSTOP)  # the converter and its soffice.bin
    try:
        for n in (1, 2):
            page = {"template": f"<h1>While converting {n}</h1>"}
            await final(app, await submit(app, page), within_s=BESIDE_S)
        assert await status(app, stuck) == "running"
    finally:
        os.killpg(converting.pid, signal.SIGCONT)
    assert (await final(app, stuck))["attempts"] == 1

    # A page held in Chromium holds one slot: Office files convert in the other.
    printing = await submit(app, {"template": pictures.page("slow")})
    await pictures.held("slow")
    for n in (1, 2):
        word_file = {"office": office, "options": {"title": f"While printing {n}"}}
        await final(app, await submit(app, word_file), within_s=BESIDE_S)
    assert await status(app, printing) == "running"
    pictures.let("slow")
    await final(app, printing)
