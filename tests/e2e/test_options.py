"""Every render option, checked on the PDF that real Chromium produced: page size and
orientation (media box), page ranges, header and footer with page numbers, metadata, CJK and
emoji text, @font-face from a data URI, print vs screen media, and waiting for content."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader

from tests.conftest import RunningApp
from tests.e2e.test_render import pdf_text, render

pytestmark = pytest.mark.browser

MM_PER_PT = 25.4 / 72
FONT_FILE = Path("/usr/share/fonts/truetype/liberation/LiberationMono-Regular.ttf")


@pytest.fixture
async def chromium_app(start_app: Callable[..., Any]) -> RunningApp:
    app: RunningApp = await start_app(render_slots=2)
    return app


async def rendered(app: RunningApp, template: str, **options: Any) -> tuple[dict[str, Any], bytes]:
    job, data = await render(app, {"template": template, "options": options})
    assert data is not None, job["error"]
    return job, data


def size_mm(data: bytes, page: int = 0) -> tuple[int, int]:
    box = PdfReader(BytesIO(data)).pages[page].mediabox
    return round(float(box.width) * MM_PER_PT), round(float(box.height) * MM_PER_PT)


def pages(count: int) -> str:
    return "".join(
        f'<p style="page-break-after: always">body of page {n + 1}</p>' for n in range(count)
    )


def font_data_uri() -> str:
    return "data:font/ttf;base64," + base64.b64encode(FONT_FILE.read_bytes()).decode()


def font_names(data: bytes) -> set[str]:
    names = set()
    for page in PdfReader(BytesIO(data)).pages:
        for font in page["/Resources"]["/Font"].values():
            name = font.get_object().get("/BaseFont")
            if name is not None:
                names.add(str(name))
    return names


async def test_paper_size_and_orientation(chromium_app: RunningApp) -> None:
    cases = {
        "a4": ({}, (210, 297)),
        "a5-landscape": ({"format": "A5", "landscape": True}, (210, 148)),
        "letter": ({"format": "letter"}, (216, 279)),
        "custom": ({"width": "100mm", "height": "50mm"}, (100, 50)),
        "custom-landscape": ({"width": "100mm", "height": "50mm", "landscape": True}, (50, 100)),
        "css-page-size": ({"prefer_css_page_size": True}, (120, 80)),
    }
    css_sized = "<style>@page { size: 120mm 80mm }</style><p>sized</p>"
    results = await asyncio.gather(
        *(
            rendered(
                chromium_app, css_sized if name == "css-page-size" else "<p>sized</p>", **options
            )
            for name, (options, _) in cases.items()
        )
    )
    for (name, (_, expected)), (_, data) in zip(cases.items(), results, strict=True):
        assert size_mm(data) == expected, name


async def test_page_ranges_and_page_count(chromium_app: RunningApp) -> None:
    job, data = await rendered(chromium_app, pages(5), page_ranges="2-3, 5")
    assert job["pages"] == 3 == len(PdfReader(BytesIO(data)).pages)
    text = pdf_text(data)
    assert "body of page 2" in text and "body of page 5" in text
    assert "body of page 1" not in text and "body of page 4" not in text


async def test_header_and_footer_with_page_numbers(chromium_app: RunningApp) -> None:
    footer = (
        '<div style="font-size: 10px; width: 100%; text-align: center">'
        'Page <span class="pageNumber"></span>/<span class="totalPages"></span></div>'
    )
    header = '<div style="font-size: 10px; margin-left: 10mm">ACME Ltd statement</div>'
    # No margins given: room is made for the header and footer, else Chromium cuts them away.
    job, data = await rendered(chromium_app, pages(3), header_html=header, footer_html=footer)
    assert job["pages"] == 3
    for number, page in enumerate(PdfReader(BytesIO(data)).pages, start=1):
        text = page.extract_text()
        assert f"Page {number}/3" in text
        assert "ACME Ltd statement" in text
        assert f"body of page {number}" in text


async def test_metadata_fields(chromium_app: RunningApp) -> None:
    _, data = await rendered(
        chromium_app,
        "<title>from the page</title><p>meta</p>",
        title="Invoice 2024-001 請求書",
        author="Ana Lima",
        subject="March services",
        keywords=["invoice", "march"],
    )
    info = PdfReader(BytesIO(data)).metadata
    assert info is not None
    assert info.title == "Invoice 2024-001 請求書"
    assert info.author == "Ana Lima"
    assert info.subject == "March services"
    assert info["/Keywords"] == "invoice, march"
    assert "Skia" in (info.producer or ""), "Chromium's own fields are kept"
    # Without options, Chromium's title (from <title>) stays and nothing else is added.
    _, plain = await rendered(chromium_app, "<title>from the page</title><p>meta</p>")
    plain_info = PdfReader(BytesIO(plain)).metadata
    assert plain_info is not None and plain_info.title == "from the page"
    assert plain_info.author is None


async def test_cjk_and_emoji_text_are_in_the_text_layer(chromium_app: RunningApp) -> None:
    _, data = await rendered(
        chromium_app, "<h1>日本語の請求書</h1><p>합계 總計 Total: 42 € 😀 🎉</p>"
    )
    # pypdf puts a space where the font changes (CJK, emoji); the words are what count.
    text = " ".join(pdf_text(data).split())
    assert "日本語の請求書" in text
    assert "합계 總計" in text
    assert "😀" in text and "🎉" in text


async def test_font_face_from_a_data_uri(chromium_app: RunningApp) -> None:
    styled = (
        "<style>@font-face { font-family: EmbeddedFace;"
        f" src: url({font_data_uri()}) format('truetype'); }}"
        " p { font-family: EmbeddedFace, serif; }</style>"
    )
    _, data = await rendered(chromium_app, styled + "<p>Embedded font text</p>")
    assert "Embedded font text" in pdf_text(data)
    assert any("LiberationMono" in name for name in font_names(data)), font_names(data)
    # The same page without the @font-face never falls back to that font.
    _, plain = await rendered(chromium_app, "<style>p { font-family: serif; }</style><p>Plain</p>")
    assert not any("LiberationMono" in name for name in font_names(plain))


async def test_media_type_print_or_screen(chromium_app: RunningApp) -> None:
    template = (
        "<style>@media print { .screen { display: none } }"
        " @media screen { .print { display: none } }</style>"
        '<p class="print">PRINT STYLES</p><p class="screen">SCREEN STYLES</p>'
    )
    (_, printed), (_, screen) = await asyncio.gather(
        rendered(chromium_app, template), rendered(chromium_app, template, media="screen")
    )
    assert "PRINT STYLES" in pdf_text(printed) and "SCREEN STYLES" not in pdf_text(printed)
    assert "SCREEN STYLES" in pdf_text(screen) and "PRINT STYLES" not in pdf_text(screen)


LATE = """<p id="first">first</p><script>
  setTimeout(() => {
    const late = document.createElement("p");
    late.id = "late";
    late.textContent = "LATE CONTENT";
    document.body.append(late);
    window.chartReady = true;
  }, 400);
