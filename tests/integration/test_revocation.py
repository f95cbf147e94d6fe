"""Revoking an API key closes what it opened: at once (within WITHIN_S), the SSE streams,
Socket.IO sessions and long-polls opened with the key or with a token it minted end, and its
tokens and download links are refused from then on. The revoke is only a write to the
database (the CLI's, or another connection's): every server hears it (NOTIFY pressroom_access)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import socketio
from aiohttp import ClientResponse, ClientSession

from server.access import apikeys
from server.events.hub import Hub, Subscription
from server.keys import HUB
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.processes import admin_cli
from tests.sio import SioClient
from tests.sse import Message, collect, messages

#: The revoke's commit to its effect on every server: a notification and one read, a few ms
#: on an idle machine; the bound allows for a busy one.
WITHIN_S = 1.0
SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def submit(app: RunningApp, key: str) -> dict[str, Any]:
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(key)) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def token_for(app: RunningApp, key: str) -> str:
    """A token for the tenant's all-jobs stream, minted with `key`."""
    async with app.http.post(app.url("/v1/tokens"), json={}, headers=bearer(key)) as resp:
        assert resp.status == 200, await resp.text()
        token: str = (await resp.json())["token"]
        return token


async def since_revoked_s(pool: asyncpg.Pool, key_id: int) -> float:
    """Seconds from the revoke's commit (as the database saw it) to now."""
    elapsed: float = await pool.fetchval(
        "SELECT extract(epoch FROM clock_timestamp() - revoked_at)::float8"
        " FROM api_keys WHERE id = $1",
        key_id,
    )
    return elapsed


async def revoked_before_s(pool: asyncpg.Pool, key_id: int, moment: float) -> float:
    """Seconds from the revoke's commit (as the database saw it) to `moment` (a time.time())."""
    elapsed: float = await pool.fetchval(
        "SELECT $2 - extract(epoch FROM revoked_at)::float8 FROM api_keys WHERE id = $1",
        key_id,
        moment,
    )
    return elapsed


async def until_end(stream: ClientResponse) -> tuple[list[Message], float]:
    """A stream's messages until it ends, and when it ended (time.time())."""
    got = [message async for message in messages(stream)]
    return got, time.time()


async def status_of(session: ClientSession, url: str, **kwargs: Any) -> int:
    async with session.get(url, **kwargs) as resp:
        return resp.status


