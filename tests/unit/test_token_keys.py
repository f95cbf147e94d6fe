"""Token keys (server/access/token_keys.py): which PEMs are public keys a token may be signed with,
each key's one algorithm and kid, and the tokens each key checks (signing.check_token)."""

from __future__ import annotations

import datetime as dt
import uuid

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x25519
from cryptography.x509.oid import NameOID

from server.access import signing, token_keys
from server.access.signing import Scope
from tests.tokenkeys import (
    ALGORITHM,
    claims,
    hs256_by_hand,
    mint,
    private_key,
    private_pem,
    public_pem,
)

# RFC 7638, section 3.1: this key's thumbprint is NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs.
RFC_7638_N = (
    "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECP"
    "ebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY3"
    "68QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4"
    "lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"
)


def rsa_public(bits: int) -> rsa.RSAPublicKey:
    """An RSA public key of any size, made from numbers (no primes needed to be refused)."""
    return rsa.RSAPublicNumbers(65537, (1 << (bits - 1)) | 1).public_key()


@pytest.mark.parametrize("kind", ["rsa", "ec", "ed25519"])
def test_each_key_type_checks_the_tokens_of_its_private_key_by_its_one_algorithm(
    kind: str,
) -> None:
    signer = private_key(kind)
    key = token_keys.read_public_key(public_pem(signer))
    assert key.algorithm == ALGORITHM[kind]
    assert key.kid == key.thumbprint[: token_keys.DERIVED_KID_CHARS]
    scope = {"scope": "channels", "channels": ["user-1", "user-2"]}
    token = mint(signer, "acme", scope, kid=key.kid)
    assert jwt.get_unverified_header(token)["kid"] == key.kid
    checked = signing.check_token(key.verifier, token, algorithm=key.algorithm)
    assert checked is not None and checked.tenant == "acme" and checked.key_id is None
    assert checked.scope == Scope(channels=frozenset({"user-1", "user-2"}))
    assert signing.token_signer(token) == signing.Signer("acme", key.algorithm, key.kid)

    # Another key of the same type, an expired token, and an altered one are refused.
    stranger = mint(private_key(kind), "acme", scope, kid=key.kid)
    expired = mint(signer, "acme", scope, kid=key.kid, ttl_s=-1)
    altered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for refused in (stranger, expired, altered):
        assert signing.check_token(key.verifier, refused, algorithm=key.algorithm) is None


def test_a_token_names_its_algorithm_and_only_the_keys_one_is_taken() -> None:
    rsa_signer, ec_signer = private_key("rsa"), private_key("ec")
    rsa_key = token_keys.read_public_key(public_pem(rsa_signer))
    ec_key = token_keys.read_public_key(public_pem(ec_signer))
    scope = {"scope": "tenant"}
    by_rsa = mint(rsa_signer, "acme", scope, kid=ec_key.kid)  # RS256, naming the ES256 key
    assert signing.check_token(ec_key.verifier, by_rsa, algorithm=ec_key.algorithm) is None
    # RS256's sibling PS256 with the very RSA key: not RS256, refused.
    pss = mint(rsa_signer, "acme", scope, kid=rsa_key.kid, algorithm="PS256")
    assert signing.check_token(rsa_key.verifier, pss, algorithm=rsa_key.algorithm) is None
    # alg none, and HS256 keyed with the public key's PEM text (the classic confusion).
    unsigned = jwt.encode(claims("acme", scope), None, algorithm="none", headers={"kid": "x"})
    forged = hs256_by_hand({"kid": rsa_key.kid}, claims("acme", scope), public_pem(rsa_signer))
    for key in (rsa_key, ec_key):
        for token in (unsigned, forged):
            assert signing.check_token(key.verifier, token, algorithm=key.algorithm) is None
    # Nor does the forgery pass as an HS256 token of a secret that is the PEM text itself.
    pem_text = rsa_key.public_key
    assert signing.check_token(pem_text, forged) is None


def test_the_kid_is_a_short_rfc_7638_thumbprint_of_the_key_whatever_its_pem() -> None:
    n = int.from_bytes(jwt.utils.base64url_decode(RFC_7638_N), "big")
    public = rsa.RSAPublicNumbers(65537, n).public_key()
    spki = public_pem(public)
    pkcs1 = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1)
    for pem in (spki, pkcs1, b"\n" + spki + b"\n"):
        key = token_keys.read_public_key(pem)
        assert key.thumbprint == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"
        assert key.kid == "NzbLsXh8uDCcd-6M" and token_keys.check_kid(key.kid) is None
        assert key.public_key == spki.decode()  # stored as SubjectPublicKeyInfo
    assert token_keys.check_kid("acme-2026.12:1") is None
    for bad in ("", "x" * 65, "has space", "ü", "a/b"):
        assert token_keys.check_kid(bad) is not None, bad


def _certificate() -> bytes:
    key = private_key("ec")
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acme")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_what_is_not_a_public_key_of_a_kind_tokens_take_is_refused_in_one_line() -> None:
    signer = private_key("ec")
    encrypted = signer.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass"),
    )
    traditional = private_key("rsa").private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    refused = {
        "private key (PKCS#8)": (private_pem(signer), "private key"),
        "private key (encrypted)": (encrypted, "private key"),
        "private key (RSA PRIVATE KEY)": (traditional, "private key"),
        "public and private key together": (public_pem(signer) + private_pem(signer), "private"),
        "certificate": (_certificate(), "certificate"),
        "garbage": (b"not a key at all", "expected one block: a PEM public key"),
        "binary": (public_pem(signer).replace(b"-", b"\xff"), "not PEM text"),
        "DER": (
            signer.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            "PEM",
        ),
        "a broken block": (
            b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            "does not decode",
        ),
        "two keys": (public_pem(signer) + public_pem(private_key("ec")), "expected one block"),
        "RSA of 1024 bits": (public_pem(rsa_public(1024)), "1024 bits; RS256 takes 2048 to 4096"),
        "RSA of 8192 bits": (public_pem(rsa_public(8192)), "8192 bits; RS256 takes 2048 to 4096"),
        "EC on P-384": (
            public_pem(ec.generate_private_key(ec.SECP384R1())),
            "secp384r1; ES256 takes P-256",
        ),
        "EC on secp256k1": (
            public_pem(ec.generate_private_key(ec.SECP256K1())),
            "secp256k1; ES256 takes P-256",
        ),
        "Ed448": (public_pem(ed448.Ed448PrivateKey.generate()), "Ed448 key; expected"),
        "X25519": (public_pem(x25519.X25519PrivateKey.generate()), "X25519 key; expected"),
        "DSA": (public_pem(dsa.generate_private_key(key_size=1024)), "DSA key; expected"),
    }
    secret = private_pem(signer).decode().splitlines()[1]
    for what, (pem, said) in refused.items():
        with pytest.raises(token_keys.TokenKeyError) as caught:
            token_keys.read_public_key(pem)
        message = str(caught.value)
        assert said in message and "\n" not in message, (what, message)
        assert secret not in message, "a private key is never shown back"
    assert "RSA" in token_keys.EXPECTED and "P-256" in token_keys.EXPECTED


def test_a_job_id_scope_still_works_with_token_keys() -> None:
    signer = private_key("ed25519")
    key = token_keys.read_public_key(public_pem(signer))
    job_id = str(uuid.uuid4())
    token = mint(signer, "acme", {"scope": "job", "job_id": job_id}, kid=key.kid)
    checked = signing.check_token(key.verifier, token, algorithm=key.algorithm)
    assert checked is not None and checked.scope == Scope(job_id=job_id)
