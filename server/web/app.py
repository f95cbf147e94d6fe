"""The application factory: resources in dependency order, routes, background tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import hdrs, web

from server.delivery.webhooks import WebhookSender
from server.events.hub import SHUTDOWN_REASON, UNAVAILABLE, Hub, Reason
from server.files.assets import AssetCache
from server.files.s3 import open_s3_storage
from server.files.storage import LocalStorage
from server.keys import (
    ASSET_CACHE,
    AUTH,
    CHROMIUM,
    COMBINER,
    CORS,
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
    SSE_STREAMS,
    STORAGE,
    TENANT_DEFAULTS,
    WEBHOOKS,
    WORKERS,
)
from server.netpolicy import NetworkPolicy
from server.pipeline.combiner import Combiner
from server.pipeline.worker import WorkerConfig, Workers, new_worker_id
from server.problems import middleware as problem_middleware
from server.queue import db
from server.queue import listener as notifications
from server.queue import maintenance as services
from server.queue.admission import InFlight
from server.queue.jobs import GroupCommit
from server.queue.listener import Listener
from server.queue.metrics import Metrics
from server.render.chromium import ChromiumRenderer, Renderer
from server.settings import S3Location, Settings
from server.tasks import background
from server.web import (
    assets_api,
    batches_api,
    health,
    jobs_api,
    openapi,
    reference,
    sockets,
    sse,
    stats_api,
    story_api,
    templates_api,
    views_api,
)
from server.web.auth import Authenticator
from server.web.cors import Cors
from server.web.defaults import TenantDefaults

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
# The browser module, served at /pressroom.js from its package (clients/js/).
CLIENT_JS = Path(__file__).resolve().parents[2] / "clients" / "js" / "pressroom.js"
LISTEN_START_TIMEOUT_S = 30.0
LISTEN_LOST_REASON = Reason(
    "this process lost its database connection; reconnect and resume by event id", UNAVAILABLE
)

RendererFactory = Callable[[Settings], Renderer]
StorageFactory = Callable[[Settings], LocalStorage]


def create_app(
    settings: Settings,
    *,
    renderer_factory: RendererFactory | None = None,
    storage_factory: StorageFactory | None = None,
) -> web.Application:
    """Build the app; tests call this too. Nothing starts until the app runner sets it up.

    The factories stand in for the renderer and the storage the settings choose (tests and
    benchmarks: a fake renderer, files kept in memory)."""
    # Authentication runs inside the problem middleware, so its 401s and 429s are problem+json.
    authenticator = Authenticator(settings)
    cors = Cors(settings)
    defaults = TenantDefaults(settings)
    app = web.Application(
        middlewares=[problem_middleware, authenticator.middleware],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    metrics = app[METRICS] = Metrics()
    app[AUTH] = authenticator
    app[CORS] = cors
    app[TENANT_DEFAULTS] = defaults
    app[POLICY] = NetworkPolicy(settings.allow_hosts)
    app[SSE_STREAMS] = sse.Streams(app)

    async def database(app: web.Application) -> AsyncIterator[None]:
        async with db.server(settings) as dsn:
            app[DSN] = dsn
            await db.migrate_at(dsn)
            pool = await db.create_pool(dsn, min_size=db.POOL_MIN_SIZE, max_size=db.POOL_MAX_SIZE)
            app[POOL] = pool
            app[GROUP_COMMIT] = GroupCommit(pool)
            app[IN_FLIGHT] = InFlight()
            yield
            await pool.close()

    async def storage(app: web.Application) -> AsyncIterator[None]:
        if isinstance(settings.storage, S3Location) and storage_factory is None:
            async with open_s3_storage(settings.storage) as s3:
                app[STORAGE] = s3
                app[ASSET_CACHE] = AssetCache(s3)
                await _report_storage(s3)
                yield
        else:
            if storage_factory is not None:
                local = storage_factory(settings)
            else:
                local = LocalStorage(settings.files_dir)
            app[STORAGE] = local
            app[ASSET_CACHE] = AssetCache(local)
            await _report_storage(local)
            yield
            await asyncio.to_thread(local.close)

    async def hub(app: web.Application) -> AsyncIterator[None]:
        hub = Hub(app[POOL], poll_interval_s=notifications.POLL_INTERVAL_S)
        app[HUB] = hub
        hub.add_encoder(app[SSE_STREAMS].encode)  # Socket.IO adds its own (sockets.py)

        def wake_workers() -> None:
            if WORKERS in app:
                app[WORKERS].wake()

        def wake_webhooks() -> None:
            if WEBHOOKS in app:
                app[WEBHOOKS].wake()

        def access_changed() -> None:
            authenticator.access_changed()
            cors.access_changed()
            defaults.access_changed()

        def listen_lost() -> None:
            # This process hears of no commit now: its streams would go quiet, so they end
            # and their clients resume by event id, on another process if need be; and no
            # change to access is heard, so nothing kept of it is trusted until it is back.
            hub.close_all(LISTEN_LOST_REASON)
            authenticator.access_changed(listening=False)
            cors.access_changed(listening=False)
            defaults.access_changed(listening=False)

        listener = Listener(
            app[DSN],
            on_event=hub.poke,
            on_work=wake_workers,
            on_webhook=wake_webhooks,
            on_access=access_changed,
            on_lost=listen_lost,
        )
        app[LISTENER] = listener
        async with (
            background("hub", hub.run()),
            background("listener", listener.run()),
            background("sse-keep-alive", app[SSE_STREAMS].keep_alive()),
        ):
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
            render_timeout_s=settings.render_timeout_s,
            shutdown_grace_s=settings.shutdown_grace_s,
            max_pages=settings.max_pages,
            secret=settings.secret,
            signing=settings.signing,
            finish_max_mb=settings.render_max_mb,
            office_user=settings.chromium_user,
        )
        workers = Workers(
            app[POOL],
            app[RENDERER],
            app[STORAGE],
            config,
            assets=app[ASSET_CACHE],
            metrics=metrics,
        )
        app[WORKERS] = workers
        app[HUB].add_listener(workers.on_event)
        async with workers.leases.running():
            yield
        await workers.close()

    async def combiner(app: web.Application) -> AsyncIterator[None]:
        if not settings.run_background:
            yield
            return
        worker_id = app[WORKERS].worker_id if WORKERS in app else new_worker_id()
        joins = Combiner(
            app[POOL],
            app[STORAGE],
            time_limit_s=settings.render_timeout_s,
            worker_id=worker_id,
            metrics=metrics,
            signing=settings.signing,
            max_mb=settings.render_max_mb,
        )
        app[COMBINER] = joins
        app[HUB].add_listener(joins.on_event)
        async with joins.leases.running():
            yield
        await joins.close()

    async def webhooks(app: web.Application) -> AsyncIterator[None]:
        if not settings.run_background:
            yield
            return
        async with WebhookSender.open(app[POOL], app[STORAGE], app[POLICY], settings) as sender:
            app[WEBHOOKS] = sender
            sender.listeners.append(
                lambda attempt: metrics.webhook_attempts.labels(attempt.outcome).inc()
            )
            async with sender.leases.running():
                yield

    async def authentication(app: web.Application) -> AsyncIterator[None]:
        # Before the browser starts: a server that must not run open stops right away.
        await authenticator.start(app[POOL])
        async with background("auth-refresh", authenticator.refresh_loop()):
            yield

    async def maintenance(app: web.Application) -> AsyncIterator[None]:
        async with services.running(app[POOL], app[STORAGE], settings):
            yield

    app.cleanup_ctx.extend(
        [database, authentication, storage, hub, renderer, workers, combiner, webhooks, maintenance]
    )
    app.cleanup_ctx.append(cors.context)  # the tenants' origins; it needs the database only
    app.cleanup_ctx.append(defaults.context)  # the tenants' defaults; the same
    app.on_response_prepare.append(cors.on_response_prepare)  # streams and files too
    app.on_shutdown.append(_close_streams)

    if settings.run_web:
        app.add_routes(jobs_api.routes)
        app.add_routes(story_api.routes)  # a job's story, and its page at /jobs/{id}
        app.add_routes(views_api.routes)  # the batches, templates and assets pages
        app.add_routes(stats_api.routes)  # GET /v1/stats and its page, /health
        app.add_routes(sse.routes)
        app.add_routes(batches_api.routes)
        app.add_routes(assets_api.routes)
        templates_api.setup(app)  # /v1/templates
        app.add_routes(health.routes)
        app.router.add_get("/v1/openapi.json", openapi.handler)
        app.add_routes(reference.routes)  # /docs, the API reference
        app.router.add_get("/", _index)
        app.router.add_get("/pressroom.js", _client_module)
        if STATIC_DIR.is_dir():
            app.router.add_static("/static/", STATIC_DIR, append_version=False)
        sockets.attach(app)  # Socket.IO at /socket.io/; its cleanup step runs after the hub's
        # Last: every path's OPTIONS, as no route above takes one. A route rather than a
        # middleware, which every open stream would hold a frame of for as long as it lasts.
        app.router.add_route(hdrs.METH_OPTIONS, "/{path:.*}", cors.preflight)
    else:
        app.add_routes(health.routes)  # a worker's probes and metrics (PRESSROOM_HEALTH_PORT)
    return app


async def _report_storage(storage: Any) -> None:
    try:
        await storage.check()
    except Exception as exc:
        log.error("storage is not ready (/readyz fails until it is): %s", exc)


async def _close_streams(app: web.Application) -> None:
    """Long-lived streams end at shutdown, or shutdown would wait out its timeout: every SSE
    stream waits on its subscription, which this drops."""
    if HUB in app:
        app[HUB].close_all(SHUTDOWN_REASON)
    await sockets.close_all(app)


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def _client_module(request: web.Request) -> web.FileResponse:
    """The browser module. Revalidated on every load (ETag), so a page never runs a copy
    older than the server it talks to."""
    return web.FileResponse(
        CLIENT_JS,
        headers={"Content-Type": "text/javascript; charset=utf-8", "Cache-Control": "no-cache"},
    )
