"""A job's secrets, its cookie and header values and its PDF passwords (options.encrypt): taken
out of the options it is shown with, sealed with PRESSROOM_SECRET (settings.secret) for the
worker, and put back only for Chromium and the finishing step.

The job's options keep each cookie and header with its value replaced by `***`, and each PDF
password as `***`, so every route, stream, webhook and log line that shows the options shows
them redacted. The values are sealed with AES-GCM under a key derived from PRESSROOM_SECRET,
bound to the job's id (a sealed value moved to another job does not open), and kept in
`jobs.secrets`, a column no route reads; the database erases it when the job reaches a final
state (0012_job_sources.sql).
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
from server.options import RenderOptions

REDACTED = "***"
_PASSWORDS = ("user_password", "owner_password")
_FORMAT = b"\x01"  # the first byte of a sealed value: its layout, should it ever change
_NONCE_BYTES = 12


@functools.lru_cache(maxsize=8)
def _cipher(secret: str) -> AESGCM:
    # A key of its own: nothing sealed here is a valid signature or token elsewhere.
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"pressroom.job-secrets"
    ).derive(secret.encode())
    return AESGCM(key)


def hide(
    options: RenderOptions, *, secret: str, job_id: uuid.UUID
) -> tuple[RenderOptions, bytes | None]:
    """The options as shown (cookie and header values and PDF passwords redacted) and the
    values sealed; None when there are none (every job but a page_url job with cookies or
    headers and a job with encrypt)."""
    encrypt = options.encrypt
    if not options.cookies and not options.headers and encrypt is None:
        return options, None
    cookies = options.cookies or []
    headers = options.headers or {}
    values: dict[str, Any] = {
        "cookies": [cookie.value for cookie in cookies],
        "headers": dict(headers),
    }
    update: dict[str, Any] = {
        "cookies": [c.model_copy(update={"value": REDACTED}) for c in cookies] or None,
        "headers": dict.fromkeys(headers, REDACTED) or None,
    }
    if encrypt is not None:
        passwords = {name: getattr(encrypt, name) for name in _PASSWORDS}
        values["encrypt"] = passwords
        hidden = {name: REDACTED for name, value in passwords.items() if value}
        update["encrypt"] = encrypt.model_copy(update=hidden)
    shown = options.model_copy(update=update)
    return shown, seal(values, secret=secret, job_id=job_id)


def reveal(
    options: RenderOptions, sealed: bytes, *, secret: str, job_id: uuid.UUID
) -> RenderOptions:
    """The options with their cookie and header values back, for the renderer only, and their
    PDF passwords, for the finishing step."""
    values = unseal(sealed, secret=secret, job_id=job_id)
    cookies = options.cookies or []
    headers = options.headers or {}
    cookie_values, header_values = values.get("cookies"), values.get("headers")
    if (
        not isinstance(cookie_values, list)
        or not isinstance(header_values, dict)
        or len(cookie_values) != len(cookies)
        or set(header_values) != set(headers)
    ):
        raise PermanentError("the job's cookies and headers do not match its options")
    update: dict[str, Any] = {
        "cookies": [
            c.model_copy(update={"value": value})
            for c, value in zip(cookies, cookie_values, strict=True)
        ]
        or None,
        "headers": header_values or None,
    }
    if options.encrypt is not None:
        passwords = values.get("encrypt")
        if not isinstance(passwords, dict) or set(passwords) != set(_PASSWORDS):
            raise PermanentError("the job's PDF passwords do not match its options")
        update["encrypt"] = options.encrypt.model_copy(update=passwords)
    return options.model_copy(update=update)


def fingerprinted(body: Any, *, secret: str) -> Any:
    """A validated job body as its fingerprint is taken (Idempotency-Key, batch item keys):
    cookie and header values and PDF passwords replaced by a hash keyed with PRESSROOM_SECRET,
    so that the fingerprint, kept after the job, is no digest of a secret that could be
    guessed at."""
    options = body.get("options") if isinstance(body, dict) else None
    if not isinstance(options, dict):
        return body
    encrypt = options.get("encrypt")
    if not (options.get("cookies") or options.get("headers") or isinstance(encrypt, dict)):
        return body

    def keyed(value: str) -> str:
        return hmac.new(secret.encode(), value.encode(), hashlib.sha256).hexdigest()

    hidden = dict(options)
    if options.get("cookies") or options.get("headers"):
        hidden["cookies"] = [
            {**c, "value": keyed(c["value"])} for c in options.get("cookies") or ()
        ]
        hidden["headers"] = {
            name: keyed(value) for name, value in (options.get("headers") or {}).items()
        }
    if isinstance(encrypt, dict):
        hidden["encrypt"] = {
            **encrypt,
            **{
                name: keyed(encrypt[name])
                for name in _PASSWORDS
                if isinstance(encrypt.get(name), str)
            },
        }
    return {**body, "options": hidden}


def seal(values: dict[str, Any], *, secret: str, job_id: uuid.UUID) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    plain = json.dumps(values, separators=(",", ":")).encode()
    return _FORMAT + nonce + _cipher(secret).encrypt(nonce, plain, job_id.bytes)


def unseal(sealed: bytes, *, secret: str, job_id: uuid.UUID) -> dict[str, Any]:
    if sealed[:1] != _FORMAT:
        raise PermanentError("the job's cookies and headers are stored in an unknown form")
    nonce, body = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
    try:
        plain = _cipher(secret).decrypt(nonce, body, job_id.bytes)
    except InvalidTag:
        raise PermanentError(
            "the job's cookies and headers cannot be opened (was PRESSROOM_SECRET changed?)"
        ) from None
    values: dict[str, Any] = json.loads(plain)
    return values
