"""How a job, a batch and an event look on the wire, to every route, stream and transport: the
job with its links and, once done, signed URLs for its files (server/delivery/downloads.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from server.delivery import downloads
from server.events import JobEvent
from server.keys import SETTINGS, STORAGE
from server.web import auth


async def present(request: web.Request, job: dict[str, Any], tenant: str) -> dict[str, Any]:
    """The job as clients see it: links, and signed download URLs once it is done."""
    return await present_job(request.app, job, tenant, auth.key_id_of(request))


async def present_job(
    app: web.Application, job: dict[str, Any], tenant: str, minted_by: int
) -> dict[str, Any]:
    """`present` without a request (Socket.IO); its URLs name the key `minted_by`."""
    return await downloads.present(
        job, tenant, storage=app[STORAGE], settings=app[SETTINGS], minted_by=minted_by
    )


async def event_wire(app: web.Application, event: JobEvent, minted_by: int) -> dict[str, Any]:
    """What every transport sends for an event: a job event carries the job as presented
    (links, signed URL); a batch event (batch.progress, batch.done) carries the batch, and
    template.published the version."""
    wire = event.wire()
    if event.type.startswith("template."):  # template.published: the version, as it is
        wire["template"] = wire.pop("job")
    elif event.type.startswith("batch."):
        wire["batch"] = await downloads.present_batch(
            wire.pop("job"),
            event.tenant,
            storage=app[STORAGE],
            settings=app[SETTINGS],
            minted_by=minted_by,
        )
    else:
        wire["job"] = await present_job(app, event.job, event.tenant, minted_by)
    return wire
