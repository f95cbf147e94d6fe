"""SSE keep-alive without a task per stream: one pass for the process writes the keep-alive
comment to every idle stream each sse.PING_S (1 s in tests/conftest.py), framed as each stream
is (chunked on HTTP/1.1, bare on HTTP/1.0) and never inside an event's frame; a stream whose
client has gone is ended by it, its subscription released; and shutdown ends every stream at
once, with `closed`, though none has a task that ticks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from server.keys import HUB, SSE_STREAMS
from server.queue import jobs
from server.queue.jobs import NewJob
from server.web import sse
from tests.conftest import RunningApp
from tests.sse import Message, messages

Raw = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_raw(app: RunningApp, version: str) -> Raw:
    """GET /v1/events on a bare socket; the reader is past the response's headers."""
    url = urlsplit(app.url("/"))
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(f"GET /v1/events HTTP/{version}\r\nHost: {url.netloc}\r\n\r\n".encode())
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(f"HTTP/{version} 200".encode()), head
    assert b"Content-Type: text/event-stream" in head
    assert (b"Transfer-Encoding: chunked" in head) == (version == "1.1")
    return reader, writer


@pytest.mark.parametrize(
    ("version", "ping"), [("1.1", sse.KEEP_ALIVE_CHUNKED), ("1.0", sse.KEEP_ALIVE)]
)
async def test_an_idle_stream_gets_the_keep_alive_comment_between_whole_events(
    start_app: Callable[..., Any], pool: asyncpg.Pool, version: str, ping: bytes
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    reader, writer = await open_raw(app, version)
    try:
        async with asyncio.timeout(10):
            got = await reader.readexactly(len(ping))
            assert got == ping
            job = NewJob(
                tenant="default",
                template="<p>x</p>",
                data={},
                options={},
                metadata={},
                max_attempts=1,
            )
            await jobs.create(pool, [job])
            # Until a comment has come after the event too.
            while not (b"job.queued" in got and got.endswith(ping) and got.count(ping) > 1):
                got += await reader.read(4096)
    finally:
        writer.close()
    rest = got
    while rest.startswith(ping):
        rest = rest.removeprefix(ping)
    if version == "1.1":
        size, _, rest = rest.partition(b"\r\n")
        frame, rest = rest[: int(size, 16)], rest[int(size, 16) :]
        assert rest.startswith(b"\r\n")
        rest = rest[2:]
    else:
        end = rest.index(b"\r\n\r\n") + 4
        frame, rest = rest[:end], rest[end:]
    assert frame.startswith(b"id: ") and b"\r\nevent: job.queued\r\n" in frame
    assert frame.endswith(b"\r\n\r\n") and frame.count(b"\r\n\r\n") == 1
    assert rest and rest == ping * (len(rest) // len(ping)), "only comments after the event"


async def test_a_stream_whose_client_has_gone_is_ended_and_released(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    hub, streams = app.app[HUB], app.app[SSE_STREAMS]
    clients = [await open_raw(app, "1.1") for _ in range(3)]
    assert hub.subscribers_by_transport()["sse"] == 3 and len(streams.open) == 3
    for _reader, writer in clients[:2]:
        writer.close()
    # Nothing is sent to them and their handlers wait without a timer: a keep-alive pass
    # (every second here) begun after the server saw them go ends them, as it pings the third.
    reader, writer = clients[2]
    async with asyncio.timeout(10):
        for _pass in range(2):
            ping = await reader.readexactly(len(sse.KEEP_ALIVE_CHUNKED))
            assert ping == sse.KEEP_ALIVE_CHUNKED
    assert hub.subscribers_by_transport()["sse"] == 1 and len(streams.open) == 1
    writer.close()


async def test_shutdown_ends_every_stream_with_closed_at_once(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    job = NewJob(
        tenant="default", template="<p>x</p>", data={}, options={}, metadata={}, max_attempts=1
    )
    await jobs.create(pool, [job])
    idle = await app.http.get(app.url("/v1/events"))
    replayed = await app.http.get(app.url("/v1/events?last_event_id=0"))
    endings: list[list[Message]] = []
    for resp in (idle, replayed):
        assert resp.status == 200
    started = asyncio.get_running_loop().time()
    closing = asyncio.create_task(app.server.close())
    for resp in (idle, replayed):
        async with asyncio.timeout(10):
            endings.append([message async for message in messages(resp)])  # to the end
    await closing
    # Without the streams' end, shutdown would wait out aiohttp's timeout (60 s).
    assert asyncio.get_running_loop().time() - started < 10
    for got in endings:
        assert got[-1].event == "closed" and "shutting down" in got[-1].json["reason"]
    assert [m.event for m in endings[1]] == ["job.queued", "closed"]
