"""page_url and markdown on real Chromium against a real web site on loopback (allowed through
PRESSROOM_ALLOW_HOSTS), and the options that make a render finish or fail loudly: a page with
its stylesheet and image prints; a 404 fails at once; cookies and headers reach the page's own
origin and no other; lazy images load when asked; script errors fail when asked; networkidle,
a delay and media features apply. One Pressroom and one site serve the whole module."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import defaultdict
from collections.abc import AsyncIterator
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer as SiteServer
from aiohttp.test_utils import get_port_socket
from pypdf import PdfReader

from server.settings import Settings
from server.web.app import create_app
from tests.conftest import RunningApp, TestServer, fresh_database
from tests.e2e.test_render import pdf_text
from tests.e2e.test_ssrf import png
from tests.sse import collect

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

COOKIE_VALUE = "c00kie-5e1f"
HEADER_VALUE = "h3ader-77a0"
MODULE = {"scope": "module", "loop_scope": "module"}


class Site:
    """The pages a team's app would serve, on one port, and a third party on another; every
    request is recorded with the cookie and header it came with."""

    def __init__(self) -> None:
        self.seen: dict[str, list[dict[str, str]]] = defaultdict(list)
        self.own: SiteServer | None = None
        self.other: SiteServer | None = None

    def url(self, path: str) -> str:
        assert self.own is not None
        return f"http://127.0.0.1:{self.own.port}{path}"

    def third_party(self, path: str) -> str:
        assert self.other is not None
        return f"http://127.0.0.1:{self.other.port}{path}"

    def record(self, request: web.Request) -> None:
        self.seen[request.path_qs].append(
            {
                "cookie": request.headers.get("Cookie", ""),
                "token": request.headers.get("X-Token", ""),
            }
        )

    def own_app(self) -> web.Application:
        pages = {
            "/invoice": """<html><head><link rel="stylesheet" href="/site.css"></head><body>
                <h1>Invoice 42</h1><p class="hidden">NOT-FOR-PRINT</p>
                <img src="/logo.png" style="width: 120px"></body></html>""",
            "/echo": """<html><body><p id="got">got nothing</p>
                <img src="{pixel}">
                <script>fetch("/whoami").then(r => r.text())
                  .then(t => document.getElementById("got").textContent = t)</script>
                <p>ua {ua}</p></body></html>""",
            "/lazy": """<html><body><h1>Long report</h1><div style="height: 30000px"></div>
                <img id="chart" data-src="/chart.png?run=RUN" style="width: 80px">
                <script>
                  const chart = document.getElementById("chart");
                  new IntersectionObserver(([entry], observer) => {
                    if (entry.isIntersecting) { chart.src = chart.dataset.src;
                                                observer.disconnect(); }
                  }).observe(chart);
                </script></body></html>""",
            "/broken": """<html><body><p>Broken page</p>
                <script>drawChart()</script></body></html>""",
            "/partial": """<html><body><p>Partial page</p><img src="/gone.png"></body></html>""",
            "/late": """<html><body><p>Early content</p><script>
                setTimeout(() => fetch("/slow").then(r => r.text())
                  .then(t => document.body.append(t)), 100);
                setTimeout(() => document.body.append(" Delayed content"), 600);
                </script></body></html>""",
        }

        async def page(request: web.Request) -> web.Response:
            self.record(request)
            text = pages[request.path]
            text = text.replace("{ua}", request.headers.get("User-Agent", ""))
            text = text.replace("{pixel}", self.third_party("/pixel.png"))
            text = text.replace("RUN", request.query.get("run", ""))
            return web.Response(text=text, content_type="text/html")

        async def whoami(request: web.Request) -> web.Response:
            self.record(request)
            seen = self.seen[request.path_qs][-1]
            return web.Response(text=f"cookie {seen['cookie']} token {seen['token']}")

        async def asset(request: web.Request) -> web.Response:
            self.record(request)
            if request.path == "/site.css":
                css = "h1::after { content: ' (styled)' } .hidden { display: none }"
                return web.Response(text=css, content_type="text/css")
            if request.path in ("/logo.png", "/chart.png"):
                return web.Response(body=png(), content_type="image/png")
            if request.path == "/slow":
                await asyncio.sleep(0.3)
                return web.Response(text=" Late content")
            return web.Response(status=404, text="no such page")

        async def bounce(request: web.Request) -> web.Response:
            self.record(request)
            raise web.HTTPFound(request.query["to"])

        app = web.Application()
        for path in pages:
            app.router.add_get(path, page)
        app.router.add_get("/whoami", whoami)
        app.router.add_get("/bounce", bounce)
        app.router.add_get("/{name:.*}", asset)
        return app

    def other_app(self) -> web.Application:
        async def pixel(request: web.Request) -> web.Response:
            self.record(request)
            return web.Response(body=png(), content_type="image/png")

        app = web.Application()
        app.router.add_get("/pixel.png", pixel)
        return app


@pytest_asyncio.fixture(**MODULE)
async def site() -> AsyncIterator[Site]:
    site = Site()
    site.own = SiteServer(site.own_app(), host="127.0.0.1")
    site.other = SiteServer(site.other_app(), host="127.0.0.1")
    await site.own.start_server()
    await site.other.start_server()
    yield site
    await site.own.close()
    await site.other.close()


@pytest_asyncio.fixture(**MODULE)
async def module_dsn(server_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A database of this module's own, cloned from the migrated template."""
    async with fresh_database(server_dsn, template_db) as made:
        yield made


