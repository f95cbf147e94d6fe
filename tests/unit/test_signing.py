"""Subscription tokens (PyJWT) and download link signatures: what they grant, and what they
refuse."""

from __future__ import annotations

import time
import uuid

import jwt

from server.access import signing
from server.access.signing import Scope

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
        Scope(channels=frozenset({"A"})): {
            "tenant": False,
            "channel A": True,
            "job": True,
            "other job": False,
        },
        Scope(channels=frozenset({"A", "B"})): {
            "tenant": False,
            "channel A": True,
            "job": True,
            "other job": True,  # in channel B
        },
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
    assert not Scope(channels=frozenset({"A"})).opens(job_id=uuid.uuid4(), channel=None)
    assert not Scope(channels=frozenset({"A", "B"})).opens(job_id=None, channel=None)


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
    assert checked == signing.TokenClaims(
        "acme", Scope(channels=frozenset({"user-42"})), now + 60, None
    )
    assert signing.token_signer(token) == signing.Signer("acme", "HS256", None)
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
        {**good, "pressroom": {"scope": "channels", "channels": []}},
        {**good, "pressroom": {"scope": "channels", "channels": "A"}},
        {**good, "pressroom": {"scope": "channels", "channels": ["A", "A"]}},
        {**good, "pressroom": {"scope": "channels", "channels": ["A", "not a channel"]}},
        {**good, "pressroom": {"scope": "channels", "channels": [f"c{n}" for n in range(21)]}},
        {**good, "pressroom": {"scope": "channels", "channel": "A"}},
        {**good, "pressroom": {"scope": "channel", "channels": ["A"]}},
    ]
    for claims in bad_claims:
        assert signing.check_token(SECRET, jwt.encode(claims, SECRET, "HS256")) is None, claims
    assert signing.check_token(SECRET, jwt.encode(good, SECRET, "HS512")) is None
    assert signing.check_token(SECRET, jwt.encode(good, None, "none")) is None
    assert signing.check_token(SECRET, "x" * (signing.MAX_TOKEN_CHARS + 1)) is None
    assert signing.token_signer("garbage") is None


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


def test_a_token_names_up_to_20_channels_and_one_keeps_the_claim_it_had() -> None:
    one = Scope(channels=frozenset({"A"}))
    assert one.claim(None) == {"scope": "channel", "channel": "A"}
    several = Scope(channels=frozenset(f"user-{n}" for n in range(20)))
    token, _ = signing.make_token(SECRET, "acme", several, ttl_s=60)
    claim = jwt.decode(token, SECRET, ["HS256"])["pressroom"]
    assert claim == {"scope": "channels", "channels": sorted(several.channels)}
    claims = signing.check_token(SECRET, token)
    assert claims is not None and claims.scope == several
    # A backend may list one channel under `channels`, in any order: the same scope.
    now = int(time.time())
    for listed, scope in ((["A"], one), (["B", "A"], Scope(channels=frozenset({"A", "B"})))):
        mine = {"sub": "acme", "iat": now, "exp": now + 60}
        mine["pressroom"] = {"scope": "channels", "channels": listed}
        checked = signing.check_token(SECRET, jwt.encode(mine, SECRET, "HS256"))
        assert checked is not None and checked.scope == scope


def test_a_scope_reads_well_in_a_403() -> None:
    assert Scope(channels=frozenset({"A"})).describe() == "channel 'A' (its stream and its jobs)"
    assert (
        Scope(channels=frozenset({"b", "a"})).describe()
        == "channels 'a' and 'b' (their streams and their jobs)"
    )
    assert (
        Scope(channels=frozenset("abc")).describe()
        == "channels 'a', 'b' and 'c' (their streams and their jobs)"
    )
    assert (
        Scope(channels=frozenset(f"c{n:02}" for n in range(20))).describe()
        == "channels 'c00', 'c01', 'c02' and 17 more (their streams and their jobs)"
    )


def test_the_longest_token_a_backend_needs_fits_the_limit_and_a_request_line() -> None:
    longest = Scope(channels=frozenset(f"{n:02}" + "c" * 198 for n in range(20)))
    now = int(time.time())
    claims = {"sub": "t" * 63, "iat": now, "exp": now + 3600}
    claims["pressroom"] = longest.claim(2**53)
    token = jwt.encode(claims, SECRET, "HS256", headers={"kid": "k" * 64})
    # "RS256" is as long as "HS256"; a 4096-bit RSA signature is 512 bytes: 683 characters
    # where HS256 has 43.
    as_rsa = len(token) - 43 + 683
    assert as_rsa < signing.MAX_TOKEN_CHARS
    # aiohttp reads request lines of up to 8190 bytes: GET /v1/jobs/{id}/events?token=… fits.
    line = f"GET /v1/jobs/{uuid.uuid4()}/events?last_event_id=9007199254740991&token= HTTP/1.1"
    assert len(line) + signing.MAX_TOKEN_CHARS < 8190
    checked = signing.check_token(SECRET, jwt.encode(claims, SECRET, "HS256"))
    assert checked is not None and checked.scope == longest
