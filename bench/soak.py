"""Soak: N renders in a row through one app with real Chromium; memory stays flat and no
Chromium process outlives the app.

Jobs go in over HTTP in batches of --every; after each batch is done the resident memory
(RSS) of this process (the server) and of every Chromium process it started is sampled.
Growth is measured from the sample at --from-job (after warm-up, caches and pools are
full) to the last one. At the end, while the app still runs, its children are checked for
zombies; after it stops, every Chromium process seen during the run must be gone.

    python -m bench.soak [--jobs 5000] [--every 100] [--from-job 500] [--slots 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time

import psutil
from aiohttp import ClientSession

from bench import common
from bench.clients import INVOICE, invoice_data, submit_many
from bench.common import QUICK, database, postgres, running_app
from server.events import JobEvent
from server.keys import CHROMIUM, HUB
from server.render.browsers import browser_processes

MIB = 1024 * 1024


def chromium_memory_mb(seen: dict[int, float]) -> tuple[float, float]:
    """Total RSS and PSS of this process's Chromium processes; remembers each (pid, start).

    RSS counts pages shared between Chromium's processes once per process; PSS splits them,
    so its sum is what the browser really holds."""
    rss = pss = 0
    for process in browser_processes():
        try:
            info = process.memory_full_info()
            seen[process.pid] = process.create_time()
        except psutil.Error:
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss / MIB, pss / MIB


def zombies() -> list[int]:
    found = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
    return found


def survivors(seen: dict[int, float]) -> list[int]:
    """Chromium processes seen during the run that still exist (same pid, same start time)."""
    alive = []
    for pid, created in seen.items():
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


def growth(samples: list[dict[str, float]], key: str, from_job: int) -> float:
    base = next(s for s in samples if s["jobs"] >= from_job)
    return (samples[-1][key] - base[key]) / base[key] * 100


async def run(args: argparse.Namespace) -> None:
    seen: dict[int, float] = {}
    samples: list[dict[str, float]] = []
    server = psutil.Process(os.getpid())
    done = target = 0  # jobs finished, and the count that ends the batch
    batch_done = asyncio.Event()

    def on_event(event: JobEvent) -> None:
        nonlocal done
        if event.type in ("job.done", "job.failed"):
            done += 1
            if event.type == "job.failed":
                print(f"soak    job failed: {event.job.get('error')}")
            if done >= target:
                batch_done.set()

    started = time.perf_counter()
    async with postgres(), database() as dsn:
        async with running_app(dsn, render_slots=args.slots) as (base, app):
            app[HUB].add_listener(on_event)
            bodies = [{"template": INVOICE, "data": invoice_data(n)} for n in range(args.every)]

            def sample() -> None:
                row = {"jobs": done, "server_mb": server.memory_info().rss / MIB}
                row["chromium_mb"], row["chromium_pss_mb"] = chromium_memory_mb(seen)
                row["total_mb"] = row["server_mb"] + row["chromium_mb"]
                samples.append(row)

            sample()
            async with ClientSession() as session:
                while done < args.jobs:
                    target = done + args.every
                    batch_done.clear()
                    await submit_many(session, base, bodies, concurrency=16)
                    async with asyncio.timeout(300):
                        await batch_done.wait()
                    sample()
                    if done % 1000 == 0 or done >= args.jobs:
                        last = samples[-1]
                        print(
                            f"soak    {done:5d} jobs: server {last['server_mb']:6.1f} MiB, "
                            f"Chromium {last['chromium_mb']:6.1f} MiB RSS, "
                            f"{last['chromium_pss_mb']:6.1f} MiB PSS",
                        )
            launches = app[CHROMIUM].launches
            zombie_pids = zombies()
        # Chromium's helpers exit just after the browser does: give them a few seconds
        # (a process ending sends this process no event to wait for).
        deadline = time.perf_counter() + 5
        while (orphan_pids := survivors(seen)) and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    elapsed = time.perf_counter() - started
    from_job = args.from_job if args.from_job <= samples[-1]["jobs"] else args.every
    result = {
        key: growth(samples, key, from_job)
        for key in ("server_mb", "chromium_mb", "chromium_pss_mb", "total_mb")
    }
    print(
        f"soak    {done} renders in {elapsed:.0f} s ({done / elapsed:.1f} PDFs/s), growth from "
        f"job {from_job}: server {result['server_mb']:+.1f} %, Chromium RSS "
        f"{result['chromium_mb']:+.1f} %, PSS {result['chromium_pss_mb']:+.1f} %, total "
        f"{result['total_mb']:+.1f} %; {launches} browser launches, {len(seen)} Chromium "
        f"processes seen; zombies {len(zombie_pids)}, orphans {len(orphan_pids)}",
    )


def parser() -> argparse.ArgumentParser:
    parser = common.arguments(__doc__)
    parser.add_argument("--jobs", type=int, default=300 if QUICK else 5000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--from-job", type=int, default=100 if QUICK else 500)
    parser.add_argument("--slots", type=int, default=2)
    return parser


if __name__ == "__main__":
    common.main(parser, run)
