"""Subscription tokens as standard JWTs signed with the tenant's token secret: minted by
POST /v1/tokens or by the tenant's own backend (PyJWT), each opens its scope only (the
tenant, one job, one channel) on SSE, Socket.IO and the long-poll alike (403 otherwise); an
expired or altered one, one signed with another tenant's secret, and one signed with a
secret since rotated are 401, and the streams they opened are closed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import pytest
import socketio
from aiohttp import ClientSession
from yarl import URL

from server.cli import admin, tenant_settings
from server.settings import Settings
from tests.conftest import RunningApp
from tests.processes import admin_cli
from tests.sio import SioClient
from tests.sse import messages
from tests.tenants import SEED, Tenant, bearer, made


def backend_token(secret: str, tenant: str, scope: dict[str, Any], ttl_s: int = 600) -> str:
    """What a tenant's backend does to mint a token, with PyJWT alone (as the README shows)."""
    now = int(time.time())
    claims = {"sub": tenant, "iat": now, "exp": now + ttl_s, "pressroom": scope}
    return jwt.encode(claims, secret, algorithm="HS256")


async def new_tenant(app: RunningApp, pool: asyncpg.Pool, name: str) -> Tenant:
    return Tenant(app, name, *await made(pool, name))


async def status(browser: ClientSession, url: str, token: str) -> int:
    async with browser.get(url, params={"token": token}) as resp:
        if resp.status == 200 and resp.content_type == "text/event-stream":
            return 200  # a stream: it opened, which is all that is asked here
        await resp.read()
        return resp.status


async def sio_refusal(app: RunningApp, token: str) -> dict[str, Any]:
    """The connect_error of a Socket.IO connection made with `token`."""
    client = SioClient()
    refusals: list[Any] = []
    client.client.on("connect_error", refusals.append)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await client.connect(app.url("/"), auth={"token": token})
    refusal: dict[str, Any] = refusals[0]
    return refusal


@pytest.fixture
async def app(start_app: Callable[..., Any]) -> RunningApp:
    """Keyed mode (the tests make keys first), no worker: jobs stay queued, events are known;
    the cache off, so that a rotation counts for the very next request."""
    running: RunningApp = await start_app(render_slots=0)
    return running


async def test_a_token_opens_its_scope_only_on_every_transport(
    app: RunningApp, pool: asyncpg.Pool, sio: Callable[[], SioClient]
) -> None:
    acme = await new_tenant(app, pool, "acme")
    in_a, in_b, plain = await acme.submit("A"), await acme.submit("B"), await acme.submit()
    job_token = (await acme.mint(job_id=in_a))["token"]
    tokens = {
        "channel A (POST /v1/tokens)": (await acme.mint(channel="A"))["token"],
        "channel A (the backend's)": backend_token(
            acme.secret, "acme", {"scope": "channel", "channel": "A"}
        ),
        "job in A": job_token,
        "tenant": (await acme.mint())["token"],
    }
    nowhere = str(uuid.uuid4())
    streams = {
        "tenant stream": "/v1/events",
        "channel A": "/v1/events?channel=A",
        "channel B": "/v1/events?channel=B",
        "job in A": f"/v1/jobs/{in_a}/events",
        "job in B": f"/v1/jobs/{in_b}/events",
        "job without channel": f"/v1/jobs/{plain}/events",
        "long-poll of job in A": f"/v1/jobs/{in_a}?wait=0",
        "long-poll of job in B": f"/v1/jobs/{in_b}?wait=0",
        "no such job": f"/v1/jobs/{nowhere}/events",
        "long-poll of no such job": f"/v1/jobs/{nowhere}",
    }
    opens = {
        "channel A": {"channel A", "job in A", "long-poll of job in A"},
        "job in A": {"job in A", "long-poll of job in A"},
        "tenant": set(streams) - {"no such job", "long-poll of no such job"},
    }
    async with ClientSession() as browser:  # no key: the token alone
        for name, token in tokens.items():
            allowed = opens[name.split(" (")[0]]
            for target, path in streams.items():
                got = await status(browser, app.url(path), token)
                expected = 200 if target in allowed else 403
                if name == "tenant" and target not in allowed:
                    expected = 404  # the tenant's token sees that there is no such job
                assert got == expected, (name, target, got)

        # A channel token's replay is that channel's events, and its 403 says what it opens.
        channel_token = tokens["channel A (the backend's)"]
        async with browser.get(
            app.url("/v1/events?channel=A&last_event_id=0"), params={"token": channel_token}
        ) as resp:
            first = await asyncio.wait_for(anext(messages(resp)), 10)
            assert first.json["job"]["id"] == in_a
        async with browser.get(app.url("/v1/events"), params={"token": channel_token}) as resp:
            assert resp.status == 403 and "channel 'A'" in (await resp.json())["detail"]

    # Socket.IO: the same rules for the same tokens.
    targets: dict[str, dict[str, Any]] = {
        "tenant stream": {"all": True},
        "channel A": {"channel": "A", "since": 0},
        "channel B": {"channel": "B"},
        "job in A": {"job_id": in_a},
        "job in B": {"job_id": in_b},
        "job without channel": {"job_id": plain},
    }
    for name, token in tokens.items():
        client = sio()
        await client.connect(app.url("/"), auth={"token": token})
        allowed = opens[name.split(" (")[0]]
        for target, subscription in targets.items():
            ack = await client.call("subscribe", subscription)
            if target in allowed:
                assert ack == {"ok": True}, (name, target, ack)
            else:
                assert ack["ok"] is False and ack["error"]["status"] == 403, (name, target, ack)
        if "channel A" in allowed:
            got = await client.take_until(lambda n, d: n == "job" and d["job"]["id"] == in_a)
            assert all(d["job"]["channel"] == "A" for n, d in got if n == "job")


