"""What a job costs PostgreSQL: per job, from submission to done with its webhook, the
statements, commits, WAL bytes, execution time and CPU of the server, next to PgQueuer and
Procrastinate doing an empty job on the same server in the same run; then how fast notifying
commits go, which every system here makes.

A throwaway cluster of Debian's PostgreSQL (the wheel's server has no pg_stat_statements),
started with pg_stat_statements loaded and tracking nested statements too (a trigger's
statements count), fsync and synchronous commit on, autovacuum off and checkpoints far apart,
so that a window holds only what its jobs did: no vacuum that happened to fire (vacuum is
timed on its own afterwards, with autovacuum's cost limits) and no full-page images of a
checkpoint.

Each system gets a database of its own, its schema installed first. Its cost is the
difference of two windows on that database: the system started, left idle, stopped (the empty
window), then the same with N jobs submitted by 16 concurrent clients, one job per call (HTTP
POST /v1/jobs with a webhook_url for Pressroom; an enqueue or defer for the others), run to
done (Pressroom: the no-op renderer of bench/noop.py, its PDF stored, the webhook delivered
to a receiver here that answers 200 and recorded). Each window starts and ends with no
connection to the database (its backends' statistics are all flushed then), and
pg_stat_statements is reset at its start. The benchmark's own reads stay out: its
statistics connection is on another database (its statements have another dbid, its
commits are not this database's), and the results are checked only after the counters are
read.

    python -m bench.dbcost [--jobs 2000] [--clients 16] [--ceiling-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from aiohttp import ClientSession, web

from bench.common import QUICK, command, machine, running_app, serving, submit_many, with_database
from bench.noop import NoopRenderer
from server.delivery.webhooks import Attempt
from server.keys import WEBHOOKS, WORKERS
from server.queue import db
from server.sql import queries
from tests.pgcluster import server_folder

NAME = "bench.dbcost"
DEBIAN_POSTGRESQL = Path("/usr/lib/postgresql")
#: The cluster's settings beyond initdb's (see the module docstring for why each).
SERVER_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.max": "10000",
    "autovacuum": "off",
    "checkpoint_timeout": "1h",
    "max_wal_size": "16GB",
    "max_connections": "200",
    "track_wal_io_timing": "on",
}
#: autovacuum's defaults, for the timed VACUUM: 200 credits, then a 2 ms sleep.
VACUUM_COST = {"vacuum_cost_delay": "2ms", "vacuum_cost_limit": "200"}
TEMPLATE = "<p>Job {{ n }}</p>"
SETTLE_S = 1.0  # a started system sits idle this long before its jobs (and in the empty window)
WORKER_CONCURRENCY = 16  # Pressroom's render slots, Procrastinate's concurrency
PGQUEUER_BATCH = 10  # its default
PRODUCER_POOL = 10  # connections the submitting side has (Pressroom's web pool: db_pool_max)
QUIET_TIMEOUT_S = 30.0
POLL_S = 0.02
SYSTEMS = ("pressroom", "pgqueuer", "procrastinate")
TOP = 8


class MissingServer(RuntimeError):
    """Debian's PostgreSQL with pg_stat_statements is not installed."""


def debian_server() -> Path:
    """The bin folder of the newest Debian PostgreSQL that has pg_stat_statements (`make
    install` installs one when there is none); the 15 of Debian 12 when none is there."""
    found = sorted(
        (folder for folder in DEBIAN_POSTGRESQL.glob("*") if folder.name.isdigit()),
        key=lambda folder: int(folder.name),
    )
    usable = [folder for folder in found if (folder / "lib" / "pg_stat_statements.so").exists()]
    return (usable[-1] if usable else DEBIAN_POSTGRESQL / "15") / "bin"


# --- The cluster ----------------------------------------------------------------------------


