"""API keys and tenants: the keys CLI, dev mode vs keyed mode, 401s, tenant isolation on every
route and stream, and subscription tokens."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import standardwebhooks
from aiohttp import ClientSession
from yarl import URL

from server.access import apikeys, signing
from server.keys import SETTINGS
from server.web import auth
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.processes import admin_cli, run_pressroom
from tests.sse import collect, messages

ROOT = Path(__file__).resolve().parents[2]
SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


async def keys_cli(dsn: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """`python -m server keys ...` against the test database, as an operator would run it."""
    return await admin_cli(dsn, tmp_path / "cli", "keys", *args)


async def new_key(dsn: str, tmp_path: Path, tenant: str) -> str:
    code, out, err = await keys_cli(dsn, tmp_path, "create", "--tenant", tenant)
    assert code == 0, err
    return out.strip()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def submit(app: RunningApp, key: str | None, body: dict[str, Any] | None = None) -> Any:
    headers = bearer(key) if key else {}
    async with app.http.post(app.url("/v1/jobs"), json=body or SEED, headers=headers) as resp:
        assert resp.status == 202, await resp.text()
        return await resp.json()


async def wait_done(app: RunningApp, key: str, job_id: str) -> dict[str, Any]:
    got = await collect(
        app.http, app.url(f"/v1/jobs/{job_id}/events"), until="job.done", headers=bearer(key)
    )
    assert got[-1].event == "job.done"
    job: dict[str, Any] = got[-1].json["job"]
    return job


async def test_keys_cli_prints_key_once_lists_and_revokes(
    dsn: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    code, out, err = await keys_cli(dsn, tmp_path, "create", "--tenant", "acme", "--name", "ci")
    assert code == 0, err
    key = out.strip()
    assert out == key + "\n", "the key must be alone on stdout"
    assert key.startswith(apikeys.KEY_PREFIX) and len(key) > 40
    assert "acme" in err and "shown only now" in err

    stored = await pool.fetch("SELECT * FROM api_keys")
    assert len(stored) == 1
    assert key not in {str(value) for value in stored[0].values()}, "only a hash is stored"
    assert stored[0]["key_hash"] == apikeys.hash_key(key)

    code, out, err = await keys_cli(dsn, tmp_path, "list")
    assert code == 0, err
    header, row = out.strip().splitlines()
    assert header.split("\t")[:6] == ["id", "tenant", "name", "prefix", "created", "revoked"]
    cells = row.split("\t")
    key_id = cells[0]
    assert cells[1:4] == ["acme", "ci", key[: apikeys.SHOWN_PREFIX_CHARS]]
    assert cells[5] == "-" and key not in out

    code, _out, err = await keys_cli(dsn, tmp_path, "revoke", key_id)
    assert code == 0 and "revoked" in err
    code, out, _err = await keys_cli(dsn, tmp_path, "list")
    assert out.strip().splitlines()[1].split("\t")[5] != "-"

    code, _out, err = await keys_cli(dsn, tmp_path, "revoke", "999")
    assert code == 1 and "no API key with id 999" in err
    code, out, err = await keys_cli(dsn, tmp_path, "create", "--tenant", "../etc")
    assert code == 2 and out == "" and "tenant" in err


async def tenants_cli(dsn: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    return await admin_cli(dsn, tmp_path / "cli", "tenants", *args)


async def test_tenants_cli_shows_and_rotates_each_tenants_webhook_secret(
    dsn: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    await new_key(dsn, tmp_path, "acme")  # the tenant's first key makes its secret
    made = await pool.fetchval("SELECT webhook_secret FROM tenants WHERE name = 'acme'")
    code, out, err = await tenants_cli(dsn, tmp_path, "webhook-secret", "acme")
    assert code == 0, err
    assert out == made + "\n", "the secret must be alone on stdout"
    assert made.startswith("whsec_") and standardwebhooks.Webhook(made)

    await new_key(dsn, tmp_path, "acme")
    await new_key(dsn, tmp_path, "bob")
    _code, again, _err = await tenants_cli(dsn, tmp_path, "webhook-secret", "acme")
    _code, bobs, _err = await tenants_cli(dsn, tmp_path, "webhook-secret", "bob")
    assert again == out, "a second key keeps the tenant's secret"
    assert bobs.startswith("whsec_") and bobs != out

    code, rotated, err = await tenants_cli(dsn, tmp_path, "webhook-secret", "acme", "--rotate")
    assert code == 0, err
    assert rotated.startswith("whsec_") and rotated.strip() not in (made, bobs.strip())
    assert "rotated" in err and "previous secret too until" in err
    code, shown, err = await tenants_cli(dsn, tmp_path, "webhook-secret", "acme")
    assert (code, shown) == (0, rotated) and "previous secret too until" in err
    _code, bobs_after, _err = await tenants_cli(dsn, tmp_path, "webhook-secret", "bob")
    assert bobs_after == bobs, "rotating one tenant's secret leaves the others alone"

    # A tenant whose keys predate the tenants table gets its secret on first need.
    await pool.execute("DELETE FROM tenants WHERE name = 'bob'")
    code, remade, err = await tenants_cli(dsn, tmp_path, "webhook-secret", "bob")
    assert code == 0 and remade.startswith("whsec_") and remade != bobs, err
    stored = await pool.fetchval("SELECT webhook_secret FROM tenants WHERE name = 'bob'")
    assert remade == stored + "\n"

    code, out, err = await tenants_cli(dsn, tmp_path, "webhook-secret", "nobody")
    assert (code, out) == (1, "") and "no API key" in err and "PRESSROOM_WEBHOOK_SECRET" in err
    assert await pool.fetchval("SELECT count(*) FROM tenants WHERE name = 'nobody'") == 0
    code, out, err = await tenants_cli(dsn, tmp_path, "webhook-secret", "../etc")
    assert code == 2 and out == "" and "tenant" in err


async def test_dev_mode_is_open_until_the_first_key(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    dev_job = await submit(app, None)
    assert dev_job["links"]["events"] == f"/v1/jobs/{dev_job['id']}/events"  # no token needed
    async with app.http.get(app.url("/v1/jobs")) as resp:
        assert resp.status == 200

    key = await new_key(dsn, tmp_path, "acme")
    for path in ("/v1/jobs", f"/v1/jobs/{dev_job['id']}", "/v1/events"):
        async with app.http.get(app.url(path)) as resp:
            assert resp.status == 401, path
            assert resp.content_type == "application/problem+json"
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            assert "Bearer" in (await resp.json())["detail"]
    async with app.http.post(app.url("/v1/jobs"), json=SEED) as resp:
        assert resp.status == 401
    for path in ("/healthz", "/readyz", "/v1/openapi.json", "/"):
        async with app.http.get(app.url(path)) as resp:
            assert resp.status == 200, path

    async with app.http.get(app.url("/v1/jobs"), headers=bearer(key)) as resp:
        assert resp.status == 200
        assert (await resp.json())["items"] == [], "dev-mode jobs belong to tenant 'default'"

    _code, out, _err = await keys_cli(dsn, tmp_path, "list")
    await keys_cli(dsn, tmp_path, "revoke", out.splitlines()[1].split("\t")[0])
    async with app.http.get(app.url(f"/v1/jobs/{dev_job['id']}")) as resp:
        assert resp.status == 200, "with every key revoked the server is back in dev mode"


async def test_bad_credentials_are_401(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    good = await new_key(dsn, tmp_path, "acme")
    revoked = await new_key(dsn, tmp_path, "acme")
    await keys_cli(dsn, tmp_path, "revoke", "2")
    cases = {
        "Basic YWxhZGRpbjpvcGVuc2VzYW1l": "invalid_request",
        "Bearer": "invalid_request",
        "Bearer prk_not-a-real-key": "invalid_token",
        f"Bearer {revoked}": "invalid_token",
        f"Bearer {good}x": "invalid_token",
    }
    for header, error in cases.items():
        async with app.http.get(app.url("/v1/jobs"), headers={"Authorization": header}) as resp:
            assert resp.status == 401, header
            assert f'error="{error}"' in resp.headers["WWW-Authenticate"]
            assert (await resp.json())["type"].endswith("/unauthorized")
    async with app.http.get(app.url("/v1/jobs"), headers=bearer(good)) as resp:
        assert resp.status == 200


async def test_other_tenants_jobs_are_404_exactly_like_unknown_ones(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    alice = await new_key(dsn, tmp_path, "alice")
    bob = await new_key(dsn, tmp_path, "bob")
    job = await submit(app, alice)
    done = await wait_done(app, alice, job["id"])
    failed = await submit(app, alice, {"template": "{{ missing }}"})
    await collect(
        app.http,
        app.url(f"/v1/jobs/{failed['id']}/events"),
        until="job.failed",
        headers=bearer(alice),
    )

    async def answer(method: str, path: str, key: str, **kwargs: Any) -> tuple[int, Any]:
        async with app.http.request(method, app.url(path), headers=bearer(key), **kwargs) as resp:
            body = await resp.json() if resp.status != 200 else None
            if isinstance(body, dict):
                body.pop("instance", None)
            return resp.status, body

    unknown = str(uuid.uuid4())
    routes = [
        ("GET", "/v1/jobs/{id}", {}),
        ("GET", "/v1/jobs/{id}?wait=1", {}),
        ("POST", "/v1/jobs/{id}/cancel", {}),
        ("POST", "/v1/jobs/{id}/retry", {}),
        ("GET", "/v1/jobs/{id}/pdf", {}),
        ("GET", "/v1/jobs/{id}/events", {}),
        ("POST", "/v1/tokens", {"json": {"job_id": "{id}"}}),
    ]
    for target in (job["id"], failed["id"]):
        for method, template, extra in routes:
            kwargs = {k: {"job_id": target} for k in extra}
            theirs = await answer(method, template.format(id=target), bob, **kwargs)
            kwargs = {k: {"job_id": unknown} for k in extra}
            nobody = await answer(method, template.format(id=unknown), bob, **kwargs)
            assert theirs[0] == 404, (method, template, theirs)
            assert theirs == nobody, (method, template)
    # The owner still reaches them all.
    assert (await answer("GET", f"/v1/jobs/{job['id']}", alice))[0] == 200
    assert (await answer("GET", f"/v1/jobs/{job['id']}/pdf", alice))[0] == 200
    assert (await answer("POST", f"/v1/jobs/{failed['id']}/retry", alice))[0] == 202
    async with app.http.get(app.url("/v1/jobs"), headers=bearer(bob)) as resp:
        assert (await resp.json())["items"] == []
    # The signed download link is the credential: it works with no key (or another tenant's).
    async with app.http.get(done["url"]) as resp:
        assert resp.status == 200 and (await resp.read()).startswith(b"%PDF-")


async def test_every_signed_download_link_needs_no_key(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path
) -> None:
    """A thumbnail's link and a combined PDF's are credentials too, as a job's url is."""
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    alice = await new_key(dsn, tmp_path, "alice")
    job = await submit(app, alice, {**SEED, "options": {"thumbnail": {"width": 50}}})
    done = await wait_done(app, alice, job["id"])
    body = {"items": [{"key": "a", **SEED}], "combine": True}
    async with app.http.post(app.url("/v1/batches"), json=body, headers=bearer(alice)) as resp:
        assert resp.status == 202, await resp.text()
    replay = app.url("/v1/events?last_event_id=0")
    got = await collect(app.http, replay, until="batch.done", headers=bearer(alice))
    for link in (done["thumbnail_url"], got[-1].json["batch"]["combined"]["url"]):
        async with app.http.get(link) as resp:
            assert resp.status == 200, (link, await resp.text())


