"""Webhooks end to end: the real app, a real receiver on 127.0.0.1, the outbox in PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import standardwebhooks
from aiohttp import web
from aiohttp.test_utils import TestServer
from jsonschema import Draft202012Validator
from yarl import URL

from server.access import apikeys, tenants
from server.delivery import webhooks
from server.delivery.webhooks import Attempt, BlockedAddress, guarded_connector, sign
from server.errors import PermanentError
from server.keys import METRICS, POOL, SETTINGS, WEBHOOKS
from server.netpolicy import NetworkPolicy
from server.queue import jobs
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer, minimal_pdf, page_contents
from tests.processes import admin_cli
from tests.sse import collect
from tests.timings import quick

SECRET = "whsec_" + base64.b64encode(b"pressroom webhook test secret 32").decode()
#: Quick retries so a test sees several attempts; one more attempt than entries.
SCHEDULE = (0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1)
WAIT_S = 15.0
Refused = standardwebhooks.webhooks.WebhookVerificationError


def verify(secret: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """What a receiver does, as the README shows: the standardwebhooks library checks it."""
    payload: dict[str, Any] = standardwebhooks.Webhook(secret).verify(body, headers)
    return payload


@dataclasses.dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


class Receiver:
    """A webhook endpoint that answers each request with the next scripted step.

    A step is a status code, (status, headers), or "hang" (no answer until `release`)."""

    def __init__(self) -> None:
        self.script: list[Any] = []
        self.received: list[Received] = []
        self.arrived: asyncio.Queue[Received] = asyncio.Queue()
        self.release = asyncio.Event()
        self._server: TestServer | None = None

    async def start(self, port: int | None = None) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._server = TestServer(app, host="127.0.0.1", port=port)
        await self._server.start_server()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.port}/hook"

    async def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            await self._server.close()

    async def _handle(self, request: web.Request) -> web.Response:
        received = Received(dict(request.headers), await request.read(), time.monotonic())
        self.received.append(received)
        self.arrived.put_nowait(received)
        step = self.script.pop(0) if self.script else 200
        if step == "hang":
            await self.release.wait()
            return web.Response(status=200)
        status, headers = step if isinstance(step, tuple) else (step, {})
        return web.Response(status=status, text=f"answer {status}", headers=headers)

    async def next(self) -> Received:
        return await asyncio.wait_for(self.arrived.get(), WAIT_S)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    await receiver.start()
    yield receiver
    await receiver.stop()


class Hooked:
    """An app with its sender's attempts observable in order."""

    def __init__(self, app: RunningApp) -> None:
        self.app = app
        self.attempts: asyncio.Queue[Attempt] = asyncio.Queue()
        if WEBHOOKS in app.app:
            app.app[WEBHOOKS].listeners.append(self.attempts.put_nowait)

    async def next_attempt(self) -> Attempt:
        return await asyncio.wait_for(self.attempts.get(), WAIT_S)

    async def until_final(self) -> list[Attempt]:
        """Every attempt up to and including the one that settles the delivery."""
        seen = [await self.next_attempt()]
        while seen[-1].outcome == "pending":
            seen.append(await self.next_attempt())
        return seen

    async def submit(self, url: str, **fields: Any) -> dict[str, Any]:
        body = {"template": "<p>Hi {{name}}</p>", "data": {"name": "Ana"}, "webhook_url": url}
        async with self.app.http.post(self.app.url("/v1/jobs"), json={**body, **fields}) as resp:
            assert resp.status == 202, await resp.text()
            job: dict[str, Any] = await resp.json()
            return job

    async def wait_final(self, job_id: str) -> dict[str, Any]:
        messages = await collect(self.app.http, self.app.url(f"/v1/jobs/{job_id}/events"))
        job: dict[str, Any] = messages[-1].json["job"]
        return job

    async def get(self, job_id: str) -> dict[str, Any]:
        async with self.app.http.get(self.app.url(f"/v1/jobs/{job_id}")) as resp:
            assert resp.status == 200
            job: dict[str, Any] = await resp.json()
            return job

    async def attempt_rows(self, delivery_id: str) -> list[dict[str, Any]]:
        rows = await self.app.app[POOL].fetch(
            "SELECT attempt, status_code, duration_ms, error FROM webhook_attempts"
            " WHERE delivery_id = $1 ORDER BY attempt",
            delivery_id,
        )
        return [dict(row) for row in rows]


