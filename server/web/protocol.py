"""HTTP connections: aiohttp's protocol, answering requests its parser refuses (a header too
long, a bad method or request line, Content-Length with Transfer-Encoding, a broken chunked
body, a Content-Encoding it cannot decode) with problem+json, closing a connection whose body
the parser stopped in, and the app runner that serves with it.

aiohttp answers those itself, before any middleware runs: text/plain quoting the request's
bytes, and an ERROR with a traceback in the log, which anyone can cause at will. aiohttp has no
setting for its protocol class (aio-libs/aiohttp#3287), so `AppRunner` builds its server with
this one; `pressroom serve` and the tests' app both run through it.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from aiohttp import http_exceptions, web, web_protocol
from aiohttp.web_request import BaseRequest

from server.problems import Problem, undecodable

log = logging.getLogger(__name__)

# What each refusal tells the client: never the bytes the parser quotes from the request.
_DETAILS: tuple[tuple[type[http_exceptions.HttpProcessingError], str], ...] = (
    (http_exceptions.LineTooLong, "The request line or a header is too long."),
    (
        http_exceptions.BadHttpMethod,
        "The request method is not valid (or this is not HTTP: TLS to a plain-HTTP port?).",
    ),
    (http_exceptions.BadStatusLine, "The request line is not valid HTTP/1.1."),
    (http_exceptions.InvalidHeader, "A header is not valid."),
    (http_exceptions.InvalidURLError, "The request target is not a valid URL."),
    (http_exceptions.TransferEncodingError, "The chunked body is not valid."),
    (http_exceptions.ContentLengthError, "The body does not match its Content-Length."),
)
_MALFORMED = (
    "The request is not valid HTTP/1.1 (a malformed header or chunked body, or a body framed "
    "twice: Content-Length with Transfer-Encoding)."
)
_MAX_REASON_CHARS = 100


def _reason(exc: BaseException | None) -> str:
    """The parser's own reason, when it can be told apart from the bytes it quotes: llhttp
    writes "<reason>:" on a line of its own, the request's bytes below it."""
    message = getattr(exc, "message", None)
    if not isinstance(message, str):
        return ""
    first, newline, _quoted = message.partition("\n")
    reason = first.strip().removesuffix(":")
    if not newline or not first.rstrip().endswith(":"):
        return ""  # a reason with bytes in it (aiohttp's pure-Python parser writes those)
    if len(reason) > _MAX_REASON_CHARS or not (reason.isascii() and reason.isprintable()):
        return ""
    return reason


def _detail(exc: BaseException | None) -> str:
    for kind, detail in _DETAILS:
        if isinstance(exc, kind):
            return detail
    reason = _reason(exc)
    return f"The request is not valid HTTP/1.1: {reason}." if reason else _MALFORMED


class _Protocol(web_protocol.RequestHandler):
    """One HTTP connection; only its error answers differ from aiohttp's."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            # A failure of the server's own (the problem middleware answers everything else):
            # worth its traceback.
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
            detail = "The server failed; the error was logged."
            problem = Problem(status, HTTPStatus(status).phrase, detail, kind="internal")
        else:
            detail = _detail(exc)
            # One line: anyone can send these, as often as they like.
            log.warning(
                "refused a malformed HTTP request from %s: %s (%s)",
                request.remote,
                _reason(exc) or detail,
                type(exc).__name__,
            )
            if isinstance(exc, http_exceptions.ContentEncodingError):
                problem = undecodable()  # br or zstd, without their packages installed
            else:
                problem = Problem(status, "Bad request", detail, kind="malformed-request")
        if request.writer.output_size > 0:
            # As aiohttp: a response has begun, so the connection can only be dropped.
            raise ConnectionError("a response was sent already; cannot send the error")
        response = problem.response()
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, web_protocol.RequestPayloadError):
            # A body that failed to decode after its answer was sent, while aiohttp read on
            # for the rest: the client's doing, so one line, as for any request the parser
            # refuses.
            log.warning("refused the rest of a request body (%s)", type(exc.__cause__).__name__)
            return
        super().log_exception(*args, **kwargs)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if request.content.exception() is not None:
            # The parser stopped inside this body (one that does not decode as its
            # Content-Encoding says, say): none of the rest will come, nor another request.
            # Its end here keeps aiohttp from reading on for the rest, which raises the error
            # again, as an ERROR with a traceback; the answer closes the connection.
            request.content.feed_eof()
            resp.force_close()
        return await super().finish_response(request, resp, start_time)


class _Server(web.Server):
    """aiohttp's low-level server, making `_Protocol` connections."""

    def __call__(self) -> web_protocol.RequestHandler:
        return _Protocol(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """web.AppRunner whose connections answer unparseable requests with problem+json."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The server aiohttp built, with every option it was given, only making our protocol.
        server.__class__ = _Server
        return server
