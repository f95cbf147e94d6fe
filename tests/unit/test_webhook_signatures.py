"""Standard Webhooks signatures: Pressroom's sign/verify against the standardwebhooks library."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time

import pytest
import standardwebhooks

from server.webhooks import WebhookVerificationError, next_try_in_s, retry_after_s, sign, verify

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
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


def test_signature_matches_the_reference_library() -> None:
    timestamp = int(time.time())
    reference = standardwebhooks.Webhook(SECRET).sign(
        "msg_1", dt.datetime.fromtimestamp(timestamp, dt.UTC), BODY.decode()
    )
    assert sign(SECRET, "msg_1", timestamp, BODY) == reference


def test_both_verifiers_accept_a_delivery_and_return_the_payload() -> None:
    headers = signed_headers()
    assert verify(SECRET, headers, BODY) == json.loads(BODY)
    assert standardwebhooks.Webhook(SECRET).verify(BODY, headers) == json.loads(BODY)


def test_header_names_are_case_insensitive() -> None:
    headers = {name.title(): value for name, value in signed_headers().items()}
    assert verify(SECRET, headers, BODY)["type"] == "job.done"


def test_tampered_body_fails_both_verifiers() -> None:
    headers = signed_headers()
    tampered = BODY.replace(b"j1", b"j2")
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(SECRET, headers, tampered)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(tampered, headers)


def test_old_or_future_timestamp_fails_even_when_correctly_signed() -> None:
    old = signed_headers(at=int(time.time()) - 301)
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(SECRET, old, BODY)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError, match="too old"):
        standardwebhooks.Webhook(SECRET).verify(BODY, old)
    future = signed_headers(at=int(time.time()) + 301)
    with pytest.raises(WebhookVerificationError, match="future"):
        verify(SECRET, future, BODY)
    assert verify(SECRET, old, BODY, tolerance_s=3600)["type"] == "job.done"


def test_any_of_several_signatures_may_match_during_secret_rotation() -> None:
    headers = signed_headers()
    other = "whsec_" + base64.b64encode(b"another secret of 24 byte").decode()
    stale = sign(other, "msg_1", int(headers["webhook-timestamp"]), BODY)
    headers["webhook-signature"] = f"{stale} v2,ignored {headers['webhook-signature']}"
    assert verify(SECRET, headers, BODY)["type"] == "job.done"
    with pytest.raises(WebhookVerificationError):
        verify(other, signed_headers(), BODY)


def test_missing_headers_and_wrong_secret_are_refused() -> None:
    headers = signed_headers()
    for name in headers:
        partial = {k: v for k, v in headers.items() if k != name}
        with pytest.raises(WebhookVerificationError, match="missing"):
            verify(SECRET, partial, BODY)
    with pytest.raises(WebhookVerificationError, match="not a number"):
        verify(SECRET, {**headers, "webhook-timestamp": "soon"}, BODY)
    wrong = "whsec_" + base64.b64encode(bytes(32)).decode()
    with pytest.raises(WebhookVerificationError):
        verify(wrong, headers, BODY)


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
