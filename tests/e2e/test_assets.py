"""Assets on real Chromium: a page's relative URLs reach the job's files (and only them) from
storage, through the gate and never the network; a logo drawn into many PDFs is read from
storage once; a brand font is embedded; a reused render slot hands nothing of one job's files
to the next; a multipart job prints with its files."""

from __future__ import annotations

import json
from collections.abc import Callable
from io import BytesIO
from typing import Any

import pytest
from aiohttp import FormData
from pypdf import PdfReader

from server.keys import ASSET_CACHE
from server.render.egress import DOCUMENT_URL
from tests.assetfiles import FONT_FAMILY, font, png
from tests.conftest import RunningApp
from tests.e2e.test_render import render

pytestmark = pytest.mark.browser

RED = (220, 20, 20)
BLUE = (20, 20, 220)


@pytest.fixture
async def chromium_app(start_app: Callable[..., Any]) -> RunningApp:
    # One slot: consecutive jobs print in the same reused page.
    app: RunningApp = await start_app(render_slots=1)
    return app


async def upload(app: RunningApp, data: bytes, kind: str) -> str:
    async with app.http.post(
        app.url("/v1/assets"), data=data, headers={"Content-Type": kind}
    ) as resp:
        assert resp.status in (200, 201), await resp.text()
        asset_id: str = (await resp.json())["id"]
        return asset_id


def images(pdf: bytes) -> list[tuple[int, int, tuple[int, ...]]]:
    """(width, height, first pixel) of every image drawn on the PDF's pages."""
    found = []
    for page in PdfReader(BytesIO(pdf)).pages:
        for image in page.images:
            picture = image.image
            assert picture is not None
            found.append(
                (picture.width, picture.height, tuple(picture.convert("RGB").getpixel((0, 0))))
            )  # type: ignore[arg-type]
    return found


def fonts(pdf: bytes) -> set[str]:
    """The names of the fonts embedded in the PDF's pages."""
    names = set()
    for page in PdfReader(BytesIO(pdf)).pages:
        for ref in page["/Resources"].get("/Font", {}).values():
            described = ref.get_object().get("/FontDescriptor")
            if described is not None:
                names.add(str(described.get_object()["/FontName"]))
    return names


async def test_a_logo_uploaded_once_is_in_every_pdf_and_read_from_storage_once(
    chromium_app: RunningApp,
) -> None:
    logo = await upload(chromium_app, png(RED, 40, 20), "image/png")
    css = await upload(chromium_app, b"img { width: 4cm } p { margin: 0 }", "text/css")
    page = (
        '<link rel="stylesheet" href="css/site.css"><img src="img/logo.png">'
        '<img src="./img/logo.png?v=2"><img src="img/missing.png"><p>Invoice {{ n }}</p>'
    )
    reads = chromium_app.app[ASSET_CACHE].reads
    for n in range(3):
        job, pdf = await render(
            chromium_app,
            {
                "template": page,
                "data": {"n": n},
                "assets": {"img/logo.png": logo, "css/site.css": css},
            },
        )
        assert pdf is not None, job
        drawn = images(pdf)
        assert drawn.count((40, 20, RED)) == 2, drawn
        assert job["warnings"] == [
            "failed image: no asset is mapped to img/missing.png; name one in the job's assets"
            f" ({DOCUMENT_URL}img/missing.png)"
        ]
    assert chromium_app.app[ASSET_CACHE].reads == reads + 2, "each asset read once"


async def test_a_font_asset_is_used_by_css_font_face(chromium_app: RunningApp) -> None:
    brand = await upload(chromium_app, font(), "font/ttf")
    page = (
        "<style>@font-face { font-family: Brand; src: url(fonts/brand.ttf) }"
        " h1 { font-family: Brand }</style><h1>Pressroom</h1>"
    )
    job, pdf = await render(chromium_app, {"template": page, "assets": {"fonts/brand.ttf": brand}})
    assert pdf is not None, job
    assert any(name.endswith(f"+{FONT_FAMILY}-Regular") for name in fonts(pdf)), fonts(pdf)
    assert job["warnings"] == []


