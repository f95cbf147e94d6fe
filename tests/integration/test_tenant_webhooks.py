"""A tenant's own webhook endpoints (`pressroom tenants webhooks`, 0040): publishing a template
version POSTs a signed template.published to each endpoint of its tenant, through the same
outbox, retries, leases and 410 rule as a job's webhooks. Real receivers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from jsonschema import Draft202012Validator

from server import events
from server.access import apikeys, tenants
from server.delivery import endpoints
from server.queue import retention
from tests.integration.test_webhooks import (
    SCHEDULE,
    SECRET,
    Hooked,
    Receiver,
    StartHooked,
    due_shortly,
    refused_by,
    verify,
)
from tests.processes import admin_cli, run_pressroom
from tests.tenants import bearer
from tests.timings import quick

VERSION = {"html": "<h1>{{ total }}</h1>", "publish": True}


@pytest.fixture
def start_hooked(start_app: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> StartHooked:
    """Web apps without render slots (a version without samples publishes without a render);
    `sends=False`: one whose sender never runs."""
    quick(monkeypatch, SCHEDULE_S=SCHEDULE)

    async def start(*, sends: bool = True) -> Hooked:
        app = await start_app(
            render_slots=0,
            run_background=sends,
            env={"PRESSROOM_ALLOW_HOSTS": "127.0.0.1", "PRESSROOM_WEBHOOK_SECRET": SECRET},
        )
        return Hooked(app)

    return start


@pytest.fixture
async def receivers() -> AsyncIterator[Callable[[], Any]]:
    """Start receivers on demand; all are stopped at the end."""
    started: list[Receiver] = []

    async def start() -> Receiver:
        receiver = Receiver()
        await receiver.start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        await receiver.stop()


async def secret_of(pool: asyncpg.Pool, tenant: str) -> str:
    found = await tenants.webhook_secrets(pool, tenant, overlap_s=0)
    assert found is not None
    return found.current


async def publish(hooked: Hooked, key: str, name: str) -> dict[str, Any]:
    """Store a version of `name` and publish it at once; the version as published."""
    body = {"name": name, **VERSION}
    async with hooked.app.http.post(
        hooked.app.url("/v1/templates"), json=body, headers=bearer(key)
    ) as resp:
        assert resp.status == 201, await resp.text()
        stored: dict[str, Any] = await resp.json()
    assert stored["status"] == "published"
    return stored


async def outbox(pool: asyncpg.Pool) -> list[tuple[str, str, str]]:
    rows = await pool.fetch(
        "SELECT tenant, url, status FROM webhook_deliveries ORDER BY tenant, url, created_at"
    )
    return [(row["tenant"], row["url"], row["status"]) for row in rows]


async def test_publishing_posts_one_signed_delivery_to_each_endpoint_of_its_tenant_only(
    start_hooked: StartHooked, receivers: Callable[[], Any], pool: asyncpg.Pool
) -> None:
    _row, acme_key = await apikeys.create_key(pool, "acme")
    _row, bob_key = await apikeys.create_key(pool, "bob")
    first, second, bobs = await receivers(), await receivers(), await receivers()
    for tenant, receiver in (("acme", first), ("acme", second), ("bob", bobs)):
        assert await endpoints.add(pool, tenant, receiver.url, ["template.published"])
    hooked = await start_hooked()
    async with hooked.app.http.get(hooked.app.url("/v1/openapi.json")) as resp:
        document = await resp.json()

    stored = await publish(hooked, acme_key, "receipt")

    # Written in the publishing transaction, one row per endpoint of acme, none for bob's.
    assert {(tenant, url) for tenant, url, _status in await outbox(pool)} == {
        ("acme", first.url),
        ("acme", second.url),
    }
    acme = await secret_of(pool, "acme")
    received = [await first.next(), await second.next()]
    ids = {r.headers["webhook-id"] for r in received}
    assert len(ids) == 2, "each endpoint's delivery is a message of its own"
    hook = document["webhooks"]["template.published"]["post"]
    schema = hook["requestBody"]["content"]["application/json"]["schema"]
    checker = Draft202012Validator(
        {**schema, "components": document["components"]},
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    for delivery in received:
        payload = verify(acme, delivery.headers, delivery.body)
        assert payload["type"] == "template.published"
        assert payload["data"] == {
            "template": {
                "name": "receipt",
                "version": 1,
                "template_id": "receipt@1",
                "kind": "html",
                "published_at": stored["published_at"],
                "replaces": None,
                "links": {
                    "self": "/v1/templates/receipt@1",
                    "diff": "/v1/templates/receipt@1/diff",
                },
            }
        }
        assert [e.message for e in checker.iter_errors(payload)] == []
        for parameter in hook["parameters"]:
            errors = Draft202012Validator(parameter["schema"]).iter_errors(
                delivery.headers[parameter["name"]]
            )
            assert [e.message for e in errors] == [], parameter["name"]
        assert refused_by(SECRET, delivery)  # the deployment's secret did not sign it

    # bob's own publishing reaches bob's endpoint, first: acme's never went there.
    await publish(hooked, bob_key, "receipt")
    theirs = await bobs.next()
    bobs_payload = verify(await secret_of(pool, "bob"), theirs.headers, theirs.body)
    assert bobs_payload["data"]["template"]["template_id"] == "receipt@1"
    assert [len(first.received), len(second.received), len(bobs.received)] == [1, 1, 1]
    for attempt in [await hooked.next_attempt() for _ in range(3)]:
        assert attempt.outcome == "delivered" and attempt.job_id is None


async def test_a_500_is_retried_with_the_same_id_and_each_attempt_recorded(
    start_hooked: StartHooked, receivers: Callable[[], Any], pool: asyncpg.Pool
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    receiver = await receivers()
    receiver.script = [500]
    await endpoints.add(pool, "acme", receiver.url, ["template.published"])
    hooked = await start_hooked()

    await publish(hooked, key, "receipt")
    attempts = await hooked.until_final()

    assert [a.outcome for a in attempts] == ["pending", "delivered"]
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1
    assert len(receiver.received) == 2
    rows = await hooked.attempt_rows(receiver.received[0].headers["webhook-id"])
    assert [(r["attempt"], r["status_code"]) for r in rows] == [(1, 500), (2, 200)]
    assert await outbox(pool) == [("acme", receiver.url, "delivered")]


async def test_a_410_disables_the_endpoint_until_it_is_added_again(
    start_hooked: StartHooked, receivers: Callable[[], Any], pool: asyncpg.Pool
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    gone, other = await receivers(), await receivers()
    gone.script = [410]
    for receiver in (gone, other):
        await endpoints.add(pool, "acme", receiver.url, ["template.published"])
    hooked = await start_hooked()

    await publish(hooked, key, "receipt")
    outcomes = {(await hooked.next_attempt()).outcome for _ in range(2)}
    assert outcomes == {"disabled", "delivered"}
    [shown] = [e for e in await endpoints.listed(pool, "acme") if e.url == gone.url]
    assert shown.disabled_at is not None and shown.last_status == "disabled"
    assert "410" in (shown.last_error or "")

    # The next version goes to the other endpoint alone: the disabled one gets no row at all.
    await publish(hooked, key, "statement")
    assert (await hooked.next_attempt()).outcome == "delivered"
    assert len(other.received) == 2 and len(gone.received) == 1
    assert [row for row in await outbox(pool) if row[1] == gone.url] == [
        ("acme", gone.url, "disabled")
    ]

    added = await endpoints.add(pool, "acme", gone.url, ["template.published"])
    assert added is not None and not added.added and added.was_disabled == shown.disabled_at
    await publish(hooked, key, "letter")
    back = await gone.next()
    assert verify(await secret_of(pool, "acme"), back.headers, back.body)["type"] == (
        "template.published"
    )


async def test_a_removed_endpoint_gets_nothing_and_its_pending_deliveries_stop(
    start_hooked: StartHooked, receivers: Callable[[], Any], pool: asyncpg.Pool
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    kept, removed = await receivers(), await receivers()
    for receiver in (kept, removed):
        await endpoints.add(pool, "acme", receiver.url, ["template.published"])
    # Published while no sender runs: both deliveries wait in the outbox.
    submitter = await start_hooked(sends=False)
    await publish(submitter, key, "receipt")
    assert await endpoints.remove(pool, "acme", removed.url) == 1
    assert await endpoints.remove(pool, "acme", removed.url) is None
    row = await pool.fetchrow(
        "SELECT status, attempts, last_error FROM webhook_deliveries WHERE url = $1", removed.url
    )
    assert dict(row) == {
        "status": "disabled",
        "attempts": 0,
        "last_error": "not sent: the endpoint was removed",
    }

    await due_shortly(submitter)
    sender = await start_hooked()
    await publish(sender, key, "statement")
    versions = set()
    for _ in range(2):
        delivery = await kept.next()
        sent = verify(await secret_of(pool, "acme"), delivery.headers, delivery.body)
        versions.add(sent["data"]["template"]["name"])
    assert versions == {"receipt", "statement"}
    assert [(await sender.next_attempt()).outcome for _ in range(2)] == ["delivered"] * 2
    assert removed.received == []
    assert [row for row in await outbox(pool) if row[1] == removed.url] == [
        ("acme", removed.url, "disabled")
    ]


async def test_a_delivery_written_while_no_sender_runs_is_sent_when_one_starts(
    start_hooked: StartHooked, receivers: Callable[[], Any], pool: asyncpg.Pool
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    receiver = await receivers()
    await endpoints.add(pool, "acme", receiver.url, ["template.published"])
    # The process that published dies before any POST: the outbox row is all that is left.
    crashed = await start_hooked(sends=False)
    await publish(crashed, key, "receipt")
    pending = await pool.fetchrow("SELECT id, status, attempts FROM webhook_deliveries")
    assert (pending["status"], pending["attempts"]) == ("pending", 0)
    await due_shortly(crashed)

    other = await start_hooked()
    received = await receiver.next()

    assert received.headers["webhook-id"] == str(pending["id"])
    sent = verify(await secret_of(pool, "acme"), received.headers, received.body)
    assert sent["data"]["template"]["template_id"] == "receipt@1"
    [attempt] = await other.until_final()
    assert attempt.outcome == "delivered"


async def cli(dsn: str, tmp_path: Path, *args: str, allow: bool = True) -> tuple[int, str, str]:
    settings = {"DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": str(tmp_path / "cli")}
    if allow:
        settings["PRESSROOM_ALLOW_HOSTS"] = "127.0.0.1"
    return await run_pressroom(settings, "tenants", "webhooks", *args)


async def test_the_cli_adds_lists_and_removes_endpoints_and_refuses_what_cannot_be_one(
    dsn: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    url = "http://127.0.0.1:9/hooks"
    # A tenant without a key (the dev-mode tenant is one) has no row to hang endpoints on.
    for asked in (("--add", url), ("--list",), ("--remove", url)):
        code, out, err = await cli(dsn, tmp_path, "default", *asked)
        assert (code, out) == (1, ""), err
        assert err.startswith("pressroom: tenant 'default' has no API key") and err.count("\n") == 1
        assert "pressroom keys create --tenant default" in err
    assert await pool.fetchval("SELECT count(*) FROM tenants") == 0

    await apikeys.create_key(pool, "acme")
    # Checked as a job's webhook_url is, before the database is touched.
    code, out, err = await cli(dsn, tmp_path, "acme", "--add", url, allow=False)
    assert (code, out) == (2, "")
    assert err == (
        "pressroom: webhook URL is not allowed: 127.0.0.1 is a loopback address; allow it with "
        "PRESSROOM_ALLOW_HOSTS=127.0.0.1\n"
    )
    code, out, err = await cli(dsn, tmp_path, "acme", "--add", "ftp://hooks.example.com/x")
    assert (code, err) == (2, "pressroom: webhook URL must use http or https\n")
    code, out, err = await cli(dsn, tmp_path, "acme", "--add", url, "--type", "job.done")
    assert code == 2 and "invalid choice: 'job.done'" in err
    code, out, err = await cli(dsn, tmp_path, "acme", "--list", "--type", "template.published")
    assert (code, err) == (2, "pressroom: --type names the events --add POSTs\n")
    assert await pool.fetchval("SELECT count(*) FROM tenant_webhooks") == 0

    code, out, err = await cli(dsn, tmp_path, "acme", "--add", url)
    assert (code, out) == (0, ""), err
    assert err == (
        f"tenant 'acme' POSTs template.published to {url}, signed with its webhook secret "
        "(pressroom tenants webhook-secret acme)\n"
    )
    code, out, err = await cli(dsn, tmp_path, "acme", "--add", url, "--type", "template.published")
    assert code == 0 and "(it had this endpoint: its types are these now)" in err
    code, out, err = await cli(dsn, tmp_path, "acme", "--list")
    assert code == 0, err
    header, row = out.splitlines()
    assert header == "url\ttypes\tadded\tdisabled\tlast_delivery\tlast_error"
    cells = row.split("\t")
    assert cells[:2] == [url, "template.published"] and cells[3:] == ["-", "-", "-"]

    code, out, err = await cli(dsn, tmp_path, "acme", "--remove", url)
    assert (code, err) == (0, f"tenant 'acme' POSTs nothing more to {url}\n")
    code, out, err = await cli(dsn, tmp_path, "acme", "--remove", url)
    assert (code, err) == (1, f"pressroom: tenant 'acme' has no webhook endpoint {url}\n")
    code, out, _err = await admin_cli(
        dsn, tmp_path / "cli", "tenants", "webhooks", "acme", "--list"
    )
    assert (code, out) == (0, "url\ttypes\tadded\tdisabled\tlast_delivery\tlast_error\n")


async def test_the_types_an_endpoint_may_take_are_the_tenants_events(pool: asyncpg.Pool) -> None:
    await apikeys.create_key(pool, "acme")
    for kind in sorted(events.TENANT_TYPES):
        assert await endpoints.add(pool, "acme", f"https://hooks.example.com/{kind}", [kind])
    for refused in ([], ["job.done"], ["batch.done"], ["template.published", "job.done"]):
        with pytest.raises(asyncpg.CheckViolationError, match="tenant_webhooks_types_known"):
            await endpoints.add(pool, "acme", "https://hooks.example.com/other", refused)


async def test_retention_deletes_a_tenants_settled_deliveries_and_keeps_the_rest(
    pool: asyncpg.Pool,
) -> None:
    await apikeys.create_key(pool, "acme")
    await endpoints.add(pool, "acme", "https://hooks.example.com/a", ["template.published"])
    log = (
        "INSERT INTO job_events (tenant, type, payload) VALUES ('acme', 'template.published', '{}')"
    )
    for _ in range(3):
        await pool.execute(log)  # the trigger writes each one's delivery, as publishing does
    old = "now() - interval '31 days'"
    await pool.execute(
        f"UPDATE webhook_deliveries SET created_at = {old}, status = 'delivered',"
        " delivered_at = now()"
        " WHERE id = (SELECT id FROM webhook_deliveries ORDER BY id LIMIT 1)"
    )
    await pool.execute(  # old, but still due: kept
        f"UPDATE webhook_deliveries SET created_at = {old}"
        " WHERE id = (SELECT id FROM webhook_deliveries WHERE status = 'pending' ORDER BY id"
        " LIMIT 1)"
    )
    assert await retention.sweep_tenant_deliveries(pool, older_than_days=30) == 1
    assert await pool.fetchval("SELECT count(*) FROM webhook_deliveries") == 2
    assert await retention.sweep_tenant_deliveries(pool, older_than_days=30) == 0
