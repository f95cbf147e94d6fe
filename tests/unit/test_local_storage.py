"""The local folder storage: what is synced to disk before a put returns, and what a reader sees."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.errors import StorageError
from server.files.storage import LocalStorage
from tests.pdfs import minimal_pdf, small_image


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """The path of every file descriptor fsynced, in order."""
    paths: list[Path] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        paths.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield paths


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads fd paths from /proc")
async def test_a_put_syncs_the_file_and_every_folder_it_created_in_its_parent(
    tmp_path: Path, synced: list[Path]
) -> None:
    storage = LocalStorage(tmp_path / "files")
    try:
        await storage.put("acme/job-1/1.pdf", minimal_pdf(), filename="job-1.pdf")
        root = (tmp_path / "files").resolve()
        job = root / "acme" / "job-1"
        # Each new folder's name in its parent, outermost first; the file's bytes (under its
        # temporary name); then the file's final name in its folder.
        assert synced[:3] == [root.parent, root, root / "acme"]
        assert synced[3].parent == job and synced[3].name.startswith(".1.pdf.")
        assert synced[4:] == [job]
        assert (job / "1.pdf").read_bytes() == minimal_pdf()

        # A second attempt of the same job: its folder exists, so only the file and its folder.
        synced.clear()
        await storage.put("acme/job-1/2.pdf", minimal_pdf(), filename="job-1.pdf")
        assert synced[0].parent == job and synced[1:] == [job]
        assert sorted(p.name for p in job.iterdir()) == ["1.pdf", "2.pdf"]
    finally:
        storage.close()


async def test_a_rendered_file_is_stored_only_whole_and_of_the_type_it_claims(
    tmp_path: Path,
) -> None:
    storage = LocalStorage(tmp_path)
    try:
        png = small_image("png")
        await storage.put("t/j/1.png", png, filename="j.png", content_type="image/png")
        assert await storage.get("t/j/1.png") == png
        refused = [
            ("image/png", minimal_pdf()),
            ("image/jpeg", png),
            ("image/webp", small_image("jpeg")),
            ("application/pdf", minimal_pdf()[:-8]),  # cut short: no %%EOF
        ]
        for content_type, data in refused:
            with pytest.raises(StorageError, match="not a complete"):
                await storage.put("t/j/2.x", data, filename="x", content_type=content_type)
        assert not (tmp_path / "t" / "j" / "2.x").exists()
        # Bytes of a type no render makes are the uploader's own: stored as they came.
        await storage.put("t/a/font", b"wOF2", filename="brand.woff2", content_type="font/woff2")
    finally:
        storage.close()