async def test_sse_streams_of_a_revoked_key_get_closed_and_its_tokens_and_links_401(
    start_app: Callable[..., Any], pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    leaked, key = await apikeys.create_key(pool, "acme", "leaked")
    _kept, kept = await apikeys.create_key(pool, "acme", "kept")
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    other: RunningApp = await start_app(render_slots=0)  # one more server
    job = await submit(app, key)
    job_stream = job["links"]["events"]  # with a token for this job, minted by `key`
    [*_, final] = await collect(app.http, app.url(job_stream), until="job.done")
    link = final.json["job"]["url"]  # minted for `key`
    async with app.http.get(app.url(f"/v1/jobs/{job['id']}"), headers=bearer(kept)) as resp:
        kept_link = (await resp.json())["url"]
    token = await token_for(app, key)

    async with ClientSession() as browser, asyncio.timeout(30):
        opened: list[ClientResponse] = []
        for server, url, headers in (
            (app, "/v1/events", bearer(key)),
            (app, f"/v1/events?token={token}", {}),
            (other, "/v1/events", bearer(key)),
            (other, f"/v1/events?token={token}", {}),
            (app, "/v1/events", bearer(kept)),
        ):
            opened.append(await browser.get(server.url(url), headers=headers))
            assert opened[-1].status == 200
        *revoked_streams, kept_stream = opened
        assert await status_of(browser, link) == 200

        # Read while the CLI runs, so that each end is timed as it arrives and not after the
        # CLI's process has exited (which a busy machine can make take longer than the cache).
        endings = [asyncio.create_task(until_end(stream)) for stream in revoked_streams]
        code, _out, err = await admin_cli(dsn, tmp_path / "cli", "keys", "revoke", str(leaked.id))
        assert code == 0, err
        ended = await asyncio.gather(*endings)
        for stream, (got, ended_at) in zip(revoked_streams, ended, strict=True):
            assert [message.event for message in got] == ["closed"]
            assert "revoked" in got[0].json["reason"]
            assert await revoked_before_s(pool, leaked.id, ended_at) <= WITHIN_S
            stream.release()

        # Refused from then on: the key, its tokens (all-jobs and the job's), its link.
        for server in (app, other):
            for url, headers in (
                ("/v1/events", bearer(key)),
                (f"/v1/events?token={token}", {}),
                (job_stream, {}),
            ):
                async with browser.get(server.url(url), headers=headers) as resp:
                    assert resp.status == 401, url
                    assert resp.content_type == "application/problem+json"
        async with browser.get(link) as resp:
            assert resp.status == 401
            assert "revoked" in (await resp.json())["detail"]
        assert await status_of(browser, kept_link) == 200

        # The tenant's other key is untouched: its stream still carries events.
        kept_job = await submit(app, kept)
        async for message in messages(kept_stream):
            assert message.event == "job.queued" and message.json["job"]["id"] == kept_job["id"]
            break
        kept_stream.release()


async def test_socketio_sessions_of_a_revoked_key_get_closed_and_disconnected(
    start_app: Callable[..., Any], pool: asyncpg.Pool, sio: Callable[[], SioClient]
) -> None:
    leaked, key = await apikeys.create_key(pool, "acme", "leaked")
    _kept, kept = await apikeys.create_key(pool, "acme", "kept")
    app: RunningApp = await start_app(render_slots=0)
    token = await token_for(app, key)
    with_key, with_token, with_kept = sio(), sio(), sio()
    await with_key.connect(app.url("/"), auth={"api_key": key})
    await with_key.subscribe(all=True)
    await with_token.connect(app.url("/"), auth={"token": token})  # connected, no subscription
    await with_kept.connect(app.url("/"), auth={"api_key": kept})
    await with_kept.subscribe(all=True)

    await apikeys.revoke_key(pool, leaked.id)
    for client in (with_key, with_token):
        [(name, data)] = await client.take(1)
        assert name == "closed" and "revoked" in data["reason"]
        async with asyncio.timeout(10):
            await client.disconnected.wait()
    assert await since_revoked_s(pool, leaked.id) <= WITHIN_S

    for credentials in ({"api_key": key}, {"token": token}):
        refused = sio()
        with pytest.raises(socketio.exceptions.ConnectionError):
            await refused.connect(app.url("/"), auth=credentials)

    kept_job = await submit(app, kept)
    [(name, data)] = await with_kept.take(1)
    assert (name, data["type"], data["job"]["id"]) == ("job", "job.queued", kept_job["id"])
    assert with_kept.client.connected


async def test_long_polls_of_a_revoked_key_are_answered_401(
    start_app: Callable[..., Any], pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaked, key = await apikeys.create_key(pool, "acme", "leaked")
    _kept_row, kept = await apikeys.create_key(pool, "acme", "kept")
    app: RunningApp = await start_app(render_slots=0)  # jobs stay queued
    job = await submit(app, key)
    token = await token_for(app, key)
    url = app.url(f"/v1/jobs/{job['id']}")
    async with app.http.get(url, headers=bearer(key)) as resp:
        etag = resp.headers["ETag"]

    # A long-poll subscribes to the job's events before it waits: count them as they do.
    hub = app.app[HUB]
    waiting: asyncio.Queue[str] = asyncio.Queue()

    def subscribe(**kwargs: Any) -> Subscription:
        waiting.put_nowait(kwargs["transport"])
        return Hub.subscribe(hub, **kwargs)

    monkeypatch.setattr(hub, "subscribe", subscribe)

    async def poll(credential: str) -> tuple[int, str, Any]:
        headers = {**bearer(credential), "If-None-Match": etag}
        async with app.http.get(url, params={"wait": "30"}, headers=headers) as resp:
            return resp.status, resp.content_type, await resp.json()

    async with asyncio.timeout(20):
        revoked_poll = asyncio.create_task(poll(key))
        kept_poll = asyncio.create_task(poll(kept))
        assert [await waiting.get(), await waiting.get()] == ["longpoll", "longpoll"]
        await apikeys.revoke_key(pool, leaked.id)
        status, content_type, body = await revoked_poll
        assert await since_revoked_s(pool, leaked.id) <= WITHIN_S
        assert (status, content_type) == (401, "application/problem+json")
        assert "revoked" in body["detail"]

        assert not kept_poll.done(), "the other key's long-poll still waits"
        async with app.http.post(f"{url}/cancel", headers=bearer(kept)) as resp:
            assert resp.status == 200
        status, _type, body = await kept_poll
        assert (status, body["status"]) == (200, "cancelled")

    # Refused from then on, with the key and with a token it minted (tokens never open REST).
    for params in ({}, {"token": token}):
        headers = bearer(key) if not params else {}
        async with app.http.get(url, params={"wait": "1", **params}, headers=headers) as resp:
            assert resp.status == 401
