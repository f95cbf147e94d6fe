"""The four sources and the page options through the API, with a fake renderer: exactly one
source per job, page URLs judged at submission, Markdown turned into HTML, and cookie and
header values kept secret (shown as ***, sealed in a column no route reads, erased when the
job is final). tests/e2e/test_page_sources.py prints the same on real Chromium."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from server.errors import PermanentError
from server.queue import admission
from server.render.sources import PageUrl
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

PAGE = "https://pages.example/invoice/7"
COOKIE_VALUE = "cookie-value-6c1f0e"
HEADER_VALUE = "header-value-93ab2d"
WITH_SECRETS = {
    "page_url": PAGE,
    "options": {
        "cookies": [{"name": "session", "value": COOKIE_VALUE, "path": "/invoice"}],
        "headers": {"X-Api-Key": HEADER_VALUE},
    },
}


async def post(app: RunningApp, path: str, body: Any) -> tuple[int, Any]:
    async with app.http.post(app.url(path), json=body) as resp:
        return resp.status, await resp.json()


async def final(app: RunningApp, job: dict[str, Any]) -> dict[str, Any]:
    messages = await collect(app.http, app.url(job["links"]["events"]), timeout_s=30)
    shown: dict[str, Any] = messages[-1].json["job"]
    return shown


@pytest.fixture
async def policed(start_app: Callable[..., Any], fake_renderer: FakeRenderer) -> RunningApp:
    """The app with the default network policy: no private address is allowed."""
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1)
    return app


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"data": {}},
            "template",
            "give one of template, template_id, page_url, markdown, office, docx or pdfs",
        ),
        (
            {"template": "<p>x</p>", "page_url": PAGE},
            "page_url",
            "give only one of template, template_id, page_url, markdown, office, docx and "
            "pdfs (template is given too)",
        ),
        (
            {"markdown": "# x", "page_url": PAGE},
            "markdown",
            "(page_url is given too)",
        ),
        ({"markdown": "{% for %}"}, "markdown", "template syntax error"),
        ({"page_url": "file:///etc/passwd"}, "page_url", "page_url must use http or https"),
        ({"page_url": "javascript:alert(1)"}, "page_url", "page_url must use http or https"),
        ({"page_url": "data:text/html,hi"}, "page_url", "page_url must use http or https"),
        ({"page_url": "http://127.0.0.1:8080/"}, "page_url", "127.0.0.1 is a loopback address"),
        ({"page_url": "http://localhost/"}, "page_url", "localhost is a loopback host name"),
        ({"page_url": "http://[::1]/"}, "page_url", "::1 is a loopback address"),
        ({"page_url": "http://10.0.0.8/"}, "page_url", "10.0.0.8 is a private address"),
        ({"page_url": "http://192.168.1.1/"}, "page_url", "192.168.1.1 is a private address"),
        ({"page_url": "http://169.254.10.1/"}, "page_url", "169.254.10.1 is a link-local address"),
        ({"page_url": "http://[fe80::1]/"}, "page_url", "fe80::1 is a link-local address"),
        (
            {"page_url": "http://169.254.169.254/latest/meta-data/"},
            "page_url",
            "169.254.169.254 is a cloud metadata address",
        ),
        (
            {"page_url": "http://metadata.google.internal/"},
            "page_url",
            "metadata.google.internal is a cloud metadata host name",
        ),
        ({"page_url": "http://2130706433/"}, "page_url", "127.0.0.1 is a loopback address"),
        ({"page_url": "https://user:pw@pages.example/"}, "page_url", "credentials"),
        (
            {"template": "<p>x</p>", "options": {"cookies": [{"name": "a", "value": "b"}]}},
            "options",
            "cookies and headers go with page_url only",
        ),
        (
            {"markdown": "x", "options": {"headers": {"X-A": "b"}}},
            "options",
            "cookies and headers go with page_url only",
        ),
        (
            {
                "page_url": PAGE,
                "options": {"cookies": [{"name": "a", "value": "b", "domain": "other.example"}]},
            },
            "options",
            "cookies[0].domain must be the page_url's host",
        ),
        (
            {"page_url": PAGE, "options": {"headers": {"Host": "x"}}},
            "options.headers",
            "Host cannot be set",
        ),
        (
            {"page_url": PAGE, "options": {"headers": {"Cookie": "a=b"}}},
            "options.headers",
            "use cookies",
        ),
        (
            {"page_url": PAGE, "options": {"cookies": [{"name": "a", "value": "x;y"}]}},
            "options.cookies[0].value",
            "must be a cookie value",
        ),
        (
            {"page_url": PAGE, "options": {"wait_delay_ms": 10_001}},
            "options.wait_delay_ms",
            "10000",
        ),
        (
            {"page_url": PAGE, "options": {"wait_until": "domcontentloaded"}},
            "options.wait_until",
            "'load' or 'networkidle'",
        ),
        (
            {"page_url": PAGE, "options": {"fail_on": {"http_status": "yes"}}},
            "options.fail_on.http_status",
            "boolean",
        ),
        (
            {"page_url": PAGE, "options": {"media_features": {"prefers-color-scheme": "blue"}}},
            "options.media_features.prefers-color-scheme",
            "'light', 'dark' or 'no-preference'",
        ),
    ],
)
async def test_bad_sources_are_refused_and_nothing_is_stored(
    policed: RunningApp, pool: asyncpg.Pool, body: dict[str, Any], field: str, message: str
) -> None:
    status, problem = await post(policed, "/v1/jobs", body)
    assert status == 422, problem
    assert any(e["field"] == field and message in e["message"] for e in problem["errors"]), problem
    # Refused values are never repeated back: they may be secrets.
    assert "x;y" not in json.dumps(problem)
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0


async def test_an_internal_address_is_refused_naming_the_setting_that_allows_it(
    policed: RunningApp, start_app: Callable[..., Any], fake_renderer: FakeRenderer
) -> None:
    refused = {
        "page_url": ("http://10.0.0.8/invoice", "PRESSROOM_ALLOW_HOSTS=10.0.0.8"),
        "webhook_url": ("http://localhost:9000/hook", "PRESSROOM_ALLOW_HOSTS=localhost"),
    }
    for field, (url, entry) in refused.items():
        status, problem = await post(policed, "/v1/jobs", {"page_url": PAGE, field: url})
        assert status == 422, problem
        [error] = problem["errors"]
        assert error["field"] == field and error["message"].endswith(f"allow it with {entry}")
    # The advice works: with those entries the same jobs are taken.
    entries = ",".join(entry.partition("=")[2] for _, entry in refused.values())
    allowed: RunningApp = await start_app(
        renderer=fake_renderer, render_slots=0, env={"PRESSROOM_ALLOW_HOSTS": entries}
    )
    for field, (url, _) in refused.items():
        status, job = await post(allowed, "/v1/jobs", {"page_url": PAGE, field: url})
        assert status == 202, job


async def test_markdown_goes_through_jinja2_then_commonmark_with_github_extensions(
    policed: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    markdown = (
        "# Invoice for {{ name }}\n\n| item | price |\n|---|---:|\n| tea | 3 |\n\n"
        "~~old price~~\n\n- [x] paid\n- [ ] shipped\n"
    )
    status, job = await post(
        policed,
        "/v1/jobs",
        {"markdown": markdown, "data": {"name": "<Ana>"}, "options": {"css": "h1 {color: red}"}},
    )
    assert status == 202, job
    assert (await final(policed, job))["status"] == "done"
    html = fake_renderer.rendered[-1]
    assert isinstance(html, str)
    assert "<h1>Invoice for &lt;Ana&gt;</h1>" in html  # Jinja2 escapes data, as for templates
    assert '<td style="text-align:right">3</td>' in html
    assert "<s>old price</s>" in html
    assert 'class="task-list-item-checkbox" checked="checked"' in html
    assert html.endswith("<style>h1 {color: red}</style>")
    row = await pool.fetchrow("SELECT source, template FROM jobs")
    assert dict(row) == {"source": "markdown", "template": markdown}


async def test_an_undefined_value_names_its_expression_and_line(
    policed: RunningApp, fake_renderer: FakeRenderer
) -> None:
    template = "<h1>Invoice {{ number }}</h1>\n{% for line in lines %}\n<p>{{ customer.nmae }}</p>"
    template += "{% endfor %}"
    data = {"number": 7, "lines": [1], "customer": {"name": "Ana"}}
    expected = "template error on line 3: 'customer' has no attribute 'nmae'"
    status, job = await post(policed, "/v1/jobs", {"template": template, "data": data})
    assert status == 202, job
    failed = await final(policed, job)
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert failed["error"] == expected
    status, problem = await post(policed, "/v1/templates/preview", {"html": template, "data": data})
    assert status == 422 and problem["detail"] == expected, problem
    # A name that is not there at all, and an item of a list.
    for source, message in [
        ("<p>{{ lines }}</p>\n{{ custmer.name }}", "on line 2: 'custmer' is undefined"),
        ("{{ lines[3] }}", "on line 1: 'lines' has no element 3"),
    ]:
        status, job = await post(policed, "/v1/jobs", {"template": source, "data": {"lines": []}})
        assert (await final(policed, job))["error"] == f"template error {message}"
    assert fake_renderer.rendered == [], "nothing reached the browser"


async def test_page_url_jobs_reach_the_renderer_as_pages_to_open(
    policed: RunningApp, fake_renderer: FakeRenderer
) -> None:
    status, job = await post(
        policed,
        "/v1/jobs",
        {
            "page_url": PAGE,
            "options": {
                "wait_until": "networkidle",
                "wait_delay_ms": 250,
                "lazy_load": True,
                "fail_on": {"console_errors": True},
                "user_agent": "Pressroom-Test/1",
                "media_features": {"prefers-color-scheme": "dark"},
            },
        },
    )
    assert status == 202, job
    assert (await final(policed, job))["status"] == "done"
    assert fake_renderer.rendered[-1] == PageUrl(PAGE)
    used = fake_renderer.options[-1]
    assert (used.wait_until, used.wait_delay_ms, used.lazy_load) == ("networkidle", 250, True)
    assert used.fail_on.console_errors and used.fail_on.http_status
    assert used.emulated_media()["color_scheme"] == "dark"
    assert job["options"]["fail_on"] == {"console_errors": True}


async def test_cookie_and_header_values_are_never_shown_and_kept_only_while_the_job_may_run(
    policed: RunningApp,
    fake_renderer: FakeRenderer,
    pool: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    hooked = {**WITH_SECRETS, "webhook_url": "https://hooks.invalid/pressroom"}
    status, job = await post(policed, "/v1/jobs", hooked)
    assert status == 202, job
    shown.append(json.dumps(job))
    assert job["options"]["cookies"] == [{"name": "session", "value": "***", "path": "/invoice"}]
    assert job["options"]["headers"] == {"X-Api-Key": "***"}
    done = await final(policed, job)
    assert done["status"] == "done"
    # The renderer alone gets the values.
    used = fake_renderer.options[-1]
    assert used.cookies is not None and used.cookies[0].value == COOKIE_VALUE
    assert used.headers == {"X-Api-Key": HEADER_VALUE}
    async with policed.http.get(policed.url(f"/v1/jobs/{job['id']}")) as resp:
        shown.append(await resp.text())
    async with policed.http.get(policed.url("/v1/jobs")) as resp:
        shown.append(await resp.text())
    async with policed.http.get(policed.url(f"/v1/jobs/{job['id']}/events")) as resp:
        shown.append(await resp.text())
    events = await pool.fetch("SELECT payload::text FROM job_events")
    deliveries = await pool.fetch("SELECT payload::text FROM webhook_deliveries")
    assert deliveries, "the job.done webhook is queued"
    shown += [row[0] for row in [*events, *deliveries]]
    shown.append(caplog.text)
    for text in shown:
        assert COOKIE_VALUE not in text and HEADER_VALUE not in text
    assert "***" in shown[1] and "***" in shown[2] and "***" in shown[3]
    # The sealed values were erased when the job was done.
    assert await pool.fetchval("SELECT secrets FROM jobs") is None


async def test_sealed_values_stay_while_queued_and_go_with_any_final_state(
    policed: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    status, job = await post(policed, "/v1/jobs", {**WITH_SECRETS, "run_at": "2999-01-01T00:00Z"})
    assert status == 202
    sealed = await pool.fetchval("SELECT secrets FROM jobs WHERE id = $1", job["id"])
    assert sealed is not None and COOKIE_VALUE.encode() not in sealed
    assert HEADER_VALUE.encode() not in sealed
    status, cancelled = await post(policed, f"/v1/jobs/{job['id']}/cancel", {})
    assert status == 200 and cancelled["status"] == "cancelled"
    assert await pool.fetchval("SELECT secrets FROM jobs WHERE id = $1", job["id"]) is None

    # A failed job's values are gone too, so it cannot be retried without them.
    fake_renderer.fail_with = PermanentError("the page answered 500")
    status, job = await post(policed, "/v1/jobs", WITH_SECRETS)
    assert (await final(policed, job))["status"] == "failed"
    assert await pool.fetchval("SELECT secrets FROM jobs WHERE id = $1", job["id"]) is None
    status, problem = await post(policed, f"/v1/jobs/{job['id']}/retry", {})
    assert status == 409 and "erased when it failed" in problem["detail"], problem
    # A failed job without secrets is retried as before.
    status, plain = await post(policed, "/v1/jobs", {"page_url": PAGE})
    assert (await final(policed, plain))["status"] == "failed"
    status, _ = await post(policed, f"/v1/jobs/{plain['id']}/retry", {})
    assert status == 202


async def test_batch_items_take_every_source(
    policed: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    body = {
        "items": [
            {"key": "t", "template": "<p>{{ n }}</p>", "data": {"n": 1}},
            {"key": "m", "markdown": "**{{ n }}**", "data": {"n": 2}},
            {"key": "p", **WITH_SECRETS},
        ]
    }
    status, batch = await post(policed, "/v1/batches", body)
    assert status == 202, batch
    assert COOKIE_VALUE not in json.dumps(batch) and HEADER_VALUE not in json.dumps(batch)
    rows = await pool.fetch("SELECT item_key, source, secrets IS NOT NULL AS sealed FROM jobs")
    assert {(r["item_key"], r["source"], r["sealed"]) for r in rows} == {
        ("t", "template", False),
        ("m", "markdown", False),
        ("p", "page_url", True),
    }
    status, problem = await post(
        policed, "/v1/batches", {"items": [{"key": "x", "template": "a", "page_url": PAGE}]}
    )
    assert status == 422 and problem["errors"][0]["field"] == "items[0].page_url", problem


async def test_stored_templates_and_previews_carry_no_cookies_or_headers(
    policed: RunningApp, pool: asyncpg.Pool
) -> None:
    secret_options = {"headers": {"X-Api-Key": HEADER_VALUE}}
    for path, body in [
        ("/v1/templates", {"name": "t", "html": "<p></p>", "options": secret_options}),
        ("/v1/templates/preview", {"html": "<p></p>", "options": secret_options}),
    ]:
        status, problem = await post(policed, path, body)
        assert status == 422, problem
        assert problem["errors"][0]["field"] == "options", problem
    assert await pool.fetchval("SELECT count(*) FROM templates") == 0


async def test_previews_add_options_css_as_jobs_do(
    policed: RunningApp, fake_renderer: FakeRenderer
) -> None:
    body = {"html": "<p>{{ n }}</p>", "data": {"n": 3}, "options": {"css": "p { color: red }"}}
    async with policed.http.post(policed.url("/v1/templates/preview"), json=body) as resp:
        assert resp.status == 200, await resp.text()
    assert fake_renderer.rendered[-1] == "<p>3</p><style>p { color: red }</style>"


async def test_fingerprints_of_bodies_with_secrets_are_keyed(
    policed: RunningApp, pool: asyncpg.Pool
) -> None:
    headers = {"Idempotency-Key": "order-7"}
    answers = []
    for _ in range(2):
        async with policed.http.post(
            policed.url("/v1/jobs"), json=WITH_SECRETS, headers=headers
        ) as resp:
            answers.append((resp.status, await resp.json()))
    assert [status for status, _ in answers] == [202, 200]
    assert answers[0][1]["id"] == answers[1][1]["id"]
    other = {**WITH_SECRETS, "options": {**WITH_SECRETS["options"], "headers": {"X-Api-Key": "b"}}}
    async with policed.http.post(policed.url("/v1/jobs"), json=other, headers=headers) as resp:
        assert resp.status == 422, "another value is another body"
    stored = await pool.fetchval("SELECT request_hash FROM jobs")
    assert stored != admission.request_hash(WITH_SECRETS), "no plain digest of the values"
