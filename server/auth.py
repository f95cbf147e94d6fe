"""Signatures for download URLs and subscription tokens (HMAC-SHA256 over the server secret)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time


def _mac(secret: str, message: str) -> str:
    digest = hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_download(secret: str, job_id: str, expires: int) -> str:
    """The signature that lets anyone holding the URL download one job's PDF until `expires`."""
    return _mac(secret, f"download:{job_id}:{expires}")


def check_download(secret: str, job_id: str, expires: str, signature: str) -> bool:
    """True when the signature matches and has not expired."""
    try:
        expires_at = int(expires)
    except ValueError:
        return False
    if expires_at < time.time():
        return False
    return hmac.compare_digest(sign_download(secret, job_id, expires_at), signature)