async def test_tokens_are_checked_against_the_tenants_own_secret_and_expire(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    acme, bob = await new_tenant(app, pool, "acme"), await new_tenant(app, pool, "bob")
    await acme.submit("A")
    tenant_scope = {"scope": "tenant"}
    good = backend_token(acme.secret, "acme", tenant_scope)
    refused = {
        "signed with another tenant's secret": backend_token(bob.secret, "acme", tenant_scope),
        "claiming another tenant": backend_token(acme.secret, "bob", tenant_scope),
        "expired": backend_token(acme.secret, "acme", tenant_scope, ttl_s=-1),
        "altered": good[:-3] + ("AAA" if not good.endswith("AAA") else "BBB"),
        "alg none": jwt.encode(jwt.decode(good, acme.secret, ["HS256"]), None, "none"),
        "scope missing": backend_token(acme.secret, "acme", {}),
        "an unknown tenant": backend_token(acme.secret, "nobody", tenant_scope),
    }
    async with ClientSession() as browser:
        assert await status(browser, app.url("/v1/events"), good) == 200
        for what, token in refused.items():
            for path in ("/v1/events", "/v1/events?channel=A"):
                async with browser.get(app.url(path), params={"token": token}) as resp:
                    assert resp.status == 401, (what, path)
                    assert 'error="invalid_token"' in resp.headers["WWW-Authenticate"]
            refusal = await sio_refusal(app, token)
            assert refusal["data"]["status"] == 401, what
    # Bob's own token opens bob's streams, and acme's jobs are unknown to it.
    async with ClientSession() as browser:
        bobs = backend_token(bob.secret, "bob", tenant_scope)
        assert await status(browser, app.url("/v1/events"), bobs) == 200
        acmes_job = await acme.submit()
        assert await status(browser, app.url(f"/v1/jobs/{acmes_job}"), bobs) == 404

    # POST /v1/tokens: ttl_s within PRESSROOM_TOKEN_TTL_S, one scope at a time.
    short = await acme.mint(channel="A", ttl_s=30)
    claims = jwt.decode(short["token"], acme.secret, ["HS256"])
    assert claims["exp"] - claims["iat"] == 30 and claims["sub"] == "acme"
    assert claims["pressroom"]["scope"] == "channel" and claims["pressroom"]["channel"] == "A"
    longest = await acme.mint(ttl_s=10**9)  # bounded by PRESSROOM_TOKEN_TTL_S (3600)
    claims = jwt.decode(longest["token"], acme.secret, ["HS256"])
    assert claims["exp"] - claims["iat"] == 3600
    for body, field in (
        ({"ttl_s": 0}, "ttl_s"),
        ({"channel": "A", "job_id": str(uuid.uuid4())}, ""),
        ({"channel": "not a channel"}, "channel"),
    ):
        async with app.http.post(
            app.url("/v1/tokens"), json=body, headers=bearer(acme.key)
        ) as resp:
            assert resp.status == 422, body
            assert field in [e["field"] for e in (await resp.json())["errors"]], body

    # links.events of a new job is a JWT for that job, signed with the tenant's secret.
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(acme.key)) as resp:
        job = await resp.json()
    link = URL(job["links"]["events"])
    claims = jwt.decode(link.query["token"], acme.secret, ["HS256"])
    assert claims["pressroom"]["scope"] == "job" and claims["pressroom"]["job_id"] == job["id"]


