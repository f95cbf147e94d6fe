"""Where a job's CPU goes outside Chromium: Pressroom against the bare service (bench/bare.py),
in the same run.

Both serve from processes of their own (`python -m bench.cost serve pressroom|bare DSN SLOTS`)
on one throwaway cluster of Debian's PostgreSQL with pg_stat_statements (tracking the
statements that triggers and functions run too), each in a database of its own, and are
warmed. Then, in --rounds rounds, in alternating order, each prints the same styled one-page
invoices: a client in a process of its own (bench/clients.py `burst`) submits --docs of them
over HTTP and follows the event stream until the last is done. Around each burst the CPU
counters are read: the server's process (its own threads; Playwright's driver and Chromium
below it are not counted) and every PostgreSQL process. Each then takes --latency-docs jobs one
at a time (`one-at-a-time`): the p50 from POST to `job.done`. A last burst runs Pressroom under
py-spy: its samples of the server, sorted into the stages of a job, share out the server's
median CPU per job. PostgreSQL's time by statement is pg_stat_statements' execution time over
every round (↳: a statement run inside another, such as a trigger's).

    python -m bench.cost [--docs 300] [--slots 2] [--rounds 5] [--latency-docs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench.bare import BareService
from bench.common import QUICK, ROOT, at, execute, machine, run_module, running_app, summary
from bench.render import RawLoop
from server.queue import db
from server.queue.embedded import ensure_run_as_user
from server.sql import queries

SYSTEMS = ("pressroom", "bare")
#: The cluster's settings beyond initdb's: statements by pg_stat_statements, nested ones too.
SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.max": "5000",
}
#: A sample belongs to the first stage (in this order) one of whose markers is in its stack;
#: py-spy's frames read "function (path/file.py)".
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("logging", ("(logging/",)),
    (
        "Playwright calls",
        ("(server/render/chromium.py)", "(server/render/printing.py)", "(playwright/"),
    ),
    ("template", ("(server/render/templates.py)", "(server/render/sandbox.py)", "(jinja2/")),
    ("PDF checks and provenance", ("(server/pdf/", "(pikepdf/", "(server/render/preflight.py)")),
    ("store", ("(server/files/",)),
    ("submit commit", ("(server/queue/admission.py)", "create (server/queue/jobs.py)")),
    ("done write", ("finish_done", "DoneRecorder")),
    ("claim", ("claim (server/queue/jobs.py)", "Consumer._claim (server/queue/lease.py)")),
    ("event fan-out", ("(server/events/", "(server/queue/listener.py)", "(server/web/sse.py)")),
    ("HTTP and validation", ("(server/web/", "(server/schemas/", "(pydantic", "(aiohttp/")),
    ("worker, other", ("(server/pipeline/",)),
    ("asyncpg protocol", ("(asyncpg/",)),
]
OTHER = "event loop and other"


def stage_of(stack: str) -> str:
    return next((name for name, marks in STAGES if any(m in stack for m in marks)), OTHER)


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
    bin_dir, folder, user = debian_bin(), Path(tempfile.mkdtemp(prefix="prb-cost-")), None
    if (user := ensure_run_as_user()) is not None:  # PostgreSQL refuses to run as root
        shutil.chown(folder, user)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data, settings = folder / "data", " ".join(f"-c {k}={v}" for k, v in SERVER_SETTINGS.items())

    def run(*args: str) -> None:
        subprocess.run(
            [str(bin_dir / args[0]), *args[1:]],
            check=True,
            user=user,
            timeout=120,
            capture_output=True,
        )

    try:
        # Throwaway data: initdb need not sync what it wrote; the server itself runs durably.
        await asyncio.to_thread(
            run, "initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"
        )
        options = f"-p {port} -h 127.0.0.1 -k {folder} {settings}"
        log = str(folder / "log")
        await asyncio.to_thread(
            run, "pg_ctl", "-D", str(data), "-o", options, "-l", log, "-w", "start"
        )
        postmaster = psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", postmaster
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            await asyncio.to_thread(run, "pg_ctl", "-D", str(data), "-m", "fast", "stop")
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
    """One system serving from a process of its own, until closed."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, base: str, dsn: str) -> None:
        self.name, self.proc, self.base, self.dsn = name, proc, base, dsn
        self.process = psutil.Process(proc.pid)

    @classmethod
    async def start(cls, name: str, dsn: str, slots: int) -> Service:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.cost",
            "serve",
            name,
            dsn,
            str(slots),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        base = (await proc.stdout.readline()).decode().strip()
        if not base.startswith("http"):
            raise RuntimeError(f"bench.cost serve {name} did not start (exit {proc.returncode})")
        return cls(name, proc, base, dsn)

    def cpu_s(self) -> float:
        return float(sum(self.process.cpu_times()[:2]))

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()