StartHooked = Callable[..., Any]


async def due_shortly(hooked: Hooked) -> None:
    """Hold the outbox a moment, so the next app's sender starts on it once it is observed."""
    await hooked.app.app[POOL].execute(
        "UPDATE webhook_deliveries SET next_attempt_at = now() + interval '0.5 second'"
    )


@pytest.fixture
def start_hooked(start_app: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> StartHooked:
    """Start an app that sends webhooks on a quick schedule; `sends=False`, one whose sender
    never runs (`pressroom web`'s), `schedule_s` and `timeout_s` for every sender."""
    quick(monkeypatch, SCHEDULE_S=SCHEDULE)

    async def start(
        renderer: FakeRenderer | None = None,
        render_slots: int = 1,
        *,
        sends: bool = True,
        env: dict[str, str] | None = None,
        **timings: Any,
    ) -> Hooked:
        quick(monkeypatch, **timings)
        app = await start_app(
            renderer=renderer if render_slots else None,
            render_slots=render_slots,
            run_background=sends,
            env={
                "PRESSROOM_ALLOW_HOSTS": "127.0.0.1",
                "PRESSROOM_WEBHOOK_SECRET": SECRET,
                **(env or {}),
            },
        )
        return Hooked(app)

    return start


async def test_a_combined_batch_posts_batch_done_with_its_file(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    hooked = await start_hooked(FakeRenderer())
    items = [{"key": f"w-{n}", "template": "<p>{{n}}</p>", "data": {"n": n}} for n in range(2)]
    body = {"items": items, "webhook_url": receiver.url, "combine": True}
    async with hooked.app.http.post(hooked.app.url("/v1/batches"), json=body) as resp:
        assert resp.status == 202
        batch = await resp.json()
    # The items' job.done, then the batch's batch.done, once its file is stored.
    payloads = [
        verify(SECRET, r.headers, r.body) for r in [await receiver.next() for _ in range(3)]
    ]
    assert sorted(p["type"] for p in payloads) == ["batch.done", "job.done", "job.done"]
    done = next(p for p in payloads if p["type"] == "batch.done")
    assert set(done["data"]) == {"batch"}
    sent = done["data"]["batch"]
    assert sent["id"] == batch["id"] and sent["combined"]["status"] == "done"
    async with hooked.app.http.get(sent["combined"]["url"]) as resp:
        assert resp.status == 200 and (await resp.read()).startswith(b"%PDF-")
    # A batch without combine posts its items' events only, as before.
    plain = {"items": [{**items[0], "key": "w-plain"}], "webhook_url": receiver.url}
    async with hooked.app.http.post(hooked.app.url("/v1/batches"), json=plain) as resp:
        assert resp.status == 202
    assert verify(SECRET, *(lambda r: (r.headers, r.body))(await receiver.next()))["type"] == (
        "job.done"
    )
    rows = await hooked.app.app[POOL].fetch(
        "SELECT type FROM webhook_deliveries ORDER BY created_at"
    )
    assert [row["type"] for row in rows].count("batch.done") == 1


async def test_every_delivery_is_as_the_webhooks_of_openapi_json_describe_it(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    """Each kind of delivery (job.done, job.failed, job.cancelled, batch.done), its headers
    and its body, validates against its webhook in the description."""
    renderer = FakeRenderer()
    hooked = await start_hooked(renderer)
    async with hooked.app.http.get(hooked.app.url("/v1/openapi.json")) as resp:
        document = await resp.json()
    items = [{"key": f"d-{n}", "template": "<p>{{n}}</p>", "data": {"n": n}} for n in range(2)]
    body = {"items": items, "webhook_url": receiver.url, "combine": True}
    async with hooked.app.http.post(hooked.app.url("/v1/batches"), json=body) as resp:
        assert resp.status == 202
    received = [await receiver.next() for _ in range(3)]  # two job.done, then batch.done
    renderer.fail_with = PermanentError("the page cannot be printed")
    await hooked.submit(receiver.url)
    received.append(await receiver.next())
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    job = await hooked.submit(receiver.url, run_at=later)
    async with hooked.app.http.post(hooked.app.url(f"/v1/jobs/{job['id']}/cancel")) as resp:
        assert resp.status == 200
    received.append(await receiver.next())

    kinds = []
    for delivery in received:
        payload = verify(SECRET, delivery.headers, delivery.body)
        kinds.append(payload["type"])
        hook = document["webhooks"][payload["type"]]["post"]
        for parameter in hook["parameters"]:
            value = delivery.headers[parameter["name"]]
            errors = Draft202012Validator(parameter["schema"]).iter_errors(value)
            assert [e.message for e in errors] == [], parameter["name"]
        schema = hook["requestBody"]["content"]["application/json"]["schema"]
        checker = Draft202012Validator(
            {**schema, "components": document["components"]},
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        )
        assert [e.message for e in checker.iter_errors(payload)] == [], payload["type"]
    assert sorted(kinds) == sorted(["job.done", "job.done", "batch.done", "job.failed",
                                    "job.cancelled"])  # fmt: skip
    # template.published goes to a tenant's own endpoints: test_tenant_webhooks checks it.
    assert set(kinds) == set(document["webhooks"]) - {"template.published"}


async def test_job_done_is_delivered_signed_and_verifiable(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    hooked = await start_hooked(FakeRenderer())
    job = await hooked.submit(receiver.url)

    received = await receiver.next()
    [attempt] = await hooked.until_final()

    assert attempt.outcome == "delivered" and attempt.status_code == 200
    headers = received.headers
    assert headers["Content-Type"] == "application/json"
    assert headers["webhook-signature"].startswith("v1,")
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 30
    payload = verify(SECRET, headers, received.body)
    assert payload["type"] == "job.done"
    assert dt.datetime.fromisoformat(payload["timestamp"].replace("Z", "+00:00"))
    sent = payload["data"]["job"]
    assert sent["id"] == job["id"] and sent["status"] == "done" and sent["pages"] == 1
    assert sent["links"]["self"] == f"/v1/jobs/{job['id']}"
    # Local storage: the signed link is made absolute with PRESSROOM_PUBLIC_URL (or host:port).
    public = hooked.app.app[SETTINGS].public_base_url
    assert sent["url"].startswith(f"{public}/v1/jobs/{job['id']}/pdf?")
    link = URL(sent["url"])
    async with hooked.app.http.get(hooked.app.url(link.raw_path_qs)) as resp:
        assert resp.status == 200
        assert page_contents(await resp.read()) == page_contents(minimal_pdf())

    shown = await hooked.get(job["id"])
    [summary] = shown["webhooks"]
    assert summary["id"] == headers["webhook-id"]
    assert summary["type"] == "job.done" and summary["status"] == "delivered"
    assert summary["attempts"] == 1 and summary["last_status_code"] == 200
    assert summary["last_error"] is None and summary["next_attempt_at"] is None


async def test_tampered_body_or_replayed_old_delivery_fails_verification(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    hooked = await start_hooked(FakeRenderer())
    await hooked.submit(receiver.url)
    received = await receiver.next()
    headers, body = received.headers, received.body

    tampered = body.replace(b'"status":"done"', b'"status":"failed"')
    assert tampered != body
    with pytest.raises(Refused):
        verify(SECRET, headers, tampered)

    # A captured delivery replayed an hour later, even with a signature that matches its time.
    old = int(time.time()) - 3600
    replayed = {
        **headers,
        "webhook-timestamp": str(old),
        "webhook-signature": sign(SECRET, headers["webhook-id"], old, body),
    }
    with pytest.raises(Refused, match="too old"):
        verify(SECRET, replayed, body)


async def submit_with_key(hooked: Hooked, key: str, url: str) -> dict[str, Any]:
    body = {"template": "<p>Hi</p>", "webhook_url": url}
    headers = {"Authorization": f"Bearer {key}"}
    async with hooked.app.http.post(hooked.app.url("/v1/jobs"), json=body, headers=headers) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


def refused_by(secret: str, received: Received) -> bool:
    """Whether a receiver refuses the delivery with this secret."""
    with pytest.raises(Refused):
        verify(secret, received.headers, received.body)
    return True


async def test_each_tenant_signs_its_deliveries_with_a_secret_of_its_own(
    start_hooked: StartHooked, receiver: Receiver, pool: asyncpg.Pool
) -> None:
    _acme_row, acme_key = await apikeys.create_key(pool, "acme")
    _bob_row, bob_key = await apikeys.create_key(pool, "bob")
    hooked = await start_hooked(FakeRenderer())
    # The dev-mode tenant has no key, so no secret of its own: PRESSROOM_WEBHOOK_SECRET signs.
    assert await tenants.webhook_secrets(pool, "default", overlap_s=0) is None
    secrets = {}
    for tenant in ("acme", "bob"):
        mine = await tenants.webhook_secrets(pool, tenant, overlap_s=0)
        assert mine is not None
        secrets[tenant] = mine.current
    assert secrets["acme"] != secrets["bob"] and SECRET not in secrets.values()

    for tenant, key, other in (("acme", acme_key, "bob"), ("bob", bob_key, "acme")):
        job = await submit_with_key(hooked, key, receiver.url)
        received = await receiver.next()
        payload = verify(secrets[tenant], received.headers, received.body)
        assert payload["data"]["job"]["id"] == job["id"]
        assert " " not in received.headers["webhook-signature"], "one secret, one signature"
        # Neither the other tenant's secret nor the deployment's can have made it.
        assert refused_by(secrets[other], received) and refused_by(SECRET, received)


async def test_a_rotated_secret_signs_alongside_the_old_one_until_the_overlap_ends(
    start_hooked: StartHooked, receiver: Receiver, pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    hooked = await start_hooked(FakeRenderer())
    before = await tenants.webhook_secrets(pool, "acme", overlap_s=0)
    assert before is not None
    old = before.current
    await submit_with_key(hooked, key, receiver.url)
    first = await receiver.next()
    assert verify(old, first.headers, first.body)

    code, out, err = await admin_cli(
        dsn, tmp_path / "cli", "tenants", "webhook-secret", "acme", "--rotate"
    )
    assert code == 0, err
    new = out.strip()
    await submit_with_key(hooked, key, receiver.url)
    during = await receiver.next()
    headers = during.headers
    signatures = headers["webhook-signature"].split(" ")
    at = int(headers["webhook-timestamp"])
    msg_id = headers["webhook-id"]
    assert signatures == [sign(new, msg_id, at, during.body), sign(old, msg_id, at, during.body)]
    for secret in (old, new):  # receivers that know either one accept it
        assert verify(secret, headers, during.body)

    # The overlap (tenants.ROTATION_OVERLAP_S, a day) ends: moved into the past
    # rather than waited out.
    await pool.execute("UPDATE tenants SET rotated_at = now() - interval '1 day 1 second'")
    await submit_with_key(hooked, key, receiver.url)
    after = await receiver.next()
    assert " " not in after.headers["webhook-signature"]
    assert verify(new, after.headers, after.body)
    assert refused_by(old, after)


async def test_receiver_down_then_up_gets_it_with_the_same_id(start_hooked: StartHooked) -> None:
    # Bound but not listening: connections to the port are refused until the receiver starts.
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    port = blocker.getsockname()[1]
    # Retries for several seconds, however slowly the receiver comes up on a busy machine.
    hooked = await start_hooked(FakeRenderer(), SCHEDULE_S=(0.05,) + (0.2,) * 30)
    job = await hooked.submit(f"http://127.0.0.1:{port}/hook")

    first, second = await hooked.next_attempt(), await hooked.next_attempt()
    assert first.outcome == second.outcome == "pending"
    assert first.status_code is None and "connect" in (first.error or "").lower()
    shown = await hooked.get(job["id"])
    assert shown["webhooks"][0]["status"] == "pending"
    assert shown["webhooks"][0]["next_attempt_at"] is not None
    blocker.close()
    receiver = Receiver()
    await receiver.start(port)
    try:
        received = await receiver.next()
        settled = (await hooked.until_final())[-1]
    finally:
        await receiver.stop()

    assert settled.outcome == "delivered"
    assert settled.delivery_id == first.delivery_id
    assert received.headers["webhook-id"] == str(first.delivery_id)
    assert verify(SECRET, received.headers, received.body)["data"]["job"]["id"] == job["id"]
    rows = await hooked.attempt_rows(received.headers["webhook-id"])
    assert len(rows) == settled.attempt >= 3
    assert [row["status_code"] for row in rows] == [None] * (len(rows) - 1) + [200]
    assert all(row["error"] for row in rows[:-1])


async def test_500_three_times_then_200_records_four_attempts(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    receiver.script = [500, 500, 500]
    hooked = await start_hooked(FakeRenderer())
    job = await hooked.submit(receiver.url)

    attempts = await hooked.until_final()

    assert [a.outcome for a in attempts] == ["pending"] * 3 + ["delivered"]
    assert len(receiver.received) == 4
    ids = {r.headers["webhook-id"] for r in receiver.received}
    assert ids == {str(attempts[0].delivery_id)}
    for request in receiver.received:
        verify(SECRET, request.headers, request.body)
    rows = await hooked.attempt_rows(ids.pop())
    assert [(r["attempt"], r["status_code"]) for r in rows] == [
        (1, 500),
        (2, 500),
        (3, 500),
        (4, 200),
    ]
    assert rows[0]["error"] == "HTTP 500: answer 500" and rows[3]["error"] is None
    assert all(r["duration_ms"] >= 0 for r in rows)
    [summary] = (await hooked.get(job["id"]))["webhooks"]
    assert summary["status"] == "delivered" and summary["attempts"] == 4
    assert summary["last_status_code"] == 200 and summary["last_error"] is None
    metrics = hooked.app.app[METRICS].registry
    assert metrics.get_sample_value("pressroom_webhook_attempts_total", {"outcome": "pending"}) == 3
    assert (
        metrics.get_sample_value("pressroom_webhook_attempts_total", {"outcome": "delivered"}) == 1
    )


async def test_429_retry_after_is_honoured(start_hooked: StartHooked, receiver: Receiver) -> None:
    receiver.script = [(429, {"Retry-After": "1"})]
    hooked = await start_hooked(FakeRenderer(), SCHEDULE_S=(0.05, 5))
    await hooked.submit(receiver.url)

    attempts = await hooked.until_final()

    assert [(a.outcome, a.status_code) for a in attempts] == [("pending", 429), ("delivered", 200)]
    assert attempts[0].retry_in_s == 1
    first, second = receiver.received
    assert second.at - first.at >= 0.9  # not the schedule's 0.05 s


async def test_hanging_receiver_times_out_and_is_retried(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    receiver.script = ["hang"]
    hooked = await start_hooked(FakeRenderer(), TIMEOUT_S=0.5)
    job = await hooked.submit(receiver.url)

    attempts = await hooked.until_final()

    assert [a.outcome for a in attempts] == ["pending", "delivered"]
    assert attempts[0].error == "timed out after 0.5 s" and attempts[0].status_code is None
    assert 500 <= attempts[0].duration_ms < 5000
    first, second = receiver.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    [summary] = (await hooked.get(job["id"]))["webhooks"]
    assert summary["status"] == "delivered" and summary["attempts"] == 2


async def test_410_disables_further_deliveries_for_the_job(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    receiver.script = [410]
    renderer = FakeRenderer()
    renderer.fail_with = PermanentError("the page cannot be printed")
    hooked = await start_hooked(renderer)
    job = await hooked.submit(receiver.url)
    [attempt] = await hooked.until_final()
    assert attempt.outcome == "disabled" and attempt.status_code == 410

    renderer.fail_with = None
    async with hooked.app.http.post(hooked.app.url(f"/v1/jobs/{job['id']}/retry")) as resp:
        assert resp.status == 202
    assert (await hooked.wait_final(job["id"]))["status"] == "done"

    shown = await hooked.get(job["id"])
    assert [(w["type"], w["status"]) for w in shown["webhooks"]] == [("job.failed", "disabled")]
    assert "410" in shown["webhooks"][0]["last_error"]
    assert len(receiver.received) == 1


async def test_400_is_final_without_retries(start_hooked: StartHooked, receiver: Receiver) -> None:
    receiver.script = [400]
    hooked = await start_hooked(FakeRenderer())
    job = await hooked.submit(receiver.url)

    [attempt] = await hooked.until_final()

    assert attempt.outcome == "failed" and attempt.status_code == 400
    [summary] = (await hooked.get(job["id"]))["webhooks"]
    assert summary["status"] == "failed" and summary["attempts"] == 1
    assert summary["last_status_code"] == 400 and summary["next_attempt_at"] is None
    assert summary["last_error"] == "HTTP 400: answer 400"
    assert len(receiver.received) == 1


async def test_address_blocked_at_delivery_time_fails_with_the_reason(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    # Accepted while 127.0.0.1 was allowed; by delivery time the policy (like DNS) has changed.
    submitter = await start_hooked(FakeRenderer(), sends=False)
    job = await submitter.submit(receiver.url)
    assert (await submitter.wait_final(job["id"]))["status"] == "done"
    await due_shortly(submitter)
    sender = await start_hooked(render_slots=0, env={"PRESSROOM_ALLOW_HOSTS": ""})

    [attempt] = await sender.until_final()

    assert attempt.outcome == "failed" and attempt.status_code is None
    assert attempt.error == (
        "not sent, address not allowed: 127.0.0.1 is a loopback address;"
        " allow it with PRESSROOM_ALLOW_HOSTS=127.0.0.1"
    )
    [summary] = (await sender.get(job["id"]))["webhooks"]
    assert summary["status"] == "failed" and "loopback" in summary["last_error"]
    assert receiver.received == []


async def test_a_host_that_does_not_resolve_is_retried_as_a_network_error(
    start_hooked: StartHooked,
) -> None:
    hooked = await start_hooked(FakeRenderer())
    # A name under .invalid never resolves (RFC 2606): a DNS failure, as any name may have one.
    job = await hooked.submit("https://hooks.example.invalid/pressroom")

    attempts = await hooked.until_final()

    tries = len(SCHEDULE) + 1
    assert [a.outcome for a in attempts] == ["pending"] * (tries - 1) + ["failed"]
    assert {a.error for a in attempts[:-1]} == {"could not resolve hooks.example.invalid"}
    assert attempts[-1].error == (
        f"could not resolve hooks.example.invalid; gave up after {tries} attempts"
    )
    [summary] = (await hooked.get(job["id"]))["webhooks"]
    assert summary["status"] == "failed" and summary["attempts"] == tries
    assert "blocked" not in summary["last_error"] and "not allowed" not in summary["last_error"]


async def test_state_change_survives_a_sender_that_never_ran(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    # The process that finished the job dies before any POST: its outbox row is all that is left.
    crashed = await start_hooked(FakeRenderer(), sends=False)
    job = await crashed.submit(receiver.url)
    assert (await crashed.wait_final(job["id"]))["status"] == "done"
    [pending] = (await crashed.get(job["id"]))["webhooks"]
    assert pending["status"] == "pending" and pending["attempts"] == 0
    await due_shortly(crashed)

    other = await start_hooked(render_slots=0)
    received = await receiver.next()

    assert received.headers["webhook-id"] == pending["id"]
    assert verify(SECRET, received.headers, received.body)["data"]["job"]["status"] == "done"
    [attempt] = await other.until_final()
    assert attempt.outcome == "delivered"


async def test_delivery_leased_by_a_dead_sender_is_sent_once_the_lease_ends(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    crashed = await start_hooked(FakeRenderer(), sends=False)
    job = await crashed.submit(receiver.url)
    await crashed.wait_final(job["id"])
    # A sender claimed the row (attempt 1) and died mid-POST; its lease still runs for 1 s.
    leased_at = time.monotonic()
    await crashed.app.app[POOL].execute(
        "UPDATE webhook_deliveries SET attempts = 1, locked_by = 'dead-sender',"
        " locked_until = now() + interval '1 second'"
    )

    other = await start_hooked(render_slots=0)
    received = await receiver.next()

    assert received.at - leased_at >= 0.9
    [attempt] = await other.until_final()
    assert attempt.outcome == "delivered" and attempt.attempt == 2
    [summary] = (await other.get(job["id"]))["webhooks"]
    assert summary["id"] == received.headers["webhook-id"] and summary["attempts"] == 2


async def test_cancelled_job_is_announced(start_hooked: StartHooked, receiver: Receiver) -> None:
    hooked = await start_hooked(FakeRenderer())
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    job = await hooked.submit(receiver.url, run_at=later)
    async with hooked.app.http.post(hooked.app.url(f"/v1/jobs/{job['id']}/cancel")) as resp:
        assert resp.status == 200

    received = await receiver.next()

    payload = verify(SECRET, received.headers, received.body)
    assert payload["type"] == "job.cancelled"
    assert payload["data"]["job"]["status"] == "cancelled" and "url" not in payload["data"]["job"]


async def test_job_failed_by_the_rescuer_is_announced(
    start_hooked: StartHooked, receiver: Receiver
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    hooked = await start_hooked(renderer)
    job = await hooked.submit(receiver.url, max_attempts=1)
    await asyncio.wait_for(renderer.started.wait(), WAIT_S)
    # The worker stops renewing its lease (as if its machine died) on its last attempt.
    await hooked.app.app[POOL].execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", job["id"]
    )
    await jobs.rescue_expired(hooked.app.app[POOL])

    received = await receiver.next()
    renderer.gate.set()

    payload = verify(SECRET, received.headers, received.body)
    assert payload["type"] == "job.failed"
    assert "worker lost" in payload["data"]["job"]["error"]


async def test_connections_never_reach_an_address_the_policy_blocks(receiver: Receiver) -> None:
    # What DNS says at connect time is checked again, so a name that passed the check and then
    # changed to a private address (DNS rebinding) is still refused. "localhost" stands in here.
    url = receiver.url.replace("127.0.0.1", "localhost")
    async with aiohttp.ClientSession(connector=guarded_connector(NetworkPolicy())) as http:
        with pytest.raises(aiohttp.ClientConnectorError) as raised:
            await http.post(url, data=b"{}")
    assert isinstance(raised.value.os_error, BlockedAddress)
    # ...which the sender records as a final failure, not a network error to retry.
    assert webhooks._blocked_cause(raised.value) is raised.value.os_error
    assert "localhost resolves to" in str(raised.value.os_error)
    assert "loopback" in str(raised.value.os_error)
    assert receiver.received == []

    allowed = NetworkPolicy(["127.0.0.1", "::1"])
    async with aiohttp.ClientSession(connector=guarded_connector(allowed)) as http:
        async with http.post(url, data=b"{}") as resp:
            assert resp.status == 200
    assert len(receiver.received) == 1
