"""Webhooks: Standard Webhooks signatures, and the sender that drains the delivery outbox.

Receivers verify deliveries with the standardwebhooks package (`Webhook(secret).verify`), the
library that signs them here.

Rows of `webhook_deliveries` are written by the trigger that follows every event row, in the
transaction of the job's state change (0010_event_side_effects.sql), and for a tenant's own
events (template.published) one per endpoint of the tenant (server/delivery/endpoints.py), in
the transaction that logs the event. Any process may send: its sender is a handler on the
lease consumer (server/queue/lease.py), which claims due rows with SKIP LOCKED and a lease (a
lease that ran out is claimed again, with the same webhook-id), and retries an attempt that did
not deliver on the webhook schedule; the sender POSTs outside any transaction, then records
the attempt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import email.utils
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

from server import netpolicy, tracing
from server.access import tenants
from server.access.signing import NO_KEY
from server.delivery import downloads
from server.errors import DB_OR_QUERY_ERRORS, StorageError, jittered
from server.files.storage import Storage
from server.netpolicy import NetworkPolicy
from server.queue import lease
from server.queue import listener as notifications
from server.queue.lease import Consumer, Failed, Lease, Outcome, Queries, Stage
from server.settings import Settings
from server.sql import query

log = logging.getLogger(__name__)

#: How much of a failed response's body is kept in `last_error`.
MAX_ERROR_BODY_CHARS = 200
#: Lease beyond the POST timeout: DNS check, presigning and recording the attempt.
LEASE_MARGIN_S = 30.0
SHUTDOWN_GRACE_S = 5.0
USER_AGENT = "Pressroom-Webhooks/1"
#: The time limit of one POST: receivers are told to answer 2xx at once and work later.
TIMEOUT_S = 10.0
#: POSTs at once from one process: receivers are other teams' servers, and every process sends.
CONCURRENCY = 8
#: Waits before each retry, 5 s to 10 h: the last of 8 attempts comes about 28 hours in, so a
#: receiver down for a day still gets every event (the Standard Webhooks guidance).
SCHEDULE_S: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)


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

#: What adds a subject's links and fresh download URLs at send time, by subject.
PRESENTERS = {"job": downloads.present, "batch": downloads.present_batch}


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    """One claimed attempt at one outbox row."""

    id: uuid.UUID
    #: None for a batch's delivery (batch.done of a combined batch) and a tenant's (its own
    #: events, naming no job and no batch: template.published, to its endpoints).
    job_id: uuid.UUID | None
    tenant: str
    url: str
    type: str
    payload: dict[str, Any]
    attempt: int
    created_at: dt.datetime
    batch_id: uuid.UUID | None = None
    #: The job's traceparent, which the delivery's span continues (None: none stored).
    traceparent: str | None = None

    @property
    def key(self) -> uuid.UUID:
        return self.id

    @property
    def subject(self) -> str:
        """What it carries, the name its body's `data` gives it: job, batch or template."""
        return self.type.partition(".")[0]

    def _about(self, job_key: str, batch_key: str) -> dict[str, str]:
        """The job or the batch it is about, under these names (a tenant's: neither)."""
        if self.job_id is not None:
            return {job_key: str(self.job_id)}
        if self.batch_id is not None:
            return {batch_key: str(self.batch_id)}
        return {}

    @property
    def log_extra(self) -> dict[str, str]:
        subject = self._about("job_id", "batch_id")
        return {**subject, "tenant": self.tenant, "webhook_id": str(self.id)}

    @property
    def span_attributes(self) -> dict[str, tracing.Attribute]:
        subject = self._about(tracing.JOB_ID, tracing.BATCH_ID)
        return {
            **subject,
            tracing.TENANT: self.tenant,
            tracing.WEBHOOK_ID: str(self.id),
            tracing.EVENT: self.type,
            tracing.WEBHOOK_ATTEMPT: self.attempt,
        }


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


class Undelivered(Failed):
    """A POST that did not deliver: tried again on network errors, 429 and 5xx (`retryable`),
    given up on otherwise; a 410 also stops the other deliveries to its URL (`disabled`)."""

    def __init__(
        self,
        error: str,
        *,
        retryable: bool,
        duration_ms: int,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        disabled: bool = False,
    ) -> None:
        super().__init__(error, retryable=retryable, retry_after_s=retry_after_s)
        self.duration_ms = duration_ms
        self.status_code = status_code
        self.disabled = disabled


