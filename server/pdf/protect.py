"""The protection steps: AES-256 encryption (pikepdf, when the document is written) and a
PAdES signature (pyHanko), the last step of all, added as an incremental update so that
everything before it (a PDF/A's metadata, an encryption) stays as it was.

Runs in a finishing process (server/pdf/finishing.py); the passwords reach it from the worker,
which holds them only for the attempt (server/pipeline/vault.py).
"""

from __future__ import annotations

import asyncio
import functools
import io

import pikepdf
from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter
from pyhanko.pdf_utils.metadata.model import VENDOR
from pyhanko.pdf_utils.text import TextBoxStyle
from pyhanko.sign import fields, signers, timestamps
from pyhanko.sign.general import SigningError
from pyhanko.stamp import TextStampStyle

from server.errors import PermanentError, TransientError
from server.options.finishing import Encrypt, Sign
from server.pdf.stamps import font_path
from server.signkey import SigningKey, SigningKeyError

TSA_TIMEOUT_S = 10
#: What each `allow` name lets a reader with the user password do (pikepdf's permissions).
_PERMISSIONS = {
    "print": ("print_lowres",),
    "print_high": ("print_lowres", "print_highres"),
    "copy": ("extract",),
    "modify": ("modify_other",),
    "annotate": ("modify_annotation",),
    "fill_forms": ("modify_form",),
    "extract_accessibility": ("accessibility",),
    "assemble": ("modify_assembly",),
}


def encryption(encrypt: Encrypt) -> pikepdf.Encryption:
    """How pikepdf writes the document: AES-256 (revision 6) with the job's passwords."""
    allowed = {name for permission in encrypt.allow for name in _PERMISSIONS[permission]}
    permissions = pikepdf.Permissions(
        **{name: name in allowed for names in _PERMISSIONS.values() for name in names}
    )
    return pikepdf.Encryption(
        owner=encrypt.owner_password,
        user=encrypt.user_password,
        R=6,
        aes=True,
        metadata=True,
        allow=permissions,
    )


@functools.lru_cache(maxsize=2)
def _signer(key: SigningKey) -> signers.SimpleSigner:
    """The key and chain, read once per finishing process."""
    password = key.password.encode() if key.password else None
    signer = signers.SimpleSigner.load_pkcs12(  # type: ignore[no-untyped-call]
        str(key.path), passphrase=password
    )
    if not isinstance(signer, signers.SimpleSigner):
        raise PermanentError("PRESSROOM_SIGNING_KEY cannot be opened")
    return signer


def before_signing(pdf: pikepdf.Pdf) -> None:
    """Name pyHanko as the producer in the document information and the XMP alike: pyHanko
    appends its name to the one and replaces the other with it, and a PDF/A needs both to say
    the same."""
    pdf.docinfo["/Producer"] = VENDOR
    if "/Metadata" in pdf.Root:
        with pdf.open_metadata(set_pikepdf_as_editor=False, update_docinfo=False) as meta:
            meta["pdf:Producer"] = VENDOR


def sign(data: bytes, sign: Sign, key: SigningKey, owner_password: str | None) -> bytes:
    """`data` signed: PAdES B-B, or B-T with the timestamp authority of the key's settings.
    `owner_password` opens an encrypted document for the signature."""
    try:
        key.check()
    except SigningKeyError as exc:
        raise PermanentError(f"cannot sign: {exc}") from None
    return asyncio.run(_sign(data, sign, key, owner_password))


async def _sign(data: bytes, sign: Sign, key: SigningKey, owner_password: str | None) -> bytes:
    writer = IncrementalPdfFileWriter(io.BytesIO(data), strict=False)
    if owner_password is not None:
        writer.encrypt(owner_password)  # type: ignore[no-untyped-call]
    spec = None
    if sign.visible is not None:
        if sign.visible.page > writer.root["/Pages"]["/Count"]:
            raise PermanentError(
                f"sign.visible.page is {sign.visible.page}, and the PDF has fewer pages"
            )
        x1, y1, x2, y2 = (round(value) for value in sign.visible.box)
        spec = fields.SigFieldSpec(sign.field, on_page=sign.visible.page - 1, box=(x1, y1, x2, y2))
    metadata = signers.PdfSignatureMetadata(
        field_name=sign.field,
        reason=sign.reason,
        location=sign.location,
        contact_info=sign.contact,
        subfilter=fields.SigSeedSubFilter.PADES,
        md_algorithm="sha256",
    )
    stamp_style = None
    if sign.visible is not None:
        stamp_style = TextStampStyle(
            stamp_text="Signed by %(signer)s\n%(ts)s", text_box_style=_text_box_style()
        )
    timestamper = (
        timestamps.HTTPTimeStamper(key.tsa_url, timeout=TSA_TIMEOUT_S) if key.tsa_url else None
    )
    signer = _signer(key)
    pdf_signer = signers.PdfSigner(
        metadata,
        signer=signer,
        timestamper=timestamper,
        stamp_style=stamp_style,
        new_field_spec=spec,
    )
    out = io.BytesIO()
    try:
        await pdf_signer.async_sign_pdf(writer, output=out)
    except SigningError as exc:
        if key.tsa_url and "timestamp" in str(exc).lower():
            raise TransientError(f"the timestamp authority did not answer: {exc}") from None
        raise PermanentError(f"cannot sign: {exc}") from None
    except OSError as exc:  # the timestamp authority is out of reach
        raise TransientError(f"the timestamp authority did not answer: {exc}") from None
    return out.getvalue()


@functools.lru_cache(maxsize=1)
def _text_box_style() -> TextBoxStyle:
    # DejaVu Sans embedded: a PDF/A stays one with a visible signature. (The OpenType engine
    # is imported only for a visible signature: it loads HarfBuzz.)
    from pyhanko.pdf_utils.font.opentype import GlyphAccumulatorFactory

    return TextBoxStyle(font=GlyphAccumulatorFactory(str(font_path())), font_size=9)
