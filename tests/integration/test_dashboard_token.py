"""The dashboard token: exchanged once for an API key (POST /v1/tokens {"scope": "dashboard"}),
it calls the API as that key would (as `Authorization: Bearer`) and opens the tenant's streams;
it is renewed with itself up to PRESSROOM_DASHBOARD_SESSION_S after the exchange, ends at its
expiry and with its key; a subscription token still calls no API route, and no backend can
mint a dashboard token with the tenant's token secret."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from server.access import apikeys, signing
from server.keys import SETTINGS
from tests.conftest import RunningApp
from tests.integration.test_tokens import backend_token
from tests.sse import messages
from tests.tenants import SEED, Tenant, bearer, made

TTL_S = 120
SESSION_S = 3600


@pytest.fixture
async def app(start_app: Callable[..., Any]) -> RunningApp:
    """Keyed mode (the tests make keys first), no worker: jobs stay queued."""
    running: RunningApp = await start_app(
        render_slots=0, dashboard_token_ttl_s=TTL_S, dashboard_session_s=SESSION_S
    )
    return running


async def exchange(app: RunningApp, credential: str, **body: Any) -> tuple[int, dict[str, Any]]:
    async with app.http.post(
        app.url("/v1/tokens"), json={"scope": "dashboard", **body}, headers=bearer(credential)
    ) as resp:
        answer: dict[str, Any] = await resp.json()
        return resp.status, answer


async def call(app: RunningApp, method: str, path: str, token: str, **kwargs: Any) -> Any:
    async with app.http.request(method, app.url(path), headers=bearer(token), **kwargs) as resp:
        body = await resp.json()
        return resp.status, body


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def crafted(app: RunningApp, tenant: Tenant, key_id: int, *, since: int, ttl_s: int) -> str:
    """A dashboard token as Pressroom signs one, with a chosen start of its session."""
    secret = signing.dashboard_secret(app.app[SETTINGS].secret, tenant.secret)
    token, _ = signing.make_token(
        secret, tenant.name, signing.DASHBOARD_SCOPE, ttl_s=ttl_s, key_id=key_id, since=since
    )
    return token


async def tenant_with_id(app: RunningApp, pool: asyncpg.Pool, name: str) -> tuple[Tenant, int]:
    tenant = Tenant(app, name, *await made(pool, name))
    [row] = [k for k in await apikeys.list_keys(pool) if k.tenant == name]
    return tenant, row.id


async def test_the_key_is_exchanged_once_and_the_token_calls_every_dashboard_route(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    acme = Tenant(app, "acme", *await made(pool, "acme"))
    queued = await acme.submit()
    before = time.time()
    code, answer = await exchange(app, acme.key)
    assert code == 200, answer
    token = answer["token"]
    assert before + TTL_S - 2 <= at(answer["expires_at"]) <= time.time() + TTL_S + 1
    assert before + SESSION_S - 2 <= at(answer["renewable_until"]) <= time.time() + SESSION_S + 1

    # The list, counts, a story, a submit, cancel and retry, templates, assets, batches, stats.
    for method, path, kwargs, expected in (
        ("GET", "/v1/jobs", {}, 200),
        ("GET", "/v1/jobs/counts", {}, 200),
        ("GET", f"/v1/jobs/{queued}/story", {}, 200),
        ("POST", "/v1/jobs", {"json": SEED}, 202),
        ("POST", f"/v1/jobs/{queued}/cancel", {}, 200),
        ("POST", f"/v1/jobs/{queued}/retry", {}, 409),  # cancelled, not failed: but let in
        ("POST", "/v1/jobs/retry", {"json": {"dry_run": True}}, 200),
        ("GET", "/v1/templates", {}, 200),
        ("GET", "/v1/assets", {}, 200),
        ("GET", "/v1/batches", {}, 200),
        ("GET", "/v1/stats", {}, 200),
    ):
        status, body = await call(app, method, path, token, **kwargs)
        assert status == expected, (method, path, body)
    status, listed = await call(app, "GET", "/v1/jobs", token)
    assert len(listed["items"]) == 2  # acme's jobs, as its key sees them

    # The tenant's stream, with the dashboard token itself as ?token=.
    async with app.http.get(app.url("/v1/events"), params={"token": token}) as stream:
        assert stream.status == 200 and stream.content_type == "text/event-stream"
        submitted = await acme.submit()
        async with asyncio.timeout(10):
            async for message in messages(stream):
                if message.event == "job.queued":
                    assert message.json["job"]["id"] == submitted
                    break

    # A subscription token it asks for lasts no longer than itself.
    status, sub = await call(app, "POST", "/v1/tokens", token, json={"ttl_s": 3600})
    assert status == 200
    assert at(sub["expires_at"]) <= at(answer["expires_at"]) + 1


async def test_renewal_keeps_the_session_and_stops_at_its_absolute_lifetime(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    acme, key_id = await tenant_with_id(app, pool, "acme")
    _, first = await exchange(app, acme.key)
    code, renewed = await exchange(app, first["token"])
    assert code == 200, renewed
    assert renewed["renewable_until"] == first["renewable_until"]  # the same session
    assert (await call(app, "GET", "/v1/jobs", renewed["token"]))[0] == 200

    # Near the session's end, a renewal lasts until the end only.
    now = int(time.time())
    late = crafted(app, acme, key_id, since=now - SESSION_S + 30, ttl_s=60)
    code, last = await exchange(app, late)
    assert code == 200, last
    assert at(last["expires_at"]) == at(last["renewable_until"]) == now + 30
    # Past it, no renewal: the key must be given again (and works at once).
    ended = crafted(app, acme, key_id, since=now - SESSION_S - 1, ttl_s=60)
    assert (await call(app, "GET", "/v1/jobs", ended))[0] == 200  # still valid itself
    code, refused = await exchange(app, ended)
    assert code == 401 and "session has ended" in refused["detail"]
    assert (await exchange(app, acme.key))[0] == 200


async def test_an_expired_token_is_401_and_a_revoked_key_ends_its_tokens(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    acme, key_id = await tenant_with_id(app, pool, "acme")
    expired = crafted(app, acme, key_id, since=int(time.time()) - 100, ttl_s=-1)
    status, body = await call(app, "GET", "/v1/jobs", expired)
    assert status == 401 and "expired" in body["detail"]
    assert (await exchange(app, expired))[0] == 401  # nor renewed

    _, answer = await exchange(app, acme.key)
    token = answer["token"]
    assert (await call(app, "GET", "/v1/jobs", token))[0] == 200
    await apikeys.create_key(pool, "acme", "kept")  # keyed mode stays when one is revoked
    async with app.http.get(app.url("/v1/events"), params={"token": token}) as stream:
        assert stream.status == 200
        await apikeys.revoke_key(pool, key_id)
        # The stream it opened is closed once the app has heard of the revoke.
        async with asyncio.timeout(10):
            got = [message.event async for message in messages(stream)]
        assert got == ["closed"]
    status, body = await call(app, "GET", "/v1/jobs", token)
    assert "revoked" in body["detail"]
    assert (await exchange(app, token))[0] == 401


async def test_a_subscription_token_still_calls_no_api_and_no_backend_mints_a_dashboard_token(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    acme, key_id = await tenant_with_id(app, pool, "acme")
    subscription = (await acme.mint())["token"]
    for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/stats"), ("POST", "/v1/tokens")):
        status, body = await call(app, method, path, subscription, json={})
        assert status == 401, (path, body)
        assert "opens streams only" in body["detail"]
    assert (await exchange(app, subscription))[0] == 401

    # Signed with the tenant's token secret (what its backend holds): not a dashboard token.
    now = int(time.time())
    claim = {"scope": "dashboard", "key": key_id, "since": now}
    forged = backend_token(acme.secret, "acme", claim)
    status, body = await call(app, "GET", "/v1/jobs", forged)
    assert status == 401 and "invalid" in body["detail"]
    async with app.http.get(app.url("/v1/events"), params={"token": forged}) as resp:
        assert resp.status == 401

    # Another tenant's dashboard token sees none of acme's jobs.
    job = await acme.submit()
    other = Tenant(app, "other", *await made(pool, "other"))
    _, theirs = await exchange(app, other.key)
    assert (await call(app, "GET", f"/v1/jobs/{job}/story", theirs["token"]))[0] == 404

    # A dashboard token opens the whole tenant: no job or channel with it.
    code, refused = await exchange(app, acme.key, channel="A")
    assert code == 422, refused


async def test_a_dev_mode_token_ends_when_keys_are_required(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    dev: RunningApp = await start_app(render_slots=0)
    async with dev.http.post(dev.url("/v1/tokens"), json={"scope": "dashboard"}) as resp:
        body = await resp.json()
        assert resp.status == 200, body
    token = body["token"]
    async with dev.http.get(dev.url("/v1/events"), params={"token": token}) as stream:
        assert stream.status == 200
        await made(pool, "acme")  # the first key: the server runs open no more
        async with asyncio.timeout(10):
            got = [message.event async for message in messages(stream)]
        assert got == ["closed"]
    status, refused = await call(dev, "GET", "/v1/jobs", token)
    assert status == 401, refused
