"""Errors that say what to do: a body over its limit (413 naming the limit, its setting and what
to send instead), an empty file, JSON nested too deeply, a body in a Content-Encoding the
server cannot decode, and an unknown field one edit away from a known one. Each is
problem+json, none is a 500 or an ERROR in the log, and none stores anything."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import FormData, web
from aiohttp.test_utils import TestClient, TestServer

from server.access import apikeys
from server.keys import SETTINGS
from server.problems import CONTENT_CODINGS
from server.problems import middleware as problem_middleware
from server.settings import Settings
from server.web.common import MAX_JSON_DEPTH
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer

JSON = {"Content-Type": "application/json"}
CSS = {"Content-Type": "text/css"}
JOB = json.dumps({"template": "<p>{{ n }}</p>", "data": {"n": 1}}).encode()
#: Small limits, so that the human units are exact: 4 KiB a JSON body, 8 KiB an asset, 16 KiB
#: a multipart job, 12 KiB all of a tenant's assets.
LIMITS = {
    "max_body_bytes": 4096,
    "max_asset_bytes": 8192,
    "max_upload_bytes": 16384,
    "tenant_max_asset_bytes": 12288,
}


@pytest.fixture
async def app(start_app: Callable[..., Any]) -> RunningApp:
    started: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0, **LIMITS)
    return started


def form(*parts: tuple[str, bytes | str, str | None, str | None]) -> FormData:
    """(name, content, file name, content type) parts, in order."""
    made = FormData()
    for name, content, filename, kind in parts:
        made.add_field(name, content, filename=filename, content_type=kind)
    return made


async def post(app: RunningApp, path: str, data: Any, headers: Any = None) -> tuple[int, Any]:
    async with app.http.post(app.url(path), data=data, headers=headers) as resp:
        assert resp.content_type in ("application/json", "application/problem+json")
        return resp.status, await resp.json()


async def stored(pool: asyncpg.Pool) -> tuple[int, int]:
    """Jobs and assets in the database."""
    jobs = await pool.fetchval("SELECT count(*) FROM jobs")
    assets = await pool.fetchval("SELECT count(*) FROM assets")
    return jobs, assets


def fields(problem: dict[str, Any]) -> dict[str, str]:
    return {error["field"]: error["message"] for error in problem.get("errors") or ()}


async def chunked(data: bytes) -> AsyncIterator[bytes]:
    """A body without Content-Length: the server only learns its size by reading it."""
    for start in range(0, len(data), 1000):
        yield data[start : start + 1000]


# --- 413 ------------------------------------------------------------------------------------

PAGE = ("files", b"<p>hi</p>", "index.html", "text/html")
BIG_JOB = json.dumps({"template": "<p>" + "x" * 5000 + "</p>"}).encode()
# (name, path, body, headers, type, setting, limit, what the detail offers instead)
TOO_LARGE: list[tuple[str, str, Any, dict[str, str], str, str, str, str]] = [
    *(
        (name, path, BIG_JOB, JSON, "body-too-large", "BODY", "4096 bytes (4 KiB)", "/v1/assets")
        for name, path in [
            ("job", "/v1/jobs"),
            ("batch", "/v1/batches"),
            ("template", "/v1/templates"),
            ("token", "/v1/tokens"),
            ("preview", "/v1/templates/preview"),
        ]
    ),
    ("job, chunked", "/v1/jobs", "chunked", JSON, "body-too-large", "BODY", "4 KiB", "multipart"),
    (
        "job, gzip of more than the limit",
        "/v1/jobs",
        gzip.compress(BIG_JOB),
        {**JSON, "Content-Encoding": "gzip"},
        "body-too-large",
        "BODY",
        "4096 bytes",
        "/v1/assets",
    ),
    ("asset", "/v1/assets", b"x" * 9000, CSS, "asset-too-large", "ASSET", "8 KiB", "smaller"),
    ("asset, chunked", "/v1/assets", "chunked-asset", CSS, "asset-too-large", "ASSET", "8 KiB", ""),
    (
        "multipart job",
        "/v1/jobs",
        [PAGE, *(("files", b"x" * 6000, f"{n}.css", "text/css") for n in range(3))],
        {},
        "body-too-large",
        "UPLOAD",
        "16384 bytes (16 KiB)",
        "/v1/assets",
    ),
    (
        "a file of a multipart job",
        "/v1/jobs",
        [PAGE, ("files", b"x" * 9000, "big.css", "text/css")],
        {},
        "asset-too-large",
        "ASSET",
        "8192 bytes (8 KiB)",
        "smaller",
    ),
    (
        "the job part of a multipart job",
        "/v1/jobs",
        [PAGE, ("job", json.dumps({"data": {"s": "x" * 5000}}), None, None)],
        {},
        "body-too-large",
        "BODY",
        "4096 bytes (4 KiB)",
        "file name",
    ),
]


@pytest.mark.parametrize(
    ("name", "path", "body", "headers", "kind", "setting", "limit", "instead"),
    TOO_LARGE,
    ids=[case[0] for case in TOO_LARGE],
)
async def test_every_413_names_the_limit_its_setting_and_what_to_send_instead(
    app: RunningApp,
    pool: asyncpg.Pool,
    name: str,
    path: str,
    body: Any,
    headers: dict[str, str],
    kind: str,
    setting: str,
    limit: str,
    instead: str,
) -> None:
    if body == "chunked":
        body = chunked(BIG_JOB)
    elif body == "chunked-asset":
        body = chunked(b"x" * 9000)
    elif isinstance(body, list):
        body = form(*body)
    status, problem = await post(app, path, body, headers)
    assert status == 413, problem
    variable = f"PRESSROOM_MAX_{setting}_BYTES"
    assert problem["type"] == f"https://pressroom.dev/problems/{kind}", problem
    assert problem["setting"] == variable and variable in problem["detail"], problem
    assert problem["limit_bytes"] == LIMITS[f"max_{setting.lower()}_bytes"]
    assert limit in problem["detail"] and instead in problem["detail"], problem["detail"]
    assert await stored(pool) == (0, 0)


async def test_the_asset_quota_413_names_its_limit_and_setting_too(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    assert (await post(app, "/v1/assets", b"a" * 8000, CSS))[0] == 201
    status, problem = await post(app, "/v1/assets", b"b" * 8000, CSS)
    assert status == 413 and problem["type"].endswith("/asset-quota"), problem
    assert problem["setting"] == "PRESSROOM_TENANT_MAX_ASSET_BYTES"
    assert problem["limit_bytes"] == 12288 and "12288 bytes (12 KiB)" in problem["detail"]
    assert "8000 bytes (7.8 KiB)" in problem["detail"] and "DELETE" in problem["detail"]
    assert await stored(pool) == (0, 1)


async def test_aiohttps_own_413_says_the_same_as_the_servers(
    make_settings: Callable[..., Settings],
) -> None:
    """A reader that leaves the limit to aiohttp (request.read() within client_max_size) gets
    the JSON body's problem, not aiohttp's bare title."""

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response()

    settings = make_settings(**LIMITS)
    bare = web.Application(middlewares=[problem_middleware], client_max_size=4096)
    bare[SETTINGS] = settings
    bare.router.add_post("/", handler)
    async with TestClient(TestServer(bare)) as client:
        resp = await client.post("/", data=b"x" * 5000)
        assert resp.status == 413 and resp.content_type == "application/problem+json"
        problem = await resp.json()
    assert problem["type"].endswith("/body-too-large") and problem["limit_bytes"] == 4096
    assert "PRESSROOM_MAX_BODY_BYTES" in problem["detail"] and "/v1/assets" in problem["detail"]


# --- empty files ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["text/css", "image/png", "font/woff2", "application/json"])
async def test_an_empty_asset_is_refused_and_nothing_is_stored(
    app: RunningApp, pool: asyncpg.Pool, kind: str
) -> None:
    status, problem = await post(app, "/v1/assets", b"", {"Content-Type": kind})
    assert status == 422, problem
    assert problem["type"].endswith("/validation") and "The asset is empty" in problem["detail"]
    assert fields(problem) == {"": "is empty: a file must have at least one byte"}
    async with app.http.get(app.url("/v1/assets")) as resp:
        listed = await resp.json()
    assert listed["items"] == [] and listed["total_bytes"] == 0
    assert await stored(pool) == (0, 0)


async def test_an_empty_file_of_a_multipart_job_is_refused_and_nothing_is_stored(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    body = form(
        PAGE,
        ("files", b"p { color: red }", "site.css", "text/css"),
        ("files", b"", "img/logo.png", "image/png"),
    )
    status, problem = await post(app, "/v1/jobs", body)
    assert status == 422, problem
    assert fields(problem) == {"img/logo.png": "is empty: a file must have at least one byte"}
    assert "The file img/logo.png is empty" in problem["detail"]
    assert await stored(pool) == (0, 0)


# --- deep JSON ------------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    """A job whose body nests arrays and objects `depth` levels deep (the body is the first)."""
    return b'{"template": "x", "data": {"a": ' + b"[" * (depth - 2) + b"]" * (depth - 2) + b"}}"


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("10,000 arrays", b"[" * 10_000 + b"]" * 10_000),
        ("10,000 objects", b'{"a":' * 10_000 + b"1" + b"}" * 10_000),
        ("300 levels of data", nested(300)),  # once a 500: orjson reads it, and cannot write it
        ("one level too many", nested(MAX_JSON_DEPTH + 1)),
        # orjson refuses a lone surrogate, json.loads reads it: the bound holds there too.
        ("one too many, the exact reader", nested(MAX_JSON_DEPTH + 1)[:-1] + b',"s":"\\ud800"}'),
    ],
)
async def test_json_nested_too_deeply_is_a_400_that_states_the_limit(
    start_app: Callable[..., Any], pool: asyncpg.Pool, name: str, body: bytes
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0)
    for path in ("/v1/jobs", "/v1/batches", "/v1/templates"):
        async with asyncio.timeout(10):
            status, problem = await post(app, path, body, JSON)
        assert status == 400, (path, problem)
        assert problem["type"].endswith("/malformed-body")
        assert f"at most {MAX_JSON_DEPTH} levels deep" in problem["detail"], problem
    status, problem = await post(app, "/v1/jobs", form(PAGE, ("job", body.decode(), None, None)))
    assert status == 422 and f"at most {MAX_JSON_DEPTH} levels" in fields(problem)["job"]
    assert await stored(pool) == (0, 0)


async def test_json_as_deep_as_the_limit_is_taken(api: RunningApp) -> None:
    status, job = await post(api, "/v1/jobs", nested(MAX_JSON_DEPTH), JSON)
    assert status == 202, job


# --- Content-Encoding -----------------------------------------------------------------------


async def exchange(
    app: RunningApp, path: str, headers: dict[str, str], body: bytes, *, late: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """POST `body` as it is, with `headers` (`late`: only once the answer has come, and then
    read until the server closes the connection); the answer."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: pressroom\r\nContent-Length: {len(body)}\r\n{head}\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(app.server.host, app.server.port)
    try:
        async with asyncio.timeout(10):
            writer.write(request if late else request + body)
            await writer.drain()
            top = await reader.readuntil(b"\r\n\r\n")
            status_line, *lines = top.decode("latin-1").strip().split("\r\n")
            found = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
            content = await reader.readexactly(int(found["content-length"]))
            if late:
                writer.write(body)
                await writer.drain()
                assert await reader.read() == b"", "the server closes the connection"
    finally:
        writer.close()
    return int(status_line.split()[1]), found, content


