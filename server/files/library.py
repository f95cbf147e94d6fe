"""Stored templates: named, immutable versions that jobs name as `template_id` (`name` for the
latest, `name@version` for one), as rows and as the API shows them."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

import asyncpg

from server.sql import query

#: A template reference: its name, and its version (None: the latest).
Ref = tuple[str, int | None]


@dataclasses.dataclass(frozen=True, slots=True)
class StoredTemplate:
    name: str
    version: int
    html: str
    options: dict[str, Any]
    sample_data: dict[str, Any]
    assets: dict[str, str]
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> StoredTemplate:
        return cls(
            name=row["name"],
            version=row["version"],
            html=row["html"],
            options=row["options"],
            sample_data=row["sample_data"],
            assets=row["assets"],
            created_at=row["created_at"],
        )

    def public(self) -> dict[str, Any]:
        """The version as the API shows it."""
        return {
            "name": self.name,
            "version": self.version,
            "template_id": f"{self.name}@{self.version}",
            "html": self.html,
            "options": self.options,
            "sample_data": self.sample_data,
            "assets": self.assets,
            "created_at": self.created_at.isoformat(),
            "links": {
                "self": f"/v1/templates/{self.name}@{self.version}",
                "latest": f"/v1/templates/{self.name}",
                "preview": f"/v1/templates/{self.name}/preview",
            },
        }


async def find(
    conn: asyncpg.Pool | asyncpg.Connection, tenant: str, refs: Iterable[Ref]
) -> dict[Ref, StoredTemplate]:
    """The stored versions these references name, in one query; unknown ones are missing."""
    wanted = sorted(set(refs), key=lambda ref: (ref[0], ref[1] or 0))
    if not wanted:
        return {}
    rows = await conn.fetch(
        query("template_find"), tenant, [name for name, _ in wanted], [v for _, v in wanted]
    )
    return {
        (row["wanted_name"], row["wanted_version"]): StoredTemplate.from_row(row) for row in rows
    }
