"""The signing key (PRESSROOM_SIGNING_KEY, a PKCS#12 file, and its password): read and checked
at start, where a key that cannot be opened stops the server with one clear line, and again by
/readyz, which reports a key that has become unreadable or whose certificate has expired.
Reading it is `cryptography`'s; signing with it is pyHanko's (server/pdf/protect.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from cryptography.hazmat.primitives.serialization import pkcs12


class SigningKeyError(ValueError):
    """The key cannot be used; the message says why, naming the variables."""


@dataclasses.dataclass(frozen=True, slots=True)
class SigningKey:
    """Where the key is and how to open it; what /readyz and the signing step read."""

    path: Path
    password: str | None = dataclasses.field(repr=False)
    tsa_url: str | None = None

    def check(self, *, now: dt.datetime | None = None, expiry: bool = True) -> dt.datetime:
        """The certificate's expiry; SigningKeyError when the file cannot be read or opened,
        holds no key and certificate, or (with `expiry`) the certificate is not valid now."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise SigningKeyError(
                f"PRESSROOM_SIGNING_KEY={str(self.path)!r} cannot be read: {exc.strerror or exc}"
            ) from None
        password = self.password.encode() if self.password else None
        try:
            key, cert, _chain = pkcs12.load_key_and_certificates(data, password)
        except (ValueError, TypeError):
            raise SigningKeyError(
                f"PRESSROOM_SIGNING_KEY_PASSWORD does not open PRESSROOM_SIGNING_KEY="
                f"{str(self.path)!r} (a wrong password, or not a PKCS#12 file)"
            ) from None
        if key is None or cert is None:
            raise SigningKeyError(
                f"PRESSROOM_SIGNING_KEY={str(self.path)!r} holds no private key and certificate"
            )
        now = now or dt.datetime.now(dt.UTC)
        if not expiry:
            return cert.not_valid_after_utc
        if cert.not_valid_after_utc <= now:
            raise SigningKeyError(
                f"the signing certificate expired at {cert.not_valid_after_utc.isoformat()}"
            )
        if cert.not_valid_before_utc > now:
            raise SigningKeyError(
                f"the signing certificate is valid from {cert.not_valid_before_utc.isoformat()}"
            )
        return cert.not_valid_after_utc
