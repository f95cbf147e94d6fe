"""Where a job's CPU goes outside Chromium: Pressroom against the bare service (bench/bare.py),
and against Pressroom at another commit (--against), in the same run.

Each system serves from a process of its own on one throwaway cluster of Debian's PostgreSQL
with pg_stat_statements (tracking the statements that triggers and functions run too), each in
a database of its own; `pressroom@REV` runs from a git worktree of REV. Pressroom runs keyed,
as in production (its clients send an API key). All are warmed. Then, in --rounds rounds, in an
order that turns each round, each prints the same styled one-page invoices: a client in a
process of its own (bench/clients.py `burst`) submits --docs of them over HTTP and follows the
event stream until the last is done. Around each burst the CPU counters are read: the server's
process (its own threads; Playwright's driver and Chromium below it are not counted) and every
PostgreSQL process. Each then takes --latency-docs jobs one at a time (`one-at-a-time`): p50
and p99 from POST to `job.done`, beside the raw print of the same pages one at a time
(bench.render's raw loop, one page). A last burst of Pressroom and one of the bare service run
under py-spy: each server's samples, sorted into the stages of a job, share out its median CPU
per job.
PostgreSQL's time by statement is pg_stat_statements' execution and planning time over every
round (↳: a statement run inside another, such as a trigger's).

    python -m bench.cost [--docs 300] [--slots 2] [--rounds 5] [--latency-docs 100]
                         [--against REV] [--samples FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench import common
from bench.clients import INVOICE, invoice_data
from bench.common import QUICK, ROOT, at, execute, free_port, run_client, start_python, summary
from bench.render import RawLoop
from server.queue.embedded import ensure_run_as_user
from server.render import templates
from server.sql import queries

#: The cluster's settings beyond initdb's: pg_stat_statements, with nested statements and planning.
SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.max": "5000",
    "pg_stat_statements.track_planning": "on",
}
#: Pressroom's server process, run in the tree it is to measure (its working folder), keyed as
#: in production: it prints its URL and the API key its clients send.
SERVE_PRESSROOM = """
import asyncio, sys
from bench.common import running_app
from server.access import apikeys
from server.queue import db

async def main(dsn, slots):
    await db.migrate_at(dsn)
    conn = await db.connect(dsn)
    _row, key, _secret = await apikeys.create_key_and_tenant(conn, "bench")
    await conn.close()
    # A key's rate limit lifted, as running_app lifts the tenant's cap on jobs in flight.
    async with running_app(dsn, render_slots=int(slots), rate_limit_rps=1e6) as (base, _app):
        print(base, key, flush=True)
        await asyncio.to_thread(sys.stdin.read)

asyncio.run(main(*sys.argv[1:]))
"""
#: A sample belongs to the first stage (in this order) one of whose markers is in its stack;
#: py-spy's frames read "function (path/file.py)", joined by ";". Pressroom's markers first,
#: then the bare service's (bench/bare.py) for the same stage.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("logging", ("(logging/",)),
    (
        "Playwright calls",
        (
            "(server/render/chromium.py)",
            "(server/render/printing.py)",
            "(playwright/",
            "(bench/render.py)",
        ),
    ),
    ("template", ("(server/render/templates.py)", "(server/render/sandbox.py)", "(jinja2/")),
    ("PDF checks and provenance", ("(server/pdf/", "(pikepdf/", "(server/render/preflight.py)")),
    ("store", ("(server/files/", "_durable_write (bench/bare.py)")),
    (
        "submit commit",
        (
            "(server/queue/admission.py)",
            "create (server/queue/jobs.py)",
            "_submit (bench/bare.py);Pool.execute",
        ),
    ),
    ("done write", ("finish_done", "DoneRecorder", "_finish (bench/bare.py)")),
    (
        "claim",
        (
            "claim (server/queue/jobs.py)",
            "Consumer._claim (server/queue/lease.py)",
            "_slot (bench/bare.py);Pool.fetchrow",
        ),
    ),
    (
        "event fan-out",
        (
            "(server/events/",
            "(server/queue/listener.py)",
            "(server/web/sse.py)",
            "_notified (bench/bare.py)",
            "_events (bench/bare.py)",
        ),
    ),
    ("HTTP and validation", ("(server/web/", "(server/schemas/", "(pydantic", "(aiohttp/")),
    ("worker, other", ("(server/pipeline/", "(bench/bare.py)")),
    ("asyncpg protocol", ("(asyncpg/",)),
]
OTHER = "event loop and other"
#: Milliseconds and calls by (queryid, top level); samples by stage; the raw print's p50, p99.
Sums = dict[tuple[int, bool], list[float]]
Stages = Counter[str]
Floor = dict[str, float]


def debian_bin() -> Path:
    """The bin folder of the newest Debian PostgreSQL with pg_stat_statements (the wheel's
    server has none)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/lib/pg_stat_statements.so"),
        key=lambda path: int(path.parts[-3]),
    )
    if not found:
        sys.exit("bench.cost needs Debian's PostgreSQL server: apt-get install postgresql")
    return found[-1].parent.parent / "bin"


