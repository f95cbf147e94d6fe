"""A cancelled client stops, even when aiohttp turns the cancellation into a TimeoutError.

aiohttp can raise a TimeoutError in place of the CancelledError of a cancel that meets one of
its timers (aio-libs/aiohttp#5979). The client's retry loops catch TimeoutError as a broken
connection; here a stream that does exactly that on cancel stands in for aiohttp's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from pressroom.client import AsyncClient


def converting_stream(opened: list[str], open_now: asyncio.Event) -> Any:
    """A `_stream` that waits for ever, and raises TimeoutError when it is cancelled; each
    connection is noted in `opened`, and `open_now` set. Once `opened` holds "stop", a cancel
    is a cancel again (so that a failing test can end its task)."""

    async def stream(
        path: str, last_event_id: int | None, on_open: Any = None
    ) -> AsyncIterator[Any]:
        opened.append(path)
        open_now.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if "stop" in opened:
                raise
            raise TimeoutError from None
        yield {}  # an async generator, as the real one

    return stream


async def test_a_cancelled_event_stream_ends() -> None:
    """`pressroom watch` on Ctrl-C: the task following the events is cancelled and ends."""
    opened: list[str] = []
    open_now = asyncio.Event()
    async with AsyncClient("http://127.0.0.1:9", None) as client:
        client._stream = converting_stream(opened, open_now)  # type: ignore[method-assign]

        async def follow() -> None:
            async for _ in client.events():
                pass

        task = asyncio.create_task(follow())
        await open_now.wait()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=3)
        count = len(opened)
        if not done:
            opened.append("stop")
            task.cancel()
            await asyncio.wait([task])
        assert done, f"still following after the cancel ({count} connections opened)"
        assert task.cancelled()
        assert count == 1  # no reconnection after the cancel


async def test_a_wait_past_its_timeout_ends() -> None:
    """`wait(timeout_s=…)`: the timeout's own cancel, turned into a TimeoutError, still ends
    the wait at its deadline instead of a reconnect."""
    opened: list[str] = []
    async with AsyncClient("http://127.0.0.1:9", None) as client:
        client._stream = converting_stream(opened, asyncio.Event())  # type: ignore[method-assign]
        started = time.monotonic()
        task = asyncio.create_task(client.wait("some-job", timeout_s=0.2))
        done, _ = await asyncio.wait([task], timeout=3)
        elapsed, count = time.monotonic() - started, len(opened)
        if not done:
            opened.append("stop")
            task.cancel()
            await asyncio.wait([task])
        assert done, f"the wait went on past its timeout ({count} connections opened)"
        assert elapsed < 2
        assert isinstance(task.exception(), TimeoutError)
        assert count == 1
