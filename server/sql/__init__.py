"""Named SQL blocks: `-- name --` starts a block in queries.sql; grep finds every query."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_BLOCK = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, str]:
    """Split a file of `-- name --` blocks into {name: sql}."""
    parts = _BLOCK.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"query {name!r} is defined twice")
        blocks[name] = body.strip()
    return blocks


@cache
def queries() -> dict[str, str]:
    return parse_blocks(resources.files(__package__).joinpath("queries.sql").read_text())


def query(name: str) -> str:
    """The SQL of one named block; KeyError names the missing block."""
    return queries()[name]


def migrations() -> list[tuple[str, str]]:
    """(version, sql) for every migration file, in order."""
    folder = resources.files(__package__).joinpath("migrations")
    files = sorted(
        (entry.name, entry.read_text()) for entry in folder.iterdir() if entry.name.endswith(".sql")
    )
    return [(name.removesuffix(".sql"), text) for name, text in files]
