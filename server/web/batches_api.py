"""Batches: many documents in one call, one job per item, each keyed by a stable business key.

A key is accepted once per tenant: submitting it again with the same content reuses its job
(nothing is rendered twice), with other content it is refused, so a revision needs a new key.
The same request again answers with the same batch. Batch progress reaches every stream as
`batch.progress` / `batch.done` events, written by a trigger (0004_batches_templates.sql).
With `combine`, the items' PDFs are joined into one once all are done (server/queue/combine.py,
0016_batch_combine.sql); the batch is done once that is over, and serves the file.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any
from urllib.parse import quote

import asyncpg
from aiohttp import web

from server import tracing
from server.access import signing
from server.delivery import downloads
from server.keys import ASSET_CACHE, METRICS, POOL, SETTINGS, STORAGE, TENANT_DEFAULTS
from server.pipeline import vault
from server.problems import Problem, invalid, not_found
from server.queue import admission, combine
from server.queue.jobs import NewJob, job_columns, source_columns, template_columns
from server.render import templates
from server.schemas.batches import BatchItem, BatchListQuery, BatchRequest, CombineOptions
from server.schemas.common import MAX_TEMPLATE_BYTES
from server.schemas.listing import encode_cursor
from server.sql import query
from server.web import auth, files, present, submission
from server.web.common import (
    checks,
    json_response,
    query_of,
    read_json,
    tenant_of,
    validated,
)

log = logging.getLogger(__name__)

IN_FLIGHT_RETRY_S = 5
ITEM_SUMMARY_FIELDS = ("status", "error", "pages", "url", "cached_from")

routes = web.RouteTableDef()


@dataclasses.dataclass(frozen=True, slots=True)
class NewBatch:
    """A validated batch request: each item's key and job (not yet inserted)."""

    keys: list[str]
    jobs: list[NewJob]
    item_hashes: list[str]
    webhook_url: str | None
    channel: str | None
    combine: CombineOptions | None
    request_hash: str


