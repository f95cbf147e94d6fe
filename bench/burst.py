"""Submit a burst of invoices over HTTP and follow the event stream until all are done.

The render benchmark's client, run in a process of its own (bench.common.run_module) so that
its HTTP requests and its reading of the event stream are not charged to the server's event
loop, as a real client's are not. The stream is followed live, opened before the first
submission, so rounds against the same server do not replay the earlier rounds' events, and
it carries only `job.done` and `job.failed` (`?type=`), the events this client waits for.
Prints one JSON line: the documents, the seconds from the first submission to the last
`job.done`, and the CPU seconds the whole machine spent in that span (so the client's own
start-up is not counted).

    python -m bench.burst URL [--docs 200] [--lines 20] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

from aiohttp import ClientSession

from bench.common import (
    FINAL_TYPES,
    INVOICE,
    invoice_data,
    machine_busy_s,
    submit_many,
    until_done,
)


async def burst(url: str, docs: int, lines: int, concurrency: int) -> dict[str, float | None]:
    bodies = [{"template": INVOICE, "data": invoice_data(n, lines)} for n in range(docs)]
    async with ClientSession() as session:
        # Live from here, and only how jobs end: all this client waits for.
        async with session.get(f"{url}/v1/events?type={FINAL_TYPES}") as stream:
            busy_before, started = machine_busy_s(), time.perf_counter()
            own_before = _own_cpu_s()
            ids = await submit_many(session, url, bodies, concurrency=concurrency)
            await until_done(stream, set(ids))
            elapsed, busy_after = time.perf_counter() - started, machine_busy_s()
            client_cpu_s = _own_cpu_s() - own_before
    machine_cpu_s = None if busy_before is None or busy_after is None else busy_after - busy_before
    return {
        "docs": docs,
        "seconds": elapsed,
        "machine_cpu_s": machine_cpu_s,
        "client_cpu_s": client_cpu_s,
    }


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(burst(args.url, args.docs, args.lines, args.concurrency))))


if __name__ == "__main__":
    main()
