"""Errors, and what to do about them: which failed job is retried, which database failure is
waited out, and how long to wait before the next try."""

from __future__ import annotations

import random

import asyncpg


class RenderError(Exception):
    """A job attempt failed. Subclasses say whether another attempt can succeed."""

    retryable = True


class TransientError(RenderError):
    """Worth another attempt: a crashed or hung browser, a storage or database hiccup."""

    retryable = True


class PermanentError(RenderError):
    """Another attempt would fail the same way: a template error, invalid options."""

    retryable = False


class PageLimitError(PermanentError):
    """A document longer than PRESSROOM_MAX_PAGES allows."""

    def __init__(self, max_pages: int) -> None:
        super().__init__(
            f"the PDF has more than {max_pages} pages, the limit (PRESSROOM_MAX_PAGES)"
        )


class StorageError(TransientError):
    """The file store refused or failed a read or write."""


#: The database is out of reach for now: the connection was refused, lost or timed out, the
#: server is shutting down or not yet accepting connections, or no host of a multi-host
#: DATABASE_URL is the read-write primary (a failover under way). asyncpg's InternalClientError
#: covers that last case, and what asyncpg raises when a connection is lost in the middle of a
#: statement ("cannot switch to state 12", MagicStack/asyncpg#1069; the pool then drops the
#: connection). A request answers 503 with Retry-After; a worker keeps its job and tries again.
DB_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.InternalClientError,
)

#: DB_ERRORS, or a statement the server refused (a deadlock, a statement timeout, a schema in
#: the middle of an upgrade). A background loop logs these and tries again later rather than
#: die; a request does not, since a refused statement there is a bug and answers 500.
DB_OR_QUERY_ERRORS: tuple[type[Exception], ...] = (*DB_ERRORS, asyncpg.PostgresError)


def backoff_s(attempt: int, *, base_s: float, max_s: float) -> float:
    """Seconds to wait before retry `attempt` (1-based): about base_s, doubled per attempt up to
    max_s, jittered so that many waiting do not all come back at once."""
    ceiling = min(max_s, base_s * 2 ** (min(attempt, 64) - 1))
    return random.uniform(ceiling / 2, ceiling)


def jittered(seconds: float, spread: float = 0.2) -> float:
    """`seconds` give or take `spread` of it: periodic passes of many processes drift apart."""
    return seconds * random.uniform(1 - spread, 1 + spread)