</script>"""


async def test_waiting_for_a_selector_or_an_expression(chromium_app: RunningApp) -> None:
    (_, eager), (_, by_selector), (_, by_expression) = await asyncio.gather(
        rendered(chromium_app, LATE),
        rendered(chromium_app, LATE, wait_for_selector="#late"),
        rendered(chromium_app, LATE, wait_for_expression="window.chartReady === true"),
    )
    assert "LATE CONTENT" not in pdf_text(eager), "printed at load, before the script ran"
    assert "LATE CONTENT" in pdf_text(by_selector)
    assert "LATE CONTENT" in pdf_text(by_expression)


async def test_waiting_is_bounded_by_the_render_time_limit(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(render_slots=1, env={"PRESSROOM_RENDER_TIMEOUT_S": "3"})
    job, data = await render(
        app,
        {
            "template": "<p>never</p>",
            "options": {"wait_for_selector": "#never"},
            "max_attempts": 1,
        },
    )
    assert data is None and job["status"] == "failed"
    assert "3" in job["error"] and "time" in job["error"].lower()


async def test_a_header_prints_the_jobs_title_where_it_asks_for_the_title(
    chromium_app: RunningApp,
) -> None:
    header = '<div style="font-size: 10px">Document: <span class="title"></span></div>'
    page = "<!DOCTYPE html><title>from the page</title><p>body</p>"
    _, titled = await rendered(chromium_app, page, header_html=header, title="Invoice 42")
    assert "Document: Invoice 42" in pdf_text(titled)
    assert "from the page" not in pdf_text(titled)
    _, untitled = await rendered(chromium_app, page, header_html=header)
    assert "Document: from the page" in pdf_text(untitled), "without a title, the page's own"


async def test_pages_have_a_documents_margins_unless_the_job_says_otherwise(
    chromium_app: RunningApp,
) -> None:
    import pypdfium2

    black = "<style>html, body {margin: 0; background: #000}</style><p>x</p>"

    def corner_and_middle(data: bytes) -> tuple[int, int]:
        """The grey levels of the page's top-left corner and of its middle, at 72 dpi."""
        bitmap = pypdfium2.PdfDocument(data)[0].render(scale=1).to_pil().convert("L")
        width, height = bitmap.size
        return bitmap.getpixel((3, 3)), bitmap.getpixel((width // 2, height // 2))

    _, default = await rendered(chromium_app, black)
    assert corner_and_middle(default) == (255, 0), "10 mm of white paper around a black page"
    _, edge = await rendered(chromium_app, black, margin="0")
    assert corner_and_middle(edge) == (0, 0), "margin 0 prints to the edge"