class Cluster:
    """A PostgreSQL cluster of its own in a temporary folder, from Debian's binaries."""

    def __init__(self, bin_dir: Path) -> None:
        for needed in (bin_dir / "postgres", bin_dir.parent / "lib" / "pg_stat_statements.so"):
            if not needed.exists():
                raise MissingServer(
                    f"{needed} is missing: bench.dbcost needs a Debian PostgreSQL server "
                    "with pg_stat_statements (apt-get install postgresql, as `make install` "
                    "does as root)"
                )
        self.bin_dir = bin_dir
        # The tests' throwaway clusters are made the same way (as bench.finishing takes their CA).
        self.folder, self._user = server_folder("prb-dbcost-")
        self.data = self.folder / "data"
        self.port = _free_port()

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(args, check=True, user=self._user, capture_output=True, timeout=120)

    def start(self) -> None:
        initdb = str(self.bin_dir / "initdb")
        # Throwaway data: initdb need not sync what it wrote; the server itself runs durably.
        self._run(initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in SERVER_SETTINGS.items())
        options = f"-p {self.port} -h 127.0.0.1 -k {self.folder}"
        pg_ctl = str(self.bin_dir / "pg_ctl")
        log = str(self.folder / "log")
        self._run(pg_ctl, "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def postmaster(self) -> psutil.Process:
        return psutil.Process(int((self.data / "postmaster.pid").read_text().split()[0]))

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def cluster(bin_dir: Path) -> AsyncIterator[Cluster]:
    server = Cluster(bin_dir)
    try:
        await asyncio.to_thread(server.start)
        await _wait_accepting(server.dsn)
        yield server
    finally:
        await asyncio.to_thread(server.destroy)


async def _wait_accepting(dsn: str) -> None:
    async with asyncio.timeout(60):
        while True:
            try:
                conn = await asyncpg.connect(dsn)
            except (OSError, asyncpg.CannotConnectNowError):
                await asyncio.sleep(0.1)
                continue
            await conn.close()
            return


# --- Counters -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Counters:
    """The cluster's counters that a window's difference is made of."""

    wal_bytes: int  # from pg_current_wal_lsn()
    xids: int  # transaction ids handed out: transactions that wrote
    commits: int  # pg_stat_database.xact_commit of the system's database
    wal_syncs: int  # pg_stat_wal: WAL fsyncs, and the milliseconds they took
    wal_sync_ms: float
    cpu_s: float  # every PostgreSQL process, the exited ones included

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            *(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self))
        )


@dataclasses.dataclass(frozen=True)
class Statement:
    query: str
    toplevel: bool
    calls: int
    exec_ms: float
    wal_bytes: int


@dataclasses.dataclass(frozen=True)
class Window:
    counters: Counters
    statements: dict[tuple[int, bool], Statement]
    elapsed_s: float
    outcome: Any  # what the run returned


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def postgres_cpu_s(postmaster: psutil.Process) -> float:
    """CPU seconds of the postmaster and every child it has (backends that exited count in its
    children's times: it waits for each)."""
    times = postmaster.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in postmaster.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return float(total)


async def counters(observer: asyncpg.Connection, database: str, server: Cluster) -> Counters:
    row = await observer.fetchrow(
        """
        SELECT pg_current_wal_lsn()::text AS lsn,
               pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
               d.xact_commit, w.wal_sync, w.wal_sync_time
        FROM pg_stat_database d, pg_stat_wal w
        WHERE d.datname = $1
        """,
        database,
    )
    return Counters(
        wal_bytes=_lsn(row["lsn"]),
        xids=row["next_xid"],
        commits=row["xact_commit"],
        wal_syncs=row["wal_sync"],
        wal_sync_ms=row["wal_sync_time"],
        cpu_s=postgres_cpu_s(server.postmaster()),
    )


async def statements(observer: asyncpg.Connection, database: str) -> dict[Any, Statement]:
    rows = await observer.fetch(
        """
        SELECT queryid, toplevel, query, calls, total_exec_time, wal_bytes
        FROM pg_stat_statements
        WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)
        """,
        database,
    )
    return {
        (row["queryid"], row["toplevel"]): Statement(
            query=_plain(row["query"]),
            toplevel=row["toplevel"],
            calls=row["calls"],
            exec_ms=row["total_exec_time"],
            wal_bytes=int(row["wal_bytes"]),
        )
        for row in rows
    }


