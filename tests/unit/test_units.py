"""Small pieces with no I/O: SQL blocks, download signatures, backoff, page counting."""

from __future__ import annotations

import time
from typing import Any

import pytest

from server import sql
from server.access import signing
from server.errors import backoff_s
from server.render.chromium import count_pages
from tests.pdfs import minimal_pdf


def test_sql_blocks_are_named_once_and_all_present() -> None:
    blocks = sql.queries()
    for name in ("insert_jobs", "claim_jobs", "finish_done_many", "finish_failed", "events_after"):
        assert name in blocks and blocks[name].strip()
    with pytest.raises(ValueError, match="twice"):
        sql.parse_blocks("-- a --\nSELECT 1;\n-- a --\nSELECT 2;")
    assert next(v for v, _ in sql.migrations()) == "0001_jobs_and_events"


def test_download_signatures_expire_and_bind_the_job_and_the_key() -> None:
    expires = int(time.time()) + 60
    signature = signing.sign_download("secret", "job-1", expires, 7)
    assert signing.check_download("secret", "job-1", str(expires), "7", signature) == 7
    assert signing.check_download("secret", "job-2", str(expires), "7", signature) is None
    assert signing.check_download("other", "job-1", str(expires), "7", signature) is None
    assert signing.check_download("secret", "job-1", str(expires + 1), "7", signature) is None
    assert signing.check_download("secret", "job-1", str(expires), "8", signature) is None
    assert signing.check_download("secret", "job-1", str(expires), "", signature) is None
    past = int(time.time()) - 1
    assert (
        signing.check_download(
            "secret", "job-1", str(past), "7", signing.sign_download("secret", "job-1", past, 7)
        )
        is None
    )
    assert signing.check_download("secret", "job-1", "soon", "7", signature) is None
    unkeyed = signing.sign_download("secret", "job-1", expires, signing.NO_KEY)
    assert signing.check_download("secret", "job-1", str(expires), "0", unkeyed) == signing.NO_KEY


def test_backoff_grows_exponentially_with_jitter_and_a_ceiling() -> None:
    for attempt, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (10, 300.0)]:
        waits = [backoff_s(attempt, base_s=2.0, max_s=300.0) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert max(waits) - min(waits) > ceiling / 10, "jittered"


def test_page_count_of_a_pdf() -> None:
    assert count_pages(minimal_pdf()) == 1


def test_json_log_lines_carry_job_id_and_tenant() -> None:
    import json
    import logging

    from server.cli.admin import JsonFormatter

    record = logging.LogRecord(
        "server.pipeline.worker", logging.INFO, __file__, 1, "job %s", ("done",), None
    )
    record.job_id = "5b0c"
    record.tenant = "acme"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job done" and line["level"] == "info"
    assert line["job_id"] == "5b0c" and line["tenant"] == "acme"


def test_log_format_json_installs_the_json_formatter_and_other_values_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import logging

    import pydantic

    from server.cli.admin import JsonFormatter, TextFormatter, setup_logging
    from server.settings import Settings

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setenv("PRESSROOM_LOG_FORMAT", "json")
    setup_logging(Settings())
    assert isinstance(root.handlers[0].formatter, JsonFormatter)
    monkeypatch.setenv("PRESSROOM_LOG_FORMAT", "text")
    setup_logging(Settings())
    assert isinstance(root.handlers[0].formatter, TextFormatter)
    monkeypatch.setenv("PRESSROOM_LOG_FORMAT", "yaml")
    with pytest.raises(pydantic.ValidationError, match="log_format"):
        Settings()


@pytest.mark.parametrize(
    "text",
    [
        '{"n": 18446744073709551616, "m": -9223372036854775809}',  # beyond 64 bits
        '{"id": "12345678901234567890123"}',  # long digits in a string: still the same
        '{"x": 1e400}',  # too large for a float: inf, as json.loads reads it
        '{"s": "\\ud800"}',  # a lone surrogate escape (a json column may hold one)
        '{"a": 1, "a": 2, "f": 0.1, "u": "\\u00e9\\u4e2d", "l": [true, null, -0.0]}',
        '{"s": "Stage+1 e+2", "f": 1.5e300, "g": -2e18, "h": 9007199254740993}',
    ],
)
def test_json_from_the_database_reads_as_json_loads_reads_it(text: str) -> None:
    import json

    from server import jsontext

    assert repr(jsontext.loads(text)) == repr(json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        '{"data": {"n": 18446744073709551616, "x": 0.1, "s": "\\u00e9"}}',
        '{"data": {"x": NaN}}',
        '{"data": {"x": 1e400}}',
        '{"data": {"x": -Infinity}}',
        '{"data": {"x": 1}',
        '{"data": {"s": "\\ud800"}}',
    ],
)
def test_request_bodies_read_with_the_same_verdicts_as_the_exact_reader(text: str) -> None:
    import json

    from server import jsontext
    from server.web import common

    hooks = {"parse_constant": common._no_constant, "parse_float": common._finite}

    def verdict(read: Any) -> str:
        try:
            return repr(read(text, **hooks))
        except ValueError as exc:
            return f"refused: {exc}"

    assert verdict(jsontext.loads) == verdict(json.loads)


def test_the_ready_line_names_the_dashboard_api_and_docs_where_clients_reach_them() -> None:
    from server.cli.admin import ready_line
    from server.settings import Settings

    site = "https://pdf.example.com"
    behind_a_proxy = Settings(host="0.0.0.0", public_url=site)
    assert ready_line(behind_a_proxy) == (
        f"Pressroom is ready: dashboard {site}/  API {site}/v1/  docs {site}/docs"
    )
    assert ready_line(Settings(run_web=False)) == (
        "Pressroom is ready: render slots only, no web app"
    )
