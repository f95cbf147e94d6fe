"""Token keys for tests: key pairs of each type a tenant's backend may sign tokens with, the
tokens it mints (PyJWT), and forged ones PyJWT will not make (HS256 keyed with a PEM)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

#: The JWT algorithm of each generated key type.
ALGORITHM = {"rsa": "RS256", "ec": "ES256", "ed25519": "EdDSA"}


def private_key(kind: str) -> PrivateKeyTypes:
    """A fresh private key: "rsa" (2048 bits), "ec" (P-256) or "ed25519"."""
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if kind == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    assert kind == "ed25519", kind
    return ed25519.Ed25519PrivateKey.generate()


def public_pem(key: PrivateKeyTypes | PublicKeyTypes) -> bytes:
    """The SubjectPublicKeyInfo PEM of a key (of a private key's public half)."""
    public = key.public_key() if hasattr(key, "public_key") else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def private_pem(key: PrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def claims(tenant: str, scope: dict[str, Any], ttl_s: int = 600) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": tenant, "iat": now, "exp": now + ttl_s, "pressroom": scope}


def mint(
    key: PrivateKeyTypes,
    tenant: str,
    scope: dict[str, Any],
    *,
    kid: str | None,
    algorithm: str | None = None,
    ttl_s: int = 600,
) -> str:
    """What a tenant's backend does: a token signed with its private key, `kid` in its header."""
    alg = algorithm or ALGORITHM[kind_of(key)]
    headers = {} if kid is None else {"kid": kid}
    return jwt.encode(claims(tenant, scope, ttl_s), key, algorithm=alg, headers=headers)  # type: ignore[arg-type]


def kind_of(key: PrivateKeyTypes) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return "rsa"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return "ec"
    return "ed25519"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def hs256_by_hand(header: dict[str, Any], body: dict[str, Any], secret: bytes) -> str:
    """An HS256 JWT keyed with any bytes: the forgery that uses a public key's PEM as the HMAC
    secret, which PyJWT refuses to make."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", **header}).encode())
    signing_input = f"{head}.{_b64(json.dumps(body).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"