async def quiet(observer: asyncpg.Connection, database: str) -> None:
    """Until no connection is left on `database`: a backend flushes its statistics on exit."""
    async with asyncio.timeout(QUIET_TIMEOUT_S):
        # PostgreSQL has no event for a database's last backend leaving: poll (another one).
        while await observer.fetchval(  # noqa: ASYNC110
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database
        ):
            await asyncio.sleep(POLL_S)


async def window(
    observer: asyncpg.Connection, database: str, server: Cluster, run: Callable[[], Awaitable[Any]]
) -> Window:
    """What `run` made PostgreSQL do in `database`."""
    await quiet(observer, database)
    await observer.execute("SELECT pg_stat_statements_reset()")
    before = await counters(observer, database, server)
    started = time.perf_counter()
    outcome = await run()
    elapsed_s = time.perf_counter() - started
    await quiet(observer, database)
    after = await counters(observer, database, server)
    return Window(after - before, await statements(observer, database), elapsed_s, outcome)


# --- The systems ----------------------------------------------------------------------------


def payload(n: int) -> dict[str, Any]:
    return {"template": TEMPLATE, "data": {"n": n}}


async def _gather_limited(count: int, clients: int, one: Callable[[int], Awaitable[None]]) -> None:
    """`one(n)` for every n below `count`, `clients` at a time."""
    numbers = iter(range(count))

    async def client() -> None:
        for n in numbers:
            await one(n)

    await asyncio.gather(*(client() for _ in range(clients)))


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[str]:
    """A webhook endpoint on 127.0.0.1 that answers 200; yields its URL."""

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    async with serving(app) as base:
        yield f"{base}/hook"


async def pressroom(dsn: str, count: int, clients: int, hook_url: str) -> int:
    """A Pressroom process (web and workers, no-op renderer); `count` jobs posted over HTTP,
    each with a webhook, until every webhook is delivered and recorded. Returns how many
    were handed to an idle worker in their submission's statement (no claim of their own)."""
    delivered = 0
    all_delivered = asyncio.Event()
    refused: list[Attempt] = []

    def on_attempt(attempt: Attempt) -> None:
        nonlocal delivered
        if attempt.outcome != "delivered":
            refused.append(attempt)
            all_delivered.set()
        delivered += 1
        if delivered == count:
            all_delivered.set()

    overrides: dict[str, Any] = {
        "render_slots": WORKER_CONCURRENCY,
        "renderer_factory": NoopRenderer,
        "allow_hosts": ("127.0.0.1",),
    }
    async with running_app(dsn, **overrides) as (base, app), ClientSession() as http:
        app[WEBHOOKS].listeners.append(on_attempt)
        await asyncio.sleep(SETTLE_S)
        if count:
            bodies = [{**payload(n), "webhook_url": hook_url} for n in range(count)]
            await submit_many(http, base, bodies, clients)
            await asyncio.wait_for(all_delivered.wait(), timeout=_timeout_s(count))
            if refused:
                raise RuntimeError(f"a webhook was not delivered: {refused[0].error}")
        return app[WORKERS].handed_off


