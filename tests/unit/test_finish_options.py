"""Finishing options: what cannot be honoured together is refused up front, each naming its
field; page choices; PDF passwords sealed apart from the options; the signing key's checks."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest

from server import options
from server.errors import PermanentError
from server.options.finishing import page_numbers
from server.pipeline import vault
from server.settings import Settings, SettingsError
from server.signkey import SigningKey, SigningKeyError
from tests import testca

ASSET = "sha256:" + "a" * 64
OWNER = {"owner_password": "owner-secret"}
XML = {"xml": ASSET}
ATTACHMENT = {"asset": ASSET, "name": "data.csv", "relationship": "Data"}

CONFLICTS: list[tuple[dict[str, Any], str, str]] = [
    ({"pdfa": "2b", "encrypt": OWNER}, "options.encrypt", "PDF/A forbids encryption"),
    ({"pdfa": "3b", "encrypt": OWNER}, "options.encrypt", "PDF/A forbids encryption"),
    ({"facturx": XML, "encrypt": OWNER}, "options.encrypt", "PDF/A forbids encryption"),
    ({"facturx": XML, "pdfa": "2b"}, "options.facturx", "PDF/A-3b"),
    ({"attachments": [ATTACHMENT], "pdfa": "2b"}, "options.attachments", "PDF/A-2"),
    (
        {"thumbnail": {"width": 100}, "encrypt": {**OWNER, "user_password": "u"}},
        "options.encrypt",
        "thumbnail",
    ),
    ({"output": "png", "pdfa": "2b"}, "options.pdfa", "PDF only"),
    ({"output": "jpeg", "stamp": {"text": "PAID"}}, "options.stamp", "PDF only"),
    ({"output": "webp", "tagged": True}, "options.tagged", "PDF only"),
    ({"stamp": {"text": "PAID", "asset": ASSET}}, "options.stamp", "either text or asset"),
    ({"stamp": {"opacity": 0.5}}, "options.stamp", "either text or asset"),
    (
        {"attachments": [ATTACHMENT, ATTACHMENT]},
        "options.attachments",
        "two attachments are named",
    ),
    (
        {"facturx": XML, "attachments": [{**ATTACHMENT, "name": "factur-x.xml"}]},
        "options.facturx",
        "factur-x.xml",
    ),
    (
        {"encrypt": {**OWNER, "allow": ["print", "print"]}},
        "options.encrypt.allow",
        "twice",
    ),
    ({"encrypt": {"user_password": "u"}}, "options.encrypt.owner_password", "required"),
    ({"sign": {"visible": {"page": 1, "box": [10, 10, 5, 50]}}}, "options.sign.visible.box", ""),
    ({"stamp": {"text": "PAID", "pages": "first"}}, "options.stamp.pages", "1-"),
]


@pytest.mark.parametrize(("raw", "field", "message"), CONFLICTS)
def test_what_cannot_be_finished_together_is_refused(
    raw: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(options.OptionsError) as refused:
        options.parse(raw)
    assert [f for f, _ in refused.value.errors] == [field], refused.value.errors
    assert message in refused.value.errors[0][1]


def test_facturx_goes_with_pdfa_3b_or_none_and_finishing_is_known() -> None:
    assert options.parse({"facturx": XML, "pdfa": "3b"}).finishing
    assert options.parse({"facturx": XML}).finishing
    assert options.parse({"encrypt": OWNER, "sign": {}}).finishing
    assert not options.parse({"tagged": True, "outline": True}).finishing
    assert options.parse({"tagged": True}).pdf_arguments()["tagged"] is True


def test_sign_is_refused_where_the_server_has_no_key() -> None:
    refused = options.RenderOptions.model_validate  # the API's context says whether it can
    refused({"sign": {}}, context={"finish_can_sign": True})
    with pytest.raises(ValueError, match="no signing key"):
        refused({"sign": {}}, context={"finish_can_sign": False})


def test_pages_choose_existing_pages_once_in_order() -> None:
    assert page_numbers("1-", 3) == [0, 1, 2]
    assert page_numbers("1,3", 5) == [0, 2]
    assert page_numbers("3,1,2-2", 3) == [0, 1, 2]
    assert page_numbers("2-4,9", 3) == [1, 2]


def test_passwords_are_shown_redacted_and_open_only_for_their_job() -> None:
    secret, job_id = "server-secret", uuid.uuid4()
    given = options.parse({"encrypt": {"user_password": "open-me", "owner_password": "own"}})
    shown, sealed = vault.hide(given, secret=secret, job_id=job_id)
    assert sealed is not None and b"open-me" not in sealed and b"own" not in sealed
    assert shown.encrypt is not None
    redacted = (vault.REDACTED, vault.REDACTED)
    assert (shown.encrypt.user_password, shown.encrypt.owner_password) == redacted
    assert "open-me" not in str(options.to_json(shown))
    back = vault.reveal(shown, sealed, secret=secret, job_id=job_id)
    assert back.encrypt == given.encrypt
    with pytest.raises(PermanentError, match="cannot be opened"):
        vault.reveal(shown, sealed, secret=secret, job_id=uuid.uuid4())
    body = {"template": "x", "options": {"encrypt": {"owner_password": "own"}}}
    fingerprint = vault.fingerprinted(body, secret=secret)
    assert "own" not in str(fingerprint["options"]["encrypt"].values())
    assert fingerprint == vault.fingerprinted(body, secret=secret)


def test_a_signing_key_that_cannot_be_opened_stops_the_start(tmp_path: Path) -> None:
    ca = testca.make(tmp_path)
    env = {"PRESSROOM_DATA_DIR": str(tmp_path / "data"), "PRESSROOM_SIGNING_KEY": str(ca.p12)}
    with pytest.raises(SettingsError, match="PRESSROOM_SIGNING_KEY_PASSWORD does not open"):
        Settings.from_env({**env, "PRESSROOM_SIGNING_KEY_PASSWORD": "wrong"})
    with pytest.raises(SettingsError, match="cannot be read"):
        Settings.from_env({**env, "PRESSROOM_SIGNING_KEY": str(tmp_path / "none.p12")})
    settings = Settings.from_env({**env, "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password})
    assert settings.signing is not None
    assert settings.signing.check() == ca.leaf.not_valid_after_utc


def test_an_expired_key_starts_and_is_reported(tmp_path: Path) -> None:
    ca = testca.make(tmp_path, expired=True)
    key = SigningKey(ca.p12, ca.password)
    key.check(expiry=False)
    with pytest.raises(SigningKeyError, match="expired"):
        key.check()
    assert key.check(now=dt.datetime.now(dt.UTC) - dt.timedelta(days=1.5), expiry=True)


def test_passwords_are_sealed_with_a_page_url_job_s_cookies_and_headers() -> None:
    secret, job_id = "server-secret", uuid.uuid4()
    given = options.parse(
        {
            "cookies": [{"name": "session", "value": "cookie-secret"}],
            "headers": {"X-Key": "header-secret"},
            "encrypt": {"owner_password": "owner-secret"},
        }
    )
    shown, sealed = vault.hide(given, secret=secret, job_id=job_id)
    assert sealed is not None
    text = str(options.to_json(shown))
    assert not any(word in text for word in ("cookie-secret", "header-secret", "owner-secret"))
    assert vault.reveal(shown, sealed, secret=secret, job_id=job_id) == given
