"""Which event ends a job's stream is one rule on every transport: the job's final event
(job.done, job.failed, job.cancelled) ends it, and nothing is delivered after; an event of a
state the job leaves again (job.queued, job.running) does not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from server.errors import PermanentError
from server.keys import HUB
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sio import SioClient
from tests.sse import Message, collect, messages

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


async def submit(api: RunningApp) -> str:
    async with api.http.post(api.url("/v1/jobs"), json=SEED) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["id"]
        return job_id


class Sse:
    """GET /v1/jobs/{id}/events, read message by message."""

    def __init__(self, api: RunningApp) -> None:
        self.api = api
        self.received: asyncio.Queue[Message | None] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None

    async def open(self, job_id: str) -> None:
        async def read() -> None:
            async with self.api.http.get(self.api.url(f"/v1/jobs/{job_id}/events")) as resp:
                assert resp.status == 200, await resp.text()
                async for message in messages(resp):
                    self.received.put_nowait(message)
            self.received.put_nowait(None)  # the server ended the stream

        self.reader = asyncio.create_task(read())

    async def arm(self) -> None:
        pass

    async def next_type(self) -> str:
        async with asyncio.timeout(15):
            message = await self.received.get()
        assert message is not None, "the stream ended early"
        return message.event

    async def assert_ended(self) -> None:
        async with asyncio.timeout(15):
            assert await self.received.get() is None, "a message after the final event"
        assert self.reader is not None
        await self.reader

    def assert_nothing_more(self) -> None:
        assert self.received.empty()


class Sio:
    """A Socket.IO subscription to the job."""

    def __init__(self, api: RunningApp, client: SioClient) -> None:
        self.api = api
        self.client = client

    async def open(self, job_id: str) -> None:
        await self.client.connect(self.api.url("/"))
        await self.client.subscribe(job_id=job_id)

    async def arm(self) -> None:
        pass

    async def next_type(self) -> str:
        [(name, data)] = await self.client.take(1)
        assert name == "job", (name, data)
        event_type: str = data["type"]
        return event_type

    async def assert_ended(self) -> None:
        # A job subscription ends silently: the server no longer holds it.
        assert self.api.app[HUB].subscribers_by_transport()["socketio"] == 0

    def assert_nothing_more(self) -> None:
        assert self.client.received.empty(), self.client.received.get_nowait()


class LongPoll:
    """GET /v1/jobs/{id}?wait=30 with the ETag of the last answer, one wait after another."""

    def __init__(self, api: RunningApp) -> None:
        self.api = api
        self.job_id = ""
        self.etag = ""
        self.answers: list[str] = []
        self.poll: asyncio.Task[tuple[int, str, dict[str, Any] | None, float]] | None = None

    async def get(self, query: str = "") -> tuple[int, str, dict[str, Any] | None, float]:
        """(status, ETag, body or None, seconds taken), sending the last ETag."""
        headers = {"If-None-Match": self.etag} if self.etag else {}
        started = time.monotonic()
        url = self.api.url(f"/v1/jobs/{self.job_id}{query}")
        async with self.api.http.get(url, headers=headers) as resp:
            body = await resp.json() if resp.status != 304 else None
            return resp.status, resp.headers.get("ETag", ""), body, time.monotonic() - started

    async def open(self, job_id: str) -> None:
        self.job_id = job_id
        status, self.etag, body, _ = await self.get()
        assert status == 200 and body is not None
        self.answers.append(f"job.{body['status']}")

    async def arm(self) -> None:
        """Start a wait and return once it is parked on the hub (it subscribes first)."""
        hub = self.api.app[HUB]
        parked = asyncio.Event()
        real = hub.subscribe

        def subscribe(**target: Any) -> Any:
            parked.set()
            hub.subscribe = real  # type: ignore[method-assign]
            return real(**target)

        hub.subscribe = subscribe  # type: ignore[method-assign]
        self.poll = asyncio.create_task(self.get("?wait=30"))
        async with asyncio.timeout(10):
            await parked.wait()

    async def next_type(self) -> str:
        if self.answers:
            return self.answers.pop(0)
        assert self.poll is not None
        status, self.etag, body, _ = await self.poll
        assert status == 200 and body is not None, status
        return f"job.{body['status']}"

    async def assert_ended(self) -> None:
        # Nothing is on its way: the wait answers at once that nothing changed.
        status, etag, body, took = await self.get("?wait=30")
        assert (status, etag, body) == (304, self.etag, None) and took < 5, (status, took)

    def assert_nothing_more(self) -> None:
        pass


Follower = Sse | Sio | LongPoll


@pytest.mark.parametrize("final", ["done", "failed", "cancelled"])
@pytest.mark.parametrize("transport", ["sse", "socketio", "longpoll"])
async def test_a_job_stream_ends_after_its_final_event_on_every_transport(
    api: RunningApp,
    fake_renderer: FakeRenderer,
    sio: Callable[[], SioClient],
    transport: str,
    final: str,
) -> None:
    follower: Follower
    if transport == "sse":
        follower = Sse(api)
    elif transport == "socketio":
        follower = Sio(api, sio())
    else:
        follower = LongPoll(api)
    fake_renderer.gate = asyncio.Event()
    blocker = await submit(api)  # holds the only render slot
    await asyncio.wait_for(fake_renderer.started.wait(), 10)
    job_id = await submit(api)
    await follower.open(job_id)
    assert await follower.next_type() == "job.queued"

    # A live event of a state the job leaves again does not end the stream.
    await follower.arm()
    async with api.http.post(api.url(f"/v1/jobs/{blocker}/cancel")) as resp:
        assert resp.status == 200
    assert await follower.next_type() == "job.running"

    await follower.arm()
    if final == "cancelled":
        async with api.http.post(api.url(f"/v1/jobs/{job_id}/cancel")) as resp:
            assert resp.status == 200
    else:
        if final == "failed":
            fake_renderer.fail_with = PermanentError("the page cannot be printed")
        fake_renderer.gate.set()
    assert await follower.next_type() == f"job.{final}"
    await follower.assert_ended()

    if final == "failed":
        # A failed job may be retried: that is news for a new stream, not for the ended one.
        async with api.http.post(api.url(f"/v1/jobs/{job_id}/retry")) as resp:
            assert resp.status == 202
        url = api.url(f"/v1/jobs/{job_id}/events")
        seen: list[Message] = []
        while [m.event for m in seen].count("job.failed") < 2:
            headers = {"Last-Event-ID": seen[-1].id or ""} if seen else {}
            seen += await collect(api.http, url, headers=headers)
        assert [m.event for m in seen][-3:] == ["job.queued", "job.running", "job.failed"]
    follower.assert_nothing_more()