async def test_a_reused_slot_gives_no_job_the_files_of_the_job_before(
    chromium_app: RunningApp,
) -> None:
    red = await upload(chromium_app, png(RED, 30, 30), "image/png")
    blue = await upload(chromium_app, png(BLUE, 30, 30), "image/png")
    page = '<img src="logo.png">'
    _, first = await render(chromium_app, {"template": page, "assets": {"logo.png": red}})
    assert first is not None and images(first) == [(30, 30, RED)]
    # The same path in the next job's map is that job's file, not the one the page had.
    _, second = await render(chromium_app, {"template": page, "assets": {"logo.png": blue}})
    assert second is not None and images(second) == [(30, 30, BLUE)]
    # A job without assets reaches no job's files, not even by the reserved origin's URL.
    absolute = f'<img src="{DOCUMENT_URL}logo.png"><img src="logo.png"><p>plain</p>'
    job, plain = await render(chromium_app, {"template": absolute})
    assert plain is not None
    assert (30, 30, BLUE) not in images(plain) and (30, 30, RED) not in images(plain)
    assert job["warnings"] == [
        "failed image: no asset is mapped to logo.png; name one in the job's assets"
        f" ({DOCUMENT_URL}logo.png)"
    ]


async def test_a_relative_url_no_asset_answers_is_a_warning_or_fails_when_asked(
    chromium_app: RunningApp,
) -> None:
    logo = await upload(chromium_app, png(RED, 40, 20), "image/png")
    page = (
        '<style>h1 { background: url("img/paper.png") }</style><h1>Invoice</h1>'
        '<img src="img/logo.png"><a href="terms.html">terms</a><a href="#top">top</a>'
    )

    def missing(path: str, kind: str = "image") -> str:
        why = f"no asset is mapped to {path}; name one in the job's assets"
        return f"failed {kind}: {why} ({DOCUMENT_URL}{path})"

    # Without assets the page is not written into about:blank, where it would load nothing
    # and say nothing, but served where its relative URLs are asked for and found missing.
    for assets, expected in [
        ({}, [missing("img/paper.png"), missing("img/logo.png")]),
        ({"img/logo.png": logo}, [missing("img/paper.png")]),
    ]:
        job, pdf = await render(chromium_app, {"template": page, "assets": assets})
        assert pdf is not None, job
        assert sorted(job["warnings"]) == sorted(expected), job["warnings"]
        job, pdf = await render(
            chromium_app,
            {"template": page, "assets": assets, "options": {"fail_on": {"resource_errors": True}}},
        )
        assert pdf is None and job["attempts"] == 1
        assert job["error"].startswith("a resource of the page failed: failed image: no asset")
    # A page that names nothing relative prints as before, and says nothing.
    job, pdf = await render(chromium_app, {"template": '<a href="#x">x</a><p id="x">plain</p>'})
    assert pdf is not None and job["warnings"] == []


async def test_a_multipart_job_prints_with_its_files(chromium_app: RunningApp) -> None:
    form = FormData()
    form.add_field(
        "files", b'<img src="logo.png" style="width: 3cm"><h1>{{ who }}</h1>', filename="index.html"
    )
    form.add_field("files", png(BLUE, 24, 12), filename="logo.png", content_type="image/png")
    form.add_field("job", json.dumps({"data": {"who": "Ana"}}), content_type="application/json")
    async with chromium_app.http.post(chromium_app.url("/v1/jobs"), data=form) as resp:
        assert resp.status == 202, await resp.text()
        submitted = await resp.json()
    from tests.sse import collect

    messages = await collect(
        chromium_app.http, chromium_app.url(submitted["links"]["events"]), timeout_s=60
    )
    done = messages[-1].json["job"]
    assert done["status"] == "done", done
    async with chromium_app.http.get(done["url"]) as resp:
        pdf = await resp.read()
    assert images(pdf) == [(24, 12, BLUE)]
    assert "Ana" in PdfReader(BytesIO(pdf)).pages[0].extract_text()