@contextlib.asynccontextmanager
async def cluster() -> AsyncIterator[tuple[str, psutil.Process]]:
    """A throwaway cluster on a free port: its DSN and its postmaster."""
    bin_dir, folder = debian_bin(), Path(tempfile.mkdtemp(prefix="prb-cost-"))
    if (user := ensure_run_as_user()) is not None:  # PostgreSQL refuses to run as root
        shutil.chown(folder, user)
    port = free_port()
    data, settings = folder / "data", " ".join(f"-c {k}={v}" for k, v in SERVER_SETTINGS.items())

    def run(command: str, *args: str) -> None:
        argv = [str(bin_dir / command), "-D", str(data), *args]
        subprocess.run(argv, check=True, user=user, capture_output=True, timeout=120)

    try:
        # Throwaway data: initdb need not sync what it wrote; the server itself runs durably.
        await asyncio.to_thread(run, "initdb", "-U", "postgres", "--auth=trust", "--no-sync")
        start = ["-o", f"-p {port} -h 127.0.0.1 -k {folder} {settings}", "-l", str(folder / "log")]
        await asyncio.to_thread(run, "pg_ctl", *start, "-w", "start")
        postmaster = psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", postmaster
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            await asyncio.to_thread(run, "pg_ctl", "-m", "fast", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def postgres_cpu_s(postmaster: psutil.Process) -> float:
    """CPU seconds of every PostgreSQL process; a backend that exited counts in its parent's
    children's times."""
    t = postmaster.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in postmaster.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return float(total)


class Service:
    """One system's server in a process of its own, until closed; its CPU and its statements
    (total milliseconds and calls by text and level) summed over the bursts measured."""

    def __init__(self, name: str, server: str) -> None:
        self.name, self.database = name, name.replace("@", "_")
        self.dsn = at(server, self.database)
        self.cpu: list[tuple[float, float]] = []  # (server, PostgreSQL) ms per job, by burst
        self.latency: list[dict[str, float]] = []  # p50 and p99 ms, one at a time, by round
        self.statements: Sums = {}  # in the bursts
        self.solo: Sums = {}  # one at a time
        self.texts: dict[int, str] = {}

    async def start(self, slots: int, tree: Path | None) -> None:
        program = ["-m", "bench.bare"] if self.name == "bare" else ["-c", SERVE_PRESSROOM]
        self.proc = await start_python(*program, self.dsn, str(slots), cwd=tree or ROOT)
        assert self.proc.stdout is not None
        self.base, *key = (await self.proc.stdout.readline()).decode().split()
        if not self.base.startswith("http"):
            raise RuntimeError(f"{self.name}'s server did not start")
        self.key = [f"--key={given}" for given in key]  # none for the bare service
        self.process = psutil.Process(self.proc.pid)

    async def close(self) -> None:
        if hasattr(self, "proc") and self.proc.stdin is not None:
            self.proc.stdin.close()
            await self.proc.wait()

    async def burst(
        self, observer: asyncpg.Connection, postmaster: psutil.Process, docs: int
    ) -> None:
        await observer.execute("SELECT pg_stat_statements_reset()")
        server, pg = sum(self.process.cpu_times()[:2]), postgres_cpu_s(postmaster)
        await self.client("burst", docs)
        await asyncio.sleep(0.5)  # what follows the last job.done (its hub read, the next claim)
        server, pg = sum(self.process.cpu_times()[:2]) - server, postgres_cpu_s(postmaster) - pg
        self.cpu.append((server * 1000 / docs, pg * 1000 / docs))
        await self._add_statements(observer, self.statements)

    async def _add_statements(self, observer: asyncpg.Connection, into: Sums) -> None:
        for row in await observer.fetch(
            "SELECT queryid, query, toplevel, total_exec_time + total_plan_time AS ms, calls FROM "
            "pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)",
            self.database,
        ):
            # By queryid: its text is the first one seen since the reset, constants and all.
            self.texts.setdefault(row["queryid"], " ".join(row["query"].split()))
            sums = into.setdefault((row["queryid"], row["toplevel"]), [0, 0])
            sums[0], sums[1] = sums[0] + row["ms"], sums[1] + row["calls"]

    async def client(self, name: str, docs: int) -> Any:
        """What client `name` of bench/clients.py prints, run against this server."""
        return await run_client(name, self.base, f"--docs={docs}", *self.key)

    async def one_at_a_time(self, observer: asyncpg.Connection, docs: int) -> None:
        await observer.execute("SELECT pg_stat_statements_reset()")
        self.latency.append(summary(await self.client("one-at-a-time", docs)))
        await self._add_statements(observer, self.solo)

    def last_round(self) -> str:
        (server, pg), p50 = self.cpu[-1], self.latency[-1]["p50"]
        return (
            f"{self.name} {server + pg:.2f} ms CPU/job (server {server:.2f}, "
            f"PostgreSQL {pg:.2f}), p50 {p50:.1f} ms"
        )

    def p(self, which: str) -> float:
        return statistics.median(r[which] for r in self.latency)

    def median(self, part: int | None = None) -> float:
        return statistics.median(sum(c) if part is None else c[part] for c in self.cpu)

    def statement_rows(self, jobs: int, *, solo: bool = False, rows: int = 12) -> list[str]:
        """The longest statements per job (bursts, or one at a time), queries.sql's by name."""
        names = {" ".join(sql.split())[:60]: name for name, sql in queries().items()}
        measured = self.solo if solo else self.statements
        top = sorted(measured.items(), key=lambda item: -item[1][0])[:rows]
        return [
            f"  {ms / jobs:7.3f} ms {calls / jobs:5.2f} calls {'' if level else '↳ '}"
            + names.get(self.texts[queryid][:60], self.texts[queryid][:80])
            for (queryid, level), (ms, calls) in top
        ]


async def raw_latencies(raw: RawLoop, html: list[str]) -> list[float]:
    """Milliseconds per document on the raw loop's page, one document at a time."""
    times = []
    for doc in html:
        started = time.perf_counter()
        await raw.run([doc])
        times.append((time.perf_counter() - started) * 1000)
    return times


async def profile(service: Service, docs: int, keep: str | None) -> Counter[str]:
    """py-spy's samples of the server's process over one burst (holding the GIL: the CPU of
    its Python), by stage; kept in `keep` if given."""
    with tempfile.TemporaryDirectory(prefix="prb-spy-") as folder:
        out = Path(keep) if keep else Path(folder) / "samples.txt"
        spy = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(service.proc.pid),
            "--rate", "250", "--format", "raw", "--nolineno", "--gil", "--output", str(out),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        await asyncio.sleep(1)  # attached
        await service.client("burst", docs)
        spy.send_signal(signal.SIGINT)
        await spy.wait()
        return stages_of(out)


def stages_of(samples: Path) -> Counter[str]:
    stages: Counter[str] = Counter()
    for line in samples.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        stage = next((name for name, marks in STAGES if any(m in stack for m in marks)), OTHER)
        stages[stage] += int(count)
    return stages


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A git worktree of `rev`, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="prb-tree-"))

    def git_worktree(*args: str, check: bool) -> None:
        subprocess.run(["git", "worktree", *args], cwd=ROOT, check=check, capture_output=True)

    git_worktree("add", "--detach", str(folder), rev, check=True)
    try:
        yield folder
    finally:
        git_worktree("remove", "--force", str(folder), check=False)


