"""Every typed key stored on the aiohttp application.

The types are named for the type checker only: importing this module loads none of the
modules it names, so a module low in the house (metrics, health) can read the app's
resources without pulling in the browser, S3 or the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    import asyncpg

    from server.delivery.webhooks import WebhookSender
    from server.events.hub import Hub
    from server.files.assets import AssetCache
    from server.files.storage import Storage
    from server.netpolicy import NetworkPolicy
    from server.pipeline.combiner import Combiner
    from server.pipeline.worker import Workers
    from server.queue.admission import InFlight
    from server.queue.jobs import GroupCommit
    from server.queue.listener import Listener
    from server.queue.metrics import Metrics
    from server.render.chromium import ChromiumRenderer, Renderer
    from server.settings import Settings
    from server.web.auth import Authenticator
    from server.web.cors import Cors
    from server.web.defaults import TenantDefaults
    from server.web.sse import Streams as SseStreams

SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
AUTH: web.AppKey[Authenticator] = web.AppKey("auth")
CORS: web.AppKey[Cors] = web.AppKey("cors")
TENANT_DEFAULTS: web.AppKey[TenantDefaults] = web.AppKey("tenant_defaults")
DSN: web.AppKey[str] = web.AppKey("dsn")
POOL: web.AppKey[asyncpg.Pool] = web.AppKey("pool")
GROUP_COMMIT: web.AppKey[GroupCommit] = web.AppKey("group_commit")
IN_FLIGHT: web.AppKey[InFlight] = web.AppKey("in_flight")
POLICY: web.AppKey[NetworkPolicy] = web.AppKey("policy")
HUB: web.AppKey[Hub] = web.AppKey("hub")
LISTENER: web.AppKey[Listener] = web.AppKey("listener")
RENDERER: web.AppKey[Renderer] = web.AppKey("renderer")
CHROMIUM: web.AppKey[ChromiumRenderer] = web.AppKey("chromium")
STORAGE: web.AppKey[Storage] = web.AppKey("storage")
ASSET_CACHE: web.AppKey[AssetCache] = web.AppKey("asset_cache")
WORKERS: web.AppKey[Workers] = web.AppKey("workers")
COMBINER: web.AppKey[Combiner] = web.AppKey("combiner")
WEBHOOKS: web.AppKey[WebhookSender] = web.AppKey("webhooks")
SSE_STREAMS: web.AppKey[SseStreams] = web.AppKey("sse_streams")
