"""Nothing is lost under faults: killed workers, killed Chromium, a restarted PostgreSQL,
cancellation mid-render, SIGTERM with renders in flight, and spaced retries."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil
import pytest

from server.errors import TransientError
from server.queue import jobs
from server.queue.jobs import NewJob
from server.render.browsers import browser_processes
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.pgcluster import Cluster
from tests.processes import PressroomProcess, free_port, wait_ready, wait_until
from tests.sse import collect, messages
from tests.timings import as_env, quick

pytestmark = [pytest.mark.faults, pytest.mark.slow]

# A page that takes about `ms` to become printable: scripts run in their own context.
SLOW_PAGE = """<div id="out">waiting</div><script>
  setTimeout(() => { const done = document.createElement("p"); done.id = "ready";
    done.textContent = "ready {{ n }}"; document.body.appendChild(done); }, {{ ms }});
</script>"""


def slow_job(n: int, ms: int) -> NewJob:
    return NewJob(
        tenant="default",
        template=SLOW_PAGE,
        data={"n": n, "ms": ms},
        options={"wait_for_selector": "#ready"},
        metadata={},
        max_attempts=10,
    )


def other_browsers() -> set[int]:
    """Chromium processes that other tests' browsers (module fixtures) own right now."""
    return {p.pid for p in browser_processes()}


def ours(others: set[int]) -> list[psutil.Process]:
    """Chromium processes started since `others` was taken: this test's app's browser."""
    return [p for p in browser_processes() if p.pid not in others]


async def no_zombies(others: set[int], timeout_s: float = 10.0) -> None:
    """Every dead child is reaped (by the browser's driver) within timeout_s; children of
    other tests' browsers are theirs to reap."""

    def zombies() -> list[str]:
        found = []
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if process.ppid() in others:
                    continue
                if process.status() == psutil.STATUS_ZOMBIE:
                    parent = psutil.Process(process.ppid())
                    found.append(
                        f"{process.pid} {process.name()} parent={parent.pid} {parent.name()} "
                        f"{' '.join(parent.cmdline()[:3])}"
                    )
        return found

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            # No event tells when another process reaps its child: look again shortly.
            while zombies():  # noqa: ASYNC110
                await asyncio.sleep(0.1)
    assert zombies() == []


async def assert_histories_complete(pool: asyncpg.Pool) -> None:
    """Every job's events form a valid path through the state machine, in log order."""
    rows = await pool.fetch("SELECT job_id, type FROM job_events ORDER BY xid, id")
    histories: dict[Any, list[str]] = {}
    for row in rows:
        histories.setdefault(row["job_id"], []).append(row["type"])
    allowed = {
        "job.queued": {"job.running", "job.cancelled"},
        "job.running": {"job.done", "job.retrying", "job.failed", "job.cancelled"},
        "job.retrying": {"job.running", "job.cancelled"},
    }
    for job_id, history in histories.items():
        assert history[0] == "job.queued", (job_id, history)
        for before, after in itertools.pairwise(history):
            assert after in allowed.get(before, set()), (job_id, history)


