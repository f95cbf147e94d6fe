"""Loading a page so that it prints whole or fails loudly: opening a page_url (its cookies and
headers sent to its own origin only, its answer's status checked), scrolling lazy pages to
their end, and watching for script errors and failed subresources.

render.py calls these only for jobs whose source or options ask for them: a template job with
the default options makes none of these Playwright calls and registers no listener or route.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from playwright.async_api import ConsoleMessage, Page, Request, Response, Route
from playwright.async_api import Error as PlaywrightError

from server import netpolicy
from server.errors import PermanentError, TransientError
from server.options import RenderOptions
from server.options.values import Cookie
from server.render.egress import EGRESS_HEADER

MAX_QUOTED_CHARS = 300
# Scrolling for lazy images: a screen at a time, each step given a frame and a moment for
# observers to start their loads, at most this many screens (an endless feed stops here).
LAZY_MAX_SCREENS = 200
LAZY_SETTLE_MS = 30
# Failures that are not the resource's: the page itself dropped the request (navigated on,
# removed the element), or the browser's own favicon lookup.
_NOT_FAILURES = ("net::ERR_ABORTED",)
_DEFAULT_PORTS = {"http": 80, "https": 443}

ADD_STYLE = """css => new Promise(done => {
  const style = document.createElement("style");
  style.textContent = css;
  style.onload = style.onerror = () => done();
  (document.head || document.documentElement).append(style);
})"""
SCROLL_TO_END = """async ([maxScreens, settleMs]) => {
  const root = document.scrollingElement || document.documentElement;
  const settle = () => new Promise(done => requestAnimationFrame(() => setTimeout(done, settleMs)));
  for (let screen = 0; screen < maxScreens; screen++) {
    if (window.scrollY + window.innerHeight >= root.scrollHeight) break;
    window.scrollBy(0, window.innerHeight);
    await settle();
  }
  await Promise.all(Array.from(document.images, image => image.complete ? null :
    new Promise(done => {
      image.addEventListener("load", done, { once: true });
      image.addEventListener("error", done, { once: true });
    })));
  window.scrollTo(0, 0);
  await settle();
}"""


def _quoted(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= MAX_QUOTED_CHARS else f"{text[: MAX_QUOTED_CHARS - 3]}...")


def _authority(origin: str) -> str:
    """host:port of an origin, as the gate names a CONNECT it refused."""
    parts = urlsplit(origin)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)}"


def _gate_note(warnings: list[str], origin: str | None, *, unresolved: bool = False) -> str | None:
    """The gate's warning about a request to `origin` (any, when None): that it refused one,
    or, with `unresolved`, that the origin's host name did not resolve."""
    for warning in warnings:
        if not (netpolicy.UNRESOLVED in warning if unresolved else warning.startswith("blocked ")):
            continue
        if origin is None:
            return warning
        if warning.endswith(f"({_authority(origin)})") or f"({origin}/" in warning:
            return warning
    return None


def _unresolved(url: str) -> TransientError:
    return TransientError(
        f"page_url could not be opened: {netpolicy.UNRESOLVED} {urlsplit(url).hostname}"
    )


class OwnOrigin:
    """The job's cookies and headers, added to the requests of the page's own origin only.

    Chromium would keep headers a route adds on a redirect to another origin, and a cookie
    jar's cookies go to every port of a host, so the page's own requests are sent from here
    (through the context's proxy, the gate, like any other) and their answers given to
    Chromium as they came, redirects included, for Chromium to follow itself."""

    def __init__(self, origin: str, options: RenderOptions, timeout_ms: float) -> None:
        self.pattern = re.compile(f"^{re.escape(origin)}(?:[/?#]|$)")
        self._https = origin.startswith("https:")
        self._cookies = options.cookies or []
        self._headers = {name.lower(): value for name, value in (options.headers or {}).items()}
        self._timeout_ms = timeout_ms

    def _cookie_header(self, url: str, existing: str | None) -> str | None:
        path = urlsplit(url).path or "/"
        sent = [
            f"{cookie.name}={cookie.value}"
            for cookie in self._cookies
            if _path_matches(cookie, path) and (self._https or not cookie.secure)
        ]
        if existing:
            sent.append(existing)
        return "; ".join(sent) or None

    async def handle(self, route: Route, request: Request) -> None:
        try:
            headers = {**await request.all_headers(), **self._headers}
            cookie = self._cookie_header(request.url, headers.pop("cookie", None))
            if cookie is not None:
                headers["cookie"] = cookie
            response = await route.fetch(headers=headers, max_redirects=0, timeout=self._timeout_ms)
            await route.fulfill(response=response)
        except PlaywrightError:
            # Its message may list the request's headers: it is not passed on, nor logged.
            with contextlib.suppress(PlaywrightError):
                await route.abort("connectionfailed")


def _path_matches(cookie: Cookie, path: str) -> bool:
    """RFC 6265 5.1.4: the request path is the cookie's path or below it."""
    wanted = cookie.path or "/"
    if path == wanted or wanted == "/":
        return True
    return path.startswith(wanted) and (wanted.endswith("/") or path[len(wanted)] == "/")


