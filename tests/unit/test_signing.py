"""Subscription tokens (PyJWT) and download link signatures: what they grant, and what they
refuse."""

from __future__ import annotations

import time
import uuid

import jwt

from server import signing

SECRET = "a signing secret, 64 characters long, as HS512 wants its keys..."


def test_check_token_claims() -> None:
    token, expires_at = signing.make_token(SECRET, "acme", job_id=None, key_id=3, ttl_s=60)
    claims = signing.check_token(SECRET, token)
    assert claims == signing.TokenClaims("acme", job_id=None, expires_at=expires_at, key_id=3)
    assert claims.allows(None) and claims.allows(uuid.uuid4())
    job_id = uuid.uuid4()
    scoped = signing.check_token(
        SECRET, signing.make_token(SECRET, "acme", job_id=job_id, key_id=3, ttl_s=60)[0]
    )
    assert scoped is not None and scoped.allows(job_id) and not scoped.allows(None)
    assert not scoped.allows(uuid.uuid4())
    assert signing.check_token("another secret of 32 characters!", token) is None


def test_a_token_is_a_standard_jwt_naming_its_key() -> None:
    token, expires_at = signing.make_token(SECRET, "acme", job_id="j1", key_id=7, ttl_s=60)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims == {"tenant": "acme", "job": "j1", "kid": 7, "exp": expires_at}


def test_tokens_missing_a_claim_of_the_wrong_type_or_expired_are_refused() -> None:
    exp = int(time.time()) + 60
    good = {"tenant": "acme", "kid": 1, "exp": exp}
    assert signing.check_token(SECRET, jwt.encode(good, SECRET, "HS256")) is not None
    bad_claims = [
        {"tenant": "acme", "kid": 1},  # never expires
        {"kid": 1, "exp": exp},
        {"tenant": "acme", "exp": exp},
        {**good, "tenant": 5},
        {**good, "kid": True},
        {**good, "kid": -1},
        {**good, "kid": "1"},
        {**good, "job": 5},
        {**good, "exp": int(time.time()) - 1},
    ]
    for claims in bad_claims:
        assert signing.check_token(SECRET, jwt.encode(claims, SECRET, "HS256")) is None, claims
    assert signing.check_token(SECRET, jwt.encode(good, SECRET, "HS512")) is None
    assert signing.check_token(SECRET, jwt.encode(good, None, "none")) is None
    assert signing.check_token(SECRET, "x" * (signing.MAX_TOKEN_CHARS + 1)) is None


def test_a_link_signature_is_no_token_and_a_token_signs_no_link() -> None:
    exp = int(time.time()) + 60
    link = signing.sign_download(SECRET, "j1", exp, 7)
    assert signing.check_token(SECRET, link) is None
    token, _ = signing.make_token(SECRET, "acme", job_id="j1", key_id=7, ttl_s=60)
    signature = token.rsplit(".", 1)[1]
    assert signing.check_download(SECRET, "j1", str(exp), "7", signature) is None
    assert signing.check_download(SECRET, "j1", str(exp), "7", link) == 7


def test_a_link_opens_the_one_file_it_was_signed_for() -> None:
    exp = int(time.time()) + 60
    document = signing.sign_download(SECRET, "j1", exp, 7)
    thumbnail = signing.sign_download(SECRET, "j1", exp, 7, route=signing.THUMBNAIL)
    assert signing.check_download(SECRET, "j1", str(exp), "7", thumbnail, route="thumbnail") == 7
    assert signing.check_download(SECRET, "j1", str(exp), "7", document, route="thumbnail") is None
    assert signing.check_download(SECRET, "j1", str(exp), "7", thumbnail) is None