@pytest.mark.browser
@pytest.mark.timeout(420)
async def test_killing_worker_processes_loses_nothing(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    total = 300
    env = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        "PRESSROOM_RENDER_SLOTS": "2",
        **as_env(LEASE_S=2, RESCUE_INTERVAL_S=0.5, POLL_INTERVAL_S=0.5, RETRY_BASE_S=0.2),
    }
    logs = iter(range(1000))
    workers = [PressroomProcess("worker", env, tmp_path / f"w{next(logs)}.log") for _ in range(2)]
    for worker in workers:
        await worker.start()
    invoice = "<h1>Invoice {{ n }}</h1>" + "<p>{{ n }} line of the invoice</p>" * 60
    await jobs.create(
        pool,
        [
            NewJob(
                tenant="default",
                template=invoice,
                data={"n": n},
                options={},
                metadata={},
                max_attempts=10,
            )
            for n in range(total)
        ],
    )
    kills = 0
    done_query = "SELECT count(*) FROM jobs WHERE status = 'done'"
    try:
        while kills < 8 and await pool.fetchval(done_query) < total * 0.8:
            await asyncio.sleep(random.uniform(1.0, 2.5))  # a random moment to strike
            # A worker holding jobs: one just restarted may still be starting Chromium on a
            # busy machine, and killing it then tests nothing.
            holding = {
                row["pid"]
                for row in await pool.fetch(
                    "SELECT DISTINCT (regexp_match(worker_id, ':([0-9]+):[0-9a-f]+$'))[1]::int"
                    " AS pid FROM jobs WHERE status = 'running'"
                )
            }
            candidates = [
                i for i, w in enumerate(workers) if w.proc is not None and w.proc.pid in holding
            ]
            if not candidates:
                continue
            victim = random.choice(candidates)
            workers[victim].kill()
            await workers[victim].stop()
            kills += 1
            workers[victim] = PressroomProcess("worker", env, tmp_path / f"w{next(logs)}.log")
            await workers[victim].start()
        await wait_until(dsn, done_query, total, timeout_s=300)
    finally:
        for worker in workers:
            await worker.stop()
    assert kills >= 4
    rescued = await pool.fetchval(
        "SELECT count(*) FROM jobs WHERE errors::text LIKE '%worker lost%'"
    )
    assert rescued > 0, "some kills hit a job mid-render"
    statuses = await pool.fetch("SELECT status, count(*) FROM jobs GROUP BY status")
    assert {r["status"]: r["count"] for r in statuses} == {"done": total}
    files = list((tmp_path / "data" / "files" / "default").glob("*/*.pdf"))
    per_job: dict[str, int] = {}
    for f in files:
        per_job[f.parent.name] = per_job.get(f.parent.name, 0) + 1
    assert len(per_job) == total and set(per_job.values()) == {1}, "exactly one stored PDF per job"
    await assert_histories_complete(pool)
    done_events = await pool.fetchval("SELECT count(*) FROM job_events WHERE type = 'job.done'")
    assert done_events == total
    print(f"\nkill-worker: jobs={total} kills={kills} rescued={rescued} done={done_events} lost=0")