class WebhookSender:
    """The outbox sender of one process: a handler on the lease consumer
    (server/queue/lease.py) that POSTs each claimed delivery and records the attempt."""

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
        lease_s = TIMEOUT_S + LEASE_MARGIN_S
        self.leases: Consumer[Delivery] = Consumer(
            # No heartbeat: the lease outlasts a POST and its checks.
            Queries(claim=self._claim, fail=self._fail, release=self._release),
            self._send,
            lease.Config(
                name="webhook",
                slots=CONCURRENCY,
                lease_s=lease_s,
                poll_interval_s=notifications.POLL_INTERVAL_S,
                backoff=self._next_try_in_s,
                grace_s=min(SHUTDOWN_GRACE_S, lease_s),
            ),
            holder=self.sender_id,
        )
        #: Called with every recorded attempt (tests, metrics).
        self.listeners: list[Callable[[Attempt], None]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, pool: asyncpg.Pool, storage: Storage, policy: NetworkPolicy, settings: Settings
    ) -> AsyncIterator[WebhookSender]:
        """A sender with its own HTTP client, closed on exit."""
        async with aiohttp.ClientSession(
            connector=guarded_connector(policy, limit=CONCURRENCY),
            headers={"User-Agent": USER_AGENT},
            trace_configs=tracing.client_trace_configs(),  # each POST's span and traceparent
        ) as http:
            yield cls(pool, storage, policy, settings, http)

    def wake(self) -> None:
        """A delivery was written (NOTIFY on pressroom_webhooks): claim now, not at the poll."""
        self.leases.wake()

    def _next_try_in_s(self, attempt: int, retry_after_s: float | None) -> float | None:
        return next_try_in_s(attempt, SCHEDULE_S, retry_after_s)

    # --- The outbox SQL the consumer calls --------------------------------------------------

    async def _claim(self, limit: int, holder: str, lease_s: float) -> list[Delivery]:
        rows = await self._pool.fetch(query("claim_webhooks"), limit, holder, lease_s)
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
                traceparent=row["traceparent"],
            )
            for row in rows
        ]

    async def _release(self, ids: list[uuid.UUID], holder: str) -> int:
        status: str = await self._pool.execute(query("release_webhooks"), ids, holder)
        return int(status.rsplit(" ", 1)[-1])

    async def _fail(
        self, delivery: Delivery, holder: str, failure: Failed, retry_in_s: float | None
    ) -> Outcome | None:
        undelivered = failure if isinstance(failure, Undelivered) else None
        error, outcome = failure.error, "pending"
        if undelivered is not None and undelivered.disabled:
            outcome = "disabled"
        elif retry_in_s is None:
            outcome = "failed"
            if failure.retryable:
                error = f"{error}; gave up after {delivery.attempt} attempts"
        attempt = Attempt(
            delivery_id=delivery.id,
            job_id=delivery.job_id,
            attempt=delivery.attempt,
            outcome=outcome,
            status_code=undelivered.status_code if undelivered else None,
            duration_ms=undelivered.duration_ms if undelivered else 0,
            error=error,
            retry_in_s=retry_in_s,
        )
        if not await self._record(attempt, holder):
            return None
        return Outcome.RETRYING if outcome == "pending" else Outcome.FAILED

    async def _record(self, attempt: Attempt, holder: str) -> bool:
        """Record one attempt: only the holder of the delivery's lease moves it on, and the
        attempt is logged either way."""
        recorded: bool = await self._pool.fetchval(
            query("record_webhook_attempt"),
            attempt.delivery_id,
            attempt.attempt,
            holder,
            attempt.status_code,
            attempt.duration_ms,
            attempt.error,
            attempt.outcome,
            attempt.retry_in_s,
        )
        for listener in self.listeners:
            listener(attempt)
        return recorded

    # --- One attempt ----------------------------------------------------------------------

    async def _send(self, held: Lease[Delivery]) -> Outcome:
        delivery = held.item
        held.enter(Stage.RUNNING)  # given the grace period at shutdown, as the POST may be out
        with tracing.delivery(delivery.traceparent, delivery.span_attributes):
            attempt = await self.post(delivery)
        if not await held.record(lambda: self._record(attempt, self.sender_id)):
            return Outcome.LATE
        log.info(
            "webhook %s delivered (attempt %s)",
            delivery.type,
            delivery.attempt,
            extra=delivery.log_extra,
        )
        return Outcome.DONE

    async def post(self, delivery: Delivery) -> Attempt:
        """POST one delivery once and judge the answer: the delivered attempt, or Undelivered
        saying why not. Nothing is written to the database."""
        started = time.monotonic()

        def undelivered(
            error: str,
            *,
            retryable: bool,
            status_code: int | None = None,
            retry_after_s: float | None = None,
            disabled: bool = False,
        ) -> Undelivered:
            return Undelivered(
                error,
                retryable=retryable,
                duration_ms=round((time.monotonic() - started) * 1000),
                status_code=status_code,
                retry_after_s=retry_after_s,
                disabled=disabled,
            )

        verdict = await self._policy.check_url(delivery.url)
        if verdict.unresolved:
            raise undelivered(verdict.reason, retryable=True)  # DNS may answer the next try
        if not verdict.allowed:
            refused = verdict.reason.removeprefix("blocked: ")
            raise undelivered(f"not sent, address not allowed: {refused}", retryable=False)
        try:
            body = await self.body(delivery)
        except (StorageError, FileNotFoundError) as exc:
            raise undelivered(f"could not make the download URL: {exc}", retryable=True) from exc
        try:
            signing = await self.signing_secrets(delivery.tenant)
        except DB_OR_QUERY_ERRORS as exc:
            error = f"could not read the signing secret: {_describe(exc)}"
            raise undelivered(error, retryable=True) from exc
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "webhook-id": str(delivery.id),
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign_all(signing, str(delivery.id), timestamp, body),
        }
        timeout_s = TIMEOUT_S
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
            raise undelivered(f"timed out after {timeout_s:g} s", retryable=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            blocked = _blocked_cause(exc)
            if blocked is not None:
                error = f"not sent, address not allowed: {str(blocked).removeprefix('blocked: ')}"
                raise undelivered(error, retryable=False) from exc
            if isinstance(exc, aiohttp.ClientConnectorDNSError):
                error = f"{netpolicy.UNRESOLVED} {exc.host}"  # as the check above says it
                raise undelivered(error, retryable=True) from exc
            raise undelivered(_describe(exc), retryable=True) from exc
        if 200 <= status < 300:
            return Attempt(
                delivery_id=delivery.id,
                job_id=delivery.job_id,
                attempt=delivery.attempt,
                outcome="delivered",
                status_code=status,
                duration_ms=round((time.monotonic() - started) * 1000),
                error=None,
            )
        error = f"HTTP {status}"
        shown = " ".join(snippet.split())[:MAX_ERROR_BODY_CHARS]
        if shown:
            error += f": {shown}"
        if status == 410:
            error += " (the receiver asked for no more deliveries)"
            raise undelivered(error, retryable=False, status_code=status, disabled=True)
        if status == 429 or status >= 500:
            raise undelivered(error, retryable=True, status_code=status, retry_after_s=retry_after)
        if 300 <= status < 400:
            error += " (redirects are not followed; configure the final URL)"
        raise undelivered(error, retryable=False, status_code=status)

    async def signing_secrets(self, tenant: str) -> list[str]:
        """The tenant's own secrets (both during a rotation's overlap), read for every
        delivery so that a rotation takes effect at once; the deployment's secret for the
        dev-mode tenant, which has no key."""
        found = await tenants.webhook_secrets(
            self._pool, tenant, overlap_s=tenants.ROTATION_OVERLAP_S
        )
        return [self._settings.webhook_secret] if found is None else found.signing

    async def body(self, delivery: Delivery) -> bytes:
        """`{type, timestamp, data: {job}}`; the job as the API shows it, with a fresh URL (a
        batch's delivery: `data: {batch}`, its combined file's URL fresh likewise; a tenant's:
        `data: {template}`, as its event carries it)."""
        # Minted by the server for the tenant's own endpoint, not with a key: revoking the key
        # that submitted the job does not void its URLs (they expire as any link does). Local
        # storage signs a path on this server; the receiver gets the whole URL.
        shown: dict[str, Any] = dict(delivery.payload)
        present = PRESENTERS.get(delivery.subject)  # none for a tenant's event: it has no file
        if present is not None:
            shown = await present(
                shown,
                delivery.tenant,
                storage=self._storage,
                settings=self._settings,
                minted_by=NO_KEY,
            )
        message = {
            "type": delivery.type,
            "timestamp": delivery.created_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
            "data": {delivery.subject: shown},
        }
        return json.dumps(message, separators=(",", ":")).encode()


async def summary(
    conn: asyncpg.Pool | asyncpg.Connection, job_id: uuid.UUID, tenant: str
) -> list[dict[str, Any]]:
    """The job's deliveries for `GET /v1/jobs/{id}`: status, attempts, last answer, next try."""
    value: list[dict[str, Any]] = await conn.fetchval(query("job_webhooks"), job_id, tenant)
    return value