async def test_all_jobs_stream_never_carries_another_tenants_events(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    alice = await new_key(dsn, tmp_path, "alice")
    bob = await new_key(dsn, tmp_path, "bob")
    seen: list[tuple[str, str]] = []
    async with asyncio.timeout(20):
        async with app.http.get(app.url("/v1/events"), headers=bearer(bob)) as resp:
            assert resp.status == 200
            alices = await submit(app, alice)
            await wait_done(app, alice, alices["id"])
            bobs = await submit(app, bob)
            async for message in messages(resp):
                seen.append((message.event, message.json["job"]["id"]))
                if message.event == "job.done":
                    break
    assert {job_id for _event, job_id in seen} == {bobs["id"]}
    assert [event for event, _id in seen] == ["job.queued", "job.running", "job.done"]

    # Replaying from the other tenant's event ids gives a reset, not their events.
    got = await collect(
        app.http,
        app.url("/v1/events?last_event_id=1"),
        count=1,
        headers=bearer(bob),
    )
    assert got[0].event == "reset"


async def test_subscription_tokens_scope_expiry_and_tampering(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    renderer = FakeRenderer()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    alice = await new_key(dsn, tmp_path, "alice")
    await new_key(dsn, tmp_path, "bob")
    job = await submit(app, alice)
    events_link = URL(job["links"]["events"])
    assert events_link.path == f"/v1/jobs/{job['id']}/events" and "token" in events_link.query

    # A browser holding only the link (no key) follows the job to the end.
    async with ClientSession() as browser:
        got = await collect(browser, app.url(str(events_link)), until="job.done")
        assert [m.event for m in got] == ["job.queued", "job.running", "job.done"]

        job_token = events_link.query["token"]
        other = await submit(app, alice)
        for path in (f"/v1/jobs/{other['id']}/events", "/v1/events", f"/v1/jobs/{other['id']}"):
            async with browser.get(app.url(path), params={"token": job_token}) as resp:
                assert resp.status == 403, path
                assert f"job {job['id']}" in (await resp.json())["detail"]
        # A token opens streams and its job's long-poll only, never the other REST routes.
        async with browser.get(app.url(f"/v1/jobs/{job['id']}"), params={"token": job_token}) as r:
            assert r.status == 200 and (await r.json())["id"] == job["id"]
        for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/tokens")):
            async with browser.request(method, app.url(path), params={"token": job_token}) as r:
                assert r.status == 401, path

        async with app.http.post(app.url("/v1/tokens"), json={}, headers=bearer(alice)) as resp:
            assert resp.status == 200
            issued = await resp.json()
        assert set(issued) == {"token", "expires_at"}
        all_jobs = await collect(
            browser, app.url(f"/v1/events?token={issued['token']}&last_event_id=0"), count=3
        )
        assert {m.json["job"]["id"] for m in all_jobs} <= {job["id"], other["id"]}

        secrets = dict(await pool.fetch("SELECT name, token_secret FROM tenants"))
        secret = secrets["alice"]

        def mint(tenant: str, key_id: int | None, *, key: str = "", ttl_s: int = 60) -> str:
            signed_with = key or secrets[tenant]
            return signing.make_token(signed_with, tenant, ttl_s=ttl_s, key_id=key_id)[0]

        expired, forged = mint("alice", 1, ttl_s=-1), mint("alice", 1, key="not-the-secret" * 3)
        unkeyed = mint("alice", signing.NO_KEY)
        deployments = mint("alice", None, key=app.app[SETTINGS].secret)
        header, body, sig = issued["token"].split(".")
        _, bobs_body, _ = mint("bob", 2).split(".")
        # An alg=none token with alice's claims: no signature at all.
        unsigned = jwt.encode(jwt.decode(issued["token"], secret, ["HS256"]), None, "none")
        tampered = (
            f"{header}.{body}.{sig[:-2]}AA",
            f"{header}.{bobs_body}.{sig}",
            unsigned,
            "garbage",
            "",
        )
        for bad in (expired, forged, unkeyed, deployments, *tampered):
            async with browser.get(app.url("/v1/events"), params={"token": bad}) as resp:
                assert resp.status == 401, bad
                assert 'error="invalid_token"' in resp.headers["WWW-Authenticate"]

    # Another tenant's token reaches none of alice's jobs.
    bobs_token = mint("bob", None)
    async with app.http.get(
        app.url(f"/v1/jobs/{job['id']}/events"), params={"token": bobs_token}
    ) as resp:
        assert resp.status == 404
    async with app.http.post(
        app.url("/v1/tokens"), json={"job_id": "nope"}, headers=bearer(alice)
    ) as resp:
        assert resp.status == 422
        assert (await resp.json())["errors"][0]["field"] == "job_id"


async def test_serve_refuses_to_run_open_beyond_loopback(dsn: str, tmp_path: Path) -> None:
    settings = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "serve"),
        "PRESSROOM_HOST": "0.0.0.0",
        "PRESSROOM_PORT": "0",
        "PRESSROOM_RENDER_SLOTS": "0",
    }
    code, _out, err = await run_pressroom(settings, "serve")
    assert code == 2
    assert "not a loopback address" in err and "keys create" in err


async def test_revoking_every_key_beyond_loopback_closes_rather_than_opens(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path
) -> None:
    key = await new_key(dsn, tmp_path, "acme")
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1, host="0.0.0.0")
    async with app.http.get(app.url("/v1/jobs"), headers=bearer(key)) as resp:
        assert resp.status == 200
    await keys_cli(dsn, tmp_path, "revoke", "1")
    async with app.http.get(app.url("/v1/jobs")) as resp:
        assert resp.status == 401
        assert "No API key is active" in (await resp.json())["detail"]


def test_loopback_hosts_allow_dev_mode() -> None:
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("::1")
    assert auth.is_loopback("localhost") and auth.is_loopback("127.0.0.2")
    assert not auth.is_loopback("0.0.0.0") and not auth.is_loopback("::")
    assert not auth.is_loopback("example.com")
