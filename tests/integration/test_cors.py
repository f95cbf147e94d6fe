"""CORS: preflights and actual responses for the deployment's origins and each tenant's, the
`tenants origins` CLI reaching a running server, and the Origin check of Socket.IO."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import socketio
from aiohttp import ClientResponse

from server.access import apikeys, tenants
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.processes import admin_cli, run_pressroom
from tests.sio import SioClient
from tests.sse import messages

ROOT = Path(__file__).resolve().parents[2]
SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}
APP = "https://app.example.com"  # allowed for every tenant (PRESSROOM_CORS_ORIGINS)
BOBS = "https://bob.example.com"  # allowed for tenant bob only
EVIL = "https://evil.example.com"  # allowed nowhere

#: A change's commit to every server following it: a notification and one read.
WITHIN_S = 1.0


def cors_headers(resp: ClientResponse) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower().startswith("access-control-")}


def comma_set(value: str) -> set[str]:
    return {part.strip().lower() for part in value.split(",") if part.strip()}


async def start(start_app: Callable[..., Any], **overrides: Any) -> RunningApp:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env={"PRESSROOM_CORS_ORIGINS": APP}, **overrides
    )
    return app


async def preflight(
    app: RunningApp, path: str, origin: str, method: str = "GET", headers: str | None = None
) -> ClientResponse:
    asked = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        asked["Access-Control-Request-Headers"] = headers
    async with app.http.options(app.url(path), headers=asked) as resp:
        await resp.read()
        return resp


def bearer(key: str, origin: str | None = APP) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if origin is not None:
        headers["Origin"] = origin
    return headers


async def test_a_preflight_from_an_allowed_origin_is_answered_on_every_route(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    await apikeys.create_key(pool, "acme")  # keyed: a preflight must pass without credentials
    app = await start(start_app)
    job = uuid.uuid4()
    routes = [
        ("/v1/jobs", "POST", "content-type, authorization, idempotency-key"),
        (f"/v1/jobs/{job}", "GET", "authorization, if-none-match"),
        (f"/v1/jobs/{job}/events", "GET", "last-event-id"),
        ("/v1/events", "GET", "authorization"),
        (f"/v1/jobs/{job}/pdf", "GET", "authorization"),
        (f"/v1/jobs/{job}/cancel", "POST", "authorization"),
        ("/v1/assets/ast_0", "DELETE", "authorization"),
        ("/socket.io/?EIO=4&transport=polling", "POST", "content-type"),
        ("/pressroom.js", "GET", None),
        ("/v1/openapi.json", "GET", None),
    ]
    for path, method, asked in routes:
        resp = await preflight(app, path, APP, method, asked)
        assert resp.status == 204, (path, resp.status)
        assert resp.headers["Access-Control-Allow-Origin"] == APP, path
        assert method.lower() in comma_set(resp.headers["Access-Control-Allow-Methods"]), path
        allowed = comma_set(resp.headers["Access-Control-Allow-Headers"])
        assert {"authorization", "content-type", "idempotency-key", "last-event-id"} <= allowed
        assert comma_set(asked or "") <= allowed, path
        assert int(resp.headers["Access-Control-Max-Age"]) > 0
        assert "origin" in comma_set(resp.headers["Vary"])
        assert "Access-Control-Allow-Credentials" not in resp.headers

    # Only headers Pressroom reads are allowed; the browser then refuses the request itself.
    resp = await preflight(app, "/v1/jobs", APP, "POST", "Content-Type, X-Mine, Cookie")
    allowed = comma_set(resp.headers["Access-Control-Allow-Headers"])
    assert "content-type" in allowed and not {"x-mine", "cookie"} & allowed
    assert comma_set(resp.headers["Access-Control-Allow-Methods"]) == {
        "get",
        "post",
        "delete",
        "options",
    }

    # An OPTIONS that is no preflight goes to the routes as before.
    async with app.http.options(app.url("/v1/jobs"), headers={"Origin": APP}) as plain:
        assert plain.status in (401, 405) and "Access-Control-Allow-Methods" not in plain.headers


async def test_actual_responses_name_an_allowed_origin_and_expose_what_clients_read(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    app = await start(start_app)
    headers = {**bearer(key), "Idempotency-Key": "order-1"}

    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=headers) as resp:
        assert resp.status == 202
        assert resp.headers["Access-Control-Allow-Origin"] == APP
        exposed = comma_set(resp.headers["Access-Control-Expose-Headers"])
        assert {"location", "etag", "retry-after", "idempotent-replayed"} <= exposed
        assert "content-disposition" in exposed
        assert "origin" in comma_set(resp.headers["Vary"])
        assert "Access-Control-Allow-Credentials" not in resp.headers
        job = await resp.json()
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=headers) as resp:
        assert resp.status == 200 and resp.headers["Idempotent-Replayed"] == "true"
        assert resp.headers["Access-Control-Allow-Origin"] == APP

    # A stream's headers go out before its first event, the CORS ones among them.
    stream = app.url(f"/v1/jobs/{job['id']}/events")
    async with app.http.get(stream, headers=bearer(key)) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert resp.headers["Access-Control-Allow-Origin"] == APP
        types = [message.event async for message in messages(resp)]
    assert types[-1] == "job.done", "the stream ends after the job's final event"
    async with app.http.get(app.url("/v1/events"), headers=bearer(key)) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert resp.headers["Access-Control-Allow-Origin"] == APP

    async with app.http.get(app.url(f"/v1/jobs/{job['id']}"), headers=bearer(key)) as resp:
        assert resp.status == 200 and resp.headers["ETag"]
        assert resp.headers["Access-Control-Allow-Origin"] == APP
        assert "etag" in comma_set(resp.headers["Access-Control-Expose-Headers"])
        done = await resp.json()
        tag = resp.headers["ETag"]
    not_modified = {**bearer(key), "If-None-Match": tag}
    async with app.http.get(app.url(f"/v1/jobs/{job['id']}"), headers=not_modified) as resp:
        assert resp.status == 304 and resp.headers["Access-Control-Allow-Origin"] == APP

    async with app.http.get(app.url(f"/v1/jobs/{job['id']}/pdf"), headers=bearer(key)) as resp:
        assert resp.status == 200 and (await resp.read()).startswith(b"%PDF")
        assert resp.headers["Access-Control-Allow-Origin"] == APP
        assert resp.headers["Content-Disposition"].startswith("inline")
    # The signed link needs no credentials: it is answered as any open path.
    async with app.http.get(done["url"], headers={"Origin": APP}) as resp:
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == APP

    # The browser module, imported from the app's page.
    async with app.http.get(app.url("/pressroom.js"), headers={"Origin": APP}) as resp:
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == APP

    # A 401 names the origin too, so that the page can read why.
    async with app.http.get(app.url("/v1/jobs"), headers={"Origin": APP}) as resp:
        assert resp.status == 401 and resp.headers["Access-Control-Allow-Origin"] == APP
        assert "www-authenticate" in comma_set(resp.headers["Access-Control-Expose-Headers"])


def _token(job: dict[str, Any]) -> str:
    """The job-scoped token in the events link POST /v1/jobs gave (it opens that job only)."""
    link: str = job["links"]["events"]
    return link.partition("?token=")[2]


async def test_a_disallowed_origin_gets_no_cors_headers(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    app = await start(start_app)
    for origin in (EVIL, "null", "https://app.example.com.evil.example", APP + ":8443"):
        resp = await preflight(app, "/v1/jobs", origin, "POST", "authorization")
        assert resp.status == 403 and resp.content_type == "application/problem+json"
        assert cors_headers(resp) == {}, origin
        async with app.http.options(
            app.url("/v1/jobs"),
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        ) as again:
            problem = await again.json()
        assert "PRESSROOM_CORS_ORIGINS" in problem["detail"]
        assert "pressroom tenants origins TENANT --add" in problem["detail"]

        # CORS is the browser's to enforce: the server answers as it would, without the
        # headers that would let a page of that origin read the answer.
        async with app.http.post(
            app.url("/v1/jobs"), json=SEED, headers=bearer(key, origin)
        ) as resp:
            assert resp.status == 202 and cors_headers(resp) == {}
        async with app.http.get(app.url("/v1/openapi.json"), headers={"Origin": origin}) as resp:
            assert resp.status == 200 and cors_headers(resp) == {}


async def test_without_any_origin_allowed_nothing_changes_but_the_preflight_answer(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers={"Origin": APP}) as resp:
        assert resp.status == 202 and cors_headers(resp) == {}
        assert "Vary" not in resp.headers
    resp = await preflight(app, "/v1/jobs", APP, "POST")
    assert resp.status == 403 and cors_headers(resp) == {}


async def test_a_tenants_origin_is_named_for_that_tenant_only(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    _row, acme = await apikeys.create_key(pool, "acme")
    _row, bob = await apikeys.create_key(pool, "bob")
    assert await tenants.add_origin(pool, "bob", BOBS) is True
    app = await start(start_app)  # reads every tenant's origins before it serves

    resp = await preflight(app, "/v1/jobs", BOBS, "POST", "authorization")
    assert resp.status == 204 and resp.headers["Access-Control-Allow-Origin"] == BOBS

    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(bob, BOBS)) as resp:
        assert resp.status == 202 and resp.headers["Access-Control-Allow-Origin"] == BOBS
        job = await resp.json()
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(acme, BOBS)) as resp:
        assert resp.status == 202 and cors_headers(resp) == {}, "bob's origin is not acme's"
    async with app.http.get(app.url("/v1/jobs"), headers=bearer(acme, BOBS)) as resp:
        assert resp.status == 200 and cors_headers(resp) == {}
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(acme, APP)) as resp:
        assert resp.headers["Access-Control-Allow-Origin"] == APP, "the deployment's: everyone's"

    # A token is its tenant's: bob's job token from bob's origin, not acme's.
    stream = app.url(f"/v1/jobs/{job['id']}/events?token={_token(job)}")
    async with app.http.get(stream, headers={"Origin": BOBS}) as resp:
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == BOBS

    # Without a tenant (a 401, an open path) any tenant's origin is named.
    async with app.http.get(app.url("/v1/jobs"), headers={"Origin": BOBS}) as resp:
        assert resp.status == 401 and resp.headers["Access-Control-Allow-Origin"] == BOBS
    async with app.http.get(app.url("/v1/openapi.json"), headers={"Origin": BOBS}) as resp:
        assert resp.headers["Access-Control-Allow-Origin"] == BOBS


async def tenants_cli(dsn: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    return await admin_cli(dsn, tmp_path / "cli", "tenants", "origins", *args)


async def test_the_cli_adds_lists_and_removes_origins_and_a_running_server_follows(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    app = await start(start_app)

    async def named(origin: str) -> str | None:
        async with app.http.get(app.url("/v1/jobs"), headers=bearer(key, origin)) as resp:
            assert resp.status == 200
            return resp.headers.get("Access-Control-Allow-Origin")

    async def followed(origin: str, expected: str | None) -> None:
        """The server answers the change within WITHIN_S of the command's end."""
        deadline = time.monotonic() + WITHIN_S
        while True:  # a request every 20 ms, as a page would ask
            answer = await named(origin)
            if answer == expected or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        assert answer == expected

    assert await named(BOBS) is None
    code, out, err = await tenants_cli(
        dsn, tmp_path, "acme", "--add", "HTTPS://Bob.Example.com:443"
    )
    assert (code, out) == (0, ""), err
    assert f"tenant 'acme' now allows {BOBS}; every server answers its pages now" in err
    await followed(BOBS, BOBS)

    code, out, err = await tenants_cli(dsn, tmp_path, "acme", "--add", BOBS)
    assert code == 0 and "already allowed" in err
    code, out, err = await tenants_cli(dsn, tmp_path, "acme", "--add", "http://localhost:5173")
    assert code == 0, err
    code, out, err = await tenants_cli(dsn, tmp_path, "acme", "--list")
    assert (code, out) == (0, f"http://localhost:5173\n{BOBS}\n"), err  # sorted

    code, out, err = await tenants_cli(dsn, tmp_path, "acme", "--remove", BOBS)
    assert code == 0 and f"no longer allows {BOBS}" in err
    await followed(BOBS, None)
    code, out, err = await tenants_cli(dsn, tmp_path, "acme", "--remove", BOBS)
    assert code == 1 and "does not allow" in err


