"""Every typed key stored on the aiohttp application or request."""

from __future__ import annotations

import asyncio

import asyncpg
from aiohttp import web

from server.admission import InFlight
from server.auth import Authenticator
from server.hub import Hub
from server.jobs import GroupCommit
from server.listener import Listener
from server.metrics import Metrics
from server.netpolicy import NetworkPolicy
from server.render import ChromiumRenderer, Renderer
from server.settings import Settings
from server.storage import Storage
from server.webhooks import WebhookSender
from server.worker import Workers

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
AUTH = web.AppKey("auth", Authenticator)
DSN = web.AppKey("dsn", str)
POOL = web.AppKey("pool", asyncpg.Pool)
GROUP_COMMIT = web.AppKey("group_commit", GroupCommit)
IN_FLIGHT = web.AppKey("in_flight", InFlight)
POLICY = web.AppKey("policy", NetworkPolicy)
HUB = web.AppKey("hub", Hub)
LISTENER = web.AppKey("listener", Listener)
RENDERER = web.AppKey("renderer", Renderer)
CHROMIUM = web.AppKey("chromium", ChromiumRenderer)
STORAGE = web.AppKey("storage", Storage)
WORKERS = web.AppKey("workers", Workers)
WEBHOOKS = web.AppKey("webhooks", WebhookSender)
STREAMS = web.AppKey("streams", set[asyncio.Task[None]])