async def pressroom_check(dsn: str, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        done = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'done'")
        delivered = await conn.fetchval(
            "SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'"
        )
    finally:
        await conn.close()
    if (done, delivered) != (count, count):
        raise RuntimeError(f"Pressroom: {done} jobs done and {delivered} webhooks of {count}")


def _pgqueuer_setup() -> None:
    # "balanced", as bench.queue: the queue table is logged (durable, as Pressroom's jobs are).
    os.environ["PGQUEUER_DURABILITY"] = "balanced"
    from pgqueuer.domain.settings import db_settings

    db_settings.cache_clear()


async def pgqueuer_install(dsn: str) -> None:
    _pgqueuer_setup()
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def pgqueuer(dsn: str, count: int, clients: int) -> None:
    """One PgQueuer queue manager with an empty handler; `count` jobs enqueued one per call."""
    _pgqueuer_setup()
    from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Queries, QueueManager
    from pgqueuer.models import Job

    processed = 0
    all_processed = asyncio.Event()
    conn = await asyncpg.connect(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=PRODUCER_POOL)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("render")
    async def render(job: Job) -> None:
        nonlocal processed
        processed += 1
        if processed == count:
            all_processed.set()

    task = asyncio.create_task(
        qm.run(batch_size=PGQUEUER_BATCH, dequeue_timeout=timedelta(seconds=5))
    )
    try:
        await asyncio.sleep(SETTLE_S)
        if count:
            producer = Queries(AsyncpgPoolDriver(pool))

            async def one(n: int) -> None:
                await producer.enqueue("render", json.dumps(payload(n)).encode(), 0)

            await _gather_limited(count, clients, one)
            await asyncio.wait_for(all_processed.wait(), timeout=_timeout_s(count))
    finally:
        qm.shutdown.set()
        await _settle(task)
        await pool.close()
        await conn.close()


async def pgqueuer_check(dsn: str, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
    finally:
        await conn.close()
    if left:
        raise RuntimeError(f"PgQueuer: {left} of {count} jobs left in its queue")


def _procrastinate_app(dsn: str) -> Any:
    import procrastinate

    # It warns that the app is made in __main__ (true when run as `python -m bench.dbcost`).
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=PRODUCER_POOL + 2)
    return procrastinate.App(connector=connector)


async def procrastinate_install(dsn: str) -> None:
    app = _procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate(dsn: str, count: int, clients: int) -> None:
    """One Procrastinate worker with an empty task; `count` jobs deferred one per call."""
    app = _procrastinate_app(dsn)
    processed = 0
    all_processed = asyncio.Event()

    @app.task(name="render", queue="render")
    async def render(**_kwargs: Any) -> None:
        nonlocal processed
        processed += 1
        if processed == count:
            all_processed.set()

    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(
                queues=["render"],
                concurrency=WORKER_CONCURRENCY,
                wait=True,
                install_signal_handlers=False,
                listen_notify=True,
            )
        )
        try:
            await asyncio.sleep(SETTLE_S)
            if count:

                async def one(n: int) -> None:
                    await render.defer_async(**payload(n))

                await _gather_limited(count, clients, one)
                await asyncio.wait_for(all_processed.wait(), timeout=_timeout_s(count))
        finally:
            worker.cancel()
            await _settle(worker)


