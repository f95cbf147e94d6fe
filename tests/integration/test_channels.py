"""Channels: a job, a batch and its items carry one, it is shown in them and in their events,
and the channel streams (SSE `?channel=`, Socket.IO `subscribe {"channel"}`) carry only that
channel's job and batch events, replayed and live, with the tenant stream's cursors, resets
and type filters. A slow channel subscriber is cut off as any other."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg
import pytest

from server import events
from server.events.hub import Hub
from server.keys import HUB
from server.queue import jobs
from server.queue.jobs import NewJob
from tests.conftest import RunningApp
from tests.sio import SioClient
from tests.sse import Message, collect, messages

SEED = {"template": "<p>{{ n }}</p>", "data": {"n": 1}}


async def submit(app: RunningApp, channel: str | None = None, **extra: Any) -> dict[str, Any]:
    body = {**SEED, **extra, **({"channel": channel} if channel else {})}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def cancel(app: RunningApp, job_id: str) -> None:
    async with app.http.post(app.url(f"/v1/jobs/{job_id}/cancel")) as resp:
        assert resp.status == 200, await resp.text()


def subject(message: Message) -> tuple[str, str]:
    """(type, id of the job or batch) of an SSE message."""
    body = message.json
    return message.event, (body.get("job") or body["batch"])["id"]


async def read_until(
    session: aiohttp.ClientSession, url: str, last: tuple[str, str], **kwargs: Any
) -> list[tuple[str, str]]:
    """Every message of a stream up to and including `last` (type, id)."""
    got: list[tuple[str, str]] = []
    async with asyncio.timeout(15), session.get(url, **kwargs) as resp:
        assert resp.status == 200, await resp.text()
        async for message in messages(resp):
            got.append(subject(message) if message.event != "reset" else ("reset", ""))
            if got[-1] == last:
                return got
    raise AssertionError(f"the stream ended before {last}: {got}")


@pytest.fixture
async def app(start_app: Callable[..., Any]) -> RunningApp:
    """No render worker: each job stays queued until cancelled, so its events are known."""
    running: RunningApp = await start_app(render_slots=0)
    return running


async def test_a_job_and_a_batch_show_their_channel_and_bad_ones_are_422(app: RunningApp) -> None:
    job = await submit(app, "user-42")
    plain = await submit(app)
    assert (job["channel"], plain["channel"]) == ("user-42", None)
    async with app.http.get(app.url(f"/v1/jobs/{job['id']}")) as resp:
        assert (await resp.json())["channel"] == "user-42"
    async with app.http.get(app.url("/v1/jobs"), params={"channel": "user-42"}) as resp:
        assert [item["id"] for item in (await resp.json())["items"]] == [job["id"]]
    [queued] = await collect(app.http, app.url(f"/v1/jobs/{job['id']}/events"), count=1)
    assert queued.json["job"]["channel"] == "user-42"

    # A batch's items take its channel unless they name their own (null included).
    items = [
        {**SEED, "key": "a"},
        {**SEED, "key": "b", "channel": "org:7/user@x.example"},
        {**SEED, "key": "c", "channel": None},
    ]
    body = {"channel": "user-42", "items": items}
    async with app.http.post(app.url("/v1/batches"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        batch = await resp.json()
    assert batch["channel"] == "user-42"
    assert batch["links"]["events"] == "/v1/events?channel=user-42"
    channels = []
    for item in batch["items"]:
        async with app.http.get(app.url(f"/v1/jobs/{item['job_id']}")) as resp:
            channels.append((await resp.json())["channel"])
    assert channels == ["user-42", "org:7/user@x.example", None]

    for bad in ("", "x" * 201, "user 42", "ü", 42):
        async with app.http.post(app.url("/v1/jobs"), json={**SEED, "channel": bad}) as resp:
            assert resp.status == 422, bad
            [error] = (await resp.json())["errors"]
            assert error["field"] == "channel" and "letters, digits" in error["message"]
    async with app.http.post(
        app.url("/v1/batches"), json={"items": [{**SEED, "key": "k", "channel": "a b"}]}
    ) as resp:
        assert resp.status == 422
        assert (await resp.json())["errors"][0]["field"] == "items[0].channel"
    for path in ("/v1/events", "/v1/jobs"):
        async with app.http.get(app.url(path), params={"channel": "a b"}) as resp:
            assert resp.status == 422, path
            assert (await resp.json())["errors"][0]["field"] == "channel"


async def test_two_channels_interleaved_each_stream_carries_only_its_own(
    app: RunningApp,
) -> None:
    a1, b1, plain, a2 = (
        await submit(app, "A"),
        await submit(app, "B"),
        await submit(app),
        await submit(app, "A"),
    )
    await cancel(app, b1["id"])
    await cancel(app, a1["id"])
    async with app.http.post(
        app.url("/v1/batches"), json={"channel": "A", "items": [{**SEED, "key": "k1"}]}
    ) as resp:
        assert resp.status == 202, await resp.text()
        batch = await resp.json()
    item = batch["items"][0]["job_id"]
    await cancel(app, plain["id"])
    a3 = await submit(app, "A")  # the last event of the log
    last = ("job.queued", a3["id"])
    a_events = [
        ("job.queued", a1["id"]),
        ("job.queued", a2["id"]),
        ("job.cancelled", a1["id"]),
        ("job.queued", item),
        ("batch.progress", batch["id"]),
        last,
    ]

    # Replayed from the start: the channel's events in log order, nothing of B or of no channel.
    replay = await read_until(app.http, app.url("/v1/events?channel=A&last_event_id=0"), last)
    assert replay == a_events
    # The tenant's stream is as it was: everything.
    everything = await read_until(app.http, app.url("/v1/events?last_event_id=0"), last)
    assert set(a_events) < set(everything)
    assert {("job.queued", b1["id"]), ("job.cancelled", plain["id"])} < set(everything)
    b_replay = await read_until(
        app.http, app.url("/v1/events?channel=B&last_event_id=0"), ("job.cancelled", b1["id"])
    )
    assert b_replay == [("job.queued", b1["id"]), ("job.cancelled", b1["id"])]

    # Resumed by Last-Event-ID (the header and the parameter): what followed, same channel.
    first = await collect(app.http, app.url("/v1/events?channel=A&last_event_id=0"), count=2)
    resumed = await read_until(
        app.http, app.url("/v1/events?channel=A"), last, headers={"Last-Event-ID": first[1].id}
    )
    assert resumed == a_events[2:]
    resumed = await read_until(
        app.http, app.url(f"/v1/events?channel=A&last_event_id={first[0].id}"), last
    )
    assert resumed == a_events[1:]
    # With a type filter: only the channel's events of that type.
    cancels = await collect(
        app.http, app.url("/v1/events?channel=A&type=job.cancelled&last_event_id=0"), count=1
    )
    assert [subject(m) for m in cancels] == [("job.cancelled", a1["id"])]

    # Live: a stream of B opened now gets B's next event, and none of A's before it.
    async with app.http.get(app.url("/v1/events?channel=B")) as resp:
        assert resp.status == 200
        stream = messages(resp)
        await submit(app, "A")
        b2 = await submit(app, "B")
        live = await asyncio.wait_for(anext(stream), 10)
        assert subject(live) == ("job.queued", b2["id"])
        assert live.json["job"]["channel"] == "B"


async def test_a_channel_cursor_no_longer_kept_gets_a_reset_then_live(
    app: RunningApp, sio: Callable[[], SioClient]
) -> None:
    async with app.http.get(app.url("/v1/events?channel=A&last_event_id=99999")) as resp:
        assert resp.status == 200
        stream = messages(resp)
        reset = await asyncio.wait_for(anext(stream), 10)
        assert reset.event == "reset" and "job" not in reset.json
        job = await submit(app, "A")
        assert subject(await asyncio.wait_for(anext(stream), 10)) == ("job.queued", job["id"])

    client = sio()
    await client.connect(app.url("/"))
    await client.subscribe(channel="A", since=99999)
    [(name, body)] = await client.take(1)
    assert name == "reset" and "job" not in body


async def test_socketio_channel_subscriptions_replay_by_since_and_stay_apart(
    app: RunningApp, sio: Callable[[], SioClient]
) -> None:
    a1, _b1, a2 = await submit(app, "A"), await submit(app, "B"), await submit(app, "A")
    client = sio()
    await client.connect(app.url("/"))
    await client.subscribe(channel="A", since=0)
    replayed = await client.take(2)
    assert [(n, d["job"]["id"]) for n, d in replayed] == [("job", a1["id"]), ("job", a2["id"])]

    # Resumed after the first: the second, then live; another channel on the same connection.
    again = sio()
    await again.connect(app.url("/"))
    await again.subscribe(channel="A", since=replayed[0][1]["event_id"])
    await again.subscribe(channel="B")  # live only
    [(_name, second)] = await again.take(1)
    assert second["job"]["id"] == a2["id"]
    b2, a3 = await submit(app, "B"), await submit(app, "A")
    live = await again.take(2)
    assert sorted((d["job"]["channel"], d["job"]["id"]) for _n, d in live) == sorted(
        [("B", b2["id"]), ("A", a3["id"])]
    )
    [(_name, first_live)] = await client.take(1)
    assert first_live["job"]["id"] == a3["id"], "the A subscription got nothing of B"

    # Unsubscribing from A leaves B: the next A job is not sent, the next B job is.
    assert await again.call("unsubscribe", {"channel": "A"}) == {"ok": True}
    await submit(app, "A")
    b3 = await submit(app, "B")
    [(_name, only)] = await again.take(1)
    assert only["job"]["id"] == b3["id"]

    refused = await again.call("subscribe", {"channel": "A", "all": True})
    assert refused["ok"] is False and refused["error"]["status"] == 422
    refused = await again.call("subscribe", {"channel": "not a channel"})
    assert refused["ok"] is False and refused["error"]["errors"][0]["field"] == "channel"


# --- a slow channel subscriber ------------------------------------------------------------

QUEUE_LIMIT = 30  # above one round: a subscriber that keeps up holds at most one
PADDING = 15_000  # bytes of metadata per event, so a client that stops reading fills buffers
ROUNDS, PER_ROUND = 20, 20


def small_receive_buffer(addr_info: Any) -> socket.socket:
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


def channel_jobs(count: int, channel: str) -> list[NewJob]:
    return [
        NewJob(
            tenant="default",
            template="<p>x</p>",
            data={},
            options={},
            metadata={"padding": "x" * PADDING},
            max_attempts=1,
            channel=channel,
        )
        for _ in range(count)
    ]


async def test_a_slow_channel_subscriber_is_cut_off_and_holds_up_no_one(
    start_app: Callable[..., Any], pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("server.events.hub.SUBSCRIBER_QUEUE", QUEUE_LIMIT)
    app: RunningApp = await start_app(render_slots=0)
    slow_http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(socket_factory=small_receive_buffer)
    )
    try:
        slow = await slow_http.get(app.url("/v1/events?channel=A"))  # never read until the end
        assert slow.status == 200
        fast: dict[str, list[Message]] = {"A": [], "tenant": []}
        caught_up = {name: asyncio.Event() for name in fast}

        async def follow(name: str, resp: aiohttp.ClientResponse) -> None:
            async for message in messages(resp):
                fast[name].append(message)
                if len(fast[name]) % PER_ROUND == 0:
                    caught_up[name].set()

        # A stream subscribes before its headers are sent: once they arrive, it is live.
        opened = {
            "A": await app.http.get(app.url("/v1/events?channel=A")),
            "tenant": await app.http.get(app.url("/v1/events")),
        }
        followers = [asyncio.create_task(follow(name, resp)) for name, resp in opened.items()]
        hub: Hub = app.app[HUB]
        async with asyncio.timeout(30):
            for _ in range(ROUNDS):
                for event in caught_up.values():
                    event.clear()
                await jobs.create(pool, channel_jobs(PER_ROUND, "A"))
                for event in caught_up.values():
                    await event.wait()
        for task in followers:
            task.cancel()
        for resp in opened.values():
            resp.close()
        log, _ = await events.after(pool, events.START, limit=ROUNDS * PER_ROUND)
        for name in fast:
            assert [int(m.id or 0) for m in fast[name]] == [e.id for e in log], name
        assert hub.slow_dropped == 1

        # The slow one, reading at last: an in-order prefix, then why it was closed.
        seen: list[Message] = []
        async with asyncio.timeout(30):
            async for message in messages(slow):
                seen.append(message)
                if message.event == "closed":
                    break
        assert seen[-1].event == "closed"
        assert f"more than {QUEUE_LIMIT} events behind" in seen[-1].json["reason"]
        ids = [int(m.id or 0) for m in seen[:-1]]
        assert ids == [e.id for e in log][: len(ids)] and len(ids) < len(log)
        slow.close()
    finally:
        await slow_http.close()