async def serve(name: str, dsn: str, slots: int) -> None:
    """`python -m bench.cost serve`: one system on a free port, its URL printed, until stdin
    closes."""
    async with contextlib.AsyncExitStack() as stack:
        if name == "pressroom":
            base, _app = await stack.enter_async_context(running_app(dsn, render_slots=slots))
        else:
            raw = await stack.enter_async_context(RawLoop(slots))
            base = (await stack.enter_async_context(BareService(dsn, raw))).base
        print(base, flush=True)
        await asyncio.to_thread(sys.stdin.read)


async def client(*args: str) -> Any:
    return await run_module("bench.clients", *args)


async def burst(
    service: Service,
    observer: asyncpg.Connection,
    postmaster: psutil.Process,
    docs: int,
    statements: dict[tuple[str, bool], list[float]],
) -> tuple[float, float]:
    """The server's and PostgreSQL's CPU milliseconds per job over one burst of `docs` jobs;
    the burst's statements added to `statements` (total ms and calls by text and level)."""
    database = service.dsn.rsplit("/", 1)[1]
    await observer.execute("SELECT pg_stat_statements_reset()")
    server, pg = service.cpu_s(), postgres_cpu_s(postmaster)
    await client("burst", service.base, f"--docs={docs}")
    await asyncio.sleep(0.5)  # what follows the last job.done (its hub read, the next claim)
    server, pg = service.cpu_s() - server, postgres_cpu_s(postmaster) - pg
    for row in await observer.fetch(
        "SELECT query, toplevel, total_exec_time + total_plan_time AS ms, calls "
        "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)",
        database,
    ):
        sums = statements.setdefault((" ".join(row["query"].split()), row["toplevel"]), [0, 0])
        sums[0] += row["ms"]
        sums[1] += row["calls"]
    return server * 1000 / docs, pg * 1000 / docs


async def profile(service: Service, docs: int) -> collections.Counter[str]:
    """py-spy's samples of the server's process over one burst, by stage."""
    out = Path(tempfile.mkdtemp(prefix="prb-spy-")) / "samples.txt"
    spy = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("py-spy")),
        "record",
        "--pid",
        str(service.proc.pid),
        "--rate",
        "250",
        "--format",
        "raw",
        "--nolineno",
        "--gil",
        "--output",
        str(out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await asyncio.sleep(1)  # attached
    await client("burst", service.base, f"--docs={docs}")
    spy.send_signal(signal.SIGINT)
    await spy.wait()
    stages: collections.Counter[str] = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        stages[stage_of(stack)] += int(count)
    shutil.rmtree(out.parent, ignore_errors=True)
    return stages


def statement_rows(statements: dict[tuple[str, bool], list[float]], jobs: int) -> list[str]:
    """The 12 statements that took longest, per job; one of queries.sql by its block's name."""
    names = {" ".join(sql.split())[:60]: name for name, sql in queries().items()}
    top = sorted(statements.items(), key=lambda item: -item[1][0])[:12]
    return [
        f"  {ms / jobs:7.3f} ms {calls / jobs:5.2f} calls {'' if level else '↳ '}"
        + names.get(text[:60], text[:80])
        for (text, level), (ms, calls) in top
    ]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with cluster() as (server, postmaster):
        observer = await asyncpg.connect(server)
        services: dict[str, Service] = {}
        try:
            await observer.execute("CREATE EXTENSION pg_stat_statements")
            for name in SYSTEMS:
                await execute(server, f"CREATE DATABASE {name}")
                if name == "pressroom":
                    await db.migrate_at(at(server, name))
                services[name] = await Service.start(name, at(server, name), args.slots)
                await client("burst", services[name].base, f"--docs={4 * args.slots}")
            cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in SYSTEMS}
            p50: dict[str, list[float]] = {name: [] for name in SYSTEMS}
            statements: dict[str, dict[tuple[str, bool], list[float]]] = {n: {} for n in SYSTEMS}
            for number in range(args.rounds):
                order = SYSTEMS if number % 2 == 0 else SYSTEMS[::-1]
                for name in order:
                    service = services[name]
                    cpu[name].append(
                        await burst(service, observer, postmaster, args.docs, statements[name])
                    )
                for name in order:
                    timed = await client(
                        "one-at-a-time", services[name].base, f"--docs={args.latency_docs}"
                    )
                    p50[name].append(summary(timed)["p50"])
                row = {n: (sum(cpu[n][-1]), p50[n][-1]) for n in SYSTEMS}
                print(
                    f"round {number + 1}: "
                    + "; ".join(
                        f"{n} {c:.2f} ms CPU/job (server {cpu[n][-1][0]:.2f}, PostgreSQL "
                        f"{cpu[n][-1][1]:.2f}), p50 {p:.1f} ms"
                        for n, (c, p) in row.items()
                    ),
                    flush=True,
                )
            stages = await profile(services["pressroom"], args.docs)
        finally:
            for service in services.values():
                await service.close()
            await observer.close()
    return report(args, cpu, p50, statements, stages)