async def procrastinate_check(dsn: str, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        done = await conn.fetchval(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
    finally:
        await conn.close()
    if done != count:
        raise RuntimeError(f"Procrastinate: {done} of {count} jobs succeeded")


def _timeout_s(count: int) -> float:
    return 60 + count / 20


async def _settle(task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(15):
            await asyncio.gather(task, return_exceptions=True)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# --- Per job --------------------------------------------------------------------------------


async def table_rows(dsn: str) -> dict[str, dict[str, int]]:
    """Row changes per table of the database, as its statistics have them."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_user_tables"
        )
    finally:
        await conn.close()
    return {
        r["relname"]: {
            "inserted": r["n_tup_ins"],
            "updated": r["n_tup_upd"],
            "hot": r["n_tup_hot_upd"],
            "deleted": r["n_tup_del"],
        }
        for r in rows
    }


async def vacuum(observer: asyncpg.Connection, dsn: str) -> dict[str, Any]:
    """VACUUM of every table the jobs left dead rows in, one at a time with autovacuum's cost
    limits: the seconds it took and the WAL it wrote."""
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch(
            "SELECT relid::regclass::text AS name FROM pg_stat_user_tables WHERE n_dead_tup > 0"
        )
        for name, value in VACUUM_COST.items():
            await conn.execute(f"SET {name} = '{value}'")
        lsn_before = _lsn(await observer.fetchval("SELECT pg_current_wal_lsn()::text"))
        seconds: dict[str, float] = {}
        for row in tables:
            started = time.perf_counter()
            await conn.execute(f"VACUUM {row['name']}")
            seconds[row["name"]] = time.perf_counter() - started
        lsn_after = _lsn(await observer.fetchval("SELECT pg_current_wal_lsn()::text"))
    finally:
        await conn.close()
    return {
        "seconds": seconds,
        "total_s": sum(seconds.values()),
        "wal_bytes": lsn_after - lsn_before,
    }


def per_job(empty: Window, full: Window, count: int) -> dict[str, Any]:
    """The full window less the empty one, divided by the jobs."""
    c = full.counters - empty.counters
    stats: dict[tuple[int, bool], Statement] = {}
    for key, s in full.statements.items():
        e = empty.statements.get(key)
        calls = s.calls - (e.calls if e else 0)
        if calls <= 0:
            continue
        stats[key] = dataclasses.replace(
            s,
            calls=calls,
            exec_ms=s.exec_ms - (e.exec_ms if e else 0.0),
            wal_bytes=s.wal_bytes - (e.wal_bytes if e else 0),
        )
    top = [s for s in stats.values() if s.toplevel]
    notifying = [s for s in stats.values() if _notifies(s.query)]
    return {
        "statements_top": sum(s.calls for s in top) / count,
        "statements_all": sum(s.calls for s in stats.values()) / count,
        "commits": c.commits / count,
        "write_transactions": c.xids / count,
        "wal_bytes": c.wal_bytes / count,
        "exec_ms": sum(s.exec_ms for s in top) / count,
        "cpu_ms": c.cpu_s * 1000 / count,
        "wal_syncs": c.wal_syncs / count,
        "wal_sync_ms": c.wal_sync_ms / c.wal_syncs if c.wal_syncs else float("nan"),
        "notify_statements": sum(s.calls for s in notifying) / count,
        # Each system's NOTIFY statements run in one trigger invocation with its most frequent
        # one (Pressroom's job_events trigger, Procrastinate's notify trigger), so that one
        # counts the transactions that NOTIFY, and take the cluster's NOTIFY lock.
        "notify_transactions": max((s.calls for s in notifying), default=0) / count,
        "top": [_each(s, count) for s in sorted(stats.values(), key=lambda s: -s.exec_ms)[:TOP]],
        "top_wal": [
            _each(s, count) for s in sorted(stats.values(), key=lambda s: -s.wal_bytes)[:TOP]
        ],
        "notifying": [_each(s, count) for s in sorted(notifying, key=lambda s: -s.calls)],
        "jobs_per_s": count / (full.elapsed_s - empty.elapsed_s),
    }


def _each(s: Statement, count: int) -> dict[str, Any]:
    return {
        "query": s.query,
        "block": block_name(s.query),
        "toplevel": s.toplevel,
        "calls": s.calls / count,
        "exec_ms": s.exec_ms / count,
        "wal_bytes": s.wal_bytes / count,
    }


def _plain(sql: str) -> str:
    """SQL without its comments, on one line."""
    return " ".join(_COMMENT.sub("", sql).split())


def block_name(query: str) -> str:
    """The block of server/sql/queries.sql that `query` (as pg_stat_statements has it, its
    constants turned into $n) was sent from: the one it shares the longest start with (at
    least MATCH_CHARS characters), or "" (a trigger's statement, or another system's)."""
    shared = {name: _shared(query, _plain(sql)) for name, sql in queries().items()}
    best = max(shared.values(), default=0)
    if best < MATCH_CHARS:
        return ""
    return " or ".join(sorted(name for name, n in shared.items() if n == best))


def _shared(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


MATCH_CHARS = 30
_COMMENT = re.compile(r"--[^\n]*")
_NOTIFY = re.compile(r"\bpg_notify\s*\(|^\s*NOTIFY\b", re.IGNORECASE)


def _notifies(query: str) -> bool:
    return bool(_NOTIFY.search(query))


# --- Commits with and without NOTIFY --------------------------------------------------------


async def commit_ceiling(dsn: str, connections: int, seconds: float) -> dict[str, float]:
    """One-row INSERTs committed per second from `connections` connections, alone and with a
    NOTIFY in the same transaction (one LISTENing connection hears them): every notifying
    commit holds one cluster-wide lock until its commit record is flushed."""
    admin = await asyncpg.connect(dsn)
    await admin.execute("CREATE TABLE ceiling (id bigserial PRIMARY KEY, at timestamptz)")
    await admin.add_listener("ceiling", lambda *_: None)
    plain = "INSERT INTO ceiling (at) VALUES (now())"
    notifying = (
        "WITH i AS (INSERT INTO ceiling (at) VALUES (now()) RETURNING id) "
        "SELECT pg_notify('ceiling', id::text) FROM i"
    )
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    try:
        result = {}
        for name, statement in (("plain", plain), ("notify", notifying)):
            deadline = time.perf_counter() + seconds
            done = 0

            async def loop(conn: asyncpg.Connection, statement: str, deadline: float) -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    await conn.execute(statement)
                    done += 1

            started = time.perf_counter()
            await asyncio.gather(*(loop(c, statement, deadline) for c in conns))
            result[name] = done / (time.perf_counter() - started)
    finally:
        for conn in [*conns, admin]:
            await conn.close()
    return {
        "connections": connections,
        "plain_per_s": result["plain"],
        "notify_per_s": result["notify"],
        "notify_hold_ms": 1000 / result["notify"],
    }


# --- The run --------------------------------------------------------------------------------


async def pressroom_install(dsn: str) -> None:
    conn = await db.connect(dsn)
    try:
        await db.migrate(conn)
    finally:
        await conn.close()


INSTALL: dict[str, Callable[[str], Awaitable[None]]] = {
    "pressroom": pressroom_install,
    "pgqueuer": pgqueuer_install,
    "procrastinate": procrastinate_install,
}
CHECK: dict[str, Callable[[str, int], Awaitable[None]]] = {
    "pressroom": pressroom_check,
    "pgqueuer": pgqueuer_check,
    "procrastinate": procrastinate_check,
}
#: The per-job figures, as the report shows them: key, label, decimals.
FIGURES = [
    ("statements_top", "statements, top-level (BEGIN and COMMIT included)", 2),
    ("statements_all", "statements, with those of triggers and functions", 2),
    ("commits", "commits (pg_stat_database)", 2),
    ("write_transactions", "of which wrote (transaction ids)", 2),
    ("wal_syncs", "WAL flushes (pg_stat_wal)", 2),
    ("notify_statements", "statements that NOTIFY", 2),
    ("notify_transactions", "transactions that NOTIFY (the most frequent of those)", 2),
    ("wal_bytes", "WAL bytes", 0),
    ("exec_ms", "execution ms (top-level statements)", 3),
    ("cpu_ms", "PostgreSQL CPU ms (all its processes)", 3),
    ("vacuum_s_per_1000", "VACUUM afterwards, s per 1,000 jobs (autovacuum's cost limits)", 3),
    ("vacuum_wal_bytes", "WAL bytes of that VACUUM", 0),
]


async def measure(
    system: str, server: Cluster, observer: asyncpg.Connection, args: argparse.Namespace
) -> dict[str, Any]:
    """One system on a database of its own: the empty window, the full one, their
    difference per job, the row changes per table and the VACUUM afterwards."""
    name = f"dbcost_{system}"
    await observer.execute(f'CREATE DATABASE "{name}"')
    dsn = with_database(server.dsn, name)
    await INSTALL[system](dsn)
    async with receiver() as hook_url:

        def run(count: int) -> Callable[[], Awaitable[Any]]:
            if system == "pressroom":
                return lambda: pressroom(dsn, count, args.clients, hook_url)
            if system == "pgqueuer":
                return lambda: pgqueuer(dsn, count, args.clients)
            return lambda: procrastinate(dsn, count, args.clients)

        empty = await window(observer, name, server, run(0))
        rows_before = await table_rows(dsn)
        full = await window(observer, name, server, run(args.jobs))
    result = per_job(empty, full, args.jobs)
    if system == "pressroom":
        result["handed_off"] = full.outcome / args.jobs
    await CHECK[system](dsn, args.jobs)
    rows_after = await table_rows(dsn)
    result["tables"] = {
        table: {k: (v - rows_before.get(table, {}).get(k, 0)) / args.jobs for k, v in row.items()}
        for table, row in rows_after.items()
        if any(row.values())
    }
    cleaned = await vacuum(observer, dsn)
    result["vacuum_s_per_1000"] = cleaned["total_s"] * 1000 / args.jobs
    result["vacuum_wal_bytes"] = cleaned["wal_bytes"] / args.jobs
    result["vacuum_tables"] = {t: s * 1000 / args.jobs for t, s in cleaned["seconds"].items()}
    return result


CORES = 16
#: A WAL flush on a datacenter NVMe drive with power-loss protection (well under this).
FAST_FLUSH_MS = 0.1
#: The limits that do not move with each other; execution time alone is shown, not chosen.
LIMITS = ("cpu", "notify", "vacuum")


def estimate(system: dict[str, Any], ceiling: dict[str, float]) -> dict[str, Any]:
    """Jobs/s that each limit allows a PostgreSQL of CORES cores of this machine's kind, from
    the per-job figures: its CPU; the NOTIFY lock, at this disk's flush (measured) and at
    FAST_FLUSH_MS; autovacuum at its default cost limit. Which breaks first, and the commits
    and WAL that rate means."""

    def bound(capacity: float, per_job: float) -> float:
        return capacity / per_job if per_job > 0 else float("inf")

    notify_fast_per_s = 1000 / FAST_FLUSH_MS
    limits = {
        "cpu": bound(CORES * 1000, system["cpu_ms"]),
        "exec": bound(CORES * 1000, system["exec_ms"]),
        "notify": bound(ceiling["notify_per_s"], system["notify_transactions"]),
        "notify_fast": bound(notify_fast_per_s, system["notify_transactions"]),
        "vacuum": bound(1000, system["vacuum_s_per_1000"]),
    }
    result: dict[str, Any] = dict(limits)
    for suffix, notify in (("", "notify"), ("_fast", "notify_fast")):
        chosen = {"cpu": limits["cpu"], "notify": limits[notify], "vacuum": limits["vacuum"]}
        first = min(LIMITS, key=lambda k: chosen[k])
        rate = chosen[first]
        result |= {
            f"first{suffix}": first,
            f"rate{suffix}": rate,
            f"commits_per_s{suffix}": rate * system["commits"],
            f"write_transactions_per_s{suffix}": rate * system["write_transactions"],
            f"wal_mb_per_s{suffix}": rate * system["wal_bytes"] / 1e6,
        }
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"args": vars(args), "command": command(NAME, *_argv(args))}
    async with cluster(Path(args.pg_bin)) as server:
        observer = await asyncpg.connect(server.dsn)
        try:
            await observer.execute("CREATE EXTENSION pg_stat_statements")
            result["postgres"] = "PostgreSQL " + await observer.fetchval("SHOW server_version")
            for system in SYSTEMS:
                result[system] = await measure(system, server, observer, args)
                print_system(system, result[system])
            await observer.execute('CREATE DATABASE "dbcost_ceiling"')
            ceiling_dsn = with_database(server.dsn, "dbcost_ceiling")
            result["ceiling"] = await commit_ceiling(ceiling_dsn, args.clients, args.ceiling_s)
        finally:
            await observer.close()
    result |= {
        "settle_s": SETTLE_S,
        "concurrency": WORKER_CONCURRENCY,
        "pgqueuer_batch": PGQUEUER_BATCH,
        "producer_pool": PRODUCER_POOL,
        "vacuum_cost": VACUUM_COST,
    }
    result["cores"] = CORES
    result["fast_flush_ms"] = FAST_FLUSH_MS
    result["figures"] = FIGURES
    result["estimate"] = {s: estimate(result[s], result["ceiling"]) for s in SYSTEMS}
    print_result(result)
    return result


def print_system(system: str, r: dict[str, Any]) -> None:
    print(
        f"dbcost  {system}: {r['statements_top']:.2f} statements ({r['statements_all']:.2f} "
        f"with nested), {r['commits']:.2f} commits, {r['wal_bytes']:.0f} WAL bytes, "
        f"{r['exec_ms']:.3f} exec ms, {r['cpu_ms']:.3f} CPU ms per job "
        f"({r['jobs_per_s']:.0f} jobs/s)",
        flush=True,
    )
    changes = ", ".join(
        f"{table} {c['inserted']:.2f} in {c['updated']:.2f} up ({c['hot']:.2f} HOT) "
        f"{c['deleted']:.2f} del"
        for table, c in r["tables"].items()
    )
    print(f"dbcost  {system}: rows per job: {changes}", flush=True)


def print_result(result: dict[str, Any]) -> None:
    width = 70
    print(f"dbcost  {result['postgres']}, {result['args']['jobs']} jobs per system, per job:")
    print("dbcost  " + " " * width + "".join(f"{s:>15}" for s in SYSTEMS))
    for key, label, digits in FIGURES:
        cells = "".join(f"{result[s][key]:>15,.{digits}f}" for s in SYSTEMS)
        print(f"dbcost  {label:<{width}}{cells}")
    for system in SYSTEMS:
        for key, what in (
            ("top", "by execution time"),
            ("top_wal", "by WAL"),
            ("notifying", "that NOTIFY"),
        ):
            print(f"dbcost  {system}: statements {what}, per job")
            for each in result[system][key]:
                print(f"dbcost    {_statement(each)}")
    c = result["ceiling"]
    print(
        f"dbcost  commits/s from {c['connections']} connections: {c['plain_per_s']:.0f} plain, "
        f"{c['notify_per_s']:.0f} with a NOTIFY (the lock held {c['notify_hold_ms']:.3f} ms each)"
    )
    for system in SYSTEMS:
        e = result["estimate"][system]
        print(
            f"dbcost  {system} on {CORES} cores, jobs/s: CPU {e['cpu']:,.0f}, NOTIFY lock "
            f"{e['notify']:,.0f} ({e['notify_fast']:,.0f} at a {FAST_FLUSH_MS:g} ms flush), "
            f"autovacuum {e['vacuum']:,.0f}; first: {e['first']} at {e['rate']:,.0f} jobs/s "
            f"({e['commits_per_s']:,.0f} commits/s, {e['wal_mb_per_s']:.1f} MB/s of WAL); at a "
            f"{FAST_FLUSH_MS:g} ms flush {e['first_fast']} at {e['rate_fast']:,.0f}",
            flush=True,
        )


def _statement(each: dict[str, Any]) -> str:
    level = "top" if each["toplevel"] else "nested"
    named = f"[{each['block']}] " if each["block"] else ""
    return (
        f"{each['exec_ms']:7.3f} ms {each['wal_bytes']:7.0f} B {each['calls']:6.2f} calls "
        f"{level:6}  {named}{each['query'][:90]}"
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=300 if QUICK else 2000)
    parser.add_argument("--clients", type=int, default=16, help="concurrent submitters")
    parser.add_argument(
        "--ceiling-s", type=float, default=0.5 if QUICK else 2.0, help="each commit ceiling"
    )
    parser.add_argument("--pg-bin", default=str(debian_server()), help="PostgreSQL's bin folder")
    return parser


def _argv(args: argparse.Namespace) -> list[str]:
    return [f"--jobs {args.jobs}", f"--clients {args.clients}", f"--ceiling-s {args.ceiling_s:g}"]


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    try:
        asyncio.run(run(args))
    except MissingServer as exc:
        raise SystemExit(f"bench.dbcost: {exc}") from None


if __name__ == "__main__":
    main()