@pytest.mark.browser
async def test_killing_chromium_mid_render_retries_the_job(
    start_app: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    others = other_browsers()
    quick(monkeypatch, RETRY_BASE_S=0.1)
    app: RunningApp = await start_app(render_slots=1)
    body = {
        "template": SLOW_PAGE,
        "data": {"n": 1, "ms": 3000},
        "options": {"wait_for_selector": "#ready"},
    }
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        created = await resp.json()
    seen: list[str] = []
    async with app.http.get(app.url(created["links"]["events"])) as resp:
        async for message in messages(resp):
            seen.append(message.event)
            if message.event == "job.running" and seen.count("job.running") == 1:
                for process in ours(others):
                    # A child may already be gone with the browser killed before it.
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
            if message.event in ("job.done", "job.failed"):
                break
    assert seen[:3] == ["job.queued", "job.running", "job.retrying"], seen
    assert seen[-1] == "job.done", seen
    # The process keeps serving on a fresh browser, and the killed one left no zombie.
    async with app.http.post(app.url("/v1/jobs"), json={"template": "<p>after</p>"}) as resp:
        again = await resp.json()
    after = await collect(app.http, app.url(again["links"]["events"]), timeout_s=60)
    assert after[-1].event == "job.done"
    await no_zombies(others)
    async with app.http.get(app.url("/metrics")) as resp:
        assert "pressroom_chromium_restarts_total 1.0" in await resp.text()


@pytest.mark.browser
async def test_cancelling_a_200_page_render_takes_under_a_second(
    start_app: Callable[..., Any], tmp_path: Path
) -> None:
    app: RunningApp = await start_app(render_slots=1)
    pages = (
        "{% for i in range(200) %}<section style='page-break-after: always'>"
        + ("<p>page {{ i }} " + "lorem ipsum dolor sit amet " * 40 + "</p>") * 6
        + "</section>{% endfor %}"
    )
    async with app.http.post(app.url("/v1/jobs"), json={"template": pages}) as resp:
        created = await resp.json()
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    async with app.http.get(app.url(created["links"]["events"])) as resp:
        async for message in messages(resp):
            seen.append(message.event)
            if message.event == "job.running":
                asked = loop.time()
                async with app.http.post(app.url(f"/v1/jobs/{created['id']}/cancel")) as cancel:
                    assert cancel.status == 200
            if message.event == "job.cancelled":
                assert loop.time() - asked < 1.0
                break
    assert seen == ["job.queued", "job.running", "job.cancelled"]
    # The slot is free again at once (the render was aborted, not waited out) and no file stays.
    async with app.http.post(app.url("/v1/jobs"), json={"template": "<p>next</p>"}) as resp:
        following = await resp.json()
    after = await collect(app.http, app.url(following["links"]["events"]), timeout_s=20)
    assert after[-1].event == "job.done"
    assert not list((tmp_path / "data" / "files").glob(f"*/{created['id']}/*.pdf"))
    async with app.http.get(app.url(f"/v1/jobs/{created['id']}")) as resp:
        assert (await resp.json())["status"] == "cancelled"


@pytest.mark.browser
async def test_sigterm_finishes_or_requeues_renders_in_flight(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    env = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        "PRESSROOM_RENDER_SLOTS": "2",
        "PRESSROOM_SHUTDOWN_GRACE_S": "1",
        "PRESSROOM_PORT": str(free_port()),
    }
    server = PressroomProcess("serve", env, tmp_path / "serve.log")
    await server.start()
    try:
        await jobs.create(pool, [slow_job(1, ms=200), slow_job(2, ms=8000), slow_job(3, ms=8000)])
        await wait_until(dsn, "SELECT count(*) FROM jobs WHERE status = 'running'", 2, timeout_s=60)
    finally:
        code = await server.stop(signal.SIGTERM)
    assert code == 0, server.log()[-3000:]
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'running'") == 0
    released = await pool.fetch("SELECT id, attempts FROM jobs WHERE status = 'queued'")
    assert len(released) >= 2, "the long renders went back to the queue"
    assert all(r["attempts"] == 0 for r in released if r["attempts"] is not None), "not charged"
    assert "released" in server.log()
    # Another process picks them up.
    worker = PressroomProcess(
        "worker", {**env, "PRESSROOM_SHUTDOWN_GRACE_S": "20"}, tmp_path / "w.log"
    )
    await worker.start()
    try:
        await wait_until(dsn, "SELECT count(*) FROM jobs WHERE status = 'done'", 3, timeout_s=90)
    finally:
        assert await worker.stop() == 0


async def test_retries_are_spaced_by_exponential_backoff(
    start_app: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer = FakeRenderer()
    renderer.fail_with = TransientError("storage unavailable")
    quick(monkeypatch, RETRY_BASE_S=0.2)
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    async with app.http.post(
        app.url("/v1/jobs"), json={"template": "<p>x</p>", "max_attempts": 4}
    ) as resp:
        created = await resp.json()
    got = await collect(
        app.http, app.url(created["links"]["events"]), until="job.failed", timeout_s=30
    )
    retrying = [m.json["job"] for m in got if m.event == "job.retrying"]
    assert [j["attempts"] for j in retrying] == [1, 2, 3]
    for attempt, snapshot in enumerate(retrying, start=1):
        delay = (
            dt.datetime.fromisoformat(snapshot["run_after"])
            - dt.datetime.fromisoformat(snapshot["updated_at"])
        ).total_seconds()
        ceiling = 0.2 * 2 ** (attempt - 1)
        assert ceiling / 2 - 0.01 <= delay <= ceiling + 0.01, (attempt, delay)
    final = got[-1].json["job"]
    assert final["status"] == "failed" and len(final["errors"]) == 4


@pytest.mark.browser
@pytest.mark.timeout(240)
async def test_postgres_restart_under_load_loses_no_job_and_no_event(tmp_path: Path) -> None:
    cluster = Cluster()
    await asyncio.to_thread(cluster.init)
    await asyncio.to_thread(cluster.start)
    port = free_port()
    env = {
        "DATABASE_URL": cluster.dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        "PRESSROOM_RENDER_SLOTS": "2",
        "PRESSROOM_PORT": str(port),
        **as_env(POLL_INTERVAL_S=0.5, LEASE_S=10),
    }
    server = PressroomProcess("serve", env, tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    accepted: list[str] = []
    refused: list[int] = []
    received: list[int] = []
    got_one = asyncio.Event()
    try:
        await server.start()
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base)

            async def follow() -> None:
                # Like EventSource: reconnect with Last-Event-ID whenever the stream ends.
                while True:
                    last = str(received[-1]) if received else "0"
                    try:
                        async with http.get(
                            f"{base}/v1/events", headers={"Last-Event-ID": last}
                        ) as resp:
                            async for message in messages(resp):
                                if message.id:
                                    received.append(int(message.id))
                                    got_one.set()
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.2)  # EventSource's reconnection delay

            follower = asyncio.create_task(follow())

            async def submit(n: int) -> None:
                try:
                    async with http.post(
                        f"{base}/v1/jobs", json={"template": "<p>{{ n }}</p>", "data": {"n": n}}
                    ) as resp:
                        if resp.status == 202:
                            accepted.append((await resp.json())["id"])
                        else:
                            assert resp.status == 503 and resp.headers["Retry-After"]
                            refused.append(resp.status)
                except aiohttp.ClientError:
                    refused.append(0)

            async def load() -> None:
                for n in range(120):
                    await submit(n)
                    await asyncio.sleep(0.05)  # a steady stream of clients

            loader = asyncio.create_task(load())
            await asyncio.sleep(1.5)  # some load before the outage, as in production
            await asyncio.to_thread(cluster.stop, "immediate")
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 503
                assert (await resp.json())["checks"]["database"].startswith("error")
            await asyncio.sleep(2.0)  # the outage itself is what is under test
            await asyncio.to_thread(cluster.start)
            await loader
            await wait_ready(http, base)
            assert refused, "requests during the outage were answered 503"
            conn = await asyncpg.connect(cluster.dsn)
            try:
                await wait_until(
                    cluster.dsn,
                    "SELECT count(*) FROM jobs WHERE status <> 'done'",
                    0,
                    timeout_s=120,
                )
                stored = {str(r["id"]) for r in await conn.fetch("SELECT id FROM jobs")}
                assert set(accepted) <= stored, "an accepted job was lost"
                # A commit in flight when the server died can be durable while its answer is
                # lost (the request got an error, not a 202): in doubt, never more than the
                # requests that were refused, and rendered like any other.
                assert len(stored - set(accepted)) <= len(refused), stored - set(accepted)
                logged = [
                    r["id"] for r in await conn.fetch("SELECT id FROM job_events ORDER BY xid, id")
                ]

                async with asyncio.timeout(30):
                    while len(received) < len(logged):
                        got_one.clear()
                        await got_one.wait()
            finally:
                await conn.close()
            follower.cancel()
            assert received == logged, "the SSE client got every event once, in log order"
    finally:
        await server.stop()
        await asyncio.to_thread(cluster.destroy)
    assert len(accepted) >= 60
    print(
        f"\npostgres-restart: accepted={len(accepted)} refused_503={len(refused)}"
        f" events={len(received)} lost=0"
    )


@pytest.mark.browser
async def test_a_hung_chromium_is_replaced(
    start_app: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    others = other_browsers()
    quick(monkeypatch, RETRY_BASE_S=0.1)
    app: RunningApp = await start_app(render_slots=1, env={"PRESSROOM_RENDER_TIMEOUT_S": "3"})
    body = {
        "template": SLOW_PAGE,
        "data": {"n": 1, "ms": 1500},
        "options": {"wait_for_selector": "#ready"},
    }
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        created = await resp.json()
    seen: list[dict[str, Any]] = []
    frozen: list[psutil.Process] = []
    async with app.http.get(app.url(created["links"]["events"])) as resp:
        async for message in messages(resp):
            seen.append(message.json["job"])
            if message.event == "job.running" and not frozen:
                frozen = ours(others)
                for process in frozen:
                    process.suspend()  # SIGSTOP: the browser hangs without dying
            if message.event in ("job.done", "job.failed"):
                break
    assert [j["status"] for j in seen][-1] == "done"
    assert "timed out" in seen[-1]["errors"][0]["error"]
    alive = [p for p in frozen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], "the hung browser was killed, not kept"