async def run(args: argparse.Namespace) -> None:
    names = ["pressroom", "bare"] + ([f"pressroom@{args.against}"] if args.against else [])
    html = [templates.render(INVOICE, invoice_data(n)) for n in range(args.latency_docs)]
    raw: list[dict[str, float]] = []
    with worktree(args.against) if args.against else contextlib.nullcontext() as tree:
        async with cluster() as (server, postmaster), RawLoop(1) as loop:
            await loop.warm(html)
            observer = await asyncpg.connect(server)
            services = [Service(name, server) for name in names]
            try:
                await observer.execute("CREATE EXTENSION pg_stat_statements")
                for service in services:
                    await execute(server, f'CREATE DATABASE "{service.database}"')
                    await service.start(args.slots, tree if "@" in service.name else None)
                    await service.client("burst", 8)
                for number in range(args.rounds):
                    order = services[number % len(services) :] + services[: number % len(services)]
                    for service in order:
                        await service.burst(observer, postmaster, args.docs)
                    for service in order:
                        await service.one_at_a_time(observer, args.latency_docs)
                    raw.append(summary(await raw_latencies(loop, html)))
                    print(f"round {number + 1}: " + "; ".join(s.last_round() for s in services))
                stages = [
                    await profile(s, args.docs, args.samples if s is services[0] else None)
                    for s in services[:2]
                ]
            finally:
                for service in services:
                    await service.close()
                await observer.close()
    floor = {which: statistics.median(r[which] for r in raw) for which in ("p50", "p99")}
    report(args, services, floor, stages)


