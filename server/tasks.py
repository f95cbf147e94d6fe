"""Background tasks owned by a cleanup context: named, reported when they crash, cancelled and
awaited on the way out; `periodic` runs one pass on an interval that way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from server.errors import DB_OR_QUERY_ERRORS, backoff_s, jittered

log = logging.getLogger(__name__)

#: The first wait after a failed pass; each failure in a row doubles it, up to the interval.
PASS_RETRY_BASE_S = 1.0


@contextlib.asynccontextmanager
async def background(
    name: str, coro: Coroutine[Any, Any, None]
) -> AsyncIterator[asyncio.Task[None]]:
    """A named task for the life of the `async with`: cancelled and awaited on exit."""
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


def periodic(
    name: str, interval_s: float, one_pass: Callable[[], Awaitable[object]]
) -> contextlib.AbstractAsyncContextManager[asyncio.Task[None]]:
    """`one_pass` now and then every interval_s (jittered) in a background task."""
    return background(name, _every(name, interval_s, one_pass))


async def _every(name: str, interval_s: float, one_pass: Callable[[], Awaitable[object]]) -> None:
    failures = 0
    while True:
        try:
            await one_pass()
        except DB_OR_QUERY_ERRORS as exc:
            failures += 1
            log.warning("%s failed, trying again: %s", name, exc)
        except Exception:
            # A service that died here would stay dead until a restart: log it and go on.
            failures += 1
            log.exception("%s failed, trying again", name)
        else:
            failures = 0
        if failures:
            wait_s = backoff_s(failures, base_s=PASS_RETRY_BASE_S, max_s=interval_s)
        else:
            wait_s = jittered(interval_s)
        await asyncio.sleep(wait_s)
