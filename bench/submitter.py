"""Submit one job at a time on a fixed schedule, each carrying the moment it was sent.

The job's data is `{"t": time.perf_counter()}` read just before the request. perf_counter is
CLOCK_MONOTONIC on Linux, one clock for every process of the machine, so the server's
renderer (bench.noop.StartClock) can subtract it: submit→start across two processes, with
none of the client's work on the server's event loop. With --answers, the milliseconds from
that moment to each response are written there as a JSON list.

    python -m bench.submitter URL [--count 200] [--interval-ms 50] [--answers FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from aiohttp import ClientSession

TEMPLATE = "{{ t }}"


async def submit(url: str, count: int, interval_s: float) -> list[float]:
    """POST `count` jobs on a fixed schedule; the milliseconds each took to be answered."""
    answers: list[float] = []
    async with ClientSession() as session:
        next_at = time.perf_counter()
        for _ in range(count):
            next_at += interval_s
            sent = time.perf_counter()
            body = {"template": TEMPLATE, "data": {"t": repr(sent)}}
            async with session.post(f"{url}/v1/jobs", json=body) as resp:
                if resp.status != 202:
                    raise SystemExit(f"submit answered {resp.status}: {await resp.text()}")
                await resp.read()
            answers.append((time.perf_counter() - sent) * 1000)
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=50)
    parser.add_argument("--answers", type=Path)
    args = parser.parse_args()
    answers = asyncio.run(submit(args.url, args.count, args.interval_ms / 1000))
    if args.answers is not None:
        args.answers.write_text(json.dumps(answers))


if __name__ == "__main__":
    main()
