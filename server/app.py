"""The application factory: resources in dependency order, routes, background tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from server import (
    admission,
    api,
    batches,
    db,
    events,
    health,
    library,
    openapi,
    retention,
    sockets,
    sse,
)
from server.admission import InFlight
from server.auth import Authenticator
from server.hub import Hub
from server.jobs import GroupCommit
from server.keys import (
    AUTH,
    CHROMIUM,
    DSN,
    GROUP_COMMIT,
    HUB,
    IN_FLIGHT,
    LISTENER,
    METRICS,
    POLICY,
    POOL,
    RENDERER,
    SETTINGS,
    STORAGE,
    WEBHOOKS,
    WORKERS,
)
from server.listener import Listener
from server.metrics import Metrics
from server.netpolicy import NetworkPolicy
from server.problems import middleware as problem_middleware
from server.render import ChromiumRenderer, Renderer
from server.settings import Settings
from server.storage import LocalStorage, open_s3_storage
from server.webhooks import WebhookSender
from server.worker import WorkerConfig, Workers, rescue_loop

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
PRUNE_INTERVAL_S = 3600.0
LISTEN_START_TIMEOUT_S = 30.0

RendererFactory = Callable[[Settings], Renderer]


@contextlib.asynccontextmanager
async def background(name: str, coro: Any) -> AsyncIterator[asyncio.Task[None]]:
    """A named task owned by a cleanup context: cancelled and awaited on exit."""
    task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
    task.add_done_callback(_report_crash)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.critical("background task %s crashed", task.get_name(), exc_info=task.exception())


def create_app(
    settings: Settings, *, renderer_factory: RendererFactory | None = None
) -> web.Application:
    """Build the app; tests call this too. Nothing starts until the app runner sets it up."""
    # Authentication runs inside the problem middleware, so its 401s and 429s are problem+json.
    authenticator = Authenticator(settings)
    app = web.Application(
        middlewares=[problem_middleware, authenticator.middleware],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    metrics = app[METRICS] = Metrics()
    app[AUTH] = authenticator
    app[POLICY] = NetworkPolicy(settings.allow_hosts)
    app[sse.STREAMS_KEY] = set()

    async def database(app: web.Application) -> AsyncIterator[None]:
        embedded = None
        dsn = settings.database_url
        if dsn is None:
            embedded = db.EmbeddedPostgres(settings.data_dir / "postgres")
            dsn = await embedded.start()
            log.info("embedded PostgreSQL running in %s", embedded.folder)
        app[DSN] = dsn
        conn = await db.connect(dsn)
        try:
            await db.migrate(conn)
        finally:
            await conn.close()
        pool = await db.create_pool(
            dsn, min_size=settings.db_pool_min, max_size=settings.db_pool_max
        )
        app[POOL] = pool
        app[GROUP_COMMIT] = GroupCommit(pool)
        app[IN_FLIGHT] = InFlight()
        yield
        await pool.close()
        if embedded is not None:
            await embedded.stop()

    async def storage(app: web.Application) -> AsyncIterator[None]:
        if settings.storage == "s3":
            async with open_s3_storage(settings) as s3:
                app[STORAGE] = s3
                await _report_storage(s3)
                yield
        else:
            local = LocalStorage(settings.files_dir, settings.secret)
            app[STORAGE] = local
            await _report_storage(local)
            yield
            await asyncio.to_thread(local.close)

    async def hub(app: web.Application) -> AsyncIterator[None]:
        hub = Hub(
            app[POOL],
            queue_limit=settings.subscriber_queue,
            poll_interval_s=settings.poll_interval_s,
        )
        app[HUB] = hub

        def wake_workers() -> None:
            if WORKERS in app:
                app[WORKERS].wake()

        def wake_webhooks() -> None:
            if WEBHOOKS in app:
                app[WEBHOOKS].wake()

        listener = Listener(
            app[DSN], on_event=hub.poke, on_work=wake_workers, on_webhook=wake_webhooks
        )
        app[LISTENER] = listener
        async with background("hub", hub.run()), background("listener", listener.run()):
            # Serve only once notifications flow, so the first job's push is not late.
            async with asyncio.timeout(LISTEN_START_TIMEOUT_S):
                await listener.connected.wait()
            yield

    async def renderer(app: web.Application) -> AsyncIterator[None]:
        if settings.render_slots == 0:
            yield
            return
        if renderer_factory is not None:
            app[RENDERER] = renderer_factory(settings)
            yield
            return
        chromium = ChromiumRenderer(
            policy=app[POLICY],
            slots=settings.render_slots,
            executable=settings.chromium,
            user=settings.chromium_user,
            render_max_mb=settings.render_max_mb,
            max_pages=settings.max_pages,
            recycle_after_jobs=settings.browser_recycle_jobs,
            max_rss_mb=settings.browser_max_rss_mb,
        )
        await chromium.start()
        app[RENDERER] = app[CHROMIUM] = chromium
        yield
        await chromium.close()

    async def workers(app: web.Application) -> AsyncIterator[None]:
        if settings.render_slots == 0:
            yield
            return
        config = WorkerConfig(
            slots=settings.render_slots,
            lease_s=settings.lease_s,
            render_timeout_s=settings.render_timeout_s,
            poll_interval_s=settings.poll_interval_s,
            retry_base_s=settings.retry_base_s,
            retry_max_s=settings.retry_max_s,
            shutdown_grace_s=settings.shutdown_grace_s,
            max_pages=settings.max_pages,
            prefetch=settings.prefetch if settings.render_slots else 0,
            claim_while_printing_s=settings.claim_while_printing_s,
        )
        workers = Workers(app[POOL], app[RENDERER], app[STORAGE], config, metrics=metrics)
        app[WORKERS] = workers
        app[HUB].add_listener(workers.on_event)
        if settings.hand_off:
            app[GROUP_COMMIT].hand_off = workers
        async with (
            background("workers", workers.run()),
            background("heartbeat", workers.heartbeat()),
        ):
            yield
            app[GROUP_COMMIT].hand_off = None
            await workers.stop()

    async def webhooks(app: web.Application) -> AsyncIterator[None]:
        if settings.webhook_concurrency == 0:
            yield
            return
        async with WebhookSender.open(app[POOL], app[STORAGE], app[POLICY], settings) as sender:
            app[WEBHOOKS] = sender
            sender.listeners.append(
                lambda attempt: metrics.webhook_attempts.labels(attempt.outcome).inc()
            )
            async with background("webhooks", sender.run()):
                yield
                await sender.stop()

    async def authentication(app: web.Application) -> AsyncIterator[None]:
        # Before the browser starts: a server that must not run open stops right away.
        await authenticator.start(app[POOL])
        pruner = admission.prune_loop(app[POOL], key_ttl_s=settings.idempotency_ttl_s)
        async with (
            background("idempotency-pruner", pruner),
            background("auth-refresh", authenticator.refresh_loop()),
        ):
            yield

    async def maintenance(app: web.Application) -> AsyncIterator[None]:
        async with (
            background("rescuer", rescue_loop(app[POOL], interval_s=settings.rescue_interval_s)),
            background("pruner", _prune_loop(app)),
            background("retention", _retention_loop(app)),
        ):
            yield

    app.cleanup_ctx.extend(
        [database, authentication, storage, hub, renderer, workers, webhooks, maintenance]
    )
    app.on_shutdown.append(_close_streams)

    if settings.run_web:
        app.add_routes(api.routes)
        app.add_routes(sse.routes)
        app.add_routes(batches.routes)
        library.setup(app)  # /v1/templates
        app.add_routes(health.routes)
        app.router.add_get("/v1/openapi.json", openapi.handler)
        app.router.add_get("/", _index)
        if STATIC_DIR.is_dir():
            app.router.add_static("/static/", STATIC_DIR, append_version=False)
        sockets.attach(app)  # Socket.IO at /socket.io/; its cleanup step runs after the hub's
    return app


async def _report_storage(storage: Any) -> None:
    try:
        await storage.check()
    except Exception as exc:
        log.error("storage is not ready (/readyz fails until it is): %s", exc)


async def _retention_loop(app: web.Application) -> None:
    days = app[SETTINGS].retention_days
    if days:
        await retention.run(app[POOL], app[STORAGE], older_than_days=days)


async def _prune_loop(app: web.Application) -> None:
    settings = app[SETTINGS]
    while True:
        try:
            pruned = await events.prune(app[POOL], older_than_s=settings.event_retention_s)
            if pruned:
                log.info("pruned %s events older than %s s", pruned, settings.event_retention_s)
        except Exception as exc:
            log.warning("event pruning failed: %s", exc)
        await asyncio.sleep(PRUNE_INTERVAL_S)


async def _close_streams(app: web.Application) -> None:
    """Long-lived streams end at shutdown, or shutdown would wait out its timeout."""
    if HUB in app:
        app[HUB].close_all("server shutting down; reconnect and resume by event id")
    streams: set[Any] = app[sse.STREAMS_KEY]
    for resp in list(streams):
        with contextlib.suppress(RuntimeError):
            resp.stop_streaming()
    await sockets.close_all(app)


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")
