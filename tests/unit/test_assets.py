"""Assets without the app: which types are accepted, which paths a page may name, and the cache
that reads each asset from storage once (a real local folder underneath)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server.errors import PermanentError
from server.files import assets
from server.files.assets import AssetCache
from server.files.storage import LocalStorage
from server.schemas.assets import ASSET_PATH_PATTERN, MAX_ASSET_PATH_CHARS, asset_path_problem


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("image/png", "image/png"),
        ("IMAGE/PNG; charset=binary", "image/png"),
        ("image/jpg", "image/jpeg"),
        ("application/javascript", "text/javascript"),
        ("text/xml", "application/xml"),
        ("application/font-woff", "font/woff"),
        ("text/html", None),
        ("application/octet-stream", None),
        ("", None),
    ],
)
def test_content_types_are_accepted_under_their_current_names(given: str, stored: str) -> None:
    assert assets.content_type(given) == stored


def test_a_file_name_stands_for_the_type_of_its_extension() -> None:
    assert assets.type_of_name("fonts/Brand.WOFF2") == "font/woff2"
    assert assets.type_of_name("logo.jpeg") == "image/jpeg"
    assert assets.type_of_name("README") is None
    assert assets.type_of_name("tool.exe") is None


PATHS_OK = ["img/logo.png", "logo.png", "a b/ü.png", ".well-known/x", "...", "..x/y", "x.."]
PATHS_REFUSED = ["../a", "a/../b", "/a", "http://x/a", "c:x", "a//b", "./a", "a/.", "a/", "",
                 "a\\b", "a%20b", "a?b", "a#b", "a\x00b", "a\nb", "x" * 256]  # fmt: skip


def test_the_path_rule_and_its_json_schema_pattern_agree() -> None:
    pattern = re.compile(f"^{ASSET_PATH_PATTERN}$")
    for path in PATHS_OK:
        assert asset_path_problem(path) is None, path
        assert pattern.match(path), path
    for path in PATHS_REFUSED:
        assert asset_path_problem(path) is not None, path
        assert len(path) > MAX_ASSET_PATH_CHARS or not pattern.match(path), path


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[LocalStorage]:
    local = LocalStorage(tmp_path)
    yield local
    local.close()


async def put(storage: LocalStorage, data: bytes) -> str:
    upload = await assets.Upload.of(data, "text/css")
    await storage.put(
        assets.storage_key("acme", upload.id), data, filename="x", content_type="text/css"
    )
    return upload.id


async def test_concurrent_renders_share_one_read_and_later_ones_none(
    storage: LocalStorage,
) -> None:
    css = await put(storage, b"p { color: red }")
    cache = AssetCache(storage, max_bytes=1000)
    got = await asyncio.gather(*(cache.get("acme", css) for _ in range(5)))
    assert got == [b"p { color: red }"] * 5
    assert await cache.files("acme", {"site.css": {"id": css, "content_type": "text/css"}}) == {
        "site.css": ("text/css", b"p { color: red }")
    }
    assert cache.reads == 1


async def test_the_cache_keeps_the_most_recently_used_within_its_bound(
    storage: LocalStorage,
) -> None:
    first, second, third = [await put(storage, bytes([n]) * 400) for n in (1, 2, 3)]
    cache = AssetCache(storage, max_bytes=1000)
    await cache.get("acme", first)
    await cache.get("acme", second)
    await cache.get("acme", first)  # used last: kept when the third comes in
    await cache.get("acme", third)
    assert cache.size == 800 and cache.reads == 3
    await cache.get("acme", first)
    assert cache.reads == 3
    await cache.get("acme", second)
    assert cache.reads == 4, "the least recently used went first"
    big = await put(storage, b"x" * 1001)
    await cache.get("acme", big)
    await cache.get("acme", big)
    assert cache.reads == 6 and cache.size <= 1000, "an asset over the bound is never kept"


async def test_an_asset_gone_from_storage_fails_the_render_naming_its_path(
    storage: LocalStorage,
) -> None:
    cache = AssetCache(storage, max_bytes=1000)
    missing = "sha256:" + "0" * 64
    with pytest.raises(PermanentError, match=rf"the asset img/logo.png \({missing}\) is no"):
        await cache.files("acme", {"img/logo.png": {"id": missing, "content_type": "image/png"}})
    css = await put(storage, b"p {}")
    with pytest.raises(FileNotFoundError):
        await cache.get("globex", css)  # where the bytes live is per tenant
