"""Webhooks: Standard Webhooks signatures, and the sender that drains the delivery outbox.

Receivers verify deliveries with the standardwebhooks package (`Webhook(secret).verify`), the
library that signs them here.

Rows of `webhook_deliveries` are written by the trigger that follows every event row, in the
transaction of the job's state change (0010_event_side_effects.sql). Any process may send: a
sender claims due rows with SKIP LOCKED and a lease, POSTs outside any transaction, then
records the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import email.utils
import functools
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import asyncpg
import standardwebhooks
from aiohttp.abc import ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

from server.access import tenants
from server.access.signing import NO_KEY
from server.delivery import downloads
from server.errors import DB_OR_QUERY_ERRORS, StorageError, jittered
from server.files.storage import Storage
from server.netpolicy import NetworkPolicy
from server.settings import Settings
from server.sql import query

log = logging.getLogger(__name__)

#: How much of a failed response's body is kept in `last_error`.
MAX_ERROR_BODY_CHARS = 200
#: Lease beyond the POST timeout: DNS check, presigning and recording the attempt.
LEASE_MARGIN_S = 30.0
SHUTDOWN_GRACE_S = 5.0
USER_AGENT = "Pressroom-Webhooks/1"


def sign(secret: str, msg_id: str, timestamp: int, body: bytes | str) -> str:
    """The `webhook-signature` value of one secret: `v1,` + base64 HMAC-SHA256 over
    `id.timestamp.body`, made by the standardwebhooks library."""
    text = body.decode() if isinstance(body, bytes) else body
    at = dt.datetime.fromtimestamp(timestamp, dt.UTC)
    signature: str = standardwebhooks.Webhook(secret).sign(msg_id, at, text)
    return signature


def sign_all(secrets: list[str], msg_id: str, timestamp: int, body: bytes | str) -> str:
    """One signature per secret, space-separated (Standard Webhooks): during a rotation's
    overlap, receivers that know either the old or the new secret accept the delivery."""
    return " ".join(sign(secret, msg_id, timestamp, body) for secret in secrets)


# --- Sending ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    """One claimed attempt at one outbox row."""

    id: uuid.UUID
    job_id: uuid.UUID | None  # None for a batch's delivery (batch.done of a combined batch)
    tenant: str
    url: str
    type: str
    payload: dict[str, Any]
    attempt: int
    created_at: dt.datetime
    batch_id: uuid.UUID | None = None

    @property
    def log_extra(self) -> dict[str, str]:
        subject = {"job_id": str(self.job_id)} if self.job_id else {"batch_id": str(self.batch_id)}
        return {**subject, "tenant": self.tenant, "webhook_id": str(self.id)}


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """What one POST came to, as recorded in `webhook_attempts`."""

    delivery_id: uuid.UUID
    job_id: uuid.UUID | None
    attempt: int
    #: pending (retry in retry_in_s), delivered, failed or disabled.
    outcome: str
    status_code: int | None
    duration_ms: int
    error: str | None
    retry_in_s: float | None = None


class BlockedAddress(OSError):
    """The destination resolved to an address the network policy refuses."""


class GuardedResolver(ThreadedResolver):
    """Checks every address the connection may use, so DNS cannot change between the policy
    check and the connect (rebinding)."""

    def __init__(self, policy: NetworkPolicy) -> None:
        super().__init__()
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await super().resolve(host, port, family)
        for result in results:
            verdict = self._policy.check_address(result["host"], host)
            if not verdict.allowed:
                raise BlockedAddress(verdict.reason)
        return results


def guarded_connector(policy: NetworkPolicy, *, limit: int = 100) -> aiohttp.TCPConnector:
    """A connector that refuses to connect to any address `policy` blocks, whatever DNS says."""
    return aiohttp.TCPConnector(
        resolver=GuardedResolver(policy), use_dns_cache=False, limit=max(1, limit)
    )


async def _lookup(host: str) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def next_try_in_s(
    attempt: int, schedule_s: tuple[float, ...], retry_after: float | None = None
) -> float | None:
    """Seconds until the next attempt after failed attempt `attempt` (1-based), or None when
    the schedule is used up. Jittered so that many deliveries do not retry in lockstep; a
    Retry-After is honoured up to the schedule's longest step."""
    if attempt > len(schedule_s):
        return None
    delay = jittered(schedule_s[attempt - 1])
    if retry_after is not None:
        delay = max(delay, min(retry_after, max(schedule_s)))
    return delay


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _blocked_cause(exc: BaseException) -> BlockedAddress | None:
    """The policy refusal behind a connection error (aiohttp wraps the resolver's error)."""
    seen: BaseException | None = exc
    for _hop in range(5):
        if seen is None or isinstance(seen, BlockedAddress):
            return seen
        seen = seen.__cause__ or getattr(seen, "os_error", None)
    return None


