"""Socket.IO against a running app: the same events as SSE, resume by `since`, rooms across
processes through PostgreSQL, refusals, and a clean close at shutdown."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
import socketio

from server import events
from server.access import apikeys, signing
from server.queue import jobs
from server.queue.jobs import NewJob
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sio import SioClient
from tests.sse import collect

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


async def submit(app: RunningApp) -> dict[str, Any]:
    async with app.http.post(app.url("/v1/jobs"), json=SEED) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


def without_url(payload: dict[str, Any]) -> dict[str, Any]:
    """The event minus the signed URL, which carries its own expiry time."""
    job = {k: v for k, v in payload["job"].items() if k != "url"}
    return {**payload, "job": job}


def is_done(name: str, data: Any) -> bool:
    return name == "job" and data["type"] == "job.done"


@pytest.mark.parametrize("transport", ["websocket", "polling"])
async def test_job_subscription_gets_history_then_live_same_as_sse(
    api: RunningApp, fake_renderer: FakeRenderer, sio: Callable[[], SioClient], transport: str
) -> None:
    fake_renderer.gate = asyncio.Event()
    job = await submit(api)
    client = sio()
    await client.connect(api.url("/"), transports=[transport])
    await client.subscribe(job_id=job["id"])
    [(name, queued)] = await client.take(1)
    assert (name, queued["type"]) == ("job", "job.queued")  # history first
    await fake_renderer.started.wait()
    fake_renderer.gate.set()
    rest = await client.take_until(is_done)
    got = [queued] + [data for _name, data in rest]
    assert [e["type"] for e in got] == ["job.queued", "job.running", "job.done"]

    sse = await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"))
    assert [int(m.id or 0) for m in sse] == [e["event_id"] for e in got]
    assert [without_url(m.json) for m in sse] == [without_url(e) for e in got]
    done = got[-1]["job"]
    assert done["links"]["pdf"] == f"/v1/jobs/{job['id']}/pdf"
    async with api.http.get(done["url"]) as resp:
        assert resp.status == 200 and (await resp.read()).startswith(b"%PDF-")


async def test_all_jobs_resume_with_since_has_no_gap_and_no_duplicate(
    api: RunningApp, pool: asyncpg.Pool, sio: Callable[[], SioClient]
) -> None:
    start = await events.head(pool)
    first = sio()
    await first.connect(api.url("/"))
    await first.subscribe(all=True)
    for _ in range(3):
        await submit(api)
    part = await first.take(4)
    await first.close()
    last_seen = part[-1][1]["event_id"]

    # Jobs go on while the client is away; wait until all six are done (3 events each).
    for _ in range(3):
        await submit(api)
    everything = await collect(api.http, api.url("/v1/events?last_event_id=0"), count=18)
    assert [m.event for m in everything].count("job.done") == 6
    log, _ = await events.after(pool, start)

    second = sio()
    await second.connect(api.url("/"))
    await second.subscribe(all=True, since=last_seen)
    rest = await second.take(len(log) - 4)
    received = [data["event_id"] for _name, data in part + rest]
    assert received == [e.id for e in log], "every event once, in log order"
    assert all(name == "job" for name, _ in rest)


async def test_an_all_jobs_subscription_of_some_types_gets_only_those(
    api: RunningApp, sio: Callable[[], SioClient]
) -> None:
    first = await submit(api)
    await collect(api.http, api.url(f"/v1/jobs/{first['id']}/events"))  # done
    client = sio()
    await client.connect(api.url("/"))
    await client.subscribe(all=True, since=0, types=["job.done", "job.failed"])
    [(name, replayed)] = await client.take(1)
    assert (name, replayed["type"], replayed["job"]["id"]) == ("job", "job.done", first["id"])
    second = await submit(api)
    [(name, live)] = await client.take(1)  # its queued and running are not sent
    assert (name, live["type"], live["job"]["id"]) == ("job", "job.done", second["id"])
    everything = await collect(api.http, api.url("/v1/events?last_event_id=0"), count=6)
    assert [m.event for m in everything].count("job.done") == 2
    assert client.received.empty()
    # A job's subscription of some types: only those, and it still ends with the job.
    await client.subscribe(job_id=first["id"], types=["job.running"])
    [(name, running)] = await client.take(1)
    assert (running["type"], running["job"]["id"]) == ("job.running", first["id"])
    third = await submit(api)
    [(name, live)] = await client.take(1)  # the all-jobs stream goes on; the job's has ended
    assert (live["type"], live["job"]["id"]) == ("job.done", third["id"])


async def test_unsubscribe_stops_the_stream(api: RunningApp, sio: Callable[[], SioClient]) -> None:
    client = sio()
    await client.connect(api.url("/"))
    await client.subscribe(all=True)
    job = await submit(api)
    await client.take_until(lambda n, d: is_done(n, d) and d["job"]["id"] == job["id"])
    # The same object as the subscription, cursor and filter included.
    target = {"all": True, "since": 0, "types": ["job.done"]}
    assert await client.call("unsubscribe", target) == {"ok": True}
    other = await submit(api)
    # The SSE stream of the job ends on job.done: by then Socket.IO would have sent it too.
    await collect(api.http, api.url(f"/v1/jobs/{other['id']}/events"), until="job.done")
    assert client.received.empty()


async def test_subscribe_refusals_are_problems(
    api: RunningApp, pool: asyncpg.Pool, sio: Callable[[], SioClient]
) -> None:
    [foreign] = await jobs.create(
        pool,
        [NewJob(tenant="acme", template="x", data={}, options={}, metadata={}, max_attempts=1)],
    )
    client = sio()
    await client.connect(api.url("/"))
    for target in ({"job_id": str(uuid.uuid4())}, {"job_id": foreign["id"]}):
        ack = await client.call("subscribe", target)
        assert ack["ok"] is False
        assert ack["error"]["status"] == 404 and ack["error"]["title"] == "Not found"
    for bad, field in (
        ({"job_id": "nope"}, "job_id"),
        ({"all": True, "since": -1}, "since"),
        ({"all": True, "colour": "red"}, "colour"),
        ({"all": True, "types": ["job.finished"]}, "types"),
        ({"all": True, "types": "job.done"}, "types"),
        ({"all": True, "types": []}, "types"),
        ({}, ""),
        ("all", ""),
    ):
        ack = await client.call("subscribe", bad)
        assert ack["ok"] is False and ack["error"]["status"] == 422, ack
        assert field in [e["field"] for e in ack["error"]["errors"]], ack
    assert client.received.empty()


async def test_cursors_past_the_event_id_range_are_refused(
    api: RunningApp, sio: Callable[[], SioClient]
) -> None:
    client = sio()
    await client.connect(api.url("/"))
    # bigint ends at 2**63 - 1: past it PostgreSQL would refuse the cursor, not this check.
    for since in (2**63, str(2**63), 10**30, -(2**63) - 1):
        ack = await client.client.call("subscribe", {"all": True, "since": since}, timeout=5)
        assert ack["ok"] is False and ack["error"]["status"] == 422, (since, ack)
        assert [e["field"] for e in ack["error"]["errors"]] == ["since"], ack
    await client.subscribe(all=True, since=2**63 - 1)  # the last event id there can be


async def test_a_handler_that_fails_still_answers_once_and_says_nothing_internal(
    api: RunningApp,
    pool: asyncpg.Pool,
    sio: Callable[[], SioClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = await submit(api)
    # Done first, so that only the subscription meets the failure below.
    await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), until="job.done")
    client = sio()
    await client.connect(api.url("/"))
    ack = await client.client.call("unheard-of", {}, timeout=5)
    assert ack["ok"] is False and ack["error"]["status"] == 404, ack

    # A real failure nobody planned for: the table the subscription reads is gone.
    await pool.execute("ALTER TABLE jobs RENAME TO jobs_elsewhere")
    await pool.execute("ALTER TABLE api_keys RENAME TO api_keys_elsewhere")
    caplog.clear()
    ack = await client.client.call("subscribe", {"job_id": job["id"]}, timeout=5)
    assert ack == {
        "ok": False,
        "error": {
            "type": "https://pressroom.dev/problems/internal",
            "title": "Internal error",
            "status": 500,
            "detail": "The server failed; the error was logged.",
        },
    }
    failures = [
        r for r in caplog.records if r.name == "server.web.socket_wire" and r.levelname == "ERROR"
    ]
    assert [r.getMessage() for r in failures] == ["Socket.IO subscribe failed"]

    caplog.clear()
    refusals: list[Any] = []
    late = SioClient()
    late.client.on("connect_error", refusals.append)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await late.client.connect(
            api.url("/"),
            auth={"api_key": "prk_" + "x" * 40},
            transports=["websocket"],
            wait_timeout=5,
        )
    assert refusals == [
        {"message": "internal error", "data": {"status": 500, "detail": ack["error"]["detail"]}}
    ]
    failures = [
        r for r in caplog.records if r.name == "server.web.socket_wire" and r.levelname == "ERROR"
    ]
    assert [r.getMessage() for r in failures] == ["Socket.IO connect failed"]


async def test_a_stream_that_fails_is_closed_with_a_reason(
    api: RunningApp,
    pool: asyncpg.Pool,
    sio: Callable[[], SioClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = sio()
    await client.connect(api.url("/"))
    await pool.execute("ALTER TABLE job_events RENAME TO job_events_elsewhere")
    caplog.clear()
    await client.subscribe(all=True, since=0)  # accepted; the replay then fails
    [(name, data)] = await client.take(1)
    assert name == "closed" and data["reason"].startswith("internal error"), data
    failures = [
        r for r in caplog.records if r.name == "server.web.sockets" and r.levelname == "ERROR"
    ]
    assert [r.getMessage() for r in failures] == ["Socket.IO stream failed"]


async def test_forgotten_cursor_gets_reset_then_job_history(
    api: RunningApp, sio: Callable[[], SioClient]
) -> None:
    job = await submit(api)
    await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), until="job.done")
    client = sio()
    await client.connect(api.url("/"))
    await client.subscribe(job_id=job["id"], since=987654321)
    got = await client.take_until(is_done)
    assert got[0][0] == "reset" and got[0][1]["job"]["status"] == "done"
    assert [d["type"] for _n, d in got[1:]] == ["job.queued", "job.running", "job.done"]


async def test_malformed_credentials_are_refused(api: RunningApp) -> None:
    client = SioClient()
    refusals: list[Any] = []
    client.client.on("connect_error", refusals.append)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await client.connect(api.url("/"), auth="not-an-object")
    assert not client.client.connected
    assert refusals[0]["message"] == "unauthorized" and refusals[0]["data"]["status"] == 401


async def test_keys_and_tokens_decide_what_a_client_may_follow(
    start_app: Callable[..., Any], pool: asyncpg.Pool, sio: Callable[[], SioClient]
) -> None:
    row, key = await apikeys.create_key(pool, "acme")  # keyed mode from the start
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    async with app.http.post(
        app.url("/v1/jobs"), json=SEED, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        assert resp.status == 202
        job = await resp.json()

    for credentials in (None, {"api_key": "prk_unknown"}, {"token": "forged.token"}):
        with pytest.raises(socketio.exceptions.ConnectionError):
            await SioClient().connect(app.url("/"), auth=credentials)

    with_key = sio()
    await with_key.connect(app.url("/"), auth={"api_key": key})
    await with_key.subscribe(job_id=job["id"])
    got = await with_key.take_until(is_done)
    assert [d["type"] for _n, d in got] == ["job.queued", "job.running", "job.done"]

    secret = await pool.fetchval("SELECT token_secret FROM tenants WHERE name = 'acme'")
    token, _expires = signing.make_token(
        secret, "acme", signing.Scope(job_id=job["id"]), key_id=row.id, ttl_s=60
    )
    with_token = sio()
    await with_token.connect(app.url("/"), auth={"token": token})
    await with_token.subscribe(job_id=job["id"])
    for other in ({"all": True}, {"job_id": str(uuid.uuid4())}):
        ack = await with_token.call("subscribe", other)
        assert ack["ok"] is False and ack["error"]["status"] == 403


async def test_shutdown_tells_clients_why_and_closes(
    start_app: Callable[..., Any], sio: Callable[[], SioClient]
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    client = sio()
    await client.connect(app.url("/"))
    await client.subscribe(all=True)
    async with asyncio.timeout(10):
        await app.server.close()
    [(name, data)] = await client.take(1)
    assert name == "closed" and "resume by event id" in data["reason"]
    async with asyncio.timeout(10):
        await client.disconnected.wait()
