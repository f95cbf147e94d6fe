"""The rules a reconnecting client meets: a final job's stream reopened at its end answers 204
(EventSource stops reconnecting), a cursor this server never gave out gets a reset of its own,
a token's stream ends when the token does (Socket.IO can renew it in place), and the long-poll
of the event stream misses nothing between polls."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from server.keys import HUB
from tests.conftest import RunningApp
from tests.sio import SioClient
from tests.sse import Message, collect, messages

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}
NEVER_GIVEN = 10**12


async def submit(api: RunningApp, **extra: Any) -> dict[str, Any]:
    async with api.http.post(api.url("/v1/jobs"), json={**SEED, **extra}) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def whole_stream(api: RunningApp, job_id: str, **headers: str) -> list[Message]:
    """The job's stream from its first event to the server's end of it."""
    return await collect(api.http, api.url(f"/v1/jobs/{job_id}/events"), headers=headers)


async def token(api: RunningApp, ttl_s: int, **scope: Any) -> str:
    async with api.http.post(api.url("/v1/tokens"), json={"ttl_s": ttl_s, **scope}) as resp:
        assert resp.status == 200, await resp.text()
        minted: str = (await resp.json())["token"]
        return minted


async def test_a_final_jobs_stream_reopened_at_its_end_answers_204(api: RunningApp) -> None:
    job = await submit(api)
    got = await whole_stream(api, job["id"])
    assert [m.event for m in got] == ["job.queued", "job.running", "job.done"]
    final_id = got[-1].id or ""

    # As EventSource reconnects (header) and as a new EventSource resumes (query).
    url = api.url(f"/v1/jobs/{job['id']}/events")
    for resumed in (
        {"headers": {"Last-Event-ID": final_id}},
        {"params": {"last_event_id": final_id}},
    ):
        async with api.http.get(url, **resumed) as resp:  # type: ignore[arg-type]
            assert resp.status == 204, await resp.text()
            assert await resp.read() == b""
    assert api.app[HUB].subscriber_count == 0, "a 204 holds nothing"

    # A cursor before the end still gets what follows it, then the end.
    rest = await whole_stream(api, job["id"], **{"Last-Event-ID": got[0].id or ""})
    assert [m.event for m in rest] == ["job.running", "job.done"]
    # Without a cursor, the job's history, then the end (not a 204).
    assert [m.event for m in await whole_stream(api, job["id"])] == [m.event for m in got]


async def test_a_retried_jobs_stream_resumed_at_its_old_end_goes_on(api: RunningApp) -> None:
    failing = await submit(api, template="{{ missing.attribute }}", data={})
    got = await whole_stream(api, failing["id"])
    assert got[-1].event == "job.failed"
    async with api.http.post(api.url(f"/v1/jobs/{failing['id']}/retry")) as resp:
        assert resp.status == 202, await resp.text()
    # The failed event is no longer the job's last: resuming from it is news, not a 204.
    rest = await whole_stream(api, failing["id"], **{"Last-Event-ID": got[-1].id or ""})
    assert next(m.event for m in rest) == "job.queued"
    assert rest[-1].event == "job.failed"


async def test_a_cursor_never_given_out_gets_its_own_reset_on_every_transport(
    api: RunningApp, sio: Any, pool: asyncpg.Pool
) -> None:
    job = await submit(api)
    await whole_stream(api, job["id"])
    never = str(NEVER_GIVEN)

    [reset] = await collect(
        api.http, api.url(f"/v1/jobs/{job['id']}/events"), headers={"Last-Event-ID": never}, count=1
    )
    assert reset.event == "reset" and reset.json["code"] == "unknown_cursor"
    assert "has not given out" in reset.json["reason"] and reset.json["job"]["id"] == job["id"]
    [reset] = await collect(
        api.http, api.url("/v1/events"), headers={"Last-Event-ID": never}, count=1
    )
    assert reset.json["code"] == "unknown_cursor" and "job" not in reset.json

    client: SioClient = sio()
    await client.connect(api.url("/"))
    await client.subscribe(all=True, since=NEVER_GIVEN)
    [(name, body)] = await client.take(1)
    assert name == "reset" and body["code"] == "unknown_cursor"

    params = {"wait": "5", "since": never}
    async with api.http.get(api.url(f"/v1/jobs/{job['id']}"), params=params) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["reset"]["code"] == "unknown_cursor"
    async with api.http.get(
        api.url("/v1/events"), params={"wait": "5", "last_event_id": never}
    ) as resp:
        poll = await resp.json()
        assert poll["events"][0]["code"] == "unknown_cursor"

    # A pruned cursor is still called one.
    await pool.execute("DELETE FROM job_events")
    [reset] = await collect(
        api.http, api.url("/v1/events"), headers={"Last-Event-ID": "1"}, count=1
    )
    assert reset.json["code"] == "pruned" and "no longer kept" in reset.json["reason"]


async def test_the_event_long_poll_misses_nothing_between_polls(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    url = api.url("/v1/events")
    async with api.http.get(url, params={"wait": "0"}) as resp:
        assert resp.status == 200
        first = await resp.json()
    assert first["events"] == []

    cursor, seen = first["last_event_id"], []
    jobs = [await submit(api) for _ in range(3)]  # submitted while no poll is open
    while len([e for e in seen if e["type"] == "job.done"]) < len(jobs):
        async with api.http.get(url, params={"wait": "10", "last_event_id": str(cursor)}) as resp:
            assert resp.status == 200, await resp.text()
            poll = await resp.json()
        assert poll["events"], "a wait of 10 s with jobs running answers with their events"
        seen.extend(poll["events"])
        cursor = poll["last_event_id"]
    ids = [e["event_id"] for e in seen]
    assert len(ids) == len(set(ids)), "each once"
    in_log = await pool.fetch("SELECT id FROM job_events ORDER BY xid::text::bigint, id")
    assert ids == [row["id"] for row in in_log], "every event, in log order"
    assert seen[-1]["event_id"] == cursor

    async with api.http.get(url, params={"wait": "a minute"}) as resp:
        assert resp.status == 422
        assert resp.content_type == "application/problem+json"


async def test_an_sse_stream_closes_when_its_token_expires(api: RunningApp) -> None:
    short = await token(api, ttl_s=2)
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(15), api.http.get(api.url(f"/v1/events?token={short}")) as resp:
        assert resp.status == 200
        got = [message async for message in messages(resp)]
    assert [m.event for m in got] == ["closed"]
    assert got[0].json["code"] == "token_expired"
    assert asyncio.get_running_loop().time() - started >= 1.0, "not before the token's end"
    assert api.app[HUB].subscriber_count == 0


async def test_socketio_renews_its_token_in_place_and_closes_an_expired_one(
    api: RunningApp, sio: Any
) -> None:
    renewed: SioClient = sio()
    await renewed.connect(api.url("/"), auth={"token": await token(api, ttl_s=3)})
    await renewed.subscribe(all=True)
    first = await submit(api)
    before = await renewed.take_until(lambda n, d: n == "job" and d["type"] == "job.done")

    ack = await renewed.call("refresh", {"token": await token(api, ttl_s=60)})
    assert ack["ok"] is True and "expires_at" in ack
    other = await renewed.call("refresh", {"token": await token(api, ttl_s=60, job_id=first["id"])})
    assert other["ok"] is False and other["error"]["status"] == 403
    bad = await renewed.call("refresh", {"token": "not a token"})
    assert bad["ok"] is False and bad["error"]["status"] == 401
    assert (await renewed.call("refresh", {}))["error"]["status"] == 422

    expiring: SioClient = sio()
    await expiring.connect(api.url("/"), auth={"token": await token(api, ttl_s=3)})
    await expiring.subscribe(all=True)
    _name, body = (await expiring.take_until(lambda n, d: n == "closed"))[-1]
    assert body["code"] == "token_expired"
    async with asyncio.timeout(10):
        await expiring.disconnected.wait()

    # Past the first token's end, the renewed connection goes on, its cursor kept.
    assert renewed.client.connected
    second = await submit(api)
    after = await renewed.take_until(
        lambda n, d: n == "job" and d["type"] == "job.done" and d["job"]["id"] == second["id"]
    )
    ids = [d["event_id"] for n, d in before + after if n == "job"]
    assert len(ids) == len(set(ids)), "no event twice across the renewal"
    assert {d["job"]["id"] for n, d in after if n == "job"} == {second["id"]}
