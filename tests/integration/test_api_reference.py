"""The API reference at /docs loads every file from Pressroom, none from anywhere else, under a
policy that allows nothing else; the description it shows is valid OpenAPI 3.1, webhooks
included. (In Chromium, offline: tests/e2e/test_api_reference.py.)"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

from jsonschema import Draft202012Validator
from openapi_spec_validator.schemas import openapi_v31_schema_validator
from yarl import URL

from server.web import reference
from tests.conftest import RunningApp

#: What each kind of reference may be served as (a browser runs either JavaScript type).
CONTENT_TYPES = {
    "script": {"text/javascript", "application/javascript"},
    "stylesheet": {"text/css"},
    "icon": {"image/svg+xml"},
}
#: The events a webhook is POSTed for: the CHECK of webhook_deliveries.type (schema.sql).
WEBHOOK_TYPES = {"job.done", "job.failed", "job.cancelled", "batch.done", "template.published"}
CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")]*)")


class References(HTMLParser):
    """Every URL a page makes the browser load: scripts, stylesheets, icons, images, frames."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []  # (kind, URL)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        shown = {name: value or "" for name, value in attrs}
        if tag == "script" and "src" in shown:
            self.found.append(("script", shown["src"]))
        elif tag == "link":
            self.found.append((shown.get("rel", ""), shown["href"]))
        elif tag in ("img", "iframe", "source", "audio", "video", "embed") and "src" in shown:
            self.found.append((tag, shown["src"]))
        elif tag == "object" and "data" in shown:
            self.found.append((tag, shown["data"]))


async def test_the_page_loads_only_pressroom_files_under_a_policy_that_allows_no_other(
    api: RunningApp,
) -> None:
    origin = URL(api.url("/")).origin()
    async with api.http.get(api.url("/docs")) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        policy = resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        page = await resp.text()
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src", "font-src"):
        assert directives[name] == "'self'", name
    assert directives["frame-ancestors"] == "'none'"

    parser = References()
    parser.feed(page)
    kinds = {kind for kind, _ in parser.found}
    assert {"script", "stylesheet", "icon"} <= kinds, parser.found
    assert kinds <= set(CONTENT_TYPES), f"a reference of an untested kind: {parser.found}"
    stylesheets: list[str] = []
    for kind, link in parser.found:
        target = origin.join(URL(link))
        assert target.origin() == origin, f"{link} is not on Pressroom"
        async with api.http.get(target) as resp:
            assert resp.status == 200, link
            assert resp.content_type in CONTENT_TYPES[kind], (link, resp.content_type)
            if kind == "stylesheet":
                stylesheets.append(await resp.text())
    # What the stylesheets load in turn (icons, fonts): data: URLs or files of Pressroom.
    for sheet in stylesheets:
        assert "@import" not in sheet
        for link in CSS_URL.findall(sheet):
            assert link.startswith("data:") or origin.join(URL(link)).origin() == origin, link

    # Of Swagger UI's package, only the files the page loads are served.
    for name in ("swagger-editor-bundle.js", "LICENSE", "..%2F__init__.py"):
        async with api.http.get(api.url(f"{reference.ASSETS_PATH}/{name}")) as resp:
            assert resp.status == 404, name


async def test_the_description_with_its_webhooks_is_valid_openapi_3_1(api: RunningApp) -> None:
    async with api.http.get(api.url("/v1/openapi.json")) as resp:
        document: dict[str, Any] = await resp.json()
    errors = [error.message for error in openapi_v31_schema_validator.iter_errors(document)]
    assert errors == []

    assert set(document["webhooks"]) == WEBHOOK_TYPES
    operation_ids = [
        operation["operationId"]
        for item in (*document["paths"].values(), *document["webhooks"].values())
        for operation in item.values()
    ]
    assert len(operation_ids) == len(set(operation_ids))
    for kind, item in document["webhooks"].items():
        hook = item["post"]
        headers = {p["name"] for p in hook["parameters"] if p["in"] == "header" and p["required"]}
        assert headers == {"webhook-id", "webhook-timestamp", "webhook-signature"}, kind
        body = hook["requestBody"]["content"]["application/json"]["schema"]
        assert body["properties"]["type"]["const"] == kind
        # Every $ref resolves within the document, and the schema is valid JSON Schema.
        Draft202012Validator.check_schema(body)
        checker = Draft202012Validator({**body, "components": document["components"]})
        assert not checker.is_valid({"type": kind, "timestamp": "now", "data": {}})