def report(args: Namespace, services: list[Service], floor: Floor, stages: list[Stages]) -> None:
    """The figures of every round: the medians, the ratios, and where the time went."""
    ours, bare = services[0], services[1]
    print(
        f"\nCPU per job outside Chromium, median of {args.rounds} rounds of {args.docs} jobs, "
        f"{args.slots} slots:"
    )
    for s in services:
        print(f"  {s.name:20} {s.median():.2f} ms (server {s.median(0):.2f}, PostgreSQL "
              f"{s.median(1):.2f})")  # fmt: skip
    print(f"submit → job.done one at a time, {args.latency_docs} jobs a round, medians:")
    print(f"  {'raw print':20} p50 {floor['p50']:.1f} ms, p99 {floor['p99']:.1f} ms")
    for s in services:
        print(f"  {s.name:20} p50 {s.p('p50'):.1f} ms ({s.p('p50') - floor['p50']:+.1f} to the raw "
              f"print), p99 {s.p('p99'):.1f} ms ({s.p('p99') - floor['p99']:+.1f})")  # fmt: skip
    for other in services[1:]:
        ratios = [sum(a) / sum(b) for a, b in zip(ours.cpu, other.cpu, strict=True)]
        gaps = [a["p50"] - b["p50"] for a, b in zip(ours.latency, other.latency, strict=True)]
        print(
            f"  Pressroom / {other.name}: {statistics.median(ratios):.2f} (rounds "
            f"{', '.join(f'{r:.2f}' for r in ratios)}); p50 {statistics.median(gaps):+.1f} ms "
            f"(rounds {', '.join(f'{g:+.1f}' for g in gaps)})"
        )
    shares = [
        {name: s.median(0) * count / (sum(counts.values()) or 1) for name, count in counts.items()}
        for s, counts in zip((ours, bare), stages, strict=True)
    ]
    samples = " and ".join(str(sum(counts.values())) for counts in stages)
    print(f"\nServer CPU per job by stage, ms ({samples} py-spy samples):")
    print(f"  {'':28} {'pressroom':>9} {'bare':>9}")
    for name in sorted(shares[0].keys() | shares[1].keys(), key=lambda n: -shares[0].get(n, 0)):
        print(f"  {name:28} {shares[0].get(name, 0.0):9.2f} {shares[1].get(name, 0.0):9.2f}")
    for s in services:
        print(f"\nPostgreSQL's time per job by statement, {s.name} (execution and planning):")
        print("\n".join(s.statement_rows(args.docs * args.rounds)))
        print("  one at a time, the longest five:")
        print("\n".join(s.statement_rows(args.latency_docs * args.rounds, solo=True, rows=5)))


def parser() -> argparse.ArgumentParser:
    parser = common.arguments(__doc__)
    parser.add_argument("--docs", type=int, default=40 if QUICK else 300, help="per burst")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 5)
    parser.add_argument("--latency-docs", type=int, default=20 if QUICK else 100)
    parser.add_argument("--against", help="a commit whose Pressroom runs beside, from a worktree")
    parser.add_argument("--samples", help="keep py-spy's samples (collapsed stacks) in this file")
    return parser


if __name__ == "__main__":
    common.main(parser, run)