def multipart_bytes() -> tuple[str, bytes]:
    boundary = "pressroom-boundary"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=files; filename=index.html\r\n"
        f"Content-Type: text/html\r\n\r\n<p>hi</p>\r\n--{boundary}--\r\n"
    ).encode()
    return f"multipart/form-data; boundary={boundary}", body


NOT_GZIP = b'{"template": "<p>x</p>"}'
MULTIPART_TYPE, MULTIPART = multipart_bytes()
# (name, path, Content-Type, Content-Encoding, body, what the detail says)
UNDECODABLE: list[tuple[str, str, str, str, bytes, str]] = [
    ("gzip that is not", "/v1/jobs", "application/json", "gzip", NOT_GZIP, "not valid gzip"),
    ("deflate that is not", "/v1/jobs", "application/json", "deflate", NOT_GZIP, "not valid"),
    ("unknown br2", "/v1/jobs", "application/json", "br2", NOT_GZIP, "'br2' is not one"),
    (
        "two codings",
        "/v1/jobs",
        "application/json",
        "gzip, br2",
        gzip.compress(NOT_GZIP),
        "'gzip, br2' is not one",
    ),
    ("asset gzip that is not", "/v1/assets", "text/css", "gzip", b"p {}" * 10, "not valid gzip"),
    ("asset br2", "/v1/assets", "text/css", "br2", b"p {}", "'br2' is not one"),
    ("multipart gzip that is not", "/v1/jobs", MULTIPART_TYPE, "gzip", MULTIPART, "not valid"),
    ("multipart br2", "/v1/jobs", MULTIPART_TYPE, "br2", MULTIPART, "'br2' is not one"),
    *(
        [("br without Brotli", "/v1/jobs", "application/json", "br", NOT_GZIP, "cannot be decoded")]
        if "br" not in CONTENT_CODINGS
        else []
    ),
]


