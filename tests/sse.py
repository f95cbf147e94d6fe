"""A small Server-Sent Events reader for tests (the wire format, parsed by hand)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientResponse, ClientSession


@dataclass
class Message:
    event: str
    id: str | None
    data: str

    @property
    def json(self) -> Any:
        return json.loads(self.data)


async def messages(resp: ClientResponse) -> AsyncIterator[Message]:
    """Yield each SSE message; comment lines (pings) are skipped."""
    event, ident, data = "message", None, []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line == "":
            if data:
                yield Message(event, ident, "\n".join(data))
            event, ident, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "id":
                ident = value
            elif field == "data":
                data.append(value)


async def collect(
    session: ClientSession,
    url: str,
    *,
    count: int | None = None,
    until: str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 15.0,
) -> list[Message]:
    """Read messages until `count` arrived, an event of type `until` arrived, or the stream ends."""
    got: list[Message] = []
    async with asyncio.timeout(timeout_s):
        async with session.get(url, headers=headers or {}) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            async for message in messages(resp):
                got.append(message)
                if count is not None and len(got) >= count:
                    break
                if until is not None and message.event == until:
                    break
    return got
