"""A job's story for the dashboard's job page (/jobs/{id}): GET /v1/jobs/{id}/story, and delivering
one of its webhooks again."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from server.files import assets as stored_assets
from server.keys import POOL
from server.problems import Problem, not_found
from server.queue.jobs import JobState
from server.render import sources
from server.schemas.story import AttemptPhases
from server.sql import query
from server.web import present
from server.web.common import json_response, parse_job_id, tenant_of

routes = web.RouteTableDef()

#: The job page, a document of its own beside the dashboard's index.html.
JOB_PAGE = Path(__file__).resolve().parents[2] / "static" / "job.html"
#: What the job does from an event on, by the status the event left it in.
_PHASE_OF = {JobState.QUEUED: "queued", JobState.RUNNING: "running"}


@routes.get("/jobs/{job_id}")
async def page(request: web.Request) -> web.FileResponse:
    """The job page for any id: it reads the story with the dashboard's key, which only the
    browser holds; an unknown id is told there."""
    return web.FileResponse(JOB_PAGE, headers={"Cache-Control": "no-cache"})


@routes.get("/v1/jobs/{job_id}/story")
async def story(request: web.Request) -> web.Response:
    job_id, tenant = parse_job_id(request), tenant_of(request)
    row = await request.app[POOL].fetchrow(query("job_story"), job_id, tenant)
    if row is None:
        raise not_found()
    now = dt.datetime.now(dt.UTC)
    final = JobState(row["status"]).final
    timeline = timeline_of(row["events"], now=now, final=final)
    attempts = [_attempt(a, now) for a in row["attempts"]]
    if row["running"] is not None:
        attempts.append(_attempt({**row["running"], "outcome": "running"}, now))
    deliveries = [_delivery(job_id, d) for d in row["deliveries"]]
    batches = [{**b, "link": f"/v1/batches/{b['id']}"} for b in row["batches"]]
    body = {
        "job": await present.present(request, row["job"], tenant),
        "source": row["source"],
        "template": (
            f"{row['template_name']}@{row['template_version']}" if row["template_name"] else None
        ),
        "files": files_of(row["source"], row["files"], row["assets"] or {}),
        "data": json.loads(row["data"]),
        "attempts": attempts,
        "timeline": timeline,
        "phases": phase_totals(timeline),
        "deliveries": deliveries,
        "batches": batches,
        "live": not final,
    }
    return json_response(body, headers={"Cache-Control": "private, no-cache"})


def files_of(source: str, text: str | None, assets: dict[str, Any]) -> list[dict[str, Any]]:
    """The files an office, docx or pdfs job takes (its `template` column names them: the one
    file's path or asset id, or the pdfs' JSON list), each with its asset id."""
    if text is None:
        return []
    names = [part["path"] for part in json.loads(text)] if source == sources.PDFS else [text]
    files = []
    for name in names:
        mapped = assets.get(name)  # {"id", "type"}: the asset a path of the job maps to
        asset_id = mapped["id"] if mapped else name if stored_assets.is_id(name) else None
        files.append({"name": name, "asset_id": asset_id})
    return files


@routes.post("/v1/jobs/{job_id}/webhooks/{delivery_id}/redeliver")
async def redeliver(request: web.Request) -> web.Response:
    """Put one of the job's deliveries back in the outbox, due now; 409 while it is pending."""
    job_id, tenant = parse_job_id(request), tenant_of(request)
    try:
        delivery_id = uuid.UUID(request.match_info["delivery_id"])
    except ValueError:
        raise not_found("webhook delivery") from None
    row = await request.app[POOL].fetchrow(query("redeliver_webhook"), job_id, delivery_id, tenant)
    if row is None:
        raise not_found("webhook delivery")
    if row["delivery"] is None:
        raise Problem(
            409,
            "Delivery pending",
            "This delivery is already due or in flight; wait for its attempt to end, then "
            "deliver it again if you still need to.",
            kind="delivery-pending",
        )
    return json_response(_delivery(job_id, row["delivery"]), status=202)


def timeline_of(
    events: list[dict[str, Any]], *, now: dt.datetime, final: bool
) -> list[dict[str, Any]]:
    """The events, each with the phase it began (from its status) and how long that lasted:
    until the next event, or until now for a job still in flight."""
    shown = []
    for i, event in enumerate(events):
        at = dt.datetime.fromisoformat(event["at"])
        phase = _PHASE_OF.get(JobState(event["status"]))
        if i + 1 < len(events):
            seconds: float | None = (
                dt.datetime.fromisoformat(events[i + 1]["at"]) - at
            ).total_seconds()
        elif phase is not None and not final:
            seconds = (now - at).total_seconds()
        else:
            seconds = None
        shown.append({**event, "phase": phase, "seconds": seconds if phase else None})
    return shown


def phase_totals(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Seconds spent queued and running, over the whole timeline."""
    totals = dict.fromkeys(_PHASE_OF.values(), 0.0)
    for event in timeline:
        if event["phase"] is not None and event["seconds"] is not None:
            totals[event["phase"]] += event["seconds"]
    return [{"phase": phase, "seconds": round(seconds, 3)} for phase, seconds in totals.items()]


def _delivery(job_id: uuid.UUID, delivery: dict[str, Any]) -> dict[str, Any]:
    return {**delivery, "redeliver": f"/v1/jobs/{job_id}/webhooks/{delivery['id']}/redeliver"}


def _attempt(attempt: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    started = dt.datetime.fromisoformat(attempt["started_at"])
    ended = attempt.get("ended_at")
    until = dt.datetime.fromisoformat(ended) if ended else now
    phases = attempt.get("phases")
    return {
        "error": None,
        "warnings": [],
        **attempt,
        "ended_at": ended,
        "seconds": round((until - started).total_seconds(), 3),
        "phases": {name: phases.get(name) for name in AttemptPhases.model_fields}
        if phases
        else None,
    }