async def test_rotating_the_secret_refuses_its_tokens_and_closes_their_streams(
    app: RunningApp, pool: asyncpg.Pool, dsn: str, tmp_path: Path, sio: Callable[[], SioClient]
) -> None:
    acme = await new_tenant(app, pool, "acme")
    other = await new_tenant(app, pool, "other")
    old = backend_token(acme.secret, "acme", {"scope": "channel", "channel": "A"})
    minted = (await acme.mint(channel="A"))["token"]  # signed with the same secret
    others = backend_token(other.secret, "other", {"scope": "tenant"})
    async with ClientSession() as browser:
        opened = [
            await browser.get(app.url("/v1/events?channel=A"), params={"token": token})
            for token in (old, minted, others)
        ]
        assert [resp.status for resp in opened] == [200, 200, 200]
        on_sio = sio()
        await on_sio.connect(app.url("/"), auth={"token": old})
        await on_sio.subscribe(channel="A")

        code, out, err = await admin_cli(
            dsn, tmp_path / "cli", "tenants", "secret", "acme", "--rotate"
        )
        assert code == 0 and "rotated" in err, err
        rotated = out.strip()
        assert out == rotated + "\n" and rotated.startswith("prts_") and rotated != acme.secret

        # The streams of acme's old tokens are closed, with why; the other tenant's carries on.
        for resp in opened[:2]:
            async with asyncio.timeout(10):
                got = [message async for message in messages(resp)]
            assert [m.event for m in got] == ["closed"] and "rotated" in got[0].json["reason"]
        [(name, body)] = await on_sio.take(1)
        assert name == "closed" and "rotated" in body["reason"]
        async with asyncio.timeout(10):
            await on_sio.disconnected.wait()
        async with asyncio.timeout(10):
            stream = messages(opened[2])
            await acme.submit("A")
            await other.submit("A")
            assert (await anext(stream)).json["job"]["channel"] == "A"
        for resp in opened:
            resp.close()

        for token in (old, minted):
            assert await status(browser, app.url("/v1/events?channel=A"), token) == 401
            assert (await sio_refusal(app, token))["data"]["status"] == 401
        fresh = backend_token(rotated, "acme", {"scope": "channel", "channel": "A"})
        assert await status(browser, app.url("/v1/events?channel=A"), fresh) == 200
        # Pressroom mints with the new one too.
        again = (await acme.mint(channel="A"))["token"]
        assert jwt.decode(again, rotated, ["HS256"])["sub"] == "acme"


async def test_keys_create_shows_a_new_tenants_token_secret_once(
    pool: asyncpg.Pool, make_settings: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings()

    async def pressroom(*argv: str) -> tuple[int, str, str]:
        """The CLI's commands, run here (the rotation test runs the real process)."""
        args = admin.build_parser().parse_args(argv)
        run = admin.run_keys if args.command == "keys" else tenant_settings.run_tenants
        code = await run(settings, args)
        out, err = capsys.readouterr()
        return code, out, err

    code, key, err = await pressroom("keys", "create", "--tenant", "acme")
    assert code == 0 and key.startswith("prk_"), err
    stored = await pool.fetchval("SELECT token_secret FROM tenants WHERE name = 'acme'")
    assert stored.startswith("prts_") and stored in err and "shown only now" in err
    assert stored not in key, "stdout holds the key alone"
    code, _key, err = await pressroom("keys", "create", "--tenant", "acme")
    assert code == 0 and stored not in err and "token signing secret" not in err

    code, out, err = await pressroom("tenants", "secret", "acme")
    assert (code, out) == (2, "") and "--rotate" in err
    assert await pool.fetchval("SELECT token_secret FROM tenants") == stored
    code, out, err = await pressroom("tenants", "secret", "nobody", "--rotate")
    assert (code, out) == (1, "") and "no API key" in err


async def test_a_tenant_without_a_secret_yet_gets_one_when_a_token_is_minted(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    acme = await new_tenant(app, pool, "acme")
    await pool.execute("UPDATE tenants SET token_secret = NULL")  # as before migration 0014
    async with ClientSession() as browser:
        assert await status(browser, app.url("/v1/events"), acme.secret) == 401
        minted = (await acme.mint(channel="A"))["token"]
        assert await status(browser, app.url("/v1/events?channel=A"), minted) == 200
    made = await pool.fetchval("SELECT token_secret FROM tenants WHERE name = 'acme'")
    assert made.startswith("prts_") and jwt.decode(minted, made, ["HS256"])["sub"] == "acme"


async def test_in_dev_mode_a_channel_token_opens_its_channel_only(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    async with app.http.post(app.url("/v1/tokens"), json={"channel": "A"}) as resp:
        token = (await resp.json())["token"]
    async with ClientSession() as browser:
        assert await status(browser, app.url("/v1/events?channel=A"), token) == 200
        assert await status(browser, app.url("/v1/events?channel=B"), token) == 403
        assert await status(browser, app.url("/v1/events"), token) == 403
