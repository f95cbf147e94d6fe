"""The Python client (async and sync) against the running app with the fake renderer; a small
proxy in front of it plays the networks that refuse SSE or cut streams."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from pypdf import PdfReader
from yarl import URL

from pressroom import AsyncClient, Client, PressroomError, PressroomUnavailable
from server.access import signing
from server.errors import PermanentError
from server.keys import SETTINGS
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer

HELLO = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}
FORWARDED = ("Authorization", "Last-Event-ID", "If-None-Match", "Content-Type", "Accept")


class Proxy:
    """Forwards to the app; can refuse event streams (502) or cut the first one short."""

    def __init__(self, upstream: str, *, refuse_streams: bool = False, cut_after: int = 0) -> None:
        self.upstream = upstream
        self.refuse_streams = refuse_streams
        self.cut_after = cut_after
        self.streams_opened = 0
        self.last_event_ids: list[str | None] = []
        self.long_polled = asyncio.Event()
        self.http = ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        self.server = TestServer(app, host="127.0.0.1")

    async def start(self) -> str:
        await self.server.start_server()
        return str(self.server.make_url("")).rstrip("/")

    async def close(self) -> None:
        await self.http.close()
        await self.server.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if "wait" in request.query:
            self.long_polled.set()
        streaming = request.path.endswith("/events")
        if streaming:
            self.last_event_ids.append(request.headers.get("Last-Event-ID"))
            if self.refuse_streams:
                return web.Response(
                    status=502, text="<h1>Bad gateway</h1>", content_type="text/html"
                )
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
        async with self.http.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
        ) as upstream:
            if not streaming:
                return web.Response(
                    status=upstream.status,
                    body=await upstream.read(),
                    headers={
                        k: v for k, v in upstream.headers.items() if k in ("Content-Type", "ETag")
                    },
                )
            self.streams_opened += 1
            resp = web.StreamResponse(
                status=upstream.status, headers={"Content-Type": upstream.headers["Content-Type"]}
            )
            await resp.prepare(request)
            sent = 0
            async for line in upstream.content:
                await resp.write(line)
                if line.strip() == b"":
                    sent += 1
                    if self.streams_opened == 1 and sent == self.cut_after:
                        return resp  # ends the response mid-stream: the client must resume
            return resp


@pytest.fixture
async def proxies() -> Any:
    made: list[Proxy] = []

    async def make(upstream: str, **kwargs: Any) -> tuple[Proxy, str]:
        proxy = Proxy(upstream, **kwargs)
        made.append(proxy)
        return proxy, await proxy.start()

    yield make
    for proxy in made:
        await proxy.close()


def base(api: RunningApp) -> str:
    return api.url("/").rstrip("/")


async def test_submit_wait_and_download(api: RunningApp, tmp_path: Path) -> None:
    seen: list[str] = []
    async with AsyncClient(base(api)) as client:
        job = await client.submit(**HELLO)
        assert job["status"] == "queued"
        done = await client.wait(job["id"], timeout_s=20, on_event=lambda e: seen.append(e["type"]))
        assert done["status"] == "done" and done["pages"] == 1
        assert seen == ["job.queued", "job.running", "job.done"]
        out = tmp_path / "out"
        out.mkdir()
        saved = await client.download(done, out / "hi.pdf")
    assert saved == out / "hi.pdf"
    assert len(PdfReader(saved).pages) == 1
    assert [p.name for p in out.iterdir()] == ["hi.pdf"], "no temporary file is left"

    async with AsyncClient(base(api)) as client:
        page = await client.list(limit=10)
        assert [item["id"] for item in page["items"]] == [job["id"]]


async def test_wait_long_polls_when_the_event_stream_is_refused(
    api: RunningApp, fake_renderer: FakeRenderer, proxies: Any
) -> None:
    proxy, url = await proxies(base(api), refuse_streams=True)
    fake_renderer.gate = asyncio.Event()
    seen: list[dict[str, Any]] = []
    async with AsyncClient(url) as client:
        job = await client.submit(**HELLO)
        waiting = asyncio.create_task(client.wait(job["id"], timeout_s=30, on_event=seen.append))
        async with asyncio.timeout(10):
            await proxy.long_polled.wait()  # the SSE attempt was refused; now it long-polls
        fake_renderer.gate.set()
        done = await waiting
    assert done["status"] == "done"
    assert proxy.last_event_ids == [None] and proxy.streams_opened == 0
    assert seen[-1]["job"]["status"] == "done"


async def test_events_resume_after_a_cut_by_last_event_id(api: RunningApp, proxies: Any) -> None:
    proxy, url = await proxies(base(api), cut_after=1)
    async with AsyncClient(url) as client:
        job = await client.submit(**HELLO)
        got = [event async for event in client.events(job["id"])]
    assert [e["type"] for e in got] == ["job.queued", "job.running", "job.done"]
    assert proxy.streams_opened == 2
    assert proxy.last_event_ids == [None, str(got[0]["event_id"])]


async def test_a_finished_jobs_events_resumed_at_the_end_stop_at_once(api: RunningApp) -> None:
    async with AsyncClient(base(api)) as client:
        job = await client.submit(**HELLO)
        got = [event async for event in client.events(job["id"])]
        # The server answers 204 for a cursor at the final event: the client stops, no retry.
        async with asyncio.timeout(5):
            rest = [e async for e in client.events(job["id"], got[-1]["event_id"])]
    assert rest == []


async def test_all_events_start_live_once_open(api: RunningApp) -> None:
    opened = asyncio.Event()
    async with AsyncClient(base(api)) as client:
        stream = client.events(on_open=opened.set)
        first = asyncio.create_task(anext(stream))
        async with asyncio.timeout(10):
            await opened.wait()
        job = await client.submit(**HELLO)
        event = await asyncio.wait_for(first, 10)
        types = [event["type"]]
        while types[-1] != "job.done":
            types.append((await asyncio.wait_for(anext(stream), 10))["type"])
        await stream.aclose()
    assert event["job"]["id"] == job["id"]
    assert types == ["job.queued", "job.running", "job.done"]


async def test_all_events_of_some_types_only(api: RunningApp) -> None:
    async with AsyncClient(base(api)) as client:
        first = await client.submit(**HELLO)
        await client.wait(first["id"], timeout_s=10)
        stream = client.events(last_event_id=0, types=["job.done", "job.failed"])
        replayed = await asyncio.wait_for(anext(stream), 10)
        second = await client.submit(**HELLO)
        live = await asyncio.wait_for(anext(stream), 10)
        await stream.aclose()
    assert (replayed["type"], replayed["job"]["id"]) == ("job.done", first["id"])
    assert (live["type"], live["job"]["id"]) == ("job.done", second["id"])


async def test_an_expired_link_is_replaced_by_a_fresh_one(api: RunningApp, tmp_path: Path) -> None:
    async with AsyncClient(base(api)) as client:
        done = await client.wait((await client.submit(**HELLO))["id"], timeout_s=20)
        expired_at = int(time.time()) - 10
        signature = signing.sign_download(
            api.app[SETTINGS].secret, done["id"], expired_at, signing.NO_KEY
        )
        stale = {
            **done,
            "url": str(URL(done["url"]).update_query(expires=expired_at, sig=signature)),
        }
        async with api.http.get(stale["url"]) as resp:
            assert resp.status == 403
        saved = await client.download(stale, tmp_path / "fresh.pdf")
    assert saved.read_bytes().startswith(b"%PDF-")


async def test_errors_carry_the_problem(
    api: RunningApp, fake_renderer: FakeRenderer, tmp_path: Path
) -> None:
    async with AsyncClient(base(api)) as client:
        with pytest.raises(PressroomError) as missing:
            await client.get(str(uuid.uuid4()))
        assert missing.value.status == 404 and missing.value.problem["title"] == "Not found"

        with pytest.raises(PressroomError) as refused:
            await client.submit(template="<p>{{ x </p>", options={"scale": 7})
        assert refused.value.status == 422
        assert [e["field"] for e in refused.value.errors] == ["template", "options.scale"]
        assert "options.scale" in str(refused.value)

        fake_renderer.fail_with = PermanentError("the page cannot be printed")
        failed = await client.wait((await client.submit(**HELLO))["id"], timeout_s=20)
        assert failed["status"] == "failed" and "cannot be printed" in failed["error"]
        with pytest.raises(PressroomError) as not_done:
            await client.download(failed, tmp_path / "never.pdf")
        assert not_done.value.status == 409
        assert not (tmp_path / "never.pdf").exists()

    async with AsyncClient("http://127.0.0.1:9") as nowhere:
        with pytest.raises(PressroomUnavailable):
            await nowhere.get(str(uuid.uuid4()))


async def test_batches_and_templates(api: RunningApp, tmp_path: Path) -> None:
    async with AsyncClient(base(api)) as client:
        stored = await client.create_template(
            "greeting", "<p>Hello {{who}}</p>", sample_data={"who": "world"}
        )
        assert stored["template_id"] == "greeting@1" and stored["status"] == "draft"
        published = await client.publish_template("greeting@1")
        assert published["status"] == "published"
        assert (await client.get_template("greeting"))["versions"][0]["version"] == 1
        assert [t["name"] for t in (await client.list_templates())["items"]] == ["greeting"]
        assert (await client.preview("greeting")).startswith(b"%PDF-")
        assert (await client.preview(html="<p>{{n}}</p>", data={"n": 1})).startswith(b"%PDF-")

        items = [{"key": f"g-{n}", "template_id": "greeting", "data": {"who": n}} for n in range(3)]
        batch = await client.create_batch(items)
        again = await client.create_batch(items)
        assert again["id"] == batch["id"]
        for item in batch["items"]:
            await client.wait(item["job_id"], timeout_s=20)
        current = await client.get_batch(batch["id"])
        assert current["status"] == "done" and current["counts"]["done"] == 3


async def test_assets_upload_list_and_delete(api: RunningApp) -> None:
    logo = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    async with AsyncClient(base(api)) as client:
        asset = await client.upload_asset(logo, "image/png")
        assert asset["size"] == len(logo) and asset["content_type"] == "image/png"
        assert (await client.upload_asset(logo, "image/png"))["id"] == asset["id"]
        job = await client.submit(template='<img src="logo.png">', assets={"logo.png": asset["id"]})
        assert (await client.wait(job["id"], timeout_s=20))["status"] == "done"
        page = await client.list_assets(limit=10)
        assert [item["id"] for item in page["items"]] == [asset["id"]]
        assert page["total_bytes"] == len(logo)
        await client.delete_asset(asset["id"])
        assert (await client.list_assets())["items"] == []
        with pytest.raises(PressroomError) as gone:
            await client.delete_asset(asset["id"])
        assert gone.value.status == 404


async def test_a_combined_batch_is_downloaded_as_one_pdf(api: RunningApp, tmp_path: Path) -> None:
    async with AsyncClient(base(api)) as client:
        items = [{"key": f"c-{n}", "template": "<p>{{n}}</p>", "data": {"n": n}} for n in range(3)]
        opened = asyncio.Event()
        events = client.events(types=["batch.done"], on_open=opened.set)
        first = asyncio.ensure_future(anext(events))
        await opened.wait()
        batch = await client.create_batch(items, combine=True)
        done = await first
        await events.aclose()
        assert done["batch"]["id"] == batch["id"]
        saved = await client.download_combined(done["batch"], tmp_path / "all.pdf")
        assert len(PdfReader(saved).pages) == 3
        plain = await client.create_batch(items[:1])
        with pytest.raises(PressroomError) as refused:
            await client.download_combined(plain["id"], tmp_path / "none.pdf")
        assert refused.value.status == 409 and "not asked for" in str(refused.value)


async def test_the_sync_client_is_the_async_one_on_its_own_loop(
    api: RunningApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRESSROOM_URL", base(api))

    def use() -> tuple[list[str], dict[str, Any], Path]:
        # Blocking calls: run in a thread, so the app (on this test's loop) keeps serving.
        with Client() as client:
            assert client.url == base(api)
            job = client.submit(**HELLO)
            types = [event["type"] for event in client.events(job["id"])]
            done = client.wait(job["id"], timeout_s=20)
            saved = client.download(done["id"], tmp_path / "sync.pdf")
            batch = client.create_batch([{"key": "one", "template": "<p>1</p>"}])
            return types, client.get_batch(batch["id"]), saved

    types, batch, saved = await asyncio.to_thread(use)
    assert types == ["job.queued", "job.running", "job.done"]
    assert batch["total"] == 1 and batch["items"][0]["key"] == "one"
    assert saved.read_bytes().startswith(b"%PDF-")


async def test_waiting_for_a_batch_returns_when_it_is_done_and_at_once_when_it_was(
    api: RunningApp,
) -> None:
    async with AsyncClient(base(api)) as client:
        items = [{"key": f"w-{n}", "template": "<p>{{n}}</p>", "data": {"n": n}} for n in range(3)]
        batch = await client.create_batch(items)
        done = await client.wait_batch(batch["id"], timeout_s=20)
        assert done["id"] == batch["id"] and done["status"] == "done"
        assert done["counts"]["done"] == 3
        # Run again (the batch.done event is long past): answered from the batch as it is.
        started = asyncio.get_running_loop().time()
        again = await client.wait_batch(batch["id"], timeout_s=10)
        assert again["status"] == "done" and asyncio.get_running_loop().time() - started < 2
