"""A python-socketio test client that queues every server event it receives, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import socketio

EVENTS = ("job", "reset", "closed", "notice")


class SioClient:
    """socketio.AsyncClient with a queue of (event, data) and small waiting helpers."""

    def __init__(self, *, reconnection: bool = False) -> None:
        self.client = socketio.AsyncClient(reconnection=reconnection)
        self.received: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.disconnected = asyncio.Event()
        for name in EVENTS:
            self.client.on(name, self._recorder(name))
        self.client.on("disconnect", self._on_disconnect)

    def _recorder(self, name: str) -> Any:
        # Synchronous handler: python-socketio runs each in its own task, in arrival order,
        # and a handler that never awaits cannot be overtaken by the next one.
        def record(data: Any) -> None:
            self.received.put_nowait((name, data))

        return record

    def _on_disconnect(self, *_args: Any) -> None:
        self.disconnected.set()

    async def connect(
        self, url: str, *, auth: Any = None, transports: list[str] | None = None
    ) -> None:
        await self.client.connect(
            url, auth=auth, transports=transports or ["websocket"], wait_timeout=10
        )

    async def call(self, event: str, data: Any) -> Any:
        return await self.client.call(event, data, timeout=10)

    async def subscribe(self, **target: Any) -> None:
        ack = await self.call("subscribe", target)
        assert ack == {"ok": True}, ack

    async def take(self, count: int, timeout_s: float = 15.0) -> list[tuple[str, Any]]:
        """The next `count` events, waiting at most timeout_s in all."""
        got = []
        async with asyncio.timeout(timeout_s):
            while len(got) < count:
                got.append(await self.received.get())
        return got

    async def take_until(self, predicate: Any, timeout_s: float = 15.0) -> list[tuple[str, Any]]:
        """Events up to and including the first for which predicate(name, data) holds."""
        got = []
        async with asyncio.timeout(timeout_s):
            while True:
                item = await self.received.get()
                got.append(item)
                if predicate(*item):
                    return got

    async def close(self) -> None:
        if self.client.connected:
            await self.client.disconnect()
