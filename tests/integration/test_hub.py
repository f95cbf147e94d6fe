"""The hub: bounded buffers, slow subscribers cut off (in the hub and on real connections)
while the others keep receiving, clean close, and the job validators used by long-polls."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg
import pytest

from server import events
from server.events import JobEvent, hub
from server.events.hub import Hub, SubscriberDropped
from server.keys import HUB
from server.queue import jobs
from server.queue.jobs import NewJob
from server.web import sockets
from tests.conftest import RunningApp
from tests.sio import SioClient
from tests.sse import Message, messages


def new_jobs(count: int, padding: int = 0) -> list[NewJob]:
    return [
        NewJob(
            tenant="default",
            template="<p>x</p>",
            data={},
            options={},
            metadata={"padding": "x" * padding} if padding else {},
            max_attempts=1,
        )
        for _ in range(count)
    ]


@pytest.fixture
async def running_hub(pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(hub, "SUBSCRIBER_QUEUE", 50)
    the_hub = Hub(pool, poll_interval_s=0.2)
    the_hub.position = events.START
    task = asyncio.create_task(the_hub.run())
    yield the_hub
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def drain(sub: hub.Subscription, count: int) -> list[JobEvent]:
    got: list[JobEvent] = []
    async with asyncio.timeout(10):
        while len(got) < count:
            event = await sub.get(1.0)
            if event is not None:
                got.append(event)
    return got


async def test_a_subscriber_that_falls_behind_is_dropped_others_get_everything(
    pool: asyncpg.Pool, running_hub: Hub
) -> None:
    fast = running_hub.subscribe(tenant="default")
    slow = running_hub.subscribe(tenant="default")
    got: list[JobEvent] = []
    for _ in range(3):
        reader = asyncio.create_task(drain(fast, 20))
        await jobs.create(pool, new_jobs(20))  # 20 events in one transaction
        running_hub.poke()
        got += await reader
        assert slow.buffered <= 50
    assert len(got) == 60 and [e.position for e in got] == sorted(e.position for e in got)
    assert slow.dropped is not None and "more than 50 events behind" in slow.dropped
    assert slow.buffered == 0, "a dropped subscriber holds nothing"
    with pytest.raises(SubscriberDropped, match="resume by event id"):
        await slow.get(1.0)
    assert running_hub.slow_dropped == 1
    assert running_hub.subscriber_count == 1  # only the fast one is left


async def test_an_all_jobs_stream_sends_a_burst_of_events_whole_and_in_order(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    async with api.http.get(api.url("/v1/events")) as resp:
        # Live: the stream subscribes before it sends its headers.
        assert resp.status == 200 and api.app[HUB].subscribers_by_transport()["sse"] == 1
        created = await jobs.create(pool, new_jobs(40))  # 40 events in one transaction
        got: list[Message] = []
        async with asyncio.timeout(10):
            async for message in messages(resp):
                if message.event == "job.queued":
                    got.append(message)
                if len(got) == 40:
                    break
    assert [m.json["job"]["id"] for m in got] == [str(j["id"]) for j in created]
    assert [int(m.id) for m in got] == sorted(int(m.id) for m in got)


async def test_a_quiet_subscription_answers_none_and_a_cancelled_wait_leaves_nothing(
    pool: asyncpg.Pool, running_hub: Hub
) -> None:
    sub = running_hub.subscribe(tenant="default")
    assert await asyncio.wait_for(sub.get(0.05), 5) is None  # quiet: None after the timeout
    waiting = asyncio.create_task(sub.get(30))
    async with asyncio.timeout(5):
        while sub._waiter is None:  # noqa: ASYNC110 (it waits once its task has run)
            await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await jobs.create(pool, new_jobs(1))  # pushed with nobody waiting: kept for the next get
    running_hub.poke()
    event = await asyncio.wait_for(sub.get(10), 10)
    assert event is not None and event.type == "job.queued"


async def test_close_all_ends_every_subscription_with_the_reason(running_hub: Hub) -> None:
    subs = [running_hub.subscribe(tenant="default"), running_hub.subscribe(tenant=None)]
    waiting = [asyncio.create_task(s.get(30)) for s in subs]
    running_hub.close_all("server shutting down")
    for task in waiting:
        with pytest.raises(SubscriberDropped, match="server shutting down"):
            await asyncio.wait_for(task, 5)
    assert running_hub.subscriber_count == 0


def test_etags_compare_weakly_and_change_with_the_job() -> None:
    job = {"id": "a", "status": "running", "progress": 10}
    tag = hub.etag(job)
    assert tag.startswith('W/"') and hub.etag(dict(reversed(job.items()))) == tag
    assert hub.etag({**job, "progress": 20}) != tag
    assert hub.etag_matches(tag, tag)
    assert hub.etag_matches(tag.removeprefix("W/"), tag)
    assert hub.etag_matches(f'W/"other", {tag}', tag)
    assert hub.etag_matches("*", tag)
    assert not hub.etag_matches('W/"other"', tag)


# --- slow clients on real connections -----------------------------------------------------

JOBS = 600
BATCH = 100
PADDING = 15_000  # bytes of metadata per event, so a client that stops reading fills buffers
# Above one batch: the hub hands a batch to every subscriber at once, so a client that keeps
# up holds at most one batch; a stalled one passes the limit at its second batch.
QUEUE_LIMIT = 150


def small_receive_buffer(addr_info: Any) -> socket.socket:
    """A client socket with a tiny receive window, so the server feels it stop reading soon."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


