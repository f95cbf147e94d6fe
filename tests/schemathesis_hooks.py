"""Schemathesis hooks for tests/integration/test_openapi.py (loaded via SCHEMATHESIS_HOOKS).

`positive_data_acceptance` expects every schema-valid request to be accepted. A few rules
are not the schema's to state, since they depend on what the server holds or on Jinja2 and
the network policy; valid requests are made to keep them here, and nothing else is changed:
a template that Jinja2 parses, a template_id replaced by a template (stored names are the
server's), a job cursor naming a real time, a public webhook URL and page URL (with
cookie domains that are its host, and header names the browser leaves to the page), fresh
idempotency and batch item keys (a key reused with other content is refused by design), no
asset map and no finishing option that names an asset (asset ids are the server's), no
signature (the server has no signing key), no uploaded PDFs or Word templates (a `pdfs` or
`docx` job becomes a template one, a Word template version an HTML one) and no form to fill
(its data paths are the data's), a PDF asset that is a whole PDF, an asset of at least one
byte (the server refuses an empty one), a multipart job whose index part is a page and whose
job part is JSON, and a stored template's preview that names the output its options are for
(the template's own output is the server's)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import schemathesis
from schemathesis.transport.serialization import Binary

from server.options.values import FORBIDDEN_HEADERS
from server.render import templates
from server.schemas.common import MAX_WAIT_S
from server.schemas.listing import encode_cursor
from tests.pdfs import minimal_pdf

MAX_TEST_WAIT_S = 0.1
PUBLIC_HOOK = "https://hooks.invalid/fuzz"
PUBLIC_PAGE = "https://pages.invalid/fuzz"
PLAIN = "<p>fuzz</p>"
JOB_CURSOR = encode_cursor(dt.datetime(2000, 1, 1, tzinfo=dt.UTC), uuid.UUID(int=0))


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    """A long-poll may rightly hold a request for a minute; keep the fuzz run short, and within
    the half second a stream's route is read for (tests/integration/test_openapi.py). Only a
    valid wait is shortened: one beyond the documented maximum is refused at once, and
    shortening it would turn a negative case into an accepted one."""
    query = case.query or {}
    try:
        too_long = MAX_TEST_WAIT_S < float(query.get("wait")) <= MAX_WAIT_S
    except (TypeError, ValueError):
        too_long = False
    if too_long:
        query["wait"] = MAX_TEST_WAIT_S  # a number, as generated: a string would be a type error
    if case.meta is not None and case.meta.generation.mode.is_positive:
        _keep_server_rules(case)


def _keep_server_rules(case: Any) -> None:
    if case.operation.path in ("/v1/jobs", "/v1/batches") and case.query and "cursor" in case.query:
        # Of the pattern's cursors, only those naming a real time are the server's.
        case.query["cursor"] = JOB_CURSOR
    if case.headers and "Idempotency-Key" in case.headers:
        case.headers["Idempotency-Key"] = str(uuid.uuid4())
    if case.media_type == "application/pdf":
        case.body = minimal_pdf()
    if case.operation.path == "/v1/assets" and isinstance(case.body, Binary):
        if case.media_type.startswith("text/"):
            # Schemathesis writes a text/* body as the text of its value, and a binary value
            # has none: it would send no bytes at all.
            case.body = "/* fuzz */"
        elif not case.body.data:
            case.body = Binary(b"fuzz")
    if case.media_type == "multipart/form-data" and isinstance(case.body, dict):
        case.body = {"index.html": PLAIN, "job": "{}"}
        return
    body = case.body if isinstance(case.body, dict) else None
    if body is None:
        return
    if case.operation.path == "/v1/templates/{template_id}/preview":
        options = body.get("options")
        if isinstance(options, dict) and options.get("output") is None:
            # The stored template's output is the server's to know (a PNG one refuses PDF
            # options): the body names the output its own options are for.
            options["output"] = "webp" if options.get("screenshot") is not None else "pdf"
    body.pop("assets", None)
    if body.pop("docx", None) is not None:  # a Word template is the server's asset: HTML instead
        body["html"] = PLAIN
    _source(body, "html")
    _job(body)
    for item in body.get("items") or ():
        if isinstance(item, dict):
            item["key"] = str(uuid.uuid4())
            item.pop("assets", None)
            _job(item)


def _job(body: dict[str, Any]) -> None:
    for source in ("pdfs", "docx"):  # uploads are the server's: a template instead
        if body.pop(source, None) is not None:
            body["template"] = PLAIN
    _source(body, "template")
    _source(body, "markdown")
    if body.get("webhook_url") is not None:
        body["webhook_url"] = PUBLIC_HOOK
    if body.get("page_url") is not None:
        body["page_url"] = PUBLIC_PAGE
    options = body.get("options")
    if not isinstance(options, dict):
        return
    _finishing(options)
    for cookie in options.get("cookies") or ():
        if isinstance(cookie, dict) and cookie.get("domain") is not None:
            cookie["domain"] = "pages.invalid"
    headers = options.get("headers")
    if isinstance(headers, dict):
        for name in [n for n in headers if n.lower() in FORBIDDEN_HEADERS]:
            del headers[name]
        # Names that differ in case only are one header, given twice.
        seen: set[str] = set()
        for name in list(headers):
            if name.lower() in seen:
                del headers[name]
            seen.add(name.lower())


def _finishing(options: Any) -> None:
    """Finishing options that name assets (the server's ids) lose them: an image stamp becomes
    a text one; attachments and an invoice go. `sign` goes too: this server has no key; and
    `fill_form`, whose data paths the generated data does not hold."""
    if not isinstance(options, dict):
        return
    for name in ("attachments", "facturx", "sign", "fill_form"):
        options.pop(name, None)
    stamp = options.get("stamp")
    if isinstance(stamp, dict) and stamp.get("asset") is not None:
        stamp["asset"] = None
        stamp["text"] = "fuzz"


def _source(body: dict[str, Any], field: str) -> None:
    if body.get("template_id") is not None:
        body.pop("template_id")
        body["template"] = PLAIN
    value = body.get(field)
    if isinstance(value, str) and templates.check(value) is not None:
        body[field] = PLAIN
