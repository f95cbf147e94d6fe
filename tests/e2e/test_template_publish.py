"""Publishing a template's draft on real Chromium: its samples rendered with it and with the
published version, compared by PDFium's pages and pixels."""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO
from typing import Any

import pytest
from PIL import Image
from playwright.async_api import Browser

from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_dashboard_views import WAIT_MS, open_page, page_text, preview_text
from tests.e2e.test_docx import DATA
from tests.e2e.test_docx import invoice as word_invoice
from tests.e2e.test_office import DOCX, upload
from tests.pdfs import FakeRenderer

pytestmark = pytest.mark.browser

ROWS = "".join(f"<tr><td>line {n}</td><td>{n}.00</td></tr>" for n in range(1, 6))
PAGE = (
    "<style>body{{font:12px sans-serif}} .pad{{height:{pad}mm}} .box{{width:{box}mm;"
    "height:{box}mm;background:#000}}</style><h1>Invoice for {{{{customer}}}}</h1>"
    "<table>" + ROWS + "</table><div class=pad></div><div class=box></div>"
    "<p>Total: {{{{total}}}}{mark}</p>"
)
SAMPLES = {
    "acme": {"customer": "Acme", "total": "15.00"},
    "globex": {"customer": "Globex", "total": "3.00"},
}


def invoice(pad: int = 10, box: int = 0, mark: str = "", **extra: Any) -> dict[str, Any]:
    html = PAGE.format(pad=pad, box=box, mark=mark)
    return {
        "name": "invoice",
        "html": html,
        "options": {"format": "A4"},
        "samples": SAMPLES,
        **extra,
    }


@pytest.fixture
async def chromium_app(start_app: Callable[..., Any]) -> RunningApp:
    app: RunningApp = await start_app(render_slots=1)
    return app


async def post(app: RunningApp, path: str, body: Any) -> tuple[int, Any]:
    async with app.http.post(app.url(path), json=body) as resp:
        return resp.status, await resp.json()


async def published_version(app: RunningApp) -> int:
    async with app.http.get(app.url("/v1/templates/invoice")) as resp:
        shown = await resp.json()
    version: int = shown["version"] if shown["status"] == "published" else 0
    return version


async def test_a_total_moved_to_page_two_is_refused_and_force_publishes_it(
    chromium_app: RunningApp,
) -> None:
    status, first = await post(chromium_app, "/v1/templates", invoice(publish=True))
    assert status == 201 and first["status"] == "published", first
    assert [s["pages_after"] for s in first["diff"]["samples"]] == [1, 1]
    status, _ = await post(chromium_app, "/v1/templates", invoice(pad=260))
    assert status == 201
    status, problem = await post(chromium_app, "/v1/templates/invoice@2/publish", {})
    assert status == 409, problem
    assert "sample 'acme': the page count changes from 1 to 2" in problem["refused"]
    assert "the page count changes from 1 to 2" in problem["detail"]
    acme = next(s for s in problem["diff"]["samples"] if s["sample"] == "acme")
    assert (acme["pages_before"], acme["pages_after"]) == (1, 2)
    moved = {p["page"]: p for p in acme["pages"]}
    assert "Total: 15.00" in moved[1]["text_removed"] and "Total: 15.00" in moved[2]["text_added"]
    assert await published_version(chromium_app) == 1

    status, forced = await post(chromium_app, "/v1/templates/invoice@2/publish", {"force": True})
    assert status == 200 and forced["status"] == "published" and forced["diff"]["forced"]
    assert await published_version(chromium_app) == 2


async def test_an_unchanged_version_has_an_empty_diff(chromium_app: RunningApp) -> None:
    await post(chromium_app, "/v1/templates", invoice(publish=True))
    await post(chromium_app, "/v1/templates", invoice())
    status, published = await post(chromium_app, "/v1/templates/invoice@2/publish", None)
    assert status == 200, published
    diff = published["diff"]
    assert diff["against"] == 1 and diff["refused"] == []
    assert [(s["pages_before"], s["pages_after"], s["pages"]) for s in diff["samples"]] == [
        (1, 1, []),
        (1, 1, []),
    ]


async def test_pixels_over_the_threshold_are_refused_and_under_it_published(
    chromium_app: RunningApp,
) -> None:
    await post(chromium_app, "/v1/templates", invoice(publish=True))
    # A 40 mm black square: about 2.5 % of an A4 page's pixels.
    await post(chromium_app, "/v1/templates", invoice(box=40))
    status, problem = await post(chromium_app, "/v1/templates/invoice@2/publish", {})
    assert status == 409, problem
    assert any("change more than 0.50% of their pixels" in r for r in problem["refused"])
    page = problem["diff"]["samples"][0]["pages"][0]
    assert 0.015 < page["changed_pixels"] < 0.04 and page["text_added"] == []
    # The same change is under a threshold of 5 %.
    status, published = await post(
        chromium_app, "/v1/templates/invoice@2/publish", {"threshold": 0.05}
    )
    assert status == 200 and published["status"] == "published"

    # One character more: text changes, a few pixels do, and it publishes.
    await post(chromium_app, "/v1/templates", invoice(box=40, mark="."))
    status, published = await post(chromium_app, "/v1/templates/invoice@3/publish", {})
    assert status == 200, published
    page = published["diff"]["samples"][0]["pages"][0]
    assert 0 < page["changed_pixels"] < 0.005
    assert page["text_added"] == ["Total: 15.00."] and page["text_removed"] == ["Total: 15.00"]

    # The diff route, and the image of a changed page: the published page beside the new one.
    async with chromium_app.http.get(chromium_app.url("/v1/templates/invoice@3/diff")) as resp:
        assert resp.status == 200
        diff = await resp.json()
    assert diff["samples"] == published["diff"]["samples"] and diff["published"]
    async with chromium_app.http.get(chromium_app.url(page["image"])) as resp:
        assert resp.status == 200 and resp.content_type == "image/png"
        image = Image.open(BytesIO(await resp.read()))
    # Two A4 pages at 50 dpi side by side (PDFium rounds 413.4 by 584.7 up), 8 between them.
    assert image.size == (414 * 2 + 8, 586)
    missing = chromium_app.url("/v1/templates/invoice@3/diff/acme/9")
    async with chromium_app.http.get(missing) as resp:
        assert resp.status == 404


