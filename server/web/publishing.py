"""Publishing a template's draft: each of its samples rendered with it and with the published
version (as their previews render them), compared page by page (server/render/diff.py), and
what refuses it: a sample that fails, a page count that changes, a page whose pixels change
beyond the threshold. The diff is kept, refused or not; the route decides (templates_api)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from server.files.library import StoredTemplate
from server.problems import Problem
from server.render import diff

#: Changed pages whose image a diff keeps (the first ones, in sample and page order), so that a
#: diff row stays bounded (each is a small 50 dpi PNG).
MAX_IMAGES = 40

#: Renders a version with data, as its preview does; a Problem when it cannot.
Render = Callable[[StoredTemplate, dict[str, Any]], Awaitable[bytes]]


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    """What publishing found: the diff (as GET …/diff shows it, without its images), the images
    of changed pages (`sample/page` → base64 PNG) and what refuses it."""

    diff: list[dict[str, Any]]
    images: dict[str, str]
    refused: list[str]


def image_link(stored: StoredTemplate, sample: str, page: int) -> str:
    return f"/v1/templates/{stored.template_id}/diff/{sample}/{page}"


async def check(
    stored: StoredTemplate, published: StoredTemplate | None, render: Render, threshold: float
) -> Checked:
    """Render every sample of `stored` and of `published` (None: the template's first version,
    whose samples need only render) and compare them."""
    samples: list[dict[str, Any]] = []
    images: dict[str, str] = {}
    for name, data in stored.samples.items():
        shown: dict[str, Any] = {
            "sample": name,
            "pages_before": None,
            "pages_after": None,
            "error": None,
            "pages": [],
        }
        samples.append(shown)
        try:
            after = await render(stored, data)
        except Problem as exc:
            if exc.status != 422:
                raise  # no renderer, or a busy one: publishing cannot run now
            shown["error"] = exc.detail
            continue
        if published is None:
            shown["pages_after"] = (await asyncio.to_thread(diff.pages, after, 0))[0]
            continue
        try:
            before = await render(published, data)
        except Problem as exc:
            if exc.status != 422:
                raise
            # The published version fails on it: nothing to compare, nothing this one breaks.
            shown["pages_after"] = (await asyncio.to_thread(diff.pages, after, 0))[0]
            continue
        compared = await asyncio.to_thread(diff.compare, before, after)
        shown["pages_before"], shown["pages_after"] = compared.pages_before, compared.pages_after
        for page in compared.changed:
            entry = page.public()
            entry["image"] = None
            if len(images) < MAX_IMAGES:
                images[f"{name}/{page.page}"] = base64.b64encode(
                    compared.images[page.page]
                ).decode()
                entry["image"] = image_link(stored, name, page.page)
            shown["pages"].append(entry)
    return Checked(samples, images, refusals(samples, threshold))


def refusals(samples: list[dict[str, Any]], threshold: float) -> list[str]:
    """What refuses publishing, read from its diff (when it runs, and for GET …/diff)."""
    found = []
    for shown in samples:
        name = shown["sample"]
        if shown["error"] is not None:
            found.append(f"sample {name!r} does not render: {shown['error']}")
            continue
        before, after = shown["pages_before"], shown["pages_after"]
        if before is not None and before != after:
            found.append(f"sample {name!r}: the page count changes from {before} to {after}")
        over = [p for p in shown["pages"] if p["changed_pixels"] > threshold]
        if over:
            worst = max(over, key=lambda p: p["changed_pixels"])
            found.append(
                f"sample {name!r}: {len(over)} page(s) change more than {threshold:.2%} of "
                f"their pixels (page {worst['page']}: {worst['changed_pixels']:.2%})"
            )
    return found
