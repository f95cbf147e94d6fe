"""Changes to access are in force on every process at once, each a real `pressroom web` of its
own: the first key closes dev mode before `keys create` returns, even where the notification
has not arrived, and a revoked key's streams end within WITHIN_S on every process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from server.queue.listener import LISTEN_APPLICATION
from tests.integration.test_revocation import WITHIN_S, bearer, revoked_before_s, until_end
from tests.processes import PressroomProcess, admin_cli, free_port, wait_ready

pytestmark = pytest.mark.slow

PROCESSES = 2


@contextlib.asynccontextmanager
async def web_processes(dsn: str, tmp_path: Path) -> AsyncIterator[list[str]]:
    """PROCESSES `pressroom web` processes on one database, ready: their base URLs."""
    servers, bases = [], []
    for n in range(PROCESSES):
        port = free_port()
        env = {
            "DATABASE_URL": dsn,
            "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
            "PRESSROOM_PORT": str(port),
        }
        servers.append(PressroomProcess("web", env, tmp_path / f"web{n}.log"))
        bases.append(f"http://127.0.0.1:{port}")
    try:
        for server in servers:
            await server.start()
        async with aiohttp.ClientSession() as http:
            for base in bases:
                await wait_ready(http, base)
        yield bases
    finally:
        for server in servers:
            assert await server.stop() == 0, server.log()[-3000:]


async def listen_backends(pool: asyncpg.Pool) -> list[int]:
    """The server pids of the LISTEN connections to this database."""
    rows = await pool.fetch(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = $1",
        LISTEN_APPLICATION,
    )
    return [row["pid"] for row in rows]


@contextlib.contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    """Stop these PostgreSQL backends (SIGSTOP) until the block ends: a LISTEN connection
    frozen so delivers no notification, as a slow or congested one would not yet have."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def status(http: aiohttp.ClientSession, url: str, **kwargs: object) -> int:
    async with http.get(url, **kwargs) as resp:  # type: ignore[arg-type]
        return resp.status


@pytest.mark.timeout(120)
async def test_the_first_key_closes_dev_mode_on_every_process_before_keys_create_returns(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    async with web_processes(dsn, tmp_path) as bases, aiohttp.ClientSession() as http:
        for base in bases:
            assert await status(http, f"{base}/v1/jobs") == 200  # open: dev mode
        backends = await listen_backends(pool)
        assert len(backends) == PROCESSES
        with frozen(backends):
            code, out, err = await admin_cli(
                dsn, tmp_path / "cli", "keys", "create", "--tenant", "acme"
            )
            assert code == 0, err
            key = out.strip()
            for base in bases:
                async with http.get(f"{base}/v1/jobs") as resp:
                    assert resp.status == 401, await resp.text()
                    assert resp.content_type == "application/problem+json"
                    assert "Authorization: Bearer KEY" in (await resp.json())["detail"]
                assert await status(http, f"{base}/v1/jobs", headers=bearer(key)) == 200
        # Once the notification arrives, the answer comes from memory and stays the same.
        for base in bases:
            assert await status(http, f"{base}/v1/jobs") == 401


@pytest.mark.timeout(120)
async def test_a_revoked_keys_streams_end_within_a_second_on_every_process(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    code, key, err = await admin_cli(dsn, tmp_path / "cli", "keys", "create", "--tenant", "acme")
    assert code == 0, err
    key = key.strip()
    key_id = await pool.fetchval("SELECT id FROM api_keys WHERE tenant = 'acme'")
    code, _kept, err = await admin_cli(dsn, tmp_path / "cli", "keys", "create", "--tenant", "b")
    assert code == 0, err  # keyed mode stays when the first key is revoked
    async with web_processes(dsn, tmp_path) as bases, aiohttp.ClientSession() as http:
        streams = []
        for base in bases:
            streams.append(await http.get(f"{base}/v1/events", headers=bearer(key)))
            assert streams[-1].status == 200
        async with asyncio.timeout(30):
            endings = [asyncio.create_task(until_end(stream)) for stream in streams]
            code, _out, err = await admin_cli(dsn, tmp_path / "cli", "keys", "revoke", str(key_id))
            assert code == 0, err
            ended = await asyncio.gather(*endings)
        for stream, (got, ended_at) in zip(streams, ended, strict=True):
            assert [message.event for message in got] == ["closed"]
            assert "revoked" in got[0].json["reason"]
            assert await revoked_before_s(pool, key_id, ended_at) <= WITHIN_S
            stream.release()
        for base in bases:
            assert await status(http, f"{base}/v1/events", headers=bearer(key)) == 401
