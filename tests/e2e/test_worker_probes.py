"""`pressroom worker` with PRESSROOM_HEALTH_PORT answers the probes and the metrics scrape of
its own process (a worker pod's), and nothing of the API; without it, it listens nowhere."""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from server.queue import jobs
from tests.newjobs import new_job
from tests.processes import PressroomProcess, free_port, run_pressroom, wait_ready, wait_until
from tests.timings import as_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.timeout(180)
async def test_a_worker_serves_its_probes_and_metrics_on_the_health_port(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        "PRESSROOM_RENDER_SLOTS": "1",
        "PRESSROOM_HEALTH_PORT": str(port),
        **as_env(POLL_INTERVAL_S=0.5),
    }
    worker = PressroomProcess("worker", env, tmp_path / "worker.log")
    base = f"http://127.0.0.1:{port}"
    await worker.start()
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base)
            async with http.get(f"{base}/readyz") as resp:
                checks = (await resp.json())["checks"]
                assert set(checks) >= {"database", "listener", "storage", "browser"}
            [job] = await jobs.create(pool, [new_job()])
            await wait_until(
                dsn, f"SELECT status FROM jobs WHERE id = '{job['id']}'", "done", timeout_s=60
            )
            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
            assert 'pressroom_job_attempts_total{outcome="done"} 1.0' in text
            for path in ("/v1/jobs", "/", "/socket.io/"):
                async with http.get(f"{base}{path}") as resp:
                    assert resp.status == 404, path  # no API, dashboard or streams
        assert "probes and metrics on http://127.0.0.1:" in worker.log()
    finally:
        assert await worker.stop() == 0, worker.log()[-3000:]


async def test_a_worker_whose_health_port_is_taken_says_which_setting_to_change(
    dsn: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _out, err = await run_pressroom(
            {
                "DATABASE_URL": dsn,
                "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
                "PRESSROOM_RENDER_SLOTS": "0",
                "PRESSROOM_HEALTH_PORT": str(port),
            },
            "worker",
        )
    assert code == 1
    assert f"cannot listen on 127.0.0.1 port {port}" in err
    assert "set PRESSROOM_HEALTH_PORT to a free one" in err
