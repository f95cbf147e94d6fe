"""/v1/openapi.json says what the API accepts, no more and no less: a walk over every request
body of every documented operation sends each documented property with a valid value (and at
its documented bounds) and expects it accepted, and sends each property it knows of that is
not documented there and expects a 422 naming it. Query parameters are walked the same way."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docx
import pytest
from jsonschema import Draft202012Validator

from tests import testca
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer, minimal_pdf

Json = dict[str, Any]
HTML = "<p>{{ name | default('you') }}</p>"
INVOICE_XML = (Path(__file__).parents[1] / "files" / "factur-x-minimum.xml").read_bytes()
PAGE_URL = "https://pages.invalid/walk"
DOCX = {"Content-Type": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}
_keys = itertools.count()


def _key() -> str:
    return f"walk-{next(_keys)}"


# A valid value for every property the API has, wherever it appears (a callable: a fresh one
# each time). A documented property missing here fails the walk: give it an example.
EXAMPLES: dict[str, Any] = {
    "template": HTML,
    "template_id": "walk",
    "data": {"name": "Ana"},
    "options": {"landscape": True},
    "webhook_url": "https://hooks.invalid/pressroom",
    "priority": 5,
    "max_attempts": 2,
    "run_at": "2030-01-01T00:00:00Z",
    "metadata": {"order": 7},
    "assets": None,  # filled in with an asset of this tenant
    "channel": "walk:user/7@example.com",
    "cache": True,
    "channels": ["walk:user/7@example.com", "walk:org/1"],
    "ttl_s": 60,
    "key": _key,
    "items": lambda: [{"key": _key(), "template": HTML}],
    "combine": {"outline": False},
    "outline": True,
    "name": "walk",
    "html": HTML,
    "sample_data": {"name": "Bo"},
    "data_schema": {"type": "object", "properties": {"name": {"type": "string"}}},
    "samples": {"short": {"name": "Cy"}},
    "sample": "short",  # walk@1's
    "publish": True,
    "force": True,
    "threshold": 0.01,
    "version": 1,
    "job_id": None,  # filled in with a job of this tenant
    "format": "A5",
    "width": "10cm",
    "height": "12cm",
    "landscape": True,
    "margin": {"top": "1cm", "left": "5mm"},
    "scale": 0.5,
    "print_background": False,
    "page_ranges": "1-2, 4",
    "prefer_css_page_size": True,
    "header_html": "<span class='title'></span>",
    "footer_html": "<span class='pageNumber'></span>",
    "media": "screen",
    "wait_for_selector": "body",
    "wait_for_expression": "document.fonts.ready",
    "javascript": False,
    "title": "Invoice 7",
    "author": "Pressroom",
    "subject": "An invoice",
    "keywords": ["invoice", "2030"],
    "output": "png",
    "screenshot": {"full_page": True},
    "thumbnail": {"width": 120},
    # The bulk routes' filter (POST /v1/jobs/retry, /cancel): counted only, nothing changed.
    "status": "failed",
    "created_from": "2020-01-01T00:00:00Z",
    "created_to": "2040-01-01T00:00:00+02:00",
    "q": "walk",
    "dry_run": True,
    "full_page": True,
    "selector": "main",
    "quality": 75,
    "omit_background": True,
    "tagged": True,
    "pdfa": "3b",
    "attachments": lambda: [{"asset": EXAMPLES["xml"], "name": "walk.xml", "relationship": "Data"}],
    "facturx": lambda: {"xml": EXAMPLES["xml"]},
    "stamp": {"text": "PAID"},
    "encrypt": {"owner_password": "walk-owner"},
    "sign": {"reason": "walked"},
    "asset": None,  # filled in with an image asset of this tenant
    "relationship": "Supplement",
    "description": "A file",
    "xml": None,  # filled in with a Factur-X XML asset of this tenant
    "profile": "minimum",
    "text": "DRAFT",
    "opacity": 0.4,
    "rotate": 45,
    "font_size": 30,
    "color": "#112233",
    "pages": "1-",
    "layer": "under",
    "user_password": "walk-user",
    "owner_password": "walk-owner",
    "allow": ["print", "copy"],
    "reason": "walked",
    "location": "Berlin",
    "contact": "ops@example.com",
    "field": "Approval",
    "visible": {"page": 1, "box": [10, 10, 110, 60]},
    "page": 1,
    "box": [10, 10, 110, 60],
    "page_url": PAGE_URL,
    "markdown": "# {{ name | default('you') }}",
    "office": None,  # filled in with a Word file of this tenant
    "docx": None,  # the same Word file, a Word template without placeholders
    "pdfs": None,  # filled in with a PDF of this tenant
    "select_pages": "1, 1",
    "degrees": 90,
    "fill_form": {"fields": {"customer": "name"}},
    "fields": {"customer": "name"},
    "flatten": True,
    "compress": {"image_dpi": 150},
    "image_dpi": 150,
    "jpeg_quality": 70,
    "css": "p { color: teal }",
    "wait_until": "networkidle",
    "wait_delay_ms": 250,
    "lazy_load": True,
    "fail_on": {"console_errors": True},
    "http_status": False,
    "console_errors": True,
    "resource_errors": True,
    "overflow": True,
    "missing_glyph": True,
    "low_resolution_image": True,
    "broken_image": True,
    "blank_page": True,
    "preflight": {"min_dpi": 100},
    "min_dpi": 100,
    "scope": "dashboard",
    "cookies": [{"name": "session", "value": "abc"}],
    "headers": {"X-Api-Key": "abc"},
    "user_agent": "Walk/1.0",
    "media_features": {"prefers-color-scheme": "dark"},
    "prefers-color-scheme": "dark",
    "prefers-reduced-motion": "reduce",
    "forced-colors": "active",
    "prefers-contrast": "more",
    "value": "abc",
    "domain": "pages.invalid",
    "path": "/walk",
    "secure": True,
    "http_only": True,
}
# Where a model gives a name another meaning: its own example (model name, property).
MODEL_EXAMPLES: dict[tuple[str, str], Any] = {
    ("Screenshot", "width"): 800,
    ("Screenshot", "height"): 600,
    ("Screenshot", "scale"): 2,
    ("Thumbnail", "width"): 120,
    ("JobBulkRequest", "template"): "walk",  # the filter: a stored template's name
    ("RenderOptions", "rotate"): {"degrees": 90},
    ("RenderOptions", "metadata"): {"Department": "Sales"},
}
# Properties that only make sense with others: sent together, and without the ones they exclude.
# A screenshot goes with an image output (webp has both quality and transparency).
TOGETHER = {
    "width": {"height": "12cm"},
    "height": {"width": "10cm"},
    "screenshot": {"output": "webp"},
    # A form is filled from the data: the paths fill_form names must be in it.
    "options": {"data": {"name": "Ana"}},
}
EXCLUDES = {
    "template_id": "template",
    "page_url": "template",
    "markdown": "template",
    "office": "template",
    "pdfs": "template",
    # A job's source, or a template version's (instead of its html).
    "docx": "template html",
    "asset": "text",
}
# Options that go with a page_url only: a job's body carries one instead of its template.
WITH_PAGE_URL = {"cookies", "headers"}
# The smallest valid body of each request model (by its name in components.schemas).
BASE: dict[str, Callable[[], Json]] = {
    "JobRequest": lambda: {"template": HTML},
    "BatchItem": lambda: {"key": _key(), "template": HTML},
    "BatchRequest": lambda: {"items": [{"key": _key(), "template": HTML}]},
    # Versions of another template than the one previewed: its options stay the fixture's.
    "TemplateRequest": lambda: {"name": "walk-versions", "html": HTML},
    "InlinePreviewRequest": lambda: {"html": HTML},
    "Attachment": lambda: {"asset": EXAMPLES["xml"], "name": "walk.xml", "relationship": "Data"},
    "FacturX": lambda: {"xml": EXAMPLES["xml"]},
    "Stamp": lambda: {"text": "PAID"},
    "Encrypt": lambda: {"owner_password": "walk-owner"},
    "SignVisible": lambda: {"page": 1, "box": [10, 10, 110, 60]},
    "Cookie": lambda: {"name": "walk", "value": "abc"},
}
QUERY_EXAMPLES: dict[str, str] = {
    "status": "queued",
    "limit": "10",
    "created_from": "2020-01-01T00:00:00Z",
    "created_to": "2040-01-01T00:00:00+02:00",
    "cursor": "",  # filled in with a cursor of a real page
    "wait": "0",
    "since": "0",
    "channel": "walk:user/7@example.com",
    "template": "walk@2",
}
#: A query parameter whose values differ by route (a cursor is a page's own): (path, name).
PATH_QUERY_EXAMPLES: dict[tuple[str, str], str] = {}


def _example(name: str, model: str = "") -> Any:
    value = MODEL_EXAMPLES.get((model, name), EXAMPLES[name])
    return value() if callable(value) else value


def _together(name: str, model: str) -> Json:
    """What `name` is sent with in `model` (models that give the name its own meaning: none)."""
    return {} if (model, name) in MODEL_EXAMPLES else TOGETHER.get(name, {})


def _resolve(document: Json, schema: Json) -> tuple[str, Json]:
    """(model name, schema) of a $ref; ("", schema) for anything else."""
    name = ""
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = document["components"]["schemas"][name]
    return name, schema


def _non_null(document: Json, schema: Json) -> tuple[str, Json]:
    branches = [s for s in schema.get("anyOf", [schema]) if s != {"type": "null"}]
    return _resolve(document, branches[0]) if len(branches) == 1 else ("", schema)


def _bounds(schema: Json) -> Iterator[Any]:
    """Values at the documented bounds of a plain string or number."""
    if schema.get("type") == "string" and "maxLength" in schema and "pattern" not in schema:
        yield "b" * schema["maxLength"]
    if schema.get("type") in ("integer", "number"):
        yield from (schema[bound] for bound in ("minimum", "maximum") if bound in schema)


def _base(model: str) -> Json:
    return BASE[model]() if model in BASE else {}


class Walk:
    """One body model at one place in a request: how to wrap a body of it into a request."""

    def __init__(
        self, document: Json, model: str, schema: Json, wrap: Callable[[Json], Json], at: str
    ) -> None:
        self.document, self.model, self.schema = document, model, schema
        self.wrap, self.at = wrap, at

    def cases(self) -> Iterator[tuple[str, Json, bool]]:
        """(what, request body, accepted?) for every property, then its nested models."""
        model = self.model
        documented = self.schema.get("properties", {})
        for name, shown in documented.items():
            assert name in EXAMPLES, f"{self.at}{name} is documented: give it an example"
            _, prop = _non_null(self.document, shown)
            values = [_example(name, model), *(_bounds(prop))]
            for value in values:
                body = {**_base(model), **_together(name, model), name: value}
                for excluded in EXCLUDES.get(name, "").split():
                    body.pop(excluded, None)
                yield f"{self.at}{name}={str(value)[:40]!r}", self.wrap(body), True
        for name in [*sorted(set(EXAMPLES) - set(documented)), "undocumented"]:
            body = {**_base(model), name: _example(name) if name in EXAMPLES else 1}
            yield f"{self.at}{name}", self.wrap(body), False

    def nested(self) -> Iterator[Walk]:
        """The models inside this one: objects, and the objects of arrays."""
        for name, shown in self.schema.get("properties", {}).items():
            inner, prop = _non_null(self.document, shown)

            def inside(body: Json, name: str = name) -> Json:
                base = _base(self.model)
                if name == "options" and WITH_PAGE_URL & set(body) and "template" in base:
                    del base["template"]
                    base["page_url"] = PAGE_URL
                return self.wrap({**base, **_together(name, self.model), name: body})

            def listed(body: Json, name: str = name) -> Json:
                return self.wrap({**_base(self.model), name: [body]})

            if prop.get("type") == "object" and "properties" in prop:
                yield Walk(self.document, inner, prop, inside, f"{self.at}{name}.")
            inner, items = _resolve(self.document, prop.get("items", {}))
            if prop.get("type") == "array" and "properties" in items:
                yield Walk(self.document, inner, items, listed, f"{self.at}{name}[0].")


def _walks(document: Json, model: str, schema: Json) -> Iterator[Walk]:
    pending = [Walk(document, model, schema, lambda body: body, "")]
    while pending:
        walk = pending.pop(0)
        yield walk
        pending.extend(walk.nested())


def _conforms(document: Json, operation: Json, status: int, body: Any) -> None:
    """The answer matches the response schema the document gives for its status."""
    content = operation["responses"][str(status)].get("content", {})
    if "application/json" in content:
        schema = {**content["application/json"]["schema"], "components": document["components"]}
        errors = [e.message for e in Draft202012Validator(schema).iter_errors(body)]
        assert not errors, (status, errors[:3])


@pytest.fixture
async def walked(start_app: Callable[..., Any], tmp_path: Path) -> tuple[RunningApp, Json]:
    ca = testca.make(tmp_path)
    app: RunningApp = await start_app(
        renderer=FakeRenderer(),
        render_slots=1,
        rate_limit_rps=1000,
        env={"PRESSROOM_SIGNING_KEY": ca.p12, "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password},
    )
    async with app.http.get(app.url("/v1/openapi.json")) as resp:
        document = await resp.json()
    published = {"name": "walk", "html": HTML, "publish": True, "samples": {"short": {}}}
    async with app.http.post(app.url("/v1/templates"), json=published) as r:
        assert r.status == 201, await r.text()
    logo = {"Content-Type": "image/png"}
    async with app.http.post(
        app.url("/v1/assets"), data=b"\x89PNG\r\n\x1a\n walk", headers=logo
    ) as r:
        assert r.status == 201, await r.text()
        EXAMPLES["assets"] = {"img/logo.png": (await r.json())["id"]}
        EXAMPLES["asset"] = (await r.json())["id"]
    invoice = {"Content-Type": "application/xml"}
    async with app.http.post(app.url("/v1/assets"), data=INVOICE_XML, headers=invoice) as r:
        assert r.status == 201, await r.text()
        EXAMPLES["xml"] = (await r.json())["id"]
    pdf = {"Content-Type": "application/pdf"}
    async with app.http.post(app.url("/v1/assets"), data=minimal_pdf(), headers=pdf) as r:
        assert r.status == 201, await r.text()
        EXAMPLES["pdfs"] = [(await r.json())["id"]]
    word = io.BytesIO()
    docx.Document().save(word)
    async with app.http.post(app.url("/v1/assets"), data=word.getvalue(), headers=DOCX) as r:
        assert r.status == 201, await r.text()
        EXAMPLES["office"] = EXAMPLES["docx"] = (await r.json())["id"]
    async with app.http.post(app.url("/v1/jobs"), json={"template": HTML}) as resp:
        EXAMPLES["job_id"] = (await resp.json())["id"]
    async with app.http.post(app.url("/v1/jobs"), json={"template": HTML}) as resp:
        assert resp.status == 202
    async with app.http.get(app.url("/v1/jobs?limit=1")) as resp:
        QUERY_EXAMPLES["cursor"] = (await resp.json())["next_cursor"]
    async with app.http.get(app.url("/v1/assets?limit=1")) as resp:
        PATH_QUERY_EXAMPLES["/v1/assets", "cursor"] = (await resp.json())["next_cursor"]
    PATH_QUERY_EXAMPLES["/v1/templates", "cursor"] = "walk"  # a page's last template name
    PATH_QUERY_EXAMPLES["/v1/templates/walk/versions", "cursor"] = "2"  # a page's last version
    return app, document


def _operations(document: Json) -> Iterator[tuple[str, str, Json]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method != "parameters":
                yield (
                    method,
                    path.replace("{job_id}", str(EXAMPLES["job_id"]))
                    .replace("{template_id}/", "walk@1/")  # publish and diff take a version
                    .replace("{template_id}", "walk")
                    .replace("{name}", "walk"),
                    operation,
                )


async def test_every_documented_body_property_is_accepted_and_no_other(
    walked: tuple[RunningApp, Json],
) -> None:
    app, document = walked
    walked_bodies = set()
    for method, path, operation in _operations(document):
        content = operation.get("requestBody", {}).get("content", {})
        shown = content.get("application/json", {}).get("schema", {})
        if "$ref" not in shown:
            continue  # no JSON body, or an asset's bytes (a JSON file, say): tested elsewhere
        # A documented value the request's own schema refuses (options that go with another
        # field, say) must be refused too.
        documented = Draft202012Validator({**shown, "components": document["components"]})
        for walk in _walks(document, *_resolve(document, shown)):
            walked_bodies.add(walk.model)
            for what, body, accepted in walk.cases():
                refused_by_schema = accepted and not documented.is_valid(body)
                async with app.http.request(method, app.url(path), json=body) as resp:
                    shown = await resp.json() if "json" in resp.content_type else None
                    if accepted and not refused_by_schema:
                        assert 200 <= resp.status < 300, (path, what, shown, body)
                        _conforms(document, operation, resp.status, shown)
                        continue
                    assert resp.status == 422, (path, what, resp.status, shown)
                    assert resp.content_type == "application/problem+json"
                assert shown is not None
                if not refused_by_schema:
                    assert what in [error["field"] for error in shown["errors"]], (path, shown)
    assert {"JobRequest", "RenderOptions", "Screenshot", "Thumbnail"} <= walked_bodies
    assert {"Attachment", "FacturX", "Stamp", "Encrypt", "Sign", "SignVisible"} <= walked_bodies
    assert {"BatchItem", "TemplateRequest"} <= walked_bodies


async def test_every_documented_query_parameter_is_accepted_up_to_its_bounds(
    walked: tuple[RunningApp, Json],
) -> None:
    app, document = walked
    walked_params = set()
    for method, path, operation in _operations(document):
        if "text/event-stream" in operation["responses"].get("200", {}).get("content", {}):
            continue  # streams have tests of their own
        for parameter in operation.get("parameters", []):
            name = parameter["name"]
            if parameter["in"] != "query" or name not in QUERY_EXAMPLES:
                continue  # signed links have tests of their own
            _, schema = _non_null(document, parameter["schema"])
            values = [PATH_QUERY_EXAMPLES.get((path, name), QUERY_EXAMPLES[name])]
            if schema.get("type") == "integer":
                assert "maximum" in schema, f"{path} ?{name} documents no maximum"
                values += [str(schema["minimum"]), str(schema["maximum"])]
            for value in values:
                async with app.http.request(method, app.url(path), params={name: value}) as resp:
                    shown = await resp.json()
                    assert resp.status == 200, (path, name, value, shown)
                _conforms(document, operation, resp.status, shown)
            walked_params.add(name)
    assert walked_params == set(QUERY_EXAMPLES)
