"""Subscription tokens (PyJWT) and download link signatures: what they grant, and what they
refuse."""

from __future__ import annotations

import time
import uuid

import jwt

from server import signing
from server.signing import Scope

SECRET = "a signing secret, 64 characters long, as HS512 wants its keys..."


def test_a_token_opens_its_scope_only() -> None:
    job_id = uuid.uuid4()
    cases = {
        signing.TENANT_SCOPE: {"tenant": True, "channel A": True, "job": True, "other job": True},
        Scope(job_id=str(job_id)): {
            "tenant": False,
            "channel A": False,
            "job": True,
            "other job": False,
        },
        Scope(channel="A"): {"tenant": False, "channel A": True, "job": True, "other job": False},
    }
    targets = {
        "tenant": {"job_id": None, "channel": None},
        "channel A": {"job_id": None, "channel": "A"},
        "job": {"job_id": job_id, "channel": "A"},  # a job of channel A
        "other job": {"job_id": uuid.uuid4(), "channel": "B"},
    }
    for scope, expected in cases.items():
        token, expires_at = signing.make_token(SECRET, "acme", scope, ttl_s=60, key_id=3)
        claims = signing.check_token(SECRET, token)
        assert claims == signing.TokenClaims("acme", scope, expires_at, key_id=3)
        opens = {name: claims.scope.opens(**target) for name, target in targets.items()}
        assert opens == expected, scope
    assert not Scope(channel="A").opens(job_id=uuid.uuid4(), channel=None)


def test_a_token_is_a_standard_jwt_a_backend_can_mint() -> None:
    job_id = str(uuid.uuid4())
    token, expires_at = signing.make_token(SECRET, "acme", Scope(job_id=job_id), ttl_s=60)
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "typ": "JWT"}
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims == {
        "sub": "acme",
        "iat": expires_at - 60,
        "exp": expires_at,
        "pressroom": {"scope": "job", "job_id": job_id},
    }
    # The same claims minted elsewhere, with PyJWT alone, are as good.
    now = int(time.time())
    mine = {"sub": "acme", "iat": now, "exp": now + 60, "pressroom": {"scope": "channel"}}
    mine["pressroom"]["channel"] = "user-42"
    checked = signing.check_token(SECRET, jwt.encode(mine, SECRET, "HS256"))
    assert checked == signing.TokenClaims("acme", Scope(channel="user-42"), now + 60, None)
    assert signing.token_tenant(token) == "acme"
    assert signing.check_token("another secret of 32 characters!", token) is None


def test_tokens_missing_a_claim_of_the_wrong_shape_or_expired_are_refused() -> None:
    now = int(time.time())
    good = {"sub": "acme", "iat": now, "exp": now + 60, "pressroom": {"scope": "tenant"}}
    assert signing.check_token(SECRET, jwt.encode(good, SECRET, "HS256")) is not None
    bad_claims = [
        {k: v for k, v in good.items() if k != "exp"},  # never expires
        {k: v for k, v in good.items() if k != "iat"},
        {k: v for k, v in good.items() if k != "sub"},
        {k: v for k, v in good.items() if k != "pressroom"},
        {**good, "sub": 5},
        {**good, "exp": now - 1},
        {**good, "iat": now + 3600},  # minted in the future
        {**good, "iat": "now"},
        {**good, "pressroom": "tenant"},
        {**good, "pressroom": {}},
        {**good, "pressroom": {"scope": "everything"}},
        {**good, "pressroom": {"scope": "tenant", "channel": "A"}},  # which is it?
        {**good, "pressroom": {"scope": "channel"}},
        {**good, "pressroom": {"scope": "channel", "channel": "not a channel"}},
        {**good, "pressroom": {"scope": "channel", "channel": "A", "job_id": "x"}},
        {**good, "pressroom": {"scope": "job", "job_id": "not-a-uuid"}},
        {**good, "pressroom": {"scope": "job", "job_id": 5}},
        {**good, "pressroom": {"scope": "tenant", "key": True}},
        {**good, "pressroom": {"scope": "tenant", "key": -1}},
        {**good, "pressroom": {"scope": "tenant", "key": "1"}},
    ]
    for claims in bad_claims:
        assert signing.check_token(SECRET, jwt.encode(claims, SECRET, "HS256")) is None, claims
    assert signing.check_token(SECRET, jwt.encode(good, SECRET, "HS512")) is None
    assert signing.check_token(SECRET, jwt.encode(good, None, "none")) is None
    assert signing.check_token(SECRET, "x" * (signing.MAX_TOKEN_CHARS + 1)) is None
    assert signing.token_tenant("garbage") is None


def test_a_link_signature_is_no_token_and_a_token_signs_no_link() -> None:
    exp = int(time.time()) + 60
    link = signing.sign_download(SECRET, "j1", exp, 7)
    assert signing.check_token(SECRET, link) is None
    token, _ = signing.make_token(SECRET, "acme", Scope(job_id=str(uuid.uuid4())), ttl_s=60)
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


def test_token_secrets_are_fresh_and_marked() -> None:
    made = {signing.new_token_secret() for _ in range(3)}
    assert len(made) == 3 and all(s.startswith("prts_") and len(s) > 40 for s in made)
