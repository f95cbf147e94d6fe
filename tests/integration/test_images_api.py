"""Image outputs and thumbnails through the API: what the job shows, what its links serve, and
what is refused. The fake renderer stands in for Chromium (tests/e2e/test_images.py has the
real screenshots); the thumbnails are real, rasterised by PDFium from the fake PDF."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image
from yarl import URL

from server.keys import POOL, STORAGE
from tests.conftest import RunningApp
from tests.sse import collect

HTML = "<h1>Hi {{name}}</h1>"


async def done_job(api: RunningApp, options: dict[str, Any]) -> dict[str, Any]:
    body = {"template": HTML, "data": {"name": "Ana"}, "options": options}
    async with api.http.post(api.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
    messages = await collect(api.http, api.url(job["links"]["events"]))
    done: dict[str, Any] = messages[-1].json["job"]
    assert done["status"] == "done", done["error"]
    return done


async def fetch(api: RunningApp, url: str) -> tuple[int, str, bytes]:
    async with api.http.get(api.url(url) if url.startswith("/") else url) as resp:
        return resp.status, resp.content_type, await resp.read()


async def test_bad_combinations_are_refused_naming_the_field_and_nothing_is_stored(
    api: RunningApp,
) -> None:
    cases = [
        ({"screenshot": {"full_page": True}}, "options.screenshot"),
        ({"output": "png", "screenshot": {"quality": 80}}, "options.screenshot"),
        ({"output": "jpeg", "screenshot": {"omit_background": True}}, "options.screenshot"),
        ({"output": "png", "margin": "1cm"}, "options.margin"),
        ({"output": "webp", "thumbnail": {"width": 100}}, "options.thumbnail"),
        ({"output": "png", "screenshot": {"height": 8}}, "options.screenshot.height"),
        ({"thumbnail": {"width": 15}}, "options.thumbnail.width"),
        ({"output": "bmp"}, "options.output"),
    ]
    for options, field in cases:
        body = {"template": HTML, "options": options}
        async with api.http.post(api.url("/v1/jobs"), json=body) as resp:
            problem = await resp.json()
            assert resp.status == 422 and resp.content_type == "application/problem+json"
        assert [error["field"] for error in problem["errors"]] == [field], (options, problem)
    assert await api.app[POOL].fetchval("SELECT count(*) FROM jobs") == 0
    root = api.app[STORAGE].root  # type: ignore[attr-defined]
    assert not root.exists() or not any(root.rglob("*.*"))


async def test_an_image_job_serves_its_image_with_its_type_and_no_pages(api: RunningApp) -> None:
    for output, content_type, extension in [
        ("png", "image/png", "png"),
        ("jpeg", "image/jpeg", "jpg"),
        ("webp", "image/webp", "webp"),
    ]:
        job = await done_job(api, {"output": output})
        assert job["pages"] is None and "thumbnail" not in job["links"]
        assert job.get("thumbnail_url") is None
        assert URL(job["url"]).path == f"/v1/jobs/{job['id']}/pdf"
        status, shown_type, data = await fetch(api, job["url"])
        assert (status, shown_type) == (200, content_type)
        assert job["bytes"] == len(data) and Image.open(io.BytesIO(data)).format == output.upper()
        async with api.http.get(api.url(job["links"]["pdf"])) as resp:  # as the tenant
            assert resp.content_type == content_type
            disposition = f'inline; filename="{job["id"]}.{extension}"'
            assert resp.headers["Content-Disposition"] == disposition
        status, _, _ = await fetch(api, f"/v1/jobs/{job['id']}/thumbnail")
        assert status == 404


async def test_a_thumbnail_is_the_first_page_n_pixels_wide_behind_its_own_signed_url(
    api: RunningApp,
) -> None:
    job = await done_job(api, {"thumbnail": {"width": 137}})
    assert job["links"]["thumbnail"] == f"/v1/jobs/{job['id']}/thumbnail"
    status, content_type, data = await fetch(api, job["thumbnail_url"])
    assert (status, content_type) == (200, "image/png")
    thumbnail = Image.open(io.BytesIO(data))
    # The fake PDF's page is US Letter, 612 x 792 points.
    assert thumbnail.format == "PNG" and thumbnail.width == 137
    assert abs(thumbnail.height - 137 * 792 / 612) < 1
    darkest, lightest = thumbnail.convert("L").getextrema()
    assert darkest < 128 and lightest == 255, "the text, small and grey, on white paper"
    status, content_type, pdf = await fetch(api, job["url"])
    assert (status, content_type) == (200, "application/pdf") and pdf.startswith(b"%PDF-")
    # A link opens the one file it was signed for.
    borrowed = f"{URL(job['url']).path}?{URL(job['thumbnail_url']).query_string}"
    status, _, _ = await fetch(api, borrowed)
    assert status == 403
    status, _, same = await fetch(api, job["links"]["thumbnail"])
    assert status == 200 and same == data
    async with api.http.get(api.url("/v1/jobs")) as resp:
        [listed] = (await resp.json())["items"]
    assert URL(listed["thumbnail_url"]).path == URL(job["thumbnail_url"]).path


async def test_a_preview_of_an_image_output_is_the_image(api: RunningApp) -> None:
    body = {"html": HTML, "data": {"name": "Bo"}, "options": {"output": "jpeg"}}
    async with api.http.post(api.url("/v1/templates/preview"), json=body) as resp:
        assert resp.status == 200 and resp.content_type == "image/jpeg"
        assert resp.headers["Content-Disposition"] == 'inline; filename="preview.jpg"'
        assert "Pressroom-Pages" not in resp.headers
        assert (await resp.read()).startswith(b"\xff\xd8\xff")
