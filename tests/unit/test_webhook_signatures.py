"""Standard Webhooks signatures: what Pressroom sends, checked the way a receiver checks it
(the standardwebhooks library, as the README shows), and against the format itself."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import time
from typing import Any

import pytest
import standardwebhooks
from standardwebhooks.webhooks import WebhookVerificationError

from server.delivery.webhooks import next_try_in_s, retry_after_s, sign, sign_all

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
OTHER = "whsec_" + base64.b64encode(b"another secret of 24 byte").decode()
BODY = json.dumps({"type": "job.done", "data": {"job": {"id": "j1"}}}).encode()


def signed_headers(
    body: bytes = BODY, *, at: int | None = None, msg_id: str = "msg_1"
) -> dict[str, str]:
    timestamp = int(time.time()) if at is None else at
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(SECRET, msg_id, timestamp, body),
    }


def verify(secret: str, headers: dict[str, str], body: bytes = BODY) -> Any:
    return standardwebhooks.Webhook(secret).verify(body, headers)


def test_signature_is_v1_hmac_sha256_of_id_timestamp_body_keyed_with_the_secret() -> None:
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, b"msg_1.1767225600." + BODY, hashlib.sha256).digest()
    assert sign(SECRET, "msg_1", 1767225600, BODY) == "v1," + base64.b64encode(digest).decode()
    reference = standardwebhooks.Webhook(SECRET).sign(
        "msg_1", dt.datetime.fromtimestamp(1767225600, dt.UTC), BODY.decode()
    )
    assert sign(SECRET, "msg_1", 1767225600, BODY.decode()) == reference


def test_a_receiver_accepts_a_delivery_and_gets_the_payload() -> None:
    assert verify(SECRET, signed_headers()) == json.loads(BODY)


def test_header_names_are_case_insensitive() -> None:
    headers = {name.title(): value for name, value in signed_headers().items()}
    assert verify(SECRET, headers)["type"] == "job.done"


def test_tampered_body_is_refused() -> None:
    headers = signed_headers()
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        verify(SECRET, headers, BODY.replace(b"j1", b"j2"))


def test_old_or_future_timestamp_is_refused_even_when_correctly_signed() -> None:
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(SECRET, signed_headers(at=int(time.time()) - 301))
    with pytest.raises(WebhookVerificationError, match="too new"):
        verify(SECRET, signed_headers(at=int(time.time()) + 301))


def test_during_a_rotation_either_secret_verifies_the_delivery() -> None:
    at = int(time.time())
    header = sign_all([SECRET, OTHER], "msg_1", at, BODY)
    current, previous = header.split(" ")
    assert current == sign(SECRET, "msg_1", at, BODY) and previous == sign(OTHER, "msg_1", at, BODY)
    headers = {**signed_headers(at=at), "webhook-signature": f"{header} v2,ignored"}
    for secret in (SECRET, OTHER):
        assert verify(secret, headers)["type"] == "job.done"
    with pytest.raises(WebhookVerificationError):
        verify(OTHER, signed_headers())


def test_missing_headers_bad_timestamp_and_wrong_secret_are_refused() -> None:
    headers = signed_headers()
    for name in headers:
        partial = {k: v for k, v in headers.items() if k != name}
        with pytest.raises(WebhookVerificationError, match="Missing"):
            verify(SECRET, partial)
    with pytest.raises(WebhookVerificationError, match="Invalid"):
        verify(SECRET, {**headers, "webhook-timestamp": "soon"})
    with pytest.raises(WebhookVerificationError):
        verify("whsec_" + base64.b64encode(bytes(32)).decode(), headers)
    # Not of the v1,<base64> form: refused. standardwebhooks 1.3 says so as it says any other
    # mismatch; earlier releases raise ValueError, which docs/webhooks.md catches too.
    for garbage in ("garbage", "v1,not base64!", "v1,a,b"):
        with pytest.raises((WebhookVerificationError, ValueError)):
            verify(SECRET, {**headers, "webhook-signature": garbage})


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert retry_after_s("120") == 120
    in_a_minute = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    parsed = retry_after_s(in_a_minute.strftime("%a, %d %b %Y %H:%M:%S GMT"))
    assert parsed is not None and 55 <= parsed <= 61
    assert retry_after_s("tomorrow-ish") is None
    assert retry_after_s(None) is None


def test_schedule_is_jittered_honours_retry_after_and_runs_out() -> None:
    schedule = (5.0, 300.0, 1800.0)
    delays = {next_try_in_s(1, schedule) for _ in range(20)}
    assert all(delay is not None and 4 <= delay <= 6 for delay in delays) and len(delays) > 1
    honoured = next_try_in_s(1, schedule, retry_after=600)
    assert honoured == 600
    capped = next_try_in_s(1, schedule, retry_after=10**9)
    assert capped == 1800  # a hostile Retry-After cannot park a delivery forever
    assert next_try_in_s(4, schedule) is None