def report(
    args: argparse.Namespace,
    cpu: dict[str, list[tuple[float, float]]],
    p50: dict[str, list[float]],
    statements: dict[str, dict[tuple[str, bool], list[float]]],
    stages: collections.Counter[str],
) -> dict[str, Any]:
    def med(name: str, part: int | None = None) -> float:
        return statistics.median(sum(c) if part is None else c[part] for c in cpu[name])

    ratios = [sum(p) / sum(b) for p, b in zip(cpu["pressroom"], cpu["bare"], strict=True)]
    gaps = [p - b for p, b in zip(p50["pressroom"], p50["bare"], strict=True)]
    figures: dict[str, Any] = {
        "cpu_ms": {n: med(n) for n in SYSTEMS},
        "server_ms": {n: med(n, 0) for n in SYSTEMS},
        "postgres_ms": {n: med(n, 1) for n in SYSTEMS},
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "p50_ms": {n: statistics.median(p50[n]) for n in SYSTEMS},
        "p50_gap_ms": statistics.median(gaps),
    }
    print(
        f"\nCPU per job outside Chromium, median of {args.rounds} rounds of {args.docs} jobs, "
        f"{args.slots} slots:"
    )
    for name in SYSTEMS:
        print(
            f"  {name:9} {figures['cpu_ms'][name]:.2f} ms (server "
            f"{figures['server_ms'][name]:.2f}, PostgreSQL {figures['postgres_ms'][name]:.2f})"
        )
    print(
        f"  Pressroom / bare: {figures['ratio']:.2f} (rounds "
        f"{', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(
        f"submit → job.done one at a time, p50: Pressroom {figures['p50_ms']['pressroom']:.1f} "
        f"ms, bare {figures['p50_ms']['bare']:.1f} ms, gap median {figures['p50_gap_ms']:+.1f} "
        f"ms (rounds {', '.join(f'{g:+.1f}' for g in gaps)})"
    )
    total = sum(stages.values()) or 1
    print(f"\nPressroom's server CPU per job by stage ({total} py-spy samples):")
    for name, count in stages.most_common():
        print(f"  {figures['server_ms']['pressroom'] * count / total:6.2f} ms  {name}")
    for name in SYSTEMS:
        jobs = args.docs * args.rounds
        print(f"\nPostgreSQL's time per job by statement, {name} (execution and planning):")
        print("\n".join(statement_rows(statements[name], jobs)))
    return figures


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=40 if QUICK else 300, help="per burst")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 5)
    parser.add_argument("--latency-docs", type=int, default=20 if QUICK else 100)
    return parser


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        name, dsn, slots = sys.argv[2:5]
        asyncio.run(serve(name, dsn, int(slots)))
        return
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
