"""/v1/openapi.json describes every route, with the credentials each takes in either mode, and
the running server keeps to it (schemathesis, in dev mode and with keys)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from server.access import apikeys
from tests.conftest import RunningApp, fresh_database
from tests.pdfs import FakeRenderer

ROOT = Path(__file__).resolve().parents[2]
# Served but not part of the JSON API: the dashboard, a job's page (/jobs/{id}), the batches,
# templates and assets pages, their files,
# the browser module, Socket.IO's own protocol, the reference page (/docs) and its files.
UNDOCUMENTED = re.compile(
    r"^(/|/static(/.*)?|/pressroom\.js|/socket\.io/?.*|/docs(/.*)?|/jobs/\{job_id\}"
    r"|/batches(/\{batch_id\})?|/templates(/\{name\})?|/assets|/health)$"
)


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


async def test_credentials_are_asked_for_once_a_key_exists(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    """Without a key the server takes requests without credentials (dev mode), and its
    description says so; with one, every /v1 operation asks for a credential of its kinds."""

    async def security(app: RunningApp) -> list[Any]:
        async with app.http.get(app.url("/v1/openapi.json")) as resp:
            document = await resp.json()
        shown = ("/v1/events", "/v1/jobs/{job_id}/pdf", "/healthz")
        return [document["security"], *(document["paths"][p]["get"]["security"] for p in shown)]

    key, token, link = {"bearer": []}, {"subscriptionToken": []}, {"signedLink": []}
    dev: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0)
    assert await security(dev) == [[key, {}], [key, token, {}], [key, link, {}], []]
    await apikeys.create_key(pool, "acme")
    keyed: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0)
    assert await security(keyed) == [[key], [key, token], [key, link], []]


#: Every check that a description and a server can disagree on.
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "positive_data_acceptance",
    "negative_data_rejection",
)
#: Seconds each run may take: coverage, then fuzzing and stateful runs until it is spent.
BUDGET_S = 40
SETTINGS = """
request-timeout = 10

# A stream with nothing to send stays open: what it sent by then is read and checked.
[[operations]]
include-path-regex = "/events$"
request-timeout = 0.5

# An invalid body that is also over PRESSROOM_MAX_BODY_BYTES is refused for its size (413).
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                     "428", "429", "5xx"]
"""


def settings_file(folder: Path) -> Path:
    folder.mkdir()
    (folder / "schemathesis.toml").write_text(SETTINGS)
    return folder / "schemathesis.toml"


async def schemathesis_run(app: RunningApp, folder: Path, *arguments: str) -> str:
    """`schemathesis run` against the app, derandomized and time-bound; its report."""
    config = settings_file(folder)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        app.url("/v1/openapi.json"),
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-time",
        str(BUDGET_S),
        # Few examples an operation per pass: the time one does not take goes to the next.
        "--max-examples",
        "5",
        "--generation-deterministic",
        # PostgreSQL stores no NUL character: a JSON body with one in a string is refused (400)
        # before validation, as the 400 of every body says; a parameter's schema refuses it.
        "--generation-allow-x00",
        "false",
        # One worker: CPython 3.11's ast.parse is not thread-safe under schemathesis' workers.
        "--workers",
        "1",
        "--suppress-health-check",
        "all",
        "--report-dir",
        str(folder / "report"),
        *arguments,
        cwd=folder,
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
            "PYTHONPATH": str(ROOT),
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BUDGET_S + 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    report = out.decode(errors="replace")
    assert proc.returncode == 0, report[-8000:]
    summary = report[report.rfind("Test cases:") :]
    assert " passed" in summary and "fail" not in summary and "error" not in summary, report[-8000:]
    return report


@pytest.fixture
async def dev_dsn(server_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A database of its own for an app without keys, beside one with: it outlives the app."""
    async with fresh_database(server_dsn, template_db) as made:
        yield made


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + 90)
async def test_schemathesis_finds_nothing_in_dev_mode_or_with_keys(
    dev_dsn: str, start_app: Callable[..., Any], pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """The server keeps to its description in both modes, each run at once: with no key (dev
    mode, which takes requests without credentials) and with a key required."""
    _row, key = await apikeys.create_key(pool, "fuzz")
    options = {"renderer": FakeRenderer(), "rate_limit_rps": 1000}
    keyed: RunningApp = await start_app(render_slots=1, **options)
    env = {"DATABASE_URL": dev_dsn, "PRESSROOM_DATA_DIR": str(tmp_path / "dev-data")}
    dev: RunningApp = await start_app(render_slots=1, env=env, **options)
    await asyncio.gather(
        schemathesis_run(dev, tmp_path / "dev"),
        schemathesis_run(keyed, tmp_path / "keyed", "--header", f"Authorization: Bearer {key}"),
    )
    for app in (dev, keyed):
        async with app.http.get(app.url("/healthz")) as resp:
            assert resp.status == 200
