"""/v1/openapi.json describes every route, and the running server keeps to it (schemathesis)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from server.access import apikeys
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer

ROOT = Path(__file__).resolve().parents[2]
# Served but not part of the JSON API: the dashboard, its files, the browser module,
# Socket.IO's own protocol.
UNDOCUMENTED = re.compile(r"^(/|/static(/.*)?|/pressroom\.js|/socket\.io/?.*)$")


async def test_every_route_is_described(api: RunningApp) -> None:
    async with api.http.get(api.url("/v1/openapi.json")) as resp:
        assert resp.status == 200
        document = await resp.json()
    assert document["openapi"].startswith("3.1")
    served = set()
    for route in api.app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter") or info.get("prefix", "")
        if route.method in ("HEAD", "OPTIONS", "*") or UNDOCUMENTED.match(path):
            continue
        served.add((route.method.lower(), path))
    described = {
        (method, path)
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert served <= described, f"not in openapi.json: {sorted(served - described)}"
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            assert operation["responses"], (method, path)
            if path.startswith("/v1/") and path != "/v1/openapi.json":
                assert "401" in operation["responses"], (method, path)
    schemas = document["components"]["schemas"]
    assert {"Job", "JobRequest", "Problem", "Token", "Event"} <= set(schemas)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    start_app: Callable[..., Any], pool: asyncpg.Pool, tmp_path: Path
) -> None:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, rate_limit_rps=1000, rate_limit_burst=1000
    )
    _row, key = await apikeys.create_key(pool, "fuzz")
    checks = ",".join(
        (
            "not_a_server_error",
            "status_code_conformance",
            "content_type_conformance",
            "response_headers_conformance",
            "response_schema_conformance",
            "positive_data_acceptance",
            "negative_data_rejection",
        )
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        app.url("/v1/openapi.json"),
        "--checks",
        checks,
        "--header",
        f"Authorization: Bearer {key}",
        # Streams stay open while a job waits (run_at in the future): they have tests of their own.
        "--exclude-path-regex",
        "/events$",
        "--max-examples",
        "10",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--request-timeout",
        "10",
        # One worker: CPython 3.11's ast.parse is not thread-safe under schemathesis' workers.
        "--workers",
        "1",
        "--seed",
        "6",
        # PostgreSQL stores no NUL character: such a body is refused (400) before validation.
        "--generation-allow-x00",
        "false",
        "--suppress-health-check",
        "all",
        "--report-dir",
        str(tmp_path / "report"),
        cwd=tmp_path,
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
            "PYTHONPATH": str(ROOT),
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 280)
    report = out.decode(errors="replace")
    assert proc.returncode == 0, report[-6000:]
    summary = report[report.rfind("Test cases:") :]
    assert " passed" in summary and "fail" not in summary, report[-3000:]
    async with app.http.get(app.url("/healthz")) as resp:
        assert resp.status == 200
