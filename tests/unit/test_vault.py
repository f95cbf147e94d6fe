"""Cookie and header values: redacted in the options a job shows, sealed for its id alone."""

from __future__ import annotations

import uuid

import pytest

from server import options
from server.errors import PermanentError
from server.pipeline import vault

SECRET = "server-secret"
GIVEN = {
    "cookies": [
        {"name": "session", "value": "s3cret", "path": "/app"},
        {"name": "csrf", "value": "t0ken", "secure": True},
    ],
    "headers": {"Authorization": "Bearer abc", "X-Tenant": "acme"},
    "scale": 0.5,
}


def test_values_are_redacted_in_what_is_shown_and_come_back_for_the_renderer() -> None:
    job_id = uuid.uuid4()
    shown, sealed = vault.hide(options.parse(GIVEN), secret=SECRET, job_id=job_id)
    assert sealed is not None
    stored = options.to_json(shown)
    assert stored == {
        "scale": 0.5,
        "cookies": [
            {"name": "session", "value": "***", "path": "/app"},
            {"name": "csrf", "value": "***", "secure": True},
        ],
        "headers": {"Authorization": "***", "X-Tenant": "***"},
    }
    for value in (b"s3cret", b"t0ken", b"Bearer abc", b"acme"):
        assert value not in sealed
    revealed = vault.reveal(options.parse(stored), sealed, secret=SECRET, job_id=job_id)
    assert revealed == options.parse(GIVEN)


def test_options_without_cookies_or_headers_seal_nothing() -> None:
    plain = options.parse({"scale": 0.5, "cookies": [], "headers": {}})
    assert vault.hide(plain, secret=SECRET, job_id=uuid.uuid4()) == (plain, None)


@pytest.mark.parametrize("change", ["job", "secret", "byte", "format"])
def test_a_sealed_value_opens_only_for_its_job_with_the_same_secret(change: str) -> None:
    job_id = uuid.uuid4()
    shown, sealed = vault.hide(options.parse(GIVEN), secret=SECRET, job_id=job_id)
    assert sealed is not None
    secret, opened_as = SECRET, job_id
    if change == "job":
        opened_as = uuid.uuid4()
    elif change == "secret":
        secret = "another-secret"
    elif change == "byte":
        sealed = sealed[:-1] + bytes([sealed[-1] ^ 1])
    else:
        sealed = b"\x09" + sealed[1:]
    with pytest.raises(PermanentError):
        vault.reveal(shown, sealed, secret=secret, job_id=opened_as)


def test_values_that_no_longer_match_the_options_are_refused() -> None:
    job_id = uuid.uuid4()
    shown, sealed = vault.hide(options.parse(GIVEN), secret=SECRET, job_id=job_id)
    assert sealed is not None
    fewer = shown.model_copy(update={"headers": {"X-Tenant": "***"}})
    with pytest.raises(PermanentError, match="do not match"):
        vault.reveal(fewer, sealed, secret=SECRET, job_id=job_id)
