"""Three Pressroom processes on one database, workers on one only: SSE and Socket.IO clients of
every process receive every event of every job, in log order, whichever process rendered it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from server import events
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.processes import PressroomProcess, free_port
from tests.sio import SioClient
from tests.sse import Message, messages
from tests.timings import as_env

pytestmark = pytest.mark.slow

JOBS = 50
EVENTS = JOBS * 3  # queued, running, done
SEED = {"template": "<h1>Invoice {{ n }}</h1>", "data": {"n": 1}}


async def wait_serving(http: aiohttp.ClientSession, base: str, proc: PressroomProcess) -> None:
    """Until the child answers /healthz; it has no other way to say its port is open."""
    async with asyncio.timeout(60):
        while True:
            assert proc.proc is not None and proc.proc.returncode is None, proc.log()[-3000:]
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(base + "/healthz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)  # retry a refused connection; nothing to wait on instead


class SseFollower:
    """An all-jobs SSE stream that is subscribed once `open` returns."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self.complete = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, http: aiohttp.ClientSession, url: str) -> None:
        resp = await http.get(url)
        assert resp.status == 200, await resp.text()
        self._task = asyncio.create_task(self._read(resp))

    async def _read(self, resp: aiohttp.ClientResponse) -> None:
        async with resp:
            async for message in messages(resp):
                self.received.append(message)
                if len(self.received) == EVENTS:
                    self.complete.set()
                    return

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


def without_url(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "job": {k: v for k, v in payload["job"].items() if k != "url"}}


@pytest.mark.timeout(180)
async def test_every_client_of_every_process_gets_every_event_in_order(
    start_app: Callable[..., Any], dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    worker: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=2)
    env = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        **as_env(POLL_INTERVAL_S=0.5),
    }
    ports = [free_port(), free_port()]
    webs = [
        PressroomProcess("web", {**env, "PRESSROOM_PORT": str(port)}, tmp_path / f"web{port}.log")
        for port in ports
    ]
    bases = [worker.url("").rstrip("/")] + [f"http://127.0.0.1:{port}" for port in ports]
    http = aiohttp.ClientSession()
    sse = [SseFollower() for _ in bases]
    sio = [SioClient() for _ in bases]
    try:
        for web in webs:
            await web.start()
        for base, web in zip(bases[1:], webs, strict=True):
            await wait_serving(http, base, web)
        for base, follower, client in zip(bases, sse, sio, strict=True):
            await follower.open(http, base + "/v1/events")
            await client.connect(base + "/")
            await client.subscribe(all=True)

        # Submissions spread over the three processes; only `worker` renders.
        for n in range(JOBS):
            async with http.post(bases[n % 3] + "/v1/jobs", json=SEED) as resp:
                assert resp.status == 202, await resp.text()

        async with asyncio.timeout(90):
            for follower in sse:
                await follower.complete.wait()
        got_sio = [await client.take(EVENTS, timeout_s=60) for client in sio]
        log, _ = await events.after(pool, events.START, limit=EVENTS + 10)
        assert len(log) == EVENTS and {e.type for e in log} == {
            "job.queued",
            "job.running",
            "job.done",
        }
        expected = [e.id for e in log]
        for base, follower, received in zip(bases, sse, got_sio, strict=True):
            assert [int(m.id or 0) for m in follower.received] == expected, base
            assert [data["event_id"] for _name, data in received] == expected, base
            # Same payloads on both transports (the signed URL carries its own expiry).
            assert [without_url(m.json) for m in follower.received] == [
                without_url(data) for _name, data in received
            ]
            done = [m.json for m in follower.received if m.event == "job.done"]
            assert all(p["job"]["url"].startswith(base + "/v1/jobs/") for p in done), base
    finally:
        for follower in sse:
            follower.close()
        for client in sio:
            await client.close()
        await http.close()
        for web in webs:
            code = await web.stop(timeout_s=20)
            assert code == 0, web.log()[-3000:]