async def test_the_cli_refuses_bad_input_in_one_line_and_changes_nothing(
    dsn: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    await apikeys.create_key(pool, "acme")
    for bad in ("https://app.example.com/", "https://*.example.com", "null"):
        code, out, err = await tenants_cli(dsn, tmp_path, "acme", "--add", bad)
        assert (code, out) == (2, ""), (bad, err)
        assert err.count("\n") == 1 and err.startswith(f"pressroom: {bad!r} must be an origin")
    code, out, err = await tenants_cli(dsn, tmp_path, "nobody", "--add", BOBS)
    assert (code, out) == (1, "") and "has no API key" in err
    assert "pressroom keys create --tenant nobody" in err and "PRESSROOM_CORS_ORIGINS" in err
    code, out, err = await tenants_cli(dsn, tmp_path, "acme")
    assert code == 2 and "--add" in err
    assert await pool.fetchval("SELECT count(*) FROM tenant_origins") == 0
    assert await pool.fetchval("SELECT count(*) FROM tenants WHERE name = 'nobody'") == 0


async def test_a_malformed_origin_stops_the_start_with_one_line(tmp_path: Path) -> None:
    settings = {
        "PRESSROOM_DATA_DIR": str(tmp_path),
        "PRESSROOM_CORS_ORIGINS": "https://a.example.com/",
    }
    code, out, err = await run_pressroom(settings, "serve")
    assert code == 2 and out == ""
    assert err == (
        "pressroom: PRESSROOM_CORS_ORIGINS='https://a.example.com/' is not valid: "
        "'https://a.example.com/' must be an origin such as https://app.example.com, "
        "without a trailing /\n"
    )


async def two_tenants(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> tuple[RunningApp, str, str]:
    """An app allowing APP for everyone and BOBS for bob; acme's key and bob's."""
    _row, acme = await apikeys.create_key(pool, "acme")
    _row, bob = await apikeys.create_key(pool, "bob")
    await tenants.add_origin(pool, "bob", BOBS)
    return await start(start_app), acme, bob


@pytest.mark.parametrize("transport", ["websocket", "polling"])
async def test_socketio_lets_allowed_origins_connect(
    start_app: Callable[..., Any],
    pool: asyncpg.Pool,
    sio: Callable[[], SioClient],
    transport: str,
) -> None:
    app, acme, bob = await two_tenants(start_app, pool)
    own = app.url("/").rstrip("/")  # the dashboard's page, on this server
    for key, origin in [(acme, APP), (bob, APP), (bob, BOBS), (acme, own), (acme, None)]:
        client = sio()
        headers = {} if origin is None else {"Origin": origin}
        await client.client.connect(
            app.url("/"),
            auth={"api_key": key},
            headers=headers,
            transports=[transport],
            wait_timeout=10,
        )
        await client.subscribe(all=True)
        await client.close()


async def test_socketio_refuses_other_origins_saying_how_to_allow_them(
    start_app: Callable[..., Any], pool: asyncpg.Pool, sio: Callable[[], SioClient]
) -> None:
    # Websocket only: the check is the connect handler's, the same for both transports, and
    # python-socketio's client, refused over polling, waits out engine.io's ping (25 s) first.
    app, acme, bob = await two_tenants(start_app, pool)
    for key, origin, tenant in [
        (acme, BOBS, "acme"),
        (acme, EVIL, "acme"),
        (bob, EVIL, "bob"),
        (acme, "null", "acme"),
        (acme, "http://127.0.0.1:1", "acme"),  # this host, another port: another origin
    ]:
        client = sio()
        refusals: list[Any] = []
        client.client.on("connect_error", refusals.append)
        with pytest.raises(socketio.exceptions.ConnectionError):
            await client.client.connect(
                app.url("/"),
                auth={"api_key": key},
                headers={"Origin": origin},
                transports=["websocket"],
                wait_timeout=10,
            )
        assert not client.client.connected
        [refusal] = refusals
        assert refusal["message"] == "origin not allowed", refusal
        assert refusal["data"]["status"] == 403
        detail = refusal["data"]["detail"]
        assert f"pressroom tenants origins {tenant} --add {origin}" in detail
        assert "PRESSROOM_CORS_ORIGINS" in detail


async def test_the_socketio_polling_transport_carries_cors_headers(
    start_app: Callable[..., Any],
) -> None:
    app = await start(start_app)
    handshake = app.url("/socket.io/?EIO=4&transport=polling")
    async with app.http.get(handshake, headers={"Origin": APP}) as resp:
        assert resp.status == 200 and (await resp.text()).startswith("0{")
        assert resp.headers["Access-Control-Allow-Origin"] == APP
        assert "Access-Control-Allow-Credentials" not in resp.headers
    async with app.http.get(handshake, headers={"Origin": EVIL}) as resp:
        assert resp.status == 200 and cors_headers(resp) == {}
