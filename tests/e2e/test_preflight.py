"""Preflight on real Chromium: each kind found on a page that has it, named, and fatal when
fail_on names it; a clean page gives none. The PDFs are Chromium's, read by PDFium."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from tests.conftest import RunningApp
from tests.e2e.test_render import render

pytestmark = pytest.mark.browser

# Vithkuqi (Unicode 14): no font installed here, nor uploaded, has a glyph for it.
UNCOVERED = "\U00010570\U00010571\U00010572"


def png_data_uri(size: tuple[int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, "steelblue").save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


# 10 cm at 72 DPI is 283 pixels.
LOW_RES = f'<p>Logo</p><img id="logo" src="{png_data_uri((283, 100))}" style="width: 10cm">'
SHARP = f'<img src="{png_data_uri((1200, 424))}" style="width: 10cm">'
WIDE_TABLE = (
    '<table class="lines"><tr>'
    + "".join(f"<td>column-{i:02d}</td>" for i in range(40))
    + "</tr></table>"
)
CLIPPED = (
    '<div id="box" style="width: 3cm; overflow: hidden; white-space: nowrap">'
    + ("a line far longer than three centimetres " * 3)
    + "</div>"
)
BROKEN = '<p>Chart</p><img src="data:image/png;base64,AAAA" style="width: 3cm">'
BLANK = '<p>one</p><div style="break-before: page"></div>'
PAGES = {
    "missing_glyph": f"<p>Greeting: {UNCOVERED}</p>",
    "low_resolution_image": LOW_RES,
    "overflow": WIDE_TABLE,
    "broken_image": BROKEN,
    "blank_page": BLANK,
}
CLEAN = f"<h1>Facture 42</h1><p>Café, Straße, Ελληνικά, 日本語, 😀</p>{SHARP}"


@pytest.fixture
async def app(start_app: Callable[..., Any]) -> RunningApp:
    running: RunningApp = await start_app(render_slots=2)
    return running


async def test_a_clean_page_gives_no_finding(app: RunningApp) -> None:
    job, data = await render(app, {"template": CLEAN, "options": {"preflight": True}})
    assert data is not None, job["error"]
    assert job["preflight"] == [] and job["warnings"] == []
    # Without asking, the checks do not run.
    job, data = await render(app, {"template": BLANK})
    assert data is not None and job["preflight"] is None and job["warnings"] == []


async def test_each_kind_is_found_and_named(app: RunningApp) -> None:
    jobs = await asyncio.gather(
        *(
            render(app, {"template": html, "options": {"preflight": True}})
            for html in PAGES.values()
        )
    )
    found: dict[str, list[dict[str, Any]]] = {}
    for kind, (job, data) in zip(PAGES, jobs, strict=True):
        assert data is not None, job["error"]
        found[kind] = job["preflight"]
        assert [f["kind"] for f in job["preflight"]] == [kind], job["preflight"]
        [warning] = job["warnings"]
        assert warning.startswith(kind), warning
        assert job["preflight"][0]["detail"] in warning
    [glyph] = found["missing_glyph"]
    assert "U+10570 VITHKUQI CAPITAL LETTER A" in glyph["detail"]
    assert "U+10572" in glyph["detail"]
    [image] = found["low_resolution_image"]
    assert image["page"] == 1 and "283x100 px" in image["detail"]
    assert "at 72 DPI, below 150" in image["detail"], image["detail"]
    [wide] = found["overflow"]
    assert "table.lines" in wide["detail"] and "printed at" in wide["detail"]
    [broken] = found["broken_image"]
    assert "data:image/png;base64,AAAA" in broken["detail"]
    [blank] = found["blank_page"]
    assert blank["page"] == 2


async def test_content_cut_off_by_its_box_is_an_overflow(app: RunningApp) -> None:
    job, data = await render(app, {"template": CLIPPED, "options": {"preflight": True}})
    assert data is not None, job["error"]
    [cut] = job["preflight"]
    assert cut["kind"] == "overflow" and "div#box cuts off its content" in cut["detail"]


async def test_min_dpi_sets_the_bar(app: RunningApp) -> None:
    options = {"preflight": {"min_dpi": 60}}
    job, data = await render(app, {"template": LOW_RES, "options": options})
    assert data is not None and job["preflight"] == []


async def test_each_kind_fails_the_job_when_fail_on_names_it(app: RunningApp) -> None:
    jobs = await asyncio.gather(
        *(
            render(app, {"template": html, "options": {"fail_on": {kind: True}}})
            for kind, html in PAGES.items()
        )
    )
    for kind, (job, data) in zip(PAGES, jobs, strict=True):
        assert data is None and job["status"] == "failed", kind
        assert job["attempts"] == 1, "not retried"
        assert job["error"].startswith(f"preflight found {kind}"), job["error"]
    # A kind fail_on does not name stays a warning.
    job, data = await render(app, {"template": BLANK, "options": {"fail_on": {"overflow": True}}})
    assert data is not None and [f["kind"] for f in job["preflight"]] == ["blank_page"]


async def test_preflight_is_refused_beside_an_image_output(app: RunningApp) -> None:
    for options in (
        {"output": "png", "fail_on": {"blank_page": True}},
        {"output": "png", "preflight": True},
    ):
        body = {"template": "<p>x</p>", "options": options}
        async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
            assert resp.status == 422, await resp.text()
            problem = await resp.json()
        assert "a printed PDF" in str(problem) or "PDF only" in str(problem), problem
