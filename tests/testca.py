"""A certificate authority made for a test with `cryptography`: a root and a signing
certificate under it, written as the PKCS#12 file PRESSROOM_SIGNING_KEY names, and on demand
a timestamp authority's certificate under the same root."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PASSWORD = "test-signing-password"


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Pressroom Test"),
        ]
    )


@dataclasses.dataclass(frozen=True)
class TestCA:
    root: x509.Certificate
    leaf: x509.Certificate
    p12: Path
    password: str
    root_key: ec.EllipticCurvePrivateKey

    def tsa(self) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
        """A timestamp authority's certificate and key (RSA: pyHanko's test stamper signs with
        RSA only) under this root."""
        now = dt.datetime.now(dt.UTC)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("Pressroom Test TSA"))
            .issuer_name(self.root.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.root_key.public_key()),
                critical=False,
            )
            .sign(self.root_key, hashes.SHA256())
        )
        return cert, key


def make(folder: Path, *, valid_days: float = 30, expired: bool = False) -> TestCA:
    """A root CA and a signing certificate under it (expired a day ago with `expired`)."""
    now = dt.datetime.now(dt.UTC)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = (
        x509.CertificateBuilder()
        .subject_name(_name("Pressroom Test Root"))
        .issuer_name(_name("Pressroom Test Root"))
        .public_key(root_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=2))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(root_key.public_key()), critical=False
        )
        .sign(root_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    start = now - dt.timedelta(days=2 if expired else 1)
    end = now - dt.timedelta(days=1) if expired else now + dt.timedelta(days=valid_days)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("Pressroom Test Signer"))
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=True,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False
        )
        .sign(root_key, hashes.SHA256())
    )
    p12 = folder / ("expired.p12" if expired else "signing.p12")
    p12.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"pressroom", key, leaf, [root], BestAvailableEncryption(PASSWORD.encode())
        )
    )
    return TestCA(root, leaf, p12, PASSWORD, root_key)
