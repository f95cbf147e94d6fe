"""Load generator, run in a child process by the accept benchmark; prints one JSON line.

Two targets with the same work per request: `http` POSTs a job to Pressroom; `raw` runs the
same insert Pressroom runs (one job row, one event row, one NOTIFY) straight over asyncpg.
Two modes: `closed` (N clients, each sends its next request when the last one answered) and
`open` (requests leave on a fixed schedule whatever the answers; latency is counted from the
scheduled moment, so a stall is not hidden by the client waiting for it).

    python -m bench.load http  --url URL --mode closed --concurrency 32 --duration 10
                               [--origin https://app.example.com]
    python -m bench.load raw   --dsn DSN --mode open --rate 500 --duration 10 --connections 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientSession, TCPConnector

from bench.common import INVOICE, invoice_data
from server.queue import db
from server.sql import query

Send = Callable[[], Awaitable[bool]]


def job_body() -> dict[str, Any]:
    return {"template": INVOICE, "data": invoice_data(1)}


async def closed_loop(send: Send, concurrency: int, duration_s: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s

    async def client() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            ok = await send()
            latencies.append((time.perf_counter() - started) * 1000)
            errors += not ok

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "errors": errors,
        "elapsed_s": elapsed,
        "rate": len(latencies) / elapsed,
        "latencies_ms": latencies,
    }


async def open_loop(send: Send, rate: float, duration_s: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    total = int(rate * duration_s)
    tasks: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        nonlocal errors
        ok = await send()
        latencies.append((time.perf_counter() - due) * 1000)
        errors += not ok

    started = time.perf_counter()
    for i in range(total):
        due = started + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    late = sum(1 for value in latencies if value > 1000 / rate * 10)
    return {
        "requests": len(latencies),
        "errors": errors,
        "elapsed_s": elapsed,
        "rate": len(latencies) / elapsed,
        "late": late,
        "latencies_ms": latencies,
    }


async def drive(send: Send, args: argparse.Namespace) -> dict[str, Any]:
    if args.warmup > 0:
        await closed_loop(send, min(args.concurrency, 8), args.warmup)
    if args.mode == "closed":
        return await closed_loop(send, args.concurrency, args.duration)
    return await open_loop(send, args.rate, args.duration)


async def http(args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps(job_body()).encode()
    headers = {"Content-Type": "application/json"}
    if args.origin:
        headers["Origin"] = args.origin  # as a page on another origin sends it
    connector = TCPConnector(limit=0)
    async with ClientSession(connector=connector) as session:
        url = f"{args.url}/v1/jobs"

        async def send() -> bool:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                return resp.status == 202

        return await drive(send, args)


async def raw(args: argparse.Namespace) -> dict[str, Any]:
    body = job_body()
    sql = query("insert_jobs")
    pool = await db.create_pool(args.dsn, min_size=args.connections, max_size=args.connections)
    try:

        async def send() -> bool:
            async with pool.acquire() as conn:
                await conn.fetch(
                    sql,
                    [uuid.uuid4()],
                    ["default"],
                    [body["template"]],
                    [body["data"]],
                    [{}],
                    [{}],
                    [None],
                    [0],
                    [3],
                    [None],
                    [None],
                    [None],
                    [False],  # not handed to a worker: the web-only server queues every job
                    None,
                    0.0,
                    [None],  # no assets
                    ["template"],  # the source, and no sealed secrets
                    [None],
                    [None],  # no channel
                )
            return True

        return await drive(send, args)
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target", choices=["http", "raw"])
    parser.add_argument("--url")
    parser.add_argument("--origin", help="send this Origin header (http only)")
    parser.add_argument("--dsn")
    parser.add_argument("--mode", choices=["closed", "open"], default="closed")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=1)
    args = parser.parse_args()
    result = asyncio.run(http(args) if args.target == "http" else raw(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