async def open_url(
    page: Page, url: str, options: RenderOptions, *, timeout_ms: float, warnings: list[str]
) -> None:
    """Open the page; PermanentError when its answer is 4xx/5xx (unless fail_on.http_status is
    off) or the network policy refused it, TransientError when its host cannot be reached or
    its name does not resolve."""
    origin = netpolicy.origin(url)
    if origin is not None and (options.cookies or options.headers):
        own = OwnOrigin(origin, options, timeout_ms)
        await page.route(own.pattern, own.handle)
    try:
        response = await page.goto(url, wait_until=options.wait_until, timeout=timeout_ms)
    except PlaywrightError as exc:
        if (refused := _gate_note(warnings, origin)) is not None:
            raise PermanentError(f"page_url was refused: {refused}") from None
        if _gate_note(warnings, origin, unresolved=True) is not None:
            raise _unresolved(url) from None
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "net::ERR_" in message and "Timeout" not in message:
            raise TransientError(f"page_url could not be opened: {message[:500]}") from None
        raise
    if response is None:
        return
    gate = response.headers.get(EGRESS_HEADER.lower())
    if gate == "refused":
        refused = _gate_note(warnings, None) or "by the network policy"
        raise PermanentError(f"page_url was refused: {refused}")
    if gate == "unresolved":
        raise _unresolved(response.url)
    if gate == "unreachable":
        raise TransientError(f"page_url could not be opened: no connection to {response.url}")
    if options.fail_on.http_status and response.status >= 400:
        status = f"{response.status} {response.status_text}".strip()
        raise PermanentError(f"page_url answered HTTP {status} ({response.url[:200]})")


async def add_css(page: Page, css: str) -> None:
    """options.css after the page's own styles. Playwright's add_style_tag fails when an
    @import in it fails; here that is a failed resource like any other (the gate's warnings
    and Watch list it), as it is for a template, whose HTML carries the stylesheet."""
    await page.evaluate(ADD_STYLE, css)


async def scroll_to_end(page: Page) -> None:
    """Scroll a screen at a time to the end and back, and wait for the images it started."""
    await page.evaluate(SCROLL_TO_END, [LAZY_MAX_SCREENS, LAZY_SETTLE_MS])


class Watch:
    """What goes wrong while a page loads: script errors (console.error and uncaught
    exceptions) and subresources that failed, each failure listed in `warnings` as the
    gate lists the requests it blocked."""

    def __init__(self, page: Page, options: RenderOptions, warnings: list[str]) -> None:
        self._page = page
        self._fail_on = options.fail_on
        self._warnings = warnings
        self.script_errors: list[str] = []
        self._listeners: list[tuple[str, Callable[[Any], None]]] = []
        if self._fail_on.console_errors:
            self._listen("console", self._console)
            self._listen("pageerror", self._page_error)
        self._listen("response", self._response)
        self._listen("requestfailed", self._request_failed)

    def _listen(self, event: str, handler: Callable[[Any], None]) -> None:
        self._page.on(event, handler)  # type: ignore[call-overload]
        self._listeners.append((event, handler))

    def stop(self) -> None:
        for event, handler in self._listeners:
            self._page.remove_listener(event, handler)
        self._listeners.clear()

    def check(self) -> None:
        """Fail the render for what fail_on names, now that the page is loaded."""
        if self._fail_on.console_errors and self.script_errors:
            raise PermanentError(f"the page reported a script error: {self.script_errors[0]}")
        if self._fail_on.resource_errors:
            for warning in self._warnings:
                if warning.startswith(("blocked ", "failed ")):
                    raise PermanentError(f"a resource of the page failed: {warning}")

    def _main(self, request: Request) -> bool:
        return request.is_navigation_request() and request.frame == self._page.main_frame

    def _console(self, message: ConsoleMessage) -> None:
        # Chromium's own "Failed to load resource" lines are resource errors, not the page's.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.script_errors.append(f"console.error {_quoted(message.text)}")

    def _page_error(self, error: Exception) -> None:
        self.script_errors.append(f"uncaught {_quoted(str(error))}")

    def _response(self, response: Response) -> None:
        request = response.request
        if response.status < 400 or self._main(request):
            return
        gate = response.headers.get(EGRESS_HEADER.lower())
        if gate == "unreachable":
            self._failed(request, "no connection to its host")
        elif gate is None:
            self._failed(request, f"HTTP {response.status}")
        # Otherwise the gate answered itself (refused, unresolved, missing): it has listed it.

    def _request_failed(self, request: Request) -> None:
        failure = request.failure or "failed"
        if self._main(request) or failure in _NOT_FAILURES:
            return
        origin = netpolicy.origin(request.url)
        if "TUNNEL_CONNECTION_FAILED" in failure and (
            _gate_note(self._warnings, origin)
            or _gate_note(self._warnings, origin, unresolved=True)
        ):
            return  # a tunnel the gate refused or could not open: listed already
        self._failed(request, failure)

    def _failed(self, request: Request, why: str) -> None:
        self._warnings.append(f"failed {request.resource_type}: {why} ({request.url[:200]})")