@pytest.mark.parametrize(
    ("name", "path", "content_type", "coding", "body", "says"),
    UNDECODABLE,
    ids=[case[0] for case in UNDECODABLE],
)
async def test_a_body_the_server_cannot_decode_is_a_400_that_names_the_codings_it_can(
    app: RunningApp,
    pool: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
    name: str,
    path: str,
    content_type: str,
    coding: str,
    body: bytes,
    says: str,
) -> None:
    caplog.clear()
    headers = {"Content-Type": content_type, "Content-Encoding": coding}
    status, answered, content = await exchange(app, path, headers, body)
    assert status == 400, content
    assert answered["content-type"].startswith("application/problem+json")
    problem = json.loads(content)
    assert problem["type"].endswith("/content-encoding"), problem
    assert says in problem["detail"] and "gzip or deflate" in problem["detail"], problem
    assert "without Content-Encoding" in problem["detail"]
    if coding in ("gzip", "deflate"):  # the parser stopped inside the body: nothing can follow
        assert answered["connection"] == "close"
    assert answered["accept-encoding"] == ", ".join(CONTENT_CODINGS)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert await stored(pool) == (0, 0)
    async with app.http.get(app.url("/healthz")) as resp:
        assert resp.status == 200


@pytest.mark.parametrize("late", [False, True], ids=["with-the-headers", "after-the-answer"])
async def test_a_body_that_is_not_read_is_no_error_either(
    start_app: Callable[..., Any], pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, late: bool
) -> None:
    """Refused before its body is read (no credentials), a body that does not decode is no
    ERROR in the log, whether it came with the headers or after the answer."""
    await apikeys.create_key(pool, "acme")
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0)
    caplog.clear()
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    status, _answered, _content = await exchange(app, "/v1/jobs", headers, NOT_GZIP, late=late)
    assert status == 401
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("GZIP", gzip.compress),
        ("identity", lambda body: body),
    ],
)
async def test_bodies_in_the_codings_the_server_reads_are_taken(
    app: RunningApp, coding: str, encode: Callable[[bytes], bytes]
) -> None:
    headers = {**JSON, "Content-Encoding": coding}
    status, job = await post(app, "/v1/jobs", encode(JOB), headers)
    assert status == 202, job
    asset = {**CSS, "Content-Encoding": coding}
    status, stored_asset = await post(app, "/v1/assets", encode(b"p { color: red }"), asset)
    assert status == 201 and stored_asset["size"] == len(b"p { color: red }"), stored_asset


