"""Token keys: public keys a tenant registers so that its backend signs subscription tokens with
its own private key (`pressroom tenants token-key`), with no secret shared with Pressroom.

The algorithm follows from the key: RS256 for RSA (2048-4096 bits), ES256 for EC on P-256,
EdDSA for Ed25519. A token names its key by `kid` in its header; a kid is given when the key is
added or is the start of its RFC 7638 thumbprint, and is unique per tenant (so is the key).
server/web/auth.py keeps the keys of the tenants in use in memory, with their token secrets.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import re

import asyncpg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from server.sql import query

RS256, ES256, EDDSA = "RS256", "ES256", "EdDSA"
MIN_RSA_BITS, MAX_RSA_BITS = 2048, 4096
KID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# A derived kid: the thumbprint's first 16 characters (96 bits), short enough to read.
DERIVED_KID_CHARS = 16
EXPECTED = "a PEM public key: RSA of 2048-4096 bits (RS256), EC on P-256 (ES256) or Ed25519 (EdDSA)"
SAME_KEY_CONSTRAINT = "tenant_token_keys_one_kid_per_key"  # migration 0021
_PEM_LABEL = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----")


#: A public key of a type a token key may be.
Verifier = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class TokenKeyError(ValueError):
    """A PEM that cannot be a token key, or a kid that cannot name one: one line, for a person."""


@dataclasses.dataclass(frozen=True, slots=True)
class TokenKey:
    """A registered public key: its kid, its algorithm, its SubjectPublicKeyInfo PEM and its
    RFC 7638 thumbprint (which a stream opened with its tokens remembers)."""

    kid: str
    algorithm: str
    public_key: str
    thumbprint: str

    @property
    def verifier(self) -> Verifier:
        """The key as PyJWT checks signatures with it (parsed once per process)."""
        return _loaded(self.public_key)


@dataclasses.dataclass(frozen=True, slots=True)
class ListedKey:
    """A key as `token-key --list` shows it."""

    kid: str
    algorithm: str
    added_at: dt.datetime


@functools.lru_cache(maxsize=4096)
def _loaded(pem: str) -> Verifier:
    key = serialization.load_pem_public_key(pem.encode())
    assert isinstance(key, Verifier), "token_keys.read_public_key checked it"
    return key


def check_kid(kid: str) -> str | None:
    """Why `kid` cannot name a token key, or None when it can."""
    if KID_PATTERN.fullmatch(kid) is None:
        return "a kid is 1-64 letters, digits or the characters _ . : -"
    return None


def read_public_key(data: bytes) -> TokenKey:
    """The token key a PEM file holds, with its derived kid; TokenKeyError names what is wrong
    and what was expected (and never echoes the file, which may be a private key)."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise TokenKeyError(f"this is not PEM text; expected {EXPECTED}") from None
    labels = _PEM_LABEL.findall(text)
    if any("PRIVATE KEY" in label for label in labels):
        raise TokenKeyError(
            "this is a private key, which stays with your backend; give its public key "
            "(openssl pkey -in KEY.pem -pubout)"
        )
    if any("CERTIFICATE" in label for label in labels):
        raise TokenKeyError(
            "this is a certificate, whose dates and names Pressroom would not check; give its "
            "public key (openssl x509 -in CERT.pem -pubkey -noout)"
        )
    if len(labels) != 1 or labels[0] not in ("PUBLIC KEY", "RSA PUBLIC KEY"):
        found = "no PEM block" if not labels else ", ".join(labels)
        raise TokenKeyError(f"found {found}; expected one block: {EXPECTED}")
    try:
        key = serialization.load_pem_public_key(text.encode())
    except ValueError:
        raise TokenKeyError(f"this PEM block does not decode; expected {EXPECTED}") from None
    algorithm = algorithm_of(key)
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    digest = thumbprint(key)
    return TokenKey(digest[:DERIVED_KID_CHARS], algorithm, pem, digest)


def algorithm_of(key: PublicKeyTypes) -> str:
    """The one algorithm a key signs tokens with, or TokenKeyError for a key it cannot be."""
    if isinstance(key, rsa.RSAPublicKey):
        if not MIN_RSA_BITS <= key.key_size <= MAX_RSA_BITS:
            raise TokenKeyError(
                f"this RSA key has {key.key_size} bits; RS256 takes {MIN_RSA_BITS} to "
                f"{MAX_RSA_BITS}"
            )
        return RS256
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise TokenKeyError(
                f"this EC key is on {key.curve.name}; ES256 takes P-256 (secp256r1, prime256v1)"
            )
        return ES256
    if isinstance(key, ed25519.Ed25519PublicKey):
        return EDDSA
    kind = type(key).__name__.removesuffix("PublicKey").lstrip("_")
    raise TokenKeyError(f"this is a {kind} key; expected {EXPECTED}")


def thumbprint(key: PublicKeyTypes) -> str:
    """The RFC 7638 JWK thumbprint (SHA-256, base64url) of a token key: over the members of its
    JWK that say which key it is, and no others."""
    members: tuple[str, ...]
    if isinstance(key, rsa.RSAPublicKey):
        jwk, members = RSAAlgorithm.to_jwk(key, as_dict=True), ("e", "kty", "n")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        jwk, members = ECAlgorithm.to_jwk(key, as_dict=True), ("crv", "kty", "x", "y")
    elif isinstance(key, ed25519.Ed25519PublicKey):
        jwk, members = OKPAlgorithm.to_jwk(key, as_dict=True), ("crv", "kty", "x")
    else:
        raise TokenKeyError(f"expected {EXPECTED}")
    canonical = json.dumps(
        {name: jwk[name] for name in members}, sort_keys=True, separators=(",", ":")
    )
    return (
        base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()
    )


def from_rows(rows: list[dict[str, str]]) -> dict[str, TokenKey]:
    """A tenant's keys by kid, from the `token_keys` column of tenant_token_secrets."""
    return {
        row["kid"]: TokenKey(row["kid"], row["algorithm"], row["public_key"], row["thumbprint"])
        for row in rows
    }


async def add(conn: asyncpg.Connection | asyncpg.Pool, tenant: str, key: TokenKey) -> ListedKey:
    """Register `key` for `tenant` (whose row exists); TokenKeyError when its kid, or the key
    itself, is registered for the tenant already."""
    try:
        row = await conn.fetchrow(
            query("token_key_add"), tenant, key.kid, key.algorithm, key.public_key, key.thumbprint
        )
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == SAME_KEY_CONSTRAINT:
            kid = await conn.fetchval(query("token_key_of_thumbprint"), tenant, key.thumbprint)
            raise TokenKeyError(f"this key is registered already, as kid {kid!r}") from None
        raise TokenKeyError(
            f"tenant {tenant!r} has a key with kid {key.kid!r} already; choose another --kid "
            "(or --remove that one first)"
        ) from None
    return ListedKey(row["kid"], row["algorithm"], row["added_at"])


async def list_keys(conn: asyncpg.Connection | asyncpg.Pool, tenant: str) -> list[ListedKey]:
    rows = await conn.fetch(query("token_key_list"), tenant)
    return [ListedKey(row["kid"], row["algorithm"], row["added_at"]) for row in rows]


async def remove(conn: asyncpg.Connection | asyncpg.Pool, tenant: str, kid: str) -> bool:
    """Remove a key: its tokens are refused, and their streams closed, from the next refresh of
    each server's cache on. False when the tenant has no such key."""
    removed: str | None = await conn.fetchval(query("token_key_remove"), tenant, kid)
    return removed is not None