async def _validate(request: web.Request, body: Any) -> NewBatch:
    """Check the body and every item; every problem found is reported at once."""
    items = body.get("items") if isinstance(body, dict) else None
    raw_items = items if isinstance(items, list) else []
    await templates.warm(
        (item.get("template") for item in raw_items if isinstance(item, dict)),
        max_bytes=MAX_TEMPLATE_BYTES,
    )
    pool, tenant = request.app[POOL], tenant_of(request)
    stored = await submission.templates_named(pool, tenant, raw_items)
    found = await submission.assets_named(pool, tenant, raw_items, stored.values())
    named = checks(request, stored, found)
    batch = validated(BatchRequest, body, named)
    await submission.check_invoices(
        request.app[ASSET_CACHE], tenant, list(batch.items), prefix="items[{index}]."
    )
    await submission.check_pdfs(
        request.app[ASSET_CACHE], tenant, list(batch.items), prefix="items[{index}]."
    )
    await submission.check_docx(
        request.app[ASSET_CACHE], tenant, list(batch.items), named, prefix="items[{index}]."
    )
    cache_default = request.app[TENANT_DEFAULTS].render_cache(tenant)
    jobs = [
        submission.new_job(
            _with_batch_defaults(item, batch), tenant, named, cache_default=cache_default
        )
        for item in batch.items
    ]
    secret = request.app[SETTINGS].secret
    shown = [vault.fingerprinted(item, secret=secret) for item in raw_items]
    asked: dict[str, Any] = {"items": shown, "webhook_url": batch.webhook_url}
    if batch.channel is not None:  # the hash of a batch without a channel stays as it was
        asked["channel"] = batch.channel
    if batch.combine is not None:  # the hash of a batch without combine stays as it was
        asked["combine"] = batch.combine.model_dump(exclude_none=True)  # one without sign too
    return NewBatch(
        keys=[item.key for item in batch.items],
        jobs=jobs,
        item_hashes=[admission.request_hash(item) for item in shown],
        webhook_url=batch.webhook_url,
        channel=batch.channel,
        combine=batch.combine,
        request_hash=admission.request_hash(asked),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Inserted:
    """A batch's new jobs: how many, and of those that use the render cache, how many it
    served (hits) and how many render (misses)."""

    created: int
    hits: int
    misses: int


def _with_batch_defaults(item: BatchItem, batch: BatchRequest) -> BatchItem:
    """The item, with the batch's webhook_url and channel where it names none of its own."""
    inherited = {
        name: getattr(batch, name)
        for name in ("webhook_url", "channel")
        if name not in item.model_fields_set
    }
    return item.model_copy(update=inherited) if inherited else item


@routes.post("/v1/batches")
@tracing.traced
async def create_batch(request: web.Request) -> web.Response:
    """One job per item, in one transaction with one NOTIFY; the same request again answers
    with the same batch (200) and creates nothing."""
    settings = request.app[SETTINGS]
    tenant = tenant_of(request)
    body = await read_json(request)
    batch = await _validate(request, body)
    inserted = None
    async with request.app[POOL].acquire() as conn, conn.transaction():
        await conn.execute(query("batch_lock"), tenant)
        batch_id = await conn.fetchval(query("batch_find"), tenant, batch.request_hash)
        replayed = batch_id is not None
        if batch_id is None:
            batch_id = uuid.uuid4()
            inserted = await _insert(
                conn,
                batch_id,
                tenant,
                batch,
                max_in_flight=settings.tenant_max_inflight,
                max_attempts=settings.max_attempts,
            )
    if inserted is not None:
        cache = request.app[METRICS].render_cache
        cache.labels(result="hit").inc(inserted.hits)
        cache.labels(result="miss").inc(inserted.misses)
        log.info(
            "batch accepted",
            extra={
                "batch_id": str(batch_id),
                "tenant": tenant,
                "new_jobs": inserted.created,
                "from_render_cache": inserted.hits,
            },
        )
    tracing.annotate(
        {tracing.BATCH_ID: str(batch_id), tracing.TENANT: tenant, tracing.ITEMS: len(batch.keys)}
    )
    shown = await present_batch(request, batch_id, tenant)
    return json_response(
        shown, status=200 if replayed else 202, headers={"Location": shown["links"]["self"]}
    )


async def _insert(
    conn: asyncpg.Connection,
    batch_id: uuid.UUID,
    tenant: str,
    batch: NewBatch,
    *,
    max_in_flight: int,
    max_attempts: int,
) -> Inserted:
    """Insert the batch and the jobs of keys not seen before, those the render cache serves
    done at once."""
    keys, new, item_hashes = batch.keys, batch.jobs, batch.item_hashes
    rows = await conn.fetch(query("batch_item_jobs"), tenant, keys)
    known = {row["item_key"]: row for row in rows}
    conflicts = [
        (
            f"items[{index}].key",
            f"{key!r} was already used with different content; "
            f"a revision needs a new key (such as {key + '-v2'!r})",
        )
        for index, (key, item_hash) in enumerate(zip(keys, item_hashes, strict=True))
        if key in known and known[key]["item_hash"] != item_hash
    ]
    if conflicts:
        raise invalid(conflicts, "Some item keys were already used with different content.")
    fresh = [
        (position, job, item_hash)
        for position, (key, job, item_hash) in enumerate(zip(keys, new, item_hashes, strict=True))
        if key not in known
    ]
    in_flight: int = await conn.fetchval(query("tenant_in_flight"), tenant)
    if fresh and in_flight + len(fresh) > max_in_flight:
        raise Problem(
            429,
            "Too many jobs in flight",
            f"This tenant has {in_flight} jobs queued or running; {len(fresh)} more would pass "
            f"the limit of {max_in_flight}.",
            kind="too-many-jobs",
            headers={"Retry-After": str(IN_FLIGHT_RETRY_S)},
        )
    await conn.execute(
        query("insert_batch"),
        batch_id,
        tenant,
        batch.request_hash,
        batch.webhook_url,
        batch.channel,
    )
    if batch.combine is not None:
        sign = batch.combine.sign
        await combine.create(
            conn,
            batch_id,
            tenant,
            outline=batch.combine.outline,
            max_attempts=max_attempts,
            sign=sign.model_dump(mode="json") if sign is not None else None,
        )
    job_ids = [
        known[key]["id"] if key in known else job.id for key, job in zip(keys, new, strict=True)
    ]
    jobs = [job for _, job, _ in fresh]
    row = await conn.fetchrow(
        query("insert_batch_jobs"),
        *job_columns(jobs),
        [keys[position] for position, _, _ in fresh],
        [item_hash for _, _, item_hash in fresh],
        batch_id,
        list(range(len(keys))),
        keys,
        job_ids,
        [job.assets for job in jobs],
        *source_columns(jobs),
        [job.channel for job in jobs],
        [job.traceparent for job in jobs],
        *template_columns(jobs),
        [job.cache_key for job in jobs],
    )
    inserted = Inserted(created=row["created"], hits=row["hits"], misses=row["misses"])
    if inserted.created == 0:
        await conn.execute(query("batch_announce"), batch_id)
    return inserted


async def present_batch(request: web.Request, batch_id: uuid.UUID, tenant: str) -> dict[str, Any]:
    """The batch: status, counts by state, its combined PDF, and its items with their jobs'
    ids and states."""
    pool = request.app[POOL]
    row = await pool.fetchrow(query("batch_get"), batch_id, tenant)
    if row is None:
        raise not_found("batch")
    shown = await downloads.present_batch(
        dict(row["batch"]),
        tenant,
        storage=request.app[STORAGE],
        settings=request.app[SETTINGS],
        minted_by=auth.key_id_of(request),
    )
    items = []
    for item in await pool.fetch(query("batch_items"), batch_id):
        job = await present.present(request, item["job"], tenant)
        summary = {"key": item["key"], "job_id": job["id"]}
        summary.update({name: job[name] for name in ITEM_SUMMARY_FIELDS if name in job})
        items.append(summary)
    shown["items"] = items
    shown["links"] = _links(shown)
    return shown


def _links(shown: dict[str, Any]) -> dict[str, str]:
    batch_id, channel = shown["id"], shown.get("channel")
    # A query may hold ':', '@' and '/' as they are (RFC 3986).
    events = "/v1/events" + (f"?channel={quote(channel, safe=':@/')}" if channel else "")
    links = {"self": f"/v1/batches/{batch_id}", "events": events}
    if shown.get("combined") is not None:
        links["pdf"] = signing.download_path(str(batch_id), signing.COMBINED)
    return links


@routes.get("/v1/batches")
async def list_batches(request: web.Request) -> web.Response:
    """A page of the tenant's batches, newest first, each without its items."""
    page = query_of(request, BatchListQuery)
    tenant = tenant_of(request)
    created, after = page.cursor or (None, None)
    rows = await request.app[POOL].fetch(
        query("batch_list"), tenant, created, after, page.limit + 1
    )
    items = []
    for row in rows[: page.limit]:
        shown = await downloads.present_batch(
            dict(row["batch"]),
            tenant,
            storage=request.app[STORAGE],
            settings=request.app[SETTINGS],
            minted_by=auth.key_id_of(request),
        )
        items.append({**shown, "links": _links(shown)})
    last = rows[page.limit - 1] if len(rows) > page.limit else None
    next_cursor = encode_cursor(last["created_at"], last["id"]) if last is not None else None
    return json_response({"items": items, "next_cursor": next_cursor})


def _batch_id(request: web.Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.match_info["batch_id"])
    except ValueError:
        raise not_found("batch") from None


@routes.get("/v1/batches/{batch_id}")
async def get_batch(request: web.Request) -> web.Response:
    return json_response(await present_batch(request, _batch_id(request), tenant_of(request)))


@routes.get("/v1/batches/{batch_id}/pdf")
async def download_combined(request: web.Request) -> web.StreamResponse:
    """The batch's combined PDF: with its signed link (combined.url) or as its tenant."""
    batch_id = _batch_id(request)
    tenant = await files.download_tenant(
        request, batch_id, signing.COMBINED, query("batch_tenant"), "batch"
    )
    row = await request.app[POOL].fetchrow(query("combine_file"), batch_id, tenant)
    if row is None:
        raise not_found("batch")
    if row["status"] is None:
        raise Problem(404, "Not Found", "The batch asked for no combined PDF (combine).")
    if row["status"] != combine.CombineState.DONE:
        raise Problem(
            409,
            "Conflict",
            f"The combined PDF is {row['shown']}; it exists once every item is done and joined.",
        )
    return await files.serve_file(
        request,
        row["object_key"],
        subject_id=str(batch_id),
        filename=combine.filename(batch_id),
        route=signing.COMBINED,
    )