@pytest_asyncio.fixture(**MODULE)
async def app(
    module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningApp]:
    """Pressroom with real Chromium, allowed to reach the site on 127.0.0.1."""
    data = Path(tmp_path_factory.mktemp("pages"))
    # Bound first, so that the download links name the port it listens on.
    sock = get_port_socket("127.0.0.1", 0, socket.AF_INET)
    settings = Settings.from_env(
        {
            "DATABASE_URL": module_dsn,
            "PRESSROOM_DATA_DIR": str(data),
            "PRESSROOM_RENDER_TIMEOUT_S": "30",
            "PRESSROOM_ALLOW_HOSTS": "127.0.0.1",
        },
        render_slots=2,
        port=sock.getsockname()[1],
    )
    server = TestServer(create_app(settings), host="127.0.0.1", socket_factory=lambda *_: sock)
    await server.start_server()
    session = ClientSession()
    yield RunningApp(server, session)
    await session.close()
    await server.close()


async def run(app: RunningApp, body: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    """Submit a job and wait for its end: the job as the stream last showed it, and its PDF."""
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    messages = await collect(app.http, app.url(job["links"]["events"]), timeout_s=60)
    final: dict[str, Any] = messages[-1].json["job"]
    if final["status"] != "done":
        return final, None
    async with app.http.get(final["url"]) as resp:
        return final, await resp.read()


async def test_a_served_page_prints_with_its_stylesheet_and_image(
    app: RunningApp, site: Site
) -> None:
    css = "body::before { content: 'Added by options.css' }"
    job, pdf = await run(app, {"page_url": site.url("/invoice"), "options": {"css": css}})
    assert pdf is not None, job["error"]
    text = pdf_text(pdf)
    assert "Invoice 42 (styled)" in text
    assert "NOT-FOR-PRINT" not in text
    assert "Added by options.css" in text
    assert len(PdfReader(BytesIO(pdf)).pages[0].images) == 1
    assert {"/invoice", "/site.css", "/logo.png"} <= set(site.seen)
    assert job["warnings"] == []


async def test_a_page_answering_404_fails_at_once_naming_the_status(
    app: RunningApp, site: Site
) -> None:
    job, pdf = await run(app, {"page_url": site.url("/missing-invoice")})
    assert pdf is None and job["status"] == "failed"
    assert job["attempts"] == 1 and job["max_attempts"] > 1, "not retried"
    assert "page_url answered HTTP 404" in job["error"], job["error"]
    # Printed as it came when the status is not to fail the job.
    job, pdf = await run(
        app,
        {"page_url": site.url("/missing-invoice"), "options": {"fail_on": {"http_status": False}}},
    )
    assert pdf is not None and "no such page" in pdf_text(pdf)


async def test_a_page_the_policy_refuses_or_that_cannot_be_reached_is_not_printed(
    app: RunningApp, site: Site
) -> None:
    # Allowed at submission (127.0.0.1 is allowed here), refused where it redirects.
    for options in ({}, {"headers": {"X-Token": HEADER_VALUE}}):
        job, pdf = await run(
            app,
            {"page_url": site.url("/bounce?to=http://10.0.0.1/admin"), "options": options},
        )
        assert pdf is None and job["attempts"] == 1, job
        assert "page_url was refused: blocked" in job["error"], job["error"]
        assert (
            "10.0.0.1 is a private address; allow it with PRESSROOM_ALLOW_HOSTS=10.0.0.1"
            in job["error"]
        ), job["error"]
    # Nothing listens there: worth another attempt, as any network failure.
    async with app.http.post(app.url("/v1/jobs"), json={"page_url": "http://127.0.0.1:9/"}) as r:
        job = await r.json()
    messages = await collect(app.http, app.url(job["links"]["events"]), until="job.retrying")
    assert messages[-1].event == "job.retrying"
    assert "page_url could not be opened" in messages[-1].json["job"]["error"]
    async with app.http.post(app.url(f"/v1/jobs/{job['id']}/cancel")) as r:
        assert r.status == 200


async def test_a_host_that_does_not_resolve_is_retried_and_never_called_blocked(
    app: RunningApp,
) -> None:
    # A name under .invalid never resolves (RFC 2606): a DNS failure, as any name may have one.
    for url in ("https://shop.example.invalid/invoice", "http://shop.example.invalid/invoice"):
        async with app.http.post(app.url("/v1/jobs"), json={"page_url": url}) as r:
            job = await r.json()
        messages = await collect(app.http, app.url(job["links"]["events"]), until="job.retrying")
        assert messages[-1].event == "job.retrying"
        retrying = messages[-1].json["job"]
        assert retrying["error"] == (
            "page_url could not be opened: could not resolve shop.example.invalid"
        )
        assert not any("blocked" in warning for warning in retrying["warnings"]), retrying
        async with app.http.post(app.url(f"/v1/jobs/{job['id']}/cancel")) as r:
            assert r.status == 200
    # A resource on such a host failed, as one whose host refused the connection would have.
    template = '<img src="https://cdn.example.invalid/logo.png"><p>x</p>'
    job, pdf = await run(app, {"template": template})
    assert pdf is not None
    assert job["warnings"] == [
        "failed connection: could not resolve cdn.example.invalid (cdn.example.invalid:443)"
    ]
    job, pdf = await run(
        app, {"template": template, "options": {"fail_on": {"resource_errors": True}}}
    )
    assert pdf is None and job["attempts"] == 1
    assert job["error"] == (
        "a resource of the page failed: failed connection: could not resolve cdn.example.invalid"
        " (cdn.example.invalid:443)"
    )


async def test_cookies_and_headers_reach_the_pages_own_origin_only_and_stay_secret(
    app: RunningApp, site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = {
        "page_url": site.url("/echo"),
        "options": {
            "cookies": [{"name": "session", "value": COOKIE_VALUE}],
            "headers": {"X-Token": HEADER_VALUE},
            "user_agent": "PressroomTest/2.0",
            "wait_until": "networkidle",
        },
    }
    job, pdf = await run(app, body)
    assert pdf is not None, job["error"]
    text = pdf_text(pdf)
    # The page's own requests: the document, and what its script fetched.
    assert f"cookie session={COOKIE_VALUE} token {HEADER_VALUE}" in text
    assert site.seen["/echo"][-1] == {"cookie": f"session={COOKIE_VALUE}", "token": HEADER_VALUE}
    assert "ua PressroomTest/2.0" in text
    # The third party, on another port of the same host, got neither.
    assert site.seen["/pixel.png"][-1] == {"cookie": "", "token": ""}

    shown = [json.dumps(job), caplog.text]
    for path in (f"/v1/jobs/{job['id']}", "/v1/jobs", f"/v1/jobs/{job['id']}/events"):
        async with app.http.get(app.url(path)) as resp:
            shown.append(await resp.text())
    for text in shown:
        assert COOKIE_VALUE not in text and HEADER_VALUE not in text
    assert job["options"]["cookies"][0]["value"] == "***"
    assert job["options"]["headers"] == {"X-Token": "***"}


async def test_lazy_images_load_when_the_page_is_scrolled_to_its_end(
    app: RunningApp, site: Site
) -> None:
    job, pdf = await run(app, {"page_url": site.url("/lazy?run=plain")})
    assert pdf is not None, job["error"]
    assert "/chart.png?run=plain" not in site.seen, "never scrolled into view"
    job, pdf = await run(
        app, {"page_url": site.url("/lazy?run=scrolled"), "options": {"lazy_load": True}}
    )
    assert pdf is not None, job["error"]
    assert "/chart.png?run=scrolled" in site.seen
    images = [image for page in PdfReader(BytesIO(pdf)).pages for image in page.images]
    assert len(images) == 1, "the image loaded before printing"


async def test_a_script_error_fails_the_job_only_when_asked(app: RunningApp, site: Site) -> None:
    job, pdf = await run(
        app, {"page_url": site.url("/broken"), "options": {"fail_on": {"console_errors": True}}}
    )
    assert pdf is None and job["status"] == "failed" and job["attempts"] == 1
    assert "the page reported a script error: uncaught" in job["error"]
    assert "drawChart is not defined" in job["error"], job["error"]
    job, pdf = await run(app, {"page_url": site.url("/broken")})
    assert pdf is not None and "Broken page" in pdf_text(pdf)
    # A template's console.error, with the option on (scripts then run).
    job, pdf = await run(
        app,
        {
            "template": "<p>x</p><script>console.error('totals do not add up')</script>",
            "options": {"fail_on": {"console_errors": True}},
        },
    )
    assert pdf is None and "console.error 'totals do not add up'" in job["error"], job


async def test_failed_subresources_are_listed_or_fail_the_job(app: RunningApp, site: Site) -> None:
    job, pdf = await run(app, {"page_url": site.url("/partial")})
    assert pdf is not None
    assert job["warnings"] == [f"failed image: HTTP 404 ({site.url('/gone.png')})"]
    job, pdf = await run(
        app, {"page_url": site.url("/partial"), "options": {"fail_on": {"resource_errors": True}}}
    )
    assert pdf is None and job["attempts"] == 1
    assert "a resource of the page failed: failed image: HTTP 404" in job["error"]
    # A blocked one fails a template job too.
    job, pdf = await run(
        app,
        {
            "template": '<img src="http://10.0.0.1/logo.png"><p>x</p>',
            "options": {"fail_on": {"resource_errors": True}},
        },
    )
    assert pdf is None and "10.0.0.1 is a private address" in job["error"], job


async def test_a_failed_import_in_options_css_is_a_warning_as_in_a_template(
    app: RunningApp, site: Site
) -> None:
    blocked = "@import url('http://10.0.0.1/theme.css'); body::before { content: 'Added' }"
    expected = (
        "blocked style: 10.0.0.1 is a private address; allow it with"
        " PRESSROOM_ALLOW_HOSTS=10.0.0.1 (http://10.0.0.1/theme.css)"
    )
    for source in ({"page_url": site.url("/invoice")}, {"template": "<h1>Invoice 42</h1>"}):
        job, pdf = await run(app, {**source, "options": {"css": blocked}})
        assert pdf is not None, job
        assert job["warnings"] == [expected]
        assert "Added" in pdf_text(pdf), "the rest of the stylesheet applies"
    # Not there: listed, or the job's failure when the options ask for that.
    missing = f"@import url('{site.url('/theme.css')}');"
    failed = f"failed stylesheet: HTTP 404 ({site.url('/theme.css')})"
    job, pdf = await run(app, {"page_url": site.url("/invoice"), "options": {"css": missing}})
    assert pdf is not None and job["warnings"] == [failed]
    strict = {"css": missing, "fail_on": {"resource_errors": True}}
    job, pdf = await run(app, {"page_url": site.url("/invoice"), "options": strict})
    assert pdf is None and job["attempts"] == 1
    assert job["error"] == f"a resource of the page failed: {failed}"


async def test_networkidle_and_a_delay_wait_for_late_content(app: RunningApp, site: Site) -> None:
    _, pdf = await run(
        app, {"page_url": site.url("/late"), "options": {"wait_until": "networkidle"}}
    )
    assert pdf is not None and "Late content" in pdf_text(pdf)
    _, pdf = await run(app, {"page_url": site.url("/late"), "options": {"wait_delay_ms": 1500}})
    assert pdf is not None and "Delayed content" in pdf_text(pdf)


async def test_media_features_are_emulated_and_reset(app: RunningApp) -> None:
    template = """<style>
        @media (prefers-color-scheme: dark) { p::after { content: "dark scheme" } }
        @media (prefers-color-scheme: light) { p::after { content: "light scheme" } }
        </style><p></p>"""
    dark = {"media_features": {"prefers-color-scheme": "dark"}}
    _, pdf = await run(app, {"template": template, "options": dark})
    assert pdf is not None and "dark scheme" in pdf_text(pdf)
    for _ in range(2):  # whichever reused slot takes it, the default is back
        _, pdf = await run(app, {"template": template})
        assert pdf is not None and "light scheme" in pdf_text(pdf)


async def test_markdown_prints_tables_strikethrough_and_task_lists(app: RunningApp) -> None:
    markdown = """# Report for {{ client }}

| Item | Amount |
|------|-------:|
| Tea  | 3.50 |
{% for line in lines %}| {{ line.name }} | {{ line.amount }} |
{% endfor %}
~~Draft~~ Final

- [x] Reviewed
- [ ] Sent
"""
    data = {"client": "Ana", "lines": [{"name": "Cake", "amount": "4.25"}]}
    job, pdf = await run(app, {"markdown": markdown, "data": data})
    assert pdf is not None, job["error"]
    text = pdf_text(pdf)
    for expected in ("Report for Ana", "Item", "Amount", "Tea", "3.50", "Cake", "4.25"):
        assert expected in text, (expected, text)
    assert "Draft" in text and "Final" in text and "Reviewed" in text and "Sent" in text
    assert "|" not in text and "~~" not in text and "[x]" not in text, text
