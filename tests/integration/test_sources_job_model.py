"""Office and pdfs jobs are jobs like any other: an Idempotency-Key gives the same job back for
the same request (a multipart body's files included) and refuses another request under it,
as for an HTML job; a webhook_url gets the job's signed job.done once its PDF is stored, once,
however often the request is replayed. Real LibreOffice converts the Word file."""

from __future__ import annotations

import io
from typing import Any

import pytest
from aiohttp import FormData
from pypdf import PdfReader

from server.keys import POOL
from tests.conftest import RunningApp
from tests.e2e.test_office import DOCX, upload, word
from tests.integration.test_webhooks import (  # noqa: F401 (fixtures)
    SECRET,
    Receiver,
    StartHooked,
    receiver,
    start_hooked,
    verify,
)
from tests.pdfmaking import text_pdf
from tests.pdfs import FakeRenderer

pytestmark = pytest.mark.slow  # the app starts its LibreOffice (about 3 s)


async def post(app: RunningApp, key: str, body: dict[str, Any] | FormData) -> tuple[int, Any, Any]:
    """POST /v1/jobs with an Idempotency-Key: the status, the body and the headers."""
    sent: dict[str, Any] = {"json": body} if isinstance(body, dict) else {"data": body}
    async with app.http.post(app.url("/v1/jobs"), headers={"Idempotency-Key": key}, **sent) as resp:
        return resp.status, await resp.json(), resp.headers


def office_form(data: bytes, webhook_url: str) -> FormData:
    """A multipart body: the Word file as the part named office, the job's fields beside it."""
    form = FormData()
    form.add_field("office", data, filename="report.docx", content_type=DOCX)
    form.add_field("job", f'{{"webhook_url": "{webhook_url}"}}', content_type="application/json")
    return form


async def delivered_done(endpoint: Receiver, job_id: str) -> dict[str, Any]:
    """The next webhook, checked as a receiver checks it (its signature): this job's job.done."""
    delivery = await endpoint.next()
    payload = verify(SECRET, delivery.headers, delivery.body)
    assert payload["type"] == "job.done", payload
    job: dict[str, Any] = payload["data"]["job"]
    assert job["id"] == job_id and job["status"] == "done", job
    return job


async def deliveries(app: RunningApp, job_id: str) -> list[str]:
    rows = await app.app[POOL].fetch(
        "SELECT type FROM webhook_deliveries WHERE job_id = $1::uuid ORDER BY created_at", job_id
    )
    return [row["type"] for row in rows]


async def pdf_of(app: RunningApp, job: dict[str, Any]) -> PdfReader:
    async with app.http.get(job["url"]) as resp:
        assert resp.status == 200 and resp.content_type == "application/pdf"
        return PdfReader(io.BytesIO(await resp.read()))


async def test_an_office_job_is_idempotent_by_key_and_posts_its_signed_job_done(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
) -> None:
    hooked = await start_hooked(FakeRenderer())
    app = hooked.app
    report = word(2, title="Quarterly report")
    status, first, headers = await post(app, "report-q3", office_form(report, receiver.url))
    assert status == 202 and "Idempotent-Replayed" not in headers, first

    # The same request again, its file sent again: the same job.
    status, again, headers = await post(app, "report-q3", office_form(report, receiver.url))
    assert status == 200 and headers["Idempotent-Replayed"] == "true", again
    assert again["id"] == first["id"] and headers["Location"] == f"/v1/jobs/{first['id']}"
    # Another file under the same key is another request.
    other = word(1, title="Another report")
    status, problem, _ = await post(app, "report-q3", office_form(other, receiver.url))
    assert status == 422 and problem["type"].endswith("/idempotency-key-reused"), problem

    done = await delivered_done(receiver, first["id"])
    assert done["pages"] == 2 and done["provenance"]["engine"] == "LibreOffice", done
    assert "Text of page 2." in (await pdf_of(app, done)).pages[1].extract_text()
    status, replayed, _ = await post(app, "report-q3", office_form(report, receiver.url))
    assert status == 200 and replayed["id"] == first["id"] and replayed["status"] == "done"
    assert await deliveries(app, first["id"]) == ["job.done"], "one delivery, not one a replay"
    jobs = await app.app[POOL].fetchval("SELECT count(*) FROM jobs")
    assert jobs == 1


async def test_a_pdfs_job_is_idempotent_by_key_and_posts_its_signed_job_done(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
) -> None:
    hooked = await start_hooked(FakeRenderer())
    app = hooked.app
    terms = await upload(app, text_pdf(["Terms 1", "Terms 2"]), "application/pdf")
    annex = await upload(app, text_pdf(["Annex"]), "application/pdf")
    body = {
        "pdfs": [terms, annex],
        "options": {"metadata": {"Department": "Sales"}, "compress": {}},
        "webhook_url": receiver.url,
    }
    status, first, _ = await post(app, "contract-42", body)
    assert status == 202, first
    status, again, headers = await post(app, "contract-42", body)
    assert status == 200 and headers["Idempotent-Replayed"] == "true"
    assert again["id"] == first["id"]
    # The same files in another order are another request.
    status, problem, _ = await post(app, "contract-42", {**body, "pdfs": [annex, terms]})
    assert status == 422 and problem["type"].endswith("/idempotency-key-reused"), problem
    assert "different request body" in problem["detail"]

    done = await delivered_done(receiver, first["id"])
    assert done["pages"] == 3 and done["finishing"]["metadata"]["Department"] == "Sales", done
    assert set(done["finishing"]["compress"]) == {"bytes_before", "bytes_after"}
    texts = [page.extract_text().strip() for page in (await pdf_of(app, done)).pages]
    assert texts == ["Terms 1", "Terms 2", "Annex"]
    assert (await post(app, "contract-42", body))[1]["status"] == "done"
    assert await deliveries(app, first["id"]) == ["job.done"]