# --- did you mean ---------------------------------------------------------------------------

# (path, body, field, the message's end or None when it must suggest nothing)
NEAR_MISSES: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("/v1/jobs", {"template": "x", "option": {}}, "option", 'did you mean "options"?'),
    ("/v1/jobs", {"template": "x", "optoins": {}}, "optoins", 'did you mean "options"?'),
    ("/v1/jobs", {"template": "x", "optionss": {}}, "optionss", 'did you mean "options"?'),
    ("/v1/jobs", {"tempalte": "x"}, "tempalte", 'did you mean "template"?'),
    (
        "/v1/jobs",
        {"template": "x", "options": {"landscap": True}},
        "options.landscap",
        'did you mean "landscape"?',
    ),
    (
        "/v1/jobs",
        {"template": "x", "options": {"output": "png", "screenshot": {"widht": 300}}},
        "options.screenshot.widht",
        'did you mean "width"?',
    ),
    (
        "/v1/jobs",
        {"template": "x", "options": {"media_features": {"prefers-color-schem": "dark"}}},
        "options.media_features.prefers-color-schem",
        'did you mean "prefers-color-scheme"?',  # an alias: the name the body gives
    ),
    (
        "/v1/batches",
        {"items": [{"key": "a", "template": "x", "optons": {}}]},
        "items[0].optons",
        'did you mean "options"?',
    ),
    (
        "/v1/templates",
        {"name": "t", "html": "x", "sample_dat": {}},
        "sample_dat",
        'did you mean "sample_data"?',
    ),
    ("/v1/jobs", {"template": "x", "opts": {}}, "opts", None),  # two edits away
    ("/v1/jobs", {"template": "x", "OPTIONS": {}}, "OPTIONS", None),
    ("/v1/jobs", {"template": "x", "data": {"optionz": 1}}, "", None),  # data is the client's
]


@pytest.mark.parametrize(
    ("path", "body", "field", "says"), NEAR_MISSES, ids=[case[2] or "data" for case in NEAR_MISSES]
)
async def test_an_unknown_field_one_edit_from_a_known_one_is_told_which(
    app: RunningApp,
    pool: asyncpg.Pool,
    path: str,
    body: dict[str, Any],
    field: str,
    says: str | None,
) -> None:
    status, answer = await post(app, path, json.dumps(body).encode(), JSON)
    if not field:
        assert status == 202, answer
        return
    assert status == 422, answer
    message = fields(answer)[field]
    if says is None:
        assert message == "is not a known field", message
    else:
        assert message == f"is not a known field; {says}", message
    assert await stored(pool) == (0, 0)


async def test_a_multipart_jobs_part_gets_the_suggestion_too(
    app: RunningApp, pool: asyncpg.Pool
) -> None:
    part = json.dumps({"dat": {"n": 1}})
    status, problem = await post(app, "/v1/jobs", form(PAGE, ("job", part, None, None)))
    assert status == 422, problem
    assert fields(problem) == {"dat": 'is not a known field; did you mean "data"?'}
    assert await stored(pool) == (0, 0)
