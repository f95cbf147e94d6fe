"""The dashboard's API: the job list's filters and search, its counts by state, and the bulk
retry and cancel of everything a filter matches; each scoped to the tenant."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from server.queue import listing
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


async def submit(api: RunningApp, body: dict[str, Any], **headers: str) -> str:
    async with api.http.post(api.url("/v1/jobs"), json=body, headers=headers) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["id"]
        return job_id


async def listed(api: RunningApp, **params: str) -> list[str]:
    async with api.http.get(api.url("/v1/jobs"), params=params) as resp:
        assert resp.status == 200, await resp.text()
        return [job["id"] for job in (await resp.json())["items"]]


async def insert(
    pool: asyncpg.Pool,
    count: int,
    status: str,
    *,
    tenant: str = "default",
    channel: str | None = None,
    options: dict[str, Any] | None = None,
    source: str = "template",
    template: str = "<p>x</p>",
) -> list[uuid.UUID]:
    """`count` jobs already final (no worker picks them up), newest last."""
    rows = await pool.fetch(
        """INSERT INTO jobs (id, tenant, template, data, max_attempts, status, attempts,
                             object_key, bytes, finished_at, created_at, channel, options,
                             source, started_at, pages)
           SELECT gen_random_uuid(), $1, $7, '{}', 3, $2, 1,
                  CASE WHEN $2 = 'done' THEN 'key' END, CASE WHEN $2 = 'done' THEN 1 END,
                  at + make_interval(secs => 0.4 + n % 7 * 0.3), at, $4, $5::jsonb, $6,
                  at + interval '0.1 s', CASE WHEN $2 = 'done' THEN 1 + n % 4 END
           FROM generate_series(1, $3) AS n,
                LATERAL (SELECT now() - make_interval(secs => 1000 - n) AS at) AS t
           RETURNING id""",
        tenant,
        status,
        count,
        channel,
        options or {},
        source,
        template,
    )
    return [row["id"] for row in rows]


async def counts(api: RunningApp, **params: str) -> dict[str, int]:
    async with api.http.get(api.url("/v1/jobs/counts"), params=params) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, int] = await resp.json()
        return body


async def bulk(api: RunningApp, action: str, body: Any) -> dict[str, Any]:
    async with api.http.post(api.url(f"/v1/jobs/{action}"), json=body) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


async def problem(api: RunningApp, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    async with api.http.request(method, api.url(path), **kwargs) as resp:
        assert resp.content_type == "application/problem+json", await resp.text()
        body: dict[str, Any] = await resp.json()
        assert resp.status == body["status"]
        return body


async def test_search_finds_a_job_by_id_prefix_idempotency_key_or_metadata_value(
    api: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    fake_renderer.gate = asyncio.Event()  # keep them queued
    ordered = await submit(api, {**SEED, "metadata": {"order": "A-17", "n": "x"}})
    keyed = await submit(api, SEED, **{"Idempotency-Key": "inv-2026-01"})
    plain = await submit(api, SEED)
    # Another tenant's job with the same metadata value is never found.
    await pool.execute(
        """INSERT INTO jobs (id, tenant, template, data, max_attempts, status, finished_at,
                             metadata)
           VALUES (gen_random_uuid(), 'other', '<p>x</p>', '{}', 1, 'cancelled', now(),
                   '{"order": "A-17"}')"""
    )
    assert await listed(api, q="A-17") == [ordered]
    assert await listed(api, q="inv-2026-01") == [keyed]
    assert await listed(api, q=plain) == [plain]
    assert await listed(api, q=plain[:8]) == [plain]
    assert await listed(api, q=plain[:8].upper()) == [plain]
    assert await listed(api, q="A-1") == [], "a metadata value matches whole"
    assert await listed(api, q="A-17", status="done") == []
    assert await listed(api, q='"quoted" \\ value') == []
    with_state = await counts(api, q="A-17")
    assert with_state["total"] == 1 and with_state["running"] + with_state["queued"] == 1

    for bad in ("", "x" * 201):
        body = await problem(api, "GET", "/v1/jobs", params={"q": bad})
        assert body["status"] == 422 and [e["field"] for e in body["errors"]] == ["q"]
    fake_renderer.gate.set()


async def test_list_names_each_jobs_source(api: RunningApp, pool: asyncpg.Pool) -> None:
    page = await insert(pool, 1, "done", source="page_url", template="https://example.com/a?b=1")
    markdown = await insert(pool, 1, "done", source="markdown", template="# Hi")
    pdfs = await insert(pool, 1, "failed", source="pdfs", template="[]")
    async with api.http.get(api.url("/v1/jobs")) as resp:
        items = {job["id"]: job["source"] for job in (await resp.json())["items"]}
    assert items == {
        str(page[0]): "example.com",
        str(markdown[0]): "Markdown",
        str(pdfs[0]): "PDFs",
    }


async def stored_template_jobs(api: RunningApp, pool: asyncpg.Pool) -> dict[str, list[str]]:
    """Jobs made from stored templates, done: two of invoice@1, one of invoice (its latest, 2),
    one of receipt; one from inline HTML; and another tenant's invoice@1 job."""
    for name, html in (("invoice", "<p>1</p>"), ("invoice", "<p>2</p>"), ("receipt", "<p>r</p>")):
        body = {"name": name, "html": html, "publish": True}
        async with api.http.post(api.url("/v1/templates"), json=body) as r:
            assert r.status == 201, await r.text()
    made: dict[str, list[str]] = {}
    for ref in ("invoice@1", "invoice@1", "invoice", "receipt"):
        made.setdefault(ref, []).append(await submit(api, {"template_id": ref}))
    made["inline"] = [await submit(api, SEED)]
    for job_id in (j for ids in made.values() for j in ids):
        await collect(api.http, api.url(f"/v1/jobs/{job_id}/events"))  # ends once it is final
    [theirs] = await insert(pool, 1, "done", tenant="other")
    await pool.execute(
        "UPDATE jobs SET template_name = 'invoice', template_version = 1 WHERE id = $1", theirs
    )
    return made


