"""Finishing through the API, with the fake renderer's PDF and real finishing processes: what
is refused up front (and stores nothing), assets and a Factur-X XML checked at submission, PDF
passwords that no route, stream, webhook or log line shows and that are erased when the job
ends, signatures (PAdES B-T with a timestamp authority the test runs), the signing key at start
and in /readyz, and the durations in /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pikepdf
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from asn1crypto import keys as asn1_keys
from asn1crypto import tsp
from asn1crypto import x509 as asn1_x509
from cryptography.hazmat.primitives import serialization
from pyhanko.pdf_utils.reader import PdfFileReader
from pyhanko.sign.timestamps.dummy_client import DummyTimeStamper
from pyhanko.sign.validation import async_validate_pdf_signature
from pyhanko_certvalidator import ValidationContext

from server.errors import PermanentError
from server.keys import POOL
from tests import testca
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer, small_image
from tests.sse import collect

HTML = "<h1>Invoice</h1>"
XML = (Path(__file__).parents[1] / "files" / "factur-x-minimum.xml").read_bytes()
USER, OWNER = "user-pw-7f3a", "owner-pw-91c2"


async def upload(app: RunningApp, data: bytes, kind: str) -> str:
    async with app.http.post(
        app.url("/v1/assets"), data=data, headers={"Content-Type": kind}
    ) as resp:
        assert resp.status in (200, 201), await resp.text()
        asset_id: str = (await resp.json())["id"]
        return asset_id


async def submit(app: RunningApp, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    async with app.http.post(app.url("/v1/jobs"), json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def count_jobs(app: RunningApp) -> int:
    count: int = await app.app[POOL].fetchval("SELECT count(*) FROM jobs")
    return count


@dataclasses.dataclass
class Signing:
    app: RunningApp
    ca: testca.TestCA
    stamped: list[int]  # requests the timestamp authority answered


@pytest.fixture
async def signing(start_app: Callable[..., Any], tmp_path: Path) -> AsyncIterator[Signing]:
    """An app with a signing key and a timestamp authority (pyHanko's test stamper behind a
    real HTTP server), so its signatures are PAdES B-T."""
    ca = testca.make(tmp_path)
    tsa_cert, tsa_key = ca.tsa()
    der = serialization.Encoding.DER
    stamper = DummyTimeStamper(
        tsa_cert=asn1_x509.Certificate.load(tsa_cert.public_bytes(der)),
        tsa_key=asn1_keys.PrivateKeyInfo.load(
            tsa_key.private_bytes(
                der, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        ),
    )
    stamped: list[int] = []

    async def timestamp(request: web.Request) -> web.Response:
        stamped.append(1)
        answer = stamper.request_tsa_response(tsp.TimeStampReq.load(await request.read()))
        return web.Response(body=answer.dump(), content_type="application/timestamp-reply")

    tsa = web.Application()
    tsa.router.add_post("/", timestamp)
    server = TestServer(tsa, host="127.0.0.1")
    await server.start_server()
    app: RunningApp = await start_app(
        renderer=FakeRenderer(),
        render_slots=1,
        env={
            "PRESSROOM_SIGNING_KEY": ca.p12,
            "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password,
            "PRESSROOM_TSA_URL": str(server.make_url("/")),
        },
    )
    yield Signing(app, ca, stamped)
    await server.close()


async def test_what_cannot_be_finished_together_is_refused_and_nothing_is_stored(
    signing: Signing,
) -> None:
    app = signing.app
    png = await upload(app, small_image("png"), "image/png")
    xml = await upload(app, XML, "application/xml")
    unknown = "sha256:" + "0" * 64
    owner = {"owner_password": OWNER}
    attachment = {"asset": xml, "name": "a.xml", "relationship": "Source"}
    cases = [
        ({"pdfa": "2b", "encrypt": owner}, "options.encrypt"),
        ({"facturx": {"xml": xml}, "encrypt": owner}, "options.encrypt"),
        ({"facturx": {"xml": xml}, "pdfa": "2b"}, "options.facturx"),
        ({"attachments": [attachment], "pdfa": "2b"}, "options.attachments"),
        ({"output": "png", "stamp": {"text": "PAID"}}, "options.stamp"),
        ({"stamp": {"asset": xml}}, "options.stamp.asset"),
        ({"stamp": {"asset": unknown}}, "options.stamp.asset"),
        ({"facturx": {"xml": png}}, "options.facturx.xml"),
        ({"attachments": [{**attachment, "asset": unknown}]}, "options.attachments[0].asset"),
        ({"facturx": {"xml": xml, "profile": "en16931"}}, "options.facturx.xml"),
    ]
    for options, field in cases:
        status, body = await submit(app, {"template": HTML, "options": options})
        assert status == 422, (options, body)
        assert field in [e["field"] for e in body["errors"]], (options, body)
    batch = {"items": [{"key": "k1", "template": HTML, "options": {"stamp": {"asset": xml}}}]}
    async with app.http.post(app.url("/v1/batches"), json=batch) as resp:
        assert resp.status == 422
        assert (await resp.json())["errors"][0]["field"] == "items[0].options.stamp.asset"
    assert await count_jobs(app) == 0


async def test_an_invalid_facturx_xml_is_refused_naming_its_first_error(
    signing: Signing,
) -> None:
    app = signing.app
    broken = await upload(app, XML.replace(b"<ram:TypeCode>380</ram:TypeCode>", b""), "text/xml")
    status, body = await submit(app, {"template": HTML, "options": {"facturx": {"xml": broken}}})
    assert status == 422, body
    [error] = body["errors"]
    assert error["field"] == "options.facturx.xml"
    assert "IssueDateTime" in error["message"] and "TypeCode" in error["message"], error
    item = {"key": "inv-1", "template": HTML, "options": {"facturx": {"xml": broken}}}
    async with app.http.post(app.url("/v1/batches"), json={"items": [item]}) as resp:
        assert resp.status == 422
        assert (await resp.json())["errors"][0]["field"] == "items[0].options.facturx.xml"
    assert await count_jobs(app) == 0


async def test_sign_without_a_key_is_refused(api: RunningApp) -> None:
    status, body = await submit(api, {"template": HTML, "options": {"sign": {}}})
    assert status == 422
    assert body["errors"][0]["field"] == "options.sign"
    assert "PRESSROOM_SIGNING_KEY" in body["errors"][0]["message"]


async def test_pdf_passwords_are_shown_by_nothing_and_erased_when_the_job_ends(
    signing: Signing, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = signing.app
    encrypt = {"user_password": USER, "owner_password": OWNER, "allow": ["print", "copy"]}
    body = {
        "template": HTML,
        "options": {"encrypt": encrypt, "sign": {"reason": "issued"}},
        "webhook_url": "https://hooks.invalid/pressroom",
    }
    status, job = await submit(app, body, **{"Idempotency-Key": "pw-1"})
    assert status == 202, job
    texts = [str(job)]
    messages = await collect(app.http, app.url(job["links"]["events"]), timeout_s=60)
    done = messages[-1].json["job"]
    assert done["status"] == "done", done["error"]
    texts += [m.data for m in messages]
    async with app.http.get(app.url(f"/v1/jobs/{job['id']}")) as resp:
        texts.append(await resp.text())
    async with app.http.get(app.url("/v1/jobs")) as resp:
        texts.append(await resp.text())
    async with app.http.get(done["url"]) as resp:
        pdf = await resp.read()
    pool = app.app[POOL]
    row = await pool.fetchrow(
        "SELECT secrets, options::text, request_hash FROM jobs WHERE id = $1", done["id"]
    )
    deliveries = await pool.fetch("SELECT payload::text FROM webhook_deliveries")
    texts += [row["options"], row["request_hash"], *(d["payload"] for d in deliveries)]
    texts += [record.getMessage() for record in caplog.records]
    assert deliveries and messages and caplog.records
    for text in texts:
        assert USER not in text and OWNER not in text, text
    assert done["options"]["encrypt"]["owner_password"] == "***"
    assert row["secrets"] is None  # erased with the final state
    with pytest.raises(pikepdf.PasswordError):
        pikepdf.open(io.BytesIO(pdf))
    with pikepdf.open(io.BytesIO(pdf), password=USER) as opened:
        assert opened.encryption.R == 6 and opened.encryption.bits == 256
        assert opened.allow.print_lowres and opened.allow.extract
        assert not opened.allow.modify_other and not opened.allow.print_highres
    # Signed after the encryption, with a timestamp: PAdES B-T, valid and trusted.
    reader = PdfFileReader(io.BytesIO(pdf), strict=False)
    reader.decrypt(OWNER)
    [signature] = reader.embedded_signatures
    assert signature.sig_object["/SubFilter"] == "/ETSI.CAdES.detached"
    root = asn1_x509.Certificate.load(signing.ca.root.public_bytes(serialization.Encoding.DER))
    status = await async_validate_pdf_signature(
        signature, ValidationContext(trust_roots=[root], allow_fetching=False)
    )
    assert status.bottom_line, status.pretty_print_details()
    assert status.timestamp_validity is not None and status.timestamp_validity.trusted
    assert signing.stamped  # pyHanko asks once to size the signature, then for its token
    # The same request again is the same job: the fingerprint was taken with the passwords.
    status, again = await submit(app, body, **{"Idempotency-Key": "pw-1"})
    assert status == 200 and again["id"] == job["id"]
    async with app.http.get(app.url("/metrics")) as resp:
        metrics = await resp.text()
    for step in ("encrypt", "sign"):
        assert f'pressroom_finish_duration_seconds_count{{step="{step}"}} 1.0' in metrics


async def test_a_failed_job_with_passwords_cannot_be_retried(start_app: Callable[..., Any]) -> None:
    renderer = FakeRenderer()
    renderer.fail_with = PermanentError("the template is broken")
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    body = {"template": HTML, "options": {"encrypt": {"owner_password": OWNER}}}
    _, job = await submit(app, body)
    messages = await collect(app.http, app.url(job["links"]["events"]), timeout_s=30)
    assert messages[-1].json["job"]["status"] == "failed"
    async with app.http.post(app.url(f"/v1/jobs/{job['id']}/retry")) as resp:
        assert resp.status == 409
        assert "PDF passwords) were erased" in (await resp.json())["detail"]


async def test_an_asset_a_queued_job_finishes_with_is_kept(api: RunningApp) -> None:
    xml = await upload(api, XML, "application/xml")
    later = {"template": HTML, "run_at": "2099-01-01T00:00:00Z"}
    attachment = {"asset": xml, "name": "invoice.xml", "relationship": "Data"}
    status, _ = await submit(api, {**later, "options": {"attachments": [attachment]}})
    assert status == 202
    async with api.http.delete(api.url(f"/v1/assets/{xml}")) as resp:
        assert resp.status == 409, await resp.text()


async def test_readyz_reports_an_expired_signing_key(
    start_app: Callable[..., Any], tmp_path: Path
) -> None:
    ca = testca.make(tmp_path, expired=True)
    env = {"PRESSROOM_SIGNING_KEY": ca.p12, "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password}
    app: RunningApp = await start_app(renderer=FakeRenderer(), env=env)
    async with app.http.get(app.url("/readyz")) as resp:
        assert resp.status == 503
        body = await resp.json()
    assert "expired" in body["checks"]["signing_key"], body


async def test_a_wrong_signing_key_password_stops_the_server_with_one_line(
    tmp_path: Path,
) -> None:
    ca = testca.make(tmp_path)
    env = {
        **os.environ,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        "PRESSROOM_SIGNING_KEY": str(ca.p12),
        "PRESSROOM_SIGNING_KEY_PASSWORD": "not-the-password",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "server", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "pressroom: PRESSROOM_SIGNING_KEY_PASSWORD does not open PRESSROOM_SIGNING_KEY="
        f"{str(ca.p12)!r} (a wrong password, or not a PKCS#12 file)"
    ]