async def test_the_dashboards_editor_previews_any_sample_and_keeps_the_contract(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(text_of=page_text), render_slots=1)
    schema = {"type": "object", "required": ["customer"]}
    body = {
        "name": "card",
        "html": "<p>Card for {{customer}}</p>",
        "sample_data": {"customer": "Sample Co"},
        "samples": {"acme": {"customer": "Acme Ltd"}, "globex": {"customer": "Globex"}},
        "data_schema": schema,
    }
    status, _ = await post(app, "/v1/templates", body)
    assert status == 201
    page, errors = await open_page(browser, 1280)
    await page.goto(app.url("/templates/card"))
    await page.wait_for_selector("#preview[data-state=shown]", timeout=WAIT_MS)
    assert "Card for Sample Co" in await preview_text(page)
    shown = await page.get_attribute("#preview", "data-seq")
    await page.select_option("#edit-sample", "globex")
    await page.wait_for_function(
        f"document.getElementById('preview').dataset.seq !== '{shown}' && "
        "document.getElementById('preview').dataset.state === 'shown'",
        timeout=WAIT_MS,
    )
    assert "Card for Globex" in await preview_text(page)
    await page.fill("#edit-html", "<p>Card, for {{customer}}</p>")
    await page.click("#save")
    await page.wait_for_function(
        "document.getElementById('save-status').textContent === 'Saved as version 2.'",
        timeout=WAIT_MS,
    )
    async with app.http.get(app.url("/v1/templates/card@2")) as resp:
        second = await resp.json()
    assert second["status"] == "draft" and second["data_schema"] == schema
    assert second["samples"] == body["samples"] and second["sample_data"] == body["sample_data"]
    assert errors == []


async def test_the_dashboard_publishes_a_draft_and_shows_what_refused_it(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(render_slots=1)
    await post(app, "/v1/templates", invoice(publish=True))
    await post(app, "/v1/templates", invoice(pad=260))
    page, errors = await open_page(browser, 1280)
    await page.goto(app.url("/templates/invoice"))
    await page.wait_for_selector("#publish-form:not([hidden])", timeout=WAIT_MS)
    assert "Version 2 is a draft" in await page.inner_text("#publish-state")
    await page.click("#publish")
    await page.wait_for_selector("#publish-diff .refused li", timeout=WAIT_MS)
    assert "the page count changes from 1 to 2" in await page.inner_text("#publish-diff .refused")
    assert "stays a draft" in await page.inner_text("#publish-state")
    # The changed pages, side by side, as images read with the page's credentials.
    await page.wait_for_function(
        "[...document.querySelectorAll('[data-sample=acme] img')].length === 2 && "
        "[...document.querySelectorAll('[data-sample=acme] img')].every(i => i.naturalWidth > 0)",
        timeout=WAIT_MS,
    )
    await page.check("#publish-force")
    await page.click("#publish")
    await page.wait_for_function(
        "document.getElementById('publish-state').textContent === 'Version 2 is published.'",
        timeout=WAIT_MS,
    )
    assert await published_version(app) == 2
    assert errors == []


@pytest.mark.slow  # the app starts its LibreOffice
async def test_a_word_templates_samples_are_compared_through_libreoffice(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    first = await upload(app, word_invoice("Invoice"), DOCX)
    unpaid = {**DATA, "paid": False}
    body = {"name": "word", "docx": first, "samples": {"paid": DATA, "unpaid": unpaid}}
    status, stored = await post(app, "/v1/templates", {**body, "publish": True})
    assert status == 201 and stored["status"] == "published", stored
    status, _ = await post(app, "/v1/templates", body)
    status, same = await post(app, "/v1/templates/word@2/publish", {})
    assert status == 200, same
    assert [(s["pages_before"], s["pages_after"], s["pages"]) for s in same["diff"]["samples"]] == [
        (1, 1, []),
        (1, 1, []),
    ]
    # Another heading: its text and its pixels change on every sample.
    second = await upload(app, word_invoice("Invoice, second layout"), DOCX)
    status, _ = await post(app, "/v1/templates", {**body, "docx": second})
    status, changed = await post(app, "/v1/templates/word@3/publish", {"threshold": 1})
    assert status == 200, changed
    for sample in changed["diff"]["samples"]:
        (page,) = sample["pages"]
        assert page["text_added"] == ["Invoice, second layout"]
        assert page["text_removed"] == ["Invoice"] and page["changed_pixels"] > 0