async def test_list_names_a_stored_templates_job_by_name_and_version(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    made = await stored_template_jobs(api, pool)
    async with api.http.get(api.url("/v1/jobs")) as resp:
        items = {job["id"]: job["source"] for job in (await resp.json())["items"]}
    assert items == {
        **{job_id: "invoice@1" for job_id in made["invoice@1"]},
        made["invoice"][0]: "invoice@2",
        made["receipt"][0]: "receipt@1",
        made["inline"][0]: "Template",
    }


async def test_the_template_filter_lists_counts_and_acts_on_one_template_or_one_version(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    made = await stored_template_jobs(api, pool)
    invoices = made["invoice@1"] + made["invoice"]
    assert sorted(await listed(api, template="invoice")) == sorted(invoices)
    assert sorted(await listed(api, template="invoice@1")) == sorted(made["invoice@1"])
    assert await listed(api, template="invoice@2") == made["invoice"]
    assert await listed(api, template="receipt", status="done") == made["receipt"]
    assert await listed(api, template="receipt", status="failed") == []
    assert await listed(api, template="invoice@3") == []
    assert await listed(api, template="nothing") == []

    assert (await counts(api, template="invoice")) == {
        "queued": 0, "running": 0, "done": 3, "failed": 0, "cancelled": 0, "total": 3,
    }  # fmt: skip
    assert (await counts(api, template="invoice@1"))["done"] == 2
    assert (await counts(api, template="receipt@2"))["total"] == 0

    asked = await bulk(api, "cancel", {"template": "invoice@1", "dry_run": True})
    assert (asked["matched"], asked["applied"], asked["skipped"]) == (2, 0, 2)
    asked = await bulk(api, "retry", {"template": "invoice", "dry_run": True})
    assert (asked["matched"], asked["applied"], asked["skipped"]) == (3, 0, 3)


async def test_a_template_filter_not_of_the_form_name_or_name_at_version_is_refused(
    api: RunningApp,
) -> None:
    for bad in ("in voice", "invoice@0", "invoice@x", "invoice@", "@3"):
        for path in ("/v1/jobs", "/v1/jobs/counts"):
            body = await problem(api, "GET", path, params={"template": bad})
            assert body["status"] == 422 and [e["field"] for e in body["errors"]] == ["template"]
            assert "name@version" in body["errors"][0]["message"], body
    for action in ("retry", "cancel"):
        body = await problem(api, "POST", f"/v1/jobs/{action}", json={"template": 3})
        assert body["status"] == 422 and [e["field"] for e in body["errors"]] == ["template"]
        assert "name@version" in body["errors"][0]["message"], body


async def test_counts_by_state_follow_the_filters_and_the_tenant(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    await insert(pool, 3, "failed", channel="user-1")
    await insert(pool, 2, "done")
    await insert(pool, 1, "cancelled", channel="user-1")
    await insert(pool, 5, "failed", tenant="other", channel="user-1")
    everything = await counts(api)
    assert everything == {
        "queued": 0,
        "running": 0,
        "done": 2,
        "failed": 3,
        "cancelled": 1,
        "total": 6,
    }
    assert (await counts(api, channel="user-1"))["total"] == 4
    assert (await counts(api, channel="user-2"))["total"] == 0
    # The state is not a filter of the counts: each count is what ?status= would list.
    assert await counts(api, status="failed") == everything
    assert (await counts(api, created_from="2999-01-01T00:00:00Z"))["total"] == 0
    assert (await counts(api, created_to="2999-01-01T00:00:00Z"))["total"] == 6

    backwards = {"created_from": "2026-02-01T00:00:00Z", "created_to": "2026-01-01T00:00:00Z"}
    assert (await counts(api, **backwards))["total"] == 0
    body = await problem(api, "GET", "/v1/jobs/counts", params={"created_from": "yesterday"})
    assert [e["field"] for e in body["errors"]] == ["created_from"]


async def test_bulk_retry_counts_first_then_requeues_each_failed_job_with_its_event(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    failed = await insert(pool, 7, "failed")
    # A failed job whose secrets were erased cannot run again: left as it is, counted.
    sealed = await insert(pool, 1, "failed", options={"cookies": [{"name": "s"}]})
    await insert(pool, 2, "done")
    others = await insert(pool, 4, "failed", tenant="other")

    asked = await bulk(api, "retry", {"dry_run": True})
    assert asked == {
        "action": "retry",
        "dry_run": True,
        "matched": 10,
        "applied": 8,
        "skipped": 2,
    }
    assert (await counts(api))["failed"] == 8, "a dry run changes nothing"

    done = await bulk(api, "retry", {"status": "failed"})
    assert done == {"action": "retry", "dry_run": False, "matched": 8, "applied": 7, "skipped": 1}
    queued = await pool.fetch(
        "SELECT job_id FROM job_events WHERE type = 'job.queued' AND tenant = 'default'"
    )
    assert sorted(row["job_id"] for row in queued) == sorted(failed)
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1", sealed[0]) == "failed"
    states = await pool.fetch("SELECT status FROM jobs WHERE id = ANY($1)", others)
    assert {row["status"] for row in states} == {"failed"}, "another tenant's jobs are left"


async def test_bulk_cancel_cancels_the_channels_queued_and_running_jobs_only(
    api: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    fake_renderer.gate = asyncio.Event()  # one running, the rest queued
    mine = [await submit(api, {**SEED, "channel": "user-9"}) for _ in range(3)]
    theirs = await submit(api, SEED)
    done = await insert(pool, 2, "done", channel="user-9")
    asked = await bulk(api, "cancel", {"channel": "user-9", "dry_run": True})
    assert asked["matched"] == 5 and asked["applied"] == 3 and asked["skipped"] == 2

    result = await bulk(api, "cancel", {"channel": "user-9"})
    assert (result["applied"], result["skipped"]) == (3, 2)
    events = await pool.fetch("SELECT job_id::text FROM job_events WHERE type = 'job.cancelled'")
    assert sorted(row["job_id"] for row in events) == sorted(mine)
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1", uuid.UUID(theirs)) in (
        "queued",
        "running",
    )
    assert {
        r["status"] for r in await pool.fetch("SELECT status FROM jobs WHERE id = ANY($1)", done)
    } == {"done"}
    fake_renderer.gate.set()


async def test_bulk_actions_write_in_bounded_batches(pool: asyncpg.Pool) -> None:
    """A filter of more jobs than one batch is written batch after batch, every job once."""
    failed = await insert(pool, 23, "failed")
    result = await listing.act_on_matching(
        pool, "default", listing.JobFilter(), "retry", dry_run=False, batch=5
    )
    assert (result.matched, result.applied, result.skipped) == (23, 23, 0)
    events = await pool.fetchval("SELECT count(*) FROM job_events WHERE type = 'job.queued'")
    assert events == len(failed)


async def test_bulk_actions_refuse_bad_bodies_with_what_to_send(api: RunningApp) -> None:
    body = await problem(
        api, "POST", "/v1/jobs/retry", json={"status": "broken", "dry_run": "yes", "all": True}
    )
    assert body["status"] == 422
    assert {e["field"] for e in body["errors"]} == {"status", "dry_run", "all"}
    status_error = next(e for e in body["errors"] if e["field"] == "status")
    assert "queued, running, done, failed, cancelled" in status_error["message"]
    body = await problem(
        api,
        "POST",
        "/v1/jobs/cancel",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert body["status"] == 400
    # No body at all: every job of the tenant, as the unfiltered list.
    assert (await bulk(api, "cancel", None))["matched"] == 0


async def held_jobs(pool: asyncpg.Pool, *states: str) -> list[uuid.UUID]:
    """Jobs of channel `held` in `states`, one each, ids ascending in insertion (heap) order;
    none due for a worker, the running ones leased by a worker that never renews."""
    ids = sorted(uuid.uuid4() for _ in states)
    for job_id, state in zip(ids, states, strict=True):
        await pool.execute(
            """INSERT INTO jobs (id, tenant, template, data, max_attempts, status, attempts,
                                 run_after, channel, worker_id, lease_expires_at, started_at)
               VALUES ($1, 'default', '<p>x</p>', '{}', 3, $2, $3,
                       now() + interval '1 day', 'held',
                       CASE WHEN $2 = 'running' THEN 'elsewhere' END,
                       CASE WHEN $2 = 'running' THEN now() + interval '1 day' END,
                       CASE WHEN $2 = 'running' THEN now() END)""",
            job_id,
            state,
            1 if state == "running" else 0,
        )
    return ids


async def deadlocked_bulk_cancel(
    api: RunningApp, dsn: str, first: uuid.UUID, second: uuid.UUID
) -> tuple[int, dict[str, Any], str | None]:
    """A bulk cancel of channel `held` deadlocked once: another transaction holds `second`, the
    bulk statement locks `first` and waits for `second`, then the other updates `first`. Only
    the bulk statement's session has the default deadlock_timeout (1 s), so PostgreSQL aborts
    that one; the other then rolls back. Answers the status, body and Retry-After."""

    async def cancel() -> tuple[int, dict[str, Any], str | None]:
        async with api.http.post(api.url("/v1/jobs/cancel"), json={"channel": "held"}) as resp:
            body: dict[str, Any] = await resp.json(content_type=None)
            return resp.status, body, resp.headers.get("Retry-After")

    other = await asyncpg.connect(dsn)
    try:
        held = other.transaction()
        await held.start()
        await other.execute("SET LOCAL deadlock_timeout = '10s'")
        await other.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", second)
        request = asyncio.create_task(cancel())
        # PostgreSQL signals no lock wait: its lock table is read until the bulk statement waits.
        async with asyncio.timeout(10):
            while not await other.fetchval(  # noqa: ASYNC110
                "SELECT EXISTS (SELECT FROM pg_stat_activity"
                " WHERE $1 = ANY (pg_blocking_pids(pid)))",
                other.get_server_pid(),
            ):
                await asyncio.sleep(0.01)
        # Waits for `first` until the bulk statement is aborted and lets go of it.
        await other.execute("UPDATE jobs SET updated_at = updated_at WHERE id = $1", first)
        await held.rollback()
    finally:
        await other.close()
    return await request


async def cancelled_events(pool: asyncpg.Pool) -> list[uuid.UUID]:
    rows = await pool.fetch("SELECT job_id FROM job_events WHERE type = 'job.cancelled'")
    return sorted(row["job_id"] for row in rows)


async def test_bulk_cancel_deadlocked_with_another_transaction_is_retried_to_the_end(
    api: RunningApp, pool: asyncpg.Pool, dsn: str
) -> None:
    first, second = await held_jobs(pool, "queued", "queued")
    untouched = await insert(pool, 1, "done", channel="held")
    before = await pool.fetchval("SELECT count(*) FROM job_events")

    status, body, _ = await deadlocked_bulk_cancel(api, dsn, first, second)

    assert status == 200, body
    assert body == {"action": "cancel", "dry_run": False, "matched": 3, "applied": 2, "skipped": 1}
    assert await cancelled_events(pool) == [first, second], "each cancelled once, one event"
    assert await pool.fetchval("SELECT count(*) FROM job_events") == before + 2
    states = await pool.fetch("SELECT status FROM jobs WHERE id = ANY($1)", [first, second])
    assert {row["status"] for row in states} == {"cancelled"}
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1", untouched[0]) == "done"


async def test_bulk_cancel_still_deadlocked_answers_503_and_can_be_sent_again(
    api: RunningApp, pool: asyncpg.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "BULK_RETRIES", 0)
    # The queued jobs' batch comes first and commits; the running jobs' batch deadlocks.
    queued, first, second = await held_jobs(pool, "queued", "running", "running")

    status, body, retry_after = await deadlocked_bulk_cancel(api, dsn, first, second)

    assert status == 503, body
    assert body["type"].endswith("/bulk-interrupted")
    assert body["detail"].startswith("The bulk cancel was interrupted after 1 job cancelled:")
    assert retry_after is not None and int(retry_after) >= 1
    assert await cancelled_events(pool) == [queued], "the aborted batch changed nothing"

    again = await bulk(api, "cancel", {"channel": "held"})
    assert (again["matched"], again["applied"], again["skipped"]) == (3, 2, 1)
    assert await cancelled_events(pool) == sorted([queued, first, second])