async def test_slow_clients_are_cut_off_with_bounded_memory_while_others_keep_receiving(
    start_app: Callable[..., Any], pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "SUBSCRIBER_QUEUE", QUEUE_LIMIT)
    app: RunningApp = await start_app(render_slots=0)
    push = app.app[sockets.PUSH]
    slow_http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(socket_factory=small_receive_buffer)
    )
    try:
        # Two clients that stop reading: SSE, and Socket.IO over a raw websocket.
        slow_sse = await slow_http.get(app.url("/v1/events"))
        assert slow_sse.status == 200
        slow_ws = await slow_http.ws_connect(app.url("/socket.io/?EIO=4&transport=websocket"))
        assert (await slow_ws.receive_str()).startswith("0")
        await slow_ws.send_str("40")
        assert (await slow_ws.receive_str()).startswith("40")
        await slow_ws.send_str('421["subscribe",{"all":true}]')
        assert await slow_ws.receive_str() == '431[{"ok":true}]'
        [slow_client] = push.clients.values()

        # Two that keep up.
        fast_sio = SioClient()
        await fast_sio.connect(app.url("/"))
        await fast_sio.subscribe(all=True)
        fast_sse: list[Message] = []
        arrived = asyncio.Event()

        async def follow() -> None:
            async with app.http.get(app.url("/v1/events?last_event_id=0")) as resp:
                async for message in messages(resp):
                    fast_sse.append(message)
                    if len(fast_sse) % BATCH == 0:
                        arrived.set()
                    if len(fast_sse) == JOBS:
                        return

        follower = asyncio.create_task(follow())
        got_sio: list[tuple[str, Any]] = []
        for _ in range(0, JOBS, BATCH):
            # One batch at a time, taken by the fast clients before the next one comes.
            arrived.clear()
            await jobs.create(pool, new_jobs(BATCH, PADDING))
            async with asyncio.timeout(30):
                await arrived.wait()
            got_sio += await fast_sio.take(BATCH, timeout_s=30)
        await follower
        log, _ = await events.after(pool, events.START, limit=JOBS)
        assert [int(m.id or 0) for m in fast_sse] == [e.id for e in log]
        assert [data["event_id"] for _name, data in got_sio] == [e.id for e in log]

        # Both slow clients were cut off in the hub; nothing of theirs is buffered there.
        hub_ = app.app[HUB]
        assert hub_.slow_dropped == 2
        transport = push._transport(slow_client)
        if transport is not None:  # not yet cut at the connection level: its queue is capped
            assert transport.queue.qsize() <= sockets.SEND_HIGH_WATER + 2

        # The slow SSE client, reading at last: an in-order prefix, then why it was closed.
        seen: list[Message] = []
        async with asyncio.timeout(30):
            async for message in messages(slow_sse):
                seen.append(message)
                if message.event == "closed":
                    break
        assert seen[-1].event == "closed"
        assert f"more than {QUEUE_LIMIT} events behind" in seen[-1].json["reason"]
        ids = [int(m.id or 0) for m in seen[:-1]]
        assert ids == [e.id for e in log][: len(ids)] and len(ids) < JOBS
        slow_sse.close()

        # The slow Socket.IO client: an in-order prefix, and its connection is ended.
        sio_ids: list[int] = []
        async with asyncio.timeout(30):
            async for frame in slow_ws:
                if frame.type == aiohttp.WSMsgType.TEXT and frame.data.startswith('42["job"'):
                    sio_ids.append(json.loads(frame.data[2:])[1]["event_id"])
        assert sio_ids == [e.id for e in log][: len(sio_ids)] and len(sio_ids) < JOBS
        assert slow_client.sid not in push.clients
        await fast_sio.close()
    finally:
        await slow_http.close()


async def test_an_event_is_encoded_once_per_transport_and_key_and_sent_as_those_bytes(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    seen: list[JobEvent] = []
    app.app[HUB].add_listener(seen.append)
    sse_streams = [await app.http.get(app.url("/v1/events")) for _ in range(3)]
    websockets = [SioClient() for _ in range(2)]
    for client in websockets:
        await client.connect(app.url("/"))
        await client.subscribe(all=True)

    [job] = await jobs.create(pool, new_jobs(1))
    raw: list[bytes] = []
    for resp in sse_streams:
        async with asyncio.timeout(10):
            line = b""
            while not line.endswith(b"\r\n\r\n"):
                line += await resp.content.readuntil(b"\r\n\r\n")
                if line.startswith(b":"):
                    line = b""  # a ping
        raw.append(line)
        resp.close()
    got = [await client.take(1) for client in websockets]
    for client in websockets:
        await client.close()

    [event] = [e for e in seen if str(e.job_id) == str(job["id"])]
    # Dev mode: one key (none), so one encoding per transport, written as it is by everyone.
    assert set(event.encoded) == {"sse 0", "sse 0 chunked", "sio 0", "sio 0 ws"}
    assert raw == [event.encoded["sse 0"]] * 3
    assert [data for [(_name, data)] in got] == [json.loads(event.encoded["sio 0"][1:])[1]] * 2
