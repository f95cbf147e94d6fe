"""Socket.IO websockets decline permessage-deflate, which browsers offer on every websocket:
a compressor per connection would cost more than the rest of the session; the session works
as ever, uncompressed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg

from server.queue import jobs
from server.queue.jobs import NewJob
from tests.conftest import RunningApp


async def test_a_websocket_offered_permessage_deflate_is_uncompressed_and_works(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    app: RunningApp = await start_app(render_slots=0)
    # compress=15: aiohttp's client offers permessage-deflate, as Chromium and Firefox do.
    async with app.http.ws_connect(
        app.url("/socket.io/?EIO=4&transport=websocket"), compress=15
    ) as ws:
        assert ws.compress == 0, "the server accepted permessage-deflate"
        assert (await ws.receive_str()).startswith("0{")
        await ws.send_str("40")
        assert (await ws.receive_str()).startswith("40")
        await ws.send_str('421["subscribe",{"all":true}]')
        assert await ws.receive_str() == '431[{"ok":true}]'
        job = NewJob(
            tenant="default", template="<p>x</p>", data={}, options={}, metadata={}, max_attempts=1
        )
        [created] = await jobs.create(pool, [job])
        message = await ws.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.TEXT and message.data.startswith('42["job"')
        name, data = json.loads(message.data[2:])
        assert name == "job" and data["job"]["id"] == str(created["id"])
