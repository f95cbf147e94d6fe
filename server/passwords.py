"""A job's PDF passwords (options.encrypt): taken out of the options it is shown with, sealed
with PRESSROOM_SECRET for the worker, and put back only for the finishing step.

The job's options keep `user_password` and `owner_password` as `***`, so every route, stream,
webhook and log line that shows the options shows them redacted. The values are sealed with
AES-GCM under a key derived from PRESSROOM_SECRET, bound to the job's id (a sealed value moved
to another job does not open), and kept in `jobs.passwords`, a column no route reads, which
the database erases when the job reaches a final state (0015_job_passwords.sql). The design is
the one server/vault.py follows for cookie and header values.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import uuid
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from server.errors import PermanentError
from server.finish_options import REDACTED
from server.options import RenderOptions

_FORMAT = b"\x01"  # the first byte of a sealed value: its layout, should it ever change
_NONCE_BYTES = 12
_FIELDS = ("user_password", "owner_password")


@functools.lru_cache(maxsize=8)
def _cipher(secret: str) -> AESGCM:
    # A key of its own: nothing sealed here is a valid signature, token or other secret.
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"pressroom.pdf-passwords"
    ).derive(secret.encode())
    return AESGCM(key)


def hide(
    options: RenderOptions, *, secret: str, job_id: uuid.UUID
) -> tuple[RenderOptions, bytes | None]:
    """The options as shown (passwords redacted) and the passwords sealed; None without
    encrypt."""
    encrypt = options.encrypt
    if encrypt is None:
        return options, None
    values = {name: getattr(encrypt, name) for name in _FIELDS}
    shown = {name: REDACTED for name, value in values.items() if value}
    return (
        options.model_copy(update={"encrypt": encrypt.model_copy(update=shown)}),
        seal(values, secret=secret, job_id=job_id),
    )


def reveal(
    options: RenderOptions, sealed: bytes | None, *, secret: str, job_id: uuid.UUID
) -> RenderOptions:
    """The options with their passwords back, for the finishing step only."""
    encrypt = options.encrypt
    if encrypt is None:
        return options
    if sealed is None:
        raise PermanentError(
            "the job's PDF passwords were erased when it ended; submit it again to retry it"
        )
    values = unseal(sealed, secret=secret, job_id=job_id)
    if set(values) != set(_FIELDS) or not all(isinstance(v, str) for v in values.values()):
        raise PermanentError("the job's PDF passwords do not match its options")
    return options.model_copy(update={"encrypt": encrypt.model_copy(update=values)})


def fingerprinted(body: Any, *, secret: str) -> Any:
    """A job body as its fingerprint is taken (Idempotency-Key, batch item keys): passwords
    replaced by a hash keyed with PRESSROOM_SECRET, so that the fingerprint, kept after the
    job, is no digest of a password that could be guessed at."""
    options = body.get("options") if isinstance(body, dict) else None
    if not isinstance(options, dict) or not isinstance(options.get("encrypt"), dict):
        return body
    encrypt: dict[str, Any] = options["encrypt"]

    def keyed(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        return hmac.new(secret.encode(), value.encode(), hashlib.sha256).hexdigest()

    hidden = {**encrypt, **{name: keyed(encrypt[name]) for name in _FIELDS if name in encrypt}}
    return {**body, "options": {**options, "encrypt": hidden}}


def seal(values: dict[str, Any], *, secret: str, job_id: uuid.UUID) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    plain = json.dumps(values, separators=(",", ":")).encode()
    return _FORMAT + nonce + _cipher(secret).encrypt(nonce, plain, job_id.bytes)


def unseal(sealed: bytes, *, secret: str, job_id: uuid.UUID) -> dict[str, Any]:
    if sealed[:1] != _FORMAT:
        raise PermanentError("the job's PDF passwords are stored in an unknown form")
    nonce, body = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
    try:
        plain = _cipher(secret).decrypt(nonce, body, job_id.bytes)
    except InvalidTag:
        raise PermanentError(
            "the job's PDF passwords cannot be opened (was PRESSROOM_SECRET changed?)"
        ) from None
    values: dict[str, Any] = json.loads(plain)
    return values