class WebhookSender:
    """The outbox sender of one process: claims due deliveries, POSTs them, records attempts."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        storage: Storage,
        policy: NetworkPolicy,
        settings: Settings,
        http: aiohttp.ClientSession,
        *,
        sender_id: str | None = None,
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._policy = policy
        self._settings = settings
        self._http = http
        self.sender_id = sender_id or f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
        self._concurrency = settings.webhook_concurrency
        self._lease_s = settings.webhook_timeout_s + LEASE_MARGIN_S
        self._wake = asyncio.Event()
        self._inflight: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._retry_due: float | None = None
        self._stopping = False
        #: Called with every recorded attempt (tests, metrics).
        self.listeners: list[Callable[[Attempt], None]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, pool: asyncpg.Pool, storage: Storage, policy: NetworkPolicy, settings: Settings
    ) -> AsyncIterator[WebhookSender]:
        """A sender with its own HTTP client, closed on exit."""
        async with aiohttp.ClientSession(
            connector=guarded_connector(policy, limit=settings.webhook_concurrency),
            headers={"User-Agent": USER_AGENT},
        ) as http:
            yield cls(pool, storage, policy, settings, http)

    def wake(self) -> None:
        """A delivery was written (NOTIFY on pressroom_webhooks): claim now, not at the poll."""
        self._wake.set()

    async def run(self) -> None:
        """Claim while there is room; sleep until woken, a retry falls due, or the poll."""
        while not self._stopping:
            self._wake.clear()
            free = self._concurrency - len(self._inflight)
            if free > 0:
                claimed = await self._claim(free)
                for delivery in claimed:
                    task = asyncio.create_task(self._send(delivery), name=f"webhook-{delivery.id}")
                    self._inflight[delivery.id] = task
                    task.add_done_callback(functools.partial(self._done, delivery.id))
                if claimed and len(claimed) == free:
                    continue
            sleep_s = jittered(self._settings.poll_interval_s, 0.5)
            if self._retry_due is not None:
                left_s = self._retry_due - time.monotonic()
                if left_s <= 0:
                    self._retry_due = None
                    continue
                sleep_s = min(sleep_s, left_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sleep_s):
                    await self._wake.wait()

    def _done(self, delivery_id: uuid.UUID, _task: asyncio.Task[None]) -> None:
        self._inflight.pop(delivery_id, None)
        self._wake.set()

    async def _claim(self, limit: int) -> list[Delivery]:
        try:
            rows = await self._pool.fetch(
                query("claim_webhooks"), limit, self.sender_id, self._lease_s
            )
        except DB_OR_QUERY_ERRORS as exc:
            log.warning("webhook claim failed: %s", exc)
            return []
        return [
            Delivery(
                id=row["id"],
                job_id=row["job_id"],
                tenant=row["tenant"],
                url=row["url"],
                type=row["type"],
                payload=row["payload"],
                attempt=row["attempts"],
                created_at=row["created_at"],
                batch_id=row["batch_id"],
            )
            for row in rows
        ]

    async def stop(self) -> None:
        """Stop claiming; let POSTs in flight finish briefly; hand the rest back uncharged."""
        self._stopping = True
        self._wake.set()
        pending = [task for task in self._inflight.values() if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=min(SHUTDOWN_GRACE_S, self._lease_s))
        unfinished = {key: task for key, task in self._inflight.items() if not task.done()}
        for task in unfinished.values():
            task.cancel()
        if unfinished:
            await asyncio.wait(unfinished.values())
            with contextlib.suppress(*DB_OR_QUERY_ERRORS):
                await self._pool.execute(
                    query("release_webhooks"), list(unfinished), self.sender_id
                )

    async def _send(self, delivery: Delivery) -> None:
        extra = delivery.log_extra
        try:
            attempt = await self.attempt(delivery)
        except Exception as exc:
            log.exception("webhook attempt crashed", extra=extra)
            attempt = Attempt(
                delivery_id=delivery.id,
                job_id=delivery.job_id,
                attempt=delivery.attempt,
                outcome="pending",
                status_code=None,
                duration_ms=0,
                error=f"internal error: {type(exc).__name__}",
                retry_in_s=next_try_in_s(delivery.attempt, self._settings.webhook_schedule_s),
            )
            if attempt.retry_in_s is None:
                attempt = dataclasses.replace(attempt, outcome="failed")
        try:
            await self._pool.execute(
                query("record_webhook_attempt"),
                delivery.id,
                delivery.attempt,
                self.sender_id,
                attempt.status_code,
                attempt.duration_ms,
                attempt.error,
                attempt.outcome,
                attempt.retry_in_s,
            )
        except DB_OR_QUERY_ERRORS as exc:
            # The lease runs out and another attempt follows, with the same webhook-id.
            log.warning("could not record webhook attempt: %s", exc, extra=extra)
            return
        if attempt.retry_in_s is not None:
            due = time.monotonic() + attempt.retry_in_s
            self._retry_due = due if self._retry_due is None else min(self._retry_due, due)
        if attempt.outcome == "delivered":
            log.info(
                "webhook %s delivered (attempt %s)", delivery.type, attempt.attempt, extra=extra
            )
        elif attempt.outcome == "pending":
            log.info(
                "webhook %s attempt %s failed (%s); retrying in %.1f s",
                delivery.type,
                attempt.attempt,
                attempt.error,
                attempt.retry_in_s,
                extra=extra,
            )
        else:
            log.warning(
                "webhook %s %s after attempt %s: %s",
                delivery.type,
                attempt.outcome,
                attempt.attempt,
                attempt.error,
                extra=extra,
            )
        for listener in self.listeners:
            listener(attempt)

    async def attempt(self, delivery: Delivery) -> Attempt:
        """POST one delivery once and judge the answer; nothing is written to the database."""
        started = time.monotonic()

        def result(
            outcome: str,
            error: str | None,
            status_code: int | None = None,
            retry_after: float | None = None,
        ) -> Attempt:
            retry_in_s = None
            if outcome == "pending":
                retry_in_s = next_try_in_s(
                    delivery.attempt, self._settings.webhook_schedule_s, retry_after
                )
                if retry_in_s is None:
                    outcome = "failed"
                    error = f"{error}; gave up after {delivery.attempt} attempts"
            return Attempt(
                delivery_id=delivery.id,
                job_id=delivery.job_id,
                attempt=delivery.attempt,
                outcome=outcome,
                status_code=status_code,
                duration_ms=round((time.monotonic() - started) * 1000),
                error=error,
                retry_in_s=retry_in_s,
            )

        resolved: list[bool] = []

        async def resolve(host: str) -> list[str]:
            resolved.append(False)
            addresses = await _lookup(host)
            resolved[-1] = True
            return addresses

        verdict = await self._policy.check_url(delivery.url, resolve=resolve)
        if not verdict.allowed:
            if resolved and not all(resolved):
                return result("pending", verdict.reason.removeprefix("blocked: "))
            return result("failed", f"not sent, address not allowed: {verdict.reason}")
        try:
            body = await self.body(delivery)
        except (StorageError, FileNotFoundError) as exc:
            return result("pending", f"could not make the download URL: {exc}")
        try:
            signing = await self.signing_secrets(delivery.tenant)
        except DB_OR_QUERY_ERRORS as exc:
            return result("pending", f"could not read the signing secret: {_describe(exc)}")
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "webhook-id": str(delivery.id),
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign_all(signing, str(delivery.id), timestamp, body),
        }
        timeout_s = self._settings.webhook_timeout_s
        try:
            async with self._http.post(
                URL(delivery.url, encoded=True),
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                status = response.status
                snippet = (await response.content.read(MAX_ERROR_BODY_CHARS * 4)).decode(
                    "utf-8", "replace"
                )
                retry_after = retry_after_s(response.headers.get("Retry-After"))
        except TimeoutError:
            return result("pending", f"timed out after {timeout_s:g} s")
        except (aiohttp.ClientError, OSError) as exc:
            blocked = _blocked_cause(exc)
            if blocked is not None:
                return result("failed", f"not sent, address not allowed: {blocked}")
            return result("pending", _describe(exc))
        if 200 <= status < 300:
            return result("delivered", None, status)
        error = f"HTTP {status}"
        shown = " ".join(snippet.split())[:MAX_ERROR_BODY_CHARS]
        if shown:
            error += f": {shown}"
        if status == 410:
            return result(
                "disabled", f"{error} (the receiver asked for no more deliveries)", status
            )
        if status == 429 or status >= 500:
            return result("pending", error, status, retry_after)
        if 300 <= status < 400:
            error += " (redirects are not followed; configure the final URL)"
        return result("failed", error, status)

    async def signing_secrets(self, tenant: str) -> list[str]:
        """The tenant's own secrets (both during a rotation's overlap), read for every
        delivery so that a rotation takes effect at once; the deployment's secret for the
        dev-mode tenant, which has no key."""
        found = await tenants.webhook_secrets(
            self._pool, tenant, overlap_s=self._settings.webhook_rotation_overlap_s
        )
        return [self._settings.webhook_secret] if found is None else found.signing

    async def body(self, delivery: Delivery) -> bytes:
        """`{type, timestamp, data: {job}}`; the job as the API shows it, with a fresh URL (a
        batch's delivery: `data: {batch}`, its combined file's URL fresh likewise)."""
        # Minted by the server for the tenant's own endpoint, not with a key: revoking the key
        # that submitted the job does not void its URLs (they expire as any link does). Local
        # storage signs a path on this server; the receiver gets the whole URL.
        present = downloads.present if delivery.job_id is not None else downloads.present_batch
        subject = await present(
            dict(delivery.payload),
            delivery.tenant,
            storage=self._storage,
            settings=self._settings,
            minted_by=NO_KEY,
        )
        message = {
            "type": delivery.type,
            "timestamp": delivery.created_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
            "data": {"job" if delivery.job_id is not None else "batch": subject},
        }
        return json.dumps(message, separators=(",", ":")).encode()


async def summary(
    conn: asyncpg.Pool | asyncpg.Connection, job_id: uuid.UUID, tenant: str
) -> list[dict[str, Any]]:
    """The job's deliveries for `GET /v1/jobs/{id}`: status, attempts, last answer, next try."""
    value: list[dict[str, Any]] = await conn.fetchval(query("job_webhooks"), job_id, tenant)
    return value
