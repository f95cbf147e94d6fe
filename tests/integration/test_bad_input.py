"""A corpus of hostile and broken requests: each gets a clear 4xx (problem+json) or a job that
fails with a clear error, nothing is half-created, and the server stays healthy after."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import asyncpg
import pytest

from server.schemas import common
from tests.conftest import RunningApp
from tests.sse import collect

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}
JSON = {"Content-Type": "application/json"}

# (name, body bytes, headers, status, what the problem says: kind, then a field or detail text)
REFUSED: list[tuple[str, bytes, dict[str, str], int, str, str]] = [
    ("truncated JSON", b'{"template": ', JSON, 400, "malformed-body", "not valid JSON"),
    ("empty body", b"", JSON, 400, "malformed-body", "not valid JSON"),
    ("not JSON at all", b"<xml/>", JSON, 400, "malformed-body", "not valid JSON"),
    ("form post", b"template=x", {"Content-Type": "text/plain"}, 415, "unsupported-media-type", ""),
    ("invalid UTF-8", b'{"template": "\xff\xfe"}', JSON, 400, "malformed-body", "UTF-8"),
    ("NaN", b'{"template": "x", "data": {"n": NaN}}', JSON, 400, "malformed-body", "NaN"),
    ("NUL", b'{"template": "a\\u0000b"}', JSON, 400, "malformed-body", "NUL"),
    ("lone surrogate", b'{"template": "\\ud800"}', JSON, 400, "malformed-body", "surrogate"),
    ("lone low surrogate", b'{"data": {"k": "\\uDC00"}}', JSON, 400, "malformed-body", "surrogate"),
    ("NUL in a key", b'{"data": {"a\\u0000": 1}}', JSON, 400, "malformed-body", "NUL"),
    ("past float", b'{"data": {"n": 1e400}}', JSON, 400, "malformed-body", "1e400"),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, JSON, 400, "malformed-body", "deeply"),
    (
        "huge number",
        b'{"template": "x", "priority": 1' + b"0" * 5000 + b"}",
        JSON,
        400,
        "malformed-body",
        "not valid JSON",
    ),
    ("a list", b"[1, 2]", JSON, 422, "validation", ""),
    ("a string", b'"hello"', JSON, 422, "validation", ""),
    ("no template", b'{"data": {}}', JSON, 422, "validation", "template"),
    ("template not a string", b'{"template": 5}', JSON, 422, "validation", "template"),
    ("data not an object", b'{"template": "x", "data": []}', JSON, 422, "validation", "data"),
    (
        "priority a string",
        b'{"template": "x", "priority": "high"}',
        JSON,
        422,
        "validation",
        "priority",
    ),
    (
        "priority a bool",
        b'{"template": "x", "priority": true}',
        JSON,
        422,
        "validation",
        "priority",
    ),
    (
        "max_attempts 0",
        b'{"template": "x", "max_attempts": 0}',
        JSON,
        422,
        "validation",
        "max_attempts",
    ),
    (
        "run_at without zone",
        b'{"template": "x", "run_at": "2030-01-01T00:00"}',
        JSON,
        422,
        "validation",
        "run_at",
    ),
    ("options a string", b'{"template": "x", "options": "A4"}', JSON, 422, "validation", "options"),
    (
        "scale out of range",
        b'{"template": "x", "options": {"scale": 50}}',
        JSON,
        422,
        "validation",
        "options.scale",
    ),
    (
        "unknown option",
        b'{"template": "x", "options": {"dpi": 300}}',
        JSON,
        422,
        "validation",
        "options.dpi",
    ),
    ("unknown field", b'{"template": "x", "callback": "y"}', JSON, 422, "validation", "callback"),
    ("syntax error", b'{"template": "{% for %}"}', JSON, 422, "validation", "template"),
    ("unclosed block", b'{"template": "{% if x %}"}', JSON, 422, "validation", "template"),
    (
        "file webhook",
        b'{"template": "x", "webhook_url": "file:///etc/passwd"}',
        JSON,
        422,
        "validation",
        "webhook_url",
    ),
    (
        "metadata webhook",
        b'{"template": "x", "webhook_url": "http://169.254.169.254/"}',
        JSON,
        422,
        "validation",
        "webhook_url",
    ),
    (
        "loopback webhook",
        b'{"template": "x", "webhook_url": "http://[::ffff:127.0.0.1]/"}',
        JSON,
        422,
        "validation",
        "webhook_url",
    ),
    *(
        (f"webhook {url} without a host", body, JSON, 422, "validation", "webhook_url")
        for url in ("http:///hook", "https:///x", "http://", "http://:80/", "http:hook")
        for body in [json.dumps({"template": "x", "webhook_url": url}).encode()]
    ),
]

# Accepted at submission, then the job fails at once (no retry) with this in its error.
FAILING_JOBS = {
    "{{ missing }}": "'missing' is undefined",
    "{{ ''.__class__.__mro__ }}": "refused by the sandbox",
    "{{ cycler.__init__.__globals__.os }}": "refused by the sandbox",
    "{{ self._TemplateReference__context }}": "refused by the sandbox",
    "{% for i in range(10**12) %}{% endfor %}": "range() is limited",
    "{{ 'x' * 10**10 }}": "template limit",
    "{{ 1 / 0 }}": "ZeroDivisionError",
    "{% include 'other.html' %}": "template error",
    "{{ data.items|sum }}": "template error",
}

GET_REFUSED = [
    ("/v1/jobs?limit=abc", {}, 422, "limit"),
    ("/v1/jobs?limit=\u00b2", {}, 422, "limit"),
    ("/v1/jobs?limit=100000000000000000000000", {}, 422, "limit"),
    ("/v1/jobs?status=bogus", {}, 422, "status"),
    ("/v1/jobs?cursor=junk", {}, 422, "cursor"),
    ("/v1/jobs?created_from=yesterday", {}, 422, "created_from"),
    ("/v1/jobs?limit=%00", {}, 400, "NUL"),
    ("/v1/events", {"Last-Event-ID": "\u00b2"}, 422, "Last-Event-ID"),
    ("/v1/events", {"Last-Event-ID": "99999999999999999999999999"}, 422, "Last-Event-ID"),
    ("/v1/events", {"Last-Event-ID": str(2**63)}, 422, "Last-Event-ID"),
    ("/v1/events", {"Last-Event-ID": "-1"}, 422, "Last-Event-ID"),
    ("/v1/events?last_event_id=-1", {}, 422, "last_event_id"),
    (f"/v1/events?last_event_id={2**63}", {}, 422, "last_event_id"),
    ("/v1/events?type=job.finished", {}, 422, "unknown event type 'job.finished'"),
    ("/v1/events?type=job.done,", {}, 422, "unknown event type ''"),
    ("/v1/events?type=job.done&type=JOB.DONE", {}, 422, "unknown event type 'JOB.DONE'"),
]


def _ids(cases: list[Any]) -> list[str]:
    return [case[0] for case in cases]


@pytest.mark.parametrize(
    ("name", "body", "headers", "status", "kind", "mentions"), REFUSED, ids=_ids(REFUSED)
)
async def test_bad_submissions_are_refused_clearly(
    api: RunningApp,
    pool: asyncpg.Pool,
    name: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    kind: str,
    mentions: str,
) -> None:
    async with api.http.post(api.url("/v1/jobs"), data=body, headers=headers) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/problem+json"
        problem = await resp.json()
    assert problem["status"] == status and problem["type"].endswith("/" + kind)
    shown = json.dumps(problem)
    assert mentions in shown, problem
    assert "Traceback" not in shown
    if status == 422 and mentions:
        assert any(error["field"] == mentions for error in problem["errors"]), problem
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    async with api.http.get(api.url("/healthz")) as resp:
        assert resp.status == 200


async def test_oversized_parts_have_their_own_errors(
    start_app: Any, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "MAX_TEMPLATE_BYTES", 10_000)
    monkeypatch.setattr(common, "MAX_DATA_BYTES", 10_000)
    app: RunningApp = await start_app(render_slots=0, max_body_bytes=200_000)
    cases = [
        ({"template": "x" * 300_000}, 413, None),
        ({"template": "x" * 20_000}, 422, "template"),
        ({"template": "x", "data": {"rows": ["y" * 100] * 200}}, 422, "data"),
        ({"template": "x", "metadata": {"k": "v" * 20_000}}, 422, "metadata"),
    ]
    for body, status, field in cases:
        async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
            assert resp.status == status
            problem = await resp.json()
        if field is not None:
            [error] = problem["errors"]
            assert error["field"] == field and "at most" in error["message"]
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize(("path", "headers", "status", "mentions"), GET_REFUSED)
async def test_bad_queries_are_refused_clearly(
    api: RunningApp, path: str, headers: dict[str, str], status: int, mentions: str
) -> None:
    async with api.http.get(api.url(path), headers=headers) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/problem+json"
        assert mentions in await resp.text()


async def test_cursors_out_of_the_event_id_range_are_422_on_every_stream(
    api: RunningApp,
) -> None:
    async with api.http.post(api.url("/v1/jobs"), json=SEED) as resp:
        job = await resp.json()
    # Event ids are PostgreSQL bigints: 2**63 would be refused by the database, not here.
    huge, negative = str(2**63), "-1"
    streams = ["/v1/events", f"/v1/jobs/{job['id']}/events"]
    asked: list[tuple[str, dict[str, str], str]] = []
    for path in streams:
        for cursor in (huge, negative, "1" * 40):
            asked.append((path, {"Last-Event-ID": cursor}, "Last-Event-ID"))
            asked.append((f"{path}?last_event_id={cursor}", {}, "last_event_id"))
    for cursor in (huge, negative):
        asked.append((f"/v1/jobs/{job['id']}?wait=1&since={cursor}", {}, "since"))
    for path, headers, field in asked:
        async with api.http.get(api.url(path), headers=headers) as resp:
            assert resp.status == 422, (path, headers, await resp.text())
            assert resp.content_type == "application/problem+json"
            problem = await resp.json()
        assert problem["errors"] == [{"field": field, "message": "must be an event id"}], path


async def test_broken_and_hostile_templates_fail_their_job_once(api: RunningApp) -> None:
    jobs = {}
    for template in FAILING_JOBS:
        async with api.http.post(api.url("/v1/jobs"), json={"template": template}) as resp:
            assert resp.status == 202, (template, await resp.text())
            jobs[template] = (await resp.json())["id"]
    for template, expected in FAILING_JOBS.items():
        got = await collect(api.http, api.url(f"/v1/jobs/{jobs[template]}/events"))
        assert [m.event for m in got] == ["job.queued", "job.running", "job.failed"], template
        failed = got[-1].json["job"]
        assert expected in failed["error"], (template, failed["error"])
        assert failed["attempts"] == 1, "a template error is permanent: no retry"
    # The server is healthy and still renders ordinary documents.
    async with api.http.get(api.url("/healthz")) as resp:
        assert resp.status == 200
    async with api.http.post(api.url("/v1/jobs"), json=SEED) as resp:
        job = await resp.json()
    got = await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"))
    assert got[-1].event == "job.done"


@pytest.mark.parametrize("path", ["/v1/jobs/not-a-uuid", "/v1/jobs/%2e%2e%2f%2e%2e/pdf"])
async def test_malformed_ids_are_404(api: RunningApp, path: str) -> None:
    async with api.http.get(api.url(path)) as resp:
        assert resp.status == 404
        assert (await resp.json())["type"].endswith("/not-found")


MARK = b"quoted-back-" + b"x" * 20  # in every request below: the answer must not echo it
POST_JOBS = b"POST /v1/jobs HTTP/1.1\r\nHost: pressroom\r\nContent-Type: application/json\r\n"
# What aiohttp's HTTP parser refuses before any handler runs.
UNPARSEABLE: list[tuple[str, bytes]] = [
    ("header too long", b"GET /healthz HTTP/1.1\r\nHost: p\r\nX-" + MARK + b": " + MARK * 300),
    ("request line too long", b"GET /" + MARK * 300 + b" HTTP/1.1\r\nHost: p\r\n\r\n"),
    ("bad method", b"G(" + MARK + b" / HTTP/1.1\r\nHost: p\r\n\r\n"),
    ("bad request line", MARK + b"\r\n\r\n"),
    ("bad version", b"GET /" + MARK + b" HTTP/9.9\r\nHost: p\r\n\r\n"),
    ("bad header name", b"GET / HTTP/1.1\r\nHost: p\r\nBad " + MARK + b": y\r\n\r\n"),
    ("TLS to the HTTP port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + MARK),
    (
        "Content-Length and Transfer-Encoding",
        POST_JOBS + b"Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + MARK,
    ),
    ("two Content-Lengths", POST_JOBS + b"Content-Length: 32\r\nContent-Length: 3\r\n\r\n" + MARK),
    ("bad chunk size", POST_JOBS + b"Transfer-Encoding: chunked\r\n\r\n" + MARK + b"\r\nab\r\n"),
    (
        "chunk without its CRLF",
        POST_JOBS + b"Transfer-Encoding: chunked\r\n\r\n2\r\n" + MARK + b"\r\n0\r\n\r\n",
    ),
]


async def _raw_exchange(api: RunningApp, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as it is and read the answer until the server closes the connection."""
    reader, writer = await asyncio.open_connection(api.server.host, api.server.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(("name", "request_bytes"), UNPARSEABLE, ids=_ids(UNPARSEABLE))
async def test_requests_the_http_parser_refuses_get_problem_json_and_one_log_line(
    api: RunningApp, caplog: pytest.LogCaptureFixture, name: str, request_bytes: bytes
) -> None:
    caplog.clear()
    status, headers, body = await _raw_exchange(api, request_bytes)
    assert status == 400, (name, body)
    assert headers["content-type"].startswith("application/problem+json"), headers
    problem = json.loads(body)
    assert set(problem) == {"type", "title", "status", "detail"}, problem
    assert problem["status"] == 400 and problem["type"].endswith("/malformed-request")
    assert problem["title"] == "Bad request" and problem["detail"].endswith("."), problem
    assert MARK not in body and b"quoted-back" not in body, body
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelname) for r in logged] == [("server.web.protocol", "WARNING")], [
        (r.name, r.levelname, r.getMessage()) for r in logged
    ]
    [line] = logged
    assert line.exc_info is None and "\n" not in line.getMessage(), line.getMessage()
    assert "quoted-back" not in line.getMessage()
    async with api.http.get(api.url("/healthz")) as resp:
        assert resp.status == 200


async def test_submitted_data_reaches_the_job_as_sent(api: RunningApp, pool: asyncpg.Pool) -> None:
    """Validation reads `data` without rewriting it: key order and number forms are kept."""
    sent = (
        b'{"template": "x", "data": {"zebra": 1, '
        b'"a": {"yy": -0.0, "x": 1e20, "n": 18446744073709551616}, "mid": [3, 2, 1.50]}}'
    )
    async with api.http.post(api.url("/v1/jobs"), data=sent, headers=JSON) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    stored = await pool.fetchval("SELECT data FROM jobs WHERE id = $1", job["id"])
    assert list(stored) == ["zebra", "a", "mid"] and list(stored["a"]) == ["yy", "x", "n"]
    assert repr(stored["a"]["yy"]) == "-0.0" and repr(stored["a"]["x"]) == "1e+20"
    assert stored["a"]["n"] == 2**64 and stored["mid"] == [3, 2, 1.5]
