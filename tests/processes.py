"""Pressroom processes started as real subprocesses for multi-process and fault tests."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import asyncpg

from server.queue.listener import CHANNEL


class PressroomProcess:
    """`python -m server COMMAND` with its own environment (and the timings of
    tests/timings.py, where it sets them); logs go to a file for post-mortems."""

    def __init__(self, command: str, env: Mapping[str, str], log_path: Path) -> None:
        self.command = command
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.timings",
                self.command,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


async def wait_until(dsn: str, query: str, expected: object, timeout_s: float) -> None:
    """Re-run `query` on every NOTIFY (and every second) until it returns `expected`."""
    conn = await asyncpg.connect(dsn)
    changed = asyncio.Event()
    await conn.add_listener(CHANNEL, lambda *_: changed.set())
    try:
        async with asyncio.timeout(timeout_s):
            while await conn.fetchval(query) != expected:
                changed.clear()
                try:
                    async with asyncio.timeout(1.0):
                        await changed.wait()
                except TimeoutError:
                    pass
    finally:
        await conn.close()


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port no one listens on now, for a server about to start."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_ready(http: aiohttp.ClientSession, base: str, timeout_s: float = 60) -> None:
    """Until the server at `base` answers /readyz with 200."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                async with http.get(f"{base}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)  # the process is starting: nothing to wait on but its port


async def admin_cli(dsn: str, data_dir: Path, *args: str) -> tuple[int, str, str]:
    """`python -m server ARGS` (keys, tenants) against a database, as an operator runs it:
    (exit code, stdout, stderr)."""
    return await run_pressroom({"DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": str(data_dir)}, *args)


async def run_pressroom(settings: dict[str, str], *args: str) -> tuple[int, str, str]:
    """`python -m server ARGS` with these variables set, run to its end: (exit code, stdout,
    stderr). For commands that end by themselves, a `serve` refused at its start among them."""
    env = {**os.environ, **settings}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
