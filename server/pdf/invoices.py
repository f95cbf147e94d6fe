"""Factur-X / ZUGFeRD invoices: the XML checked against its official schema, and the XMP
metadata (with the Factur-X extension schema) that a Factur-X PDF carries. Both are the
`factur-x` package's; the API checks the XML at submission (an invalid one is a 422 naming the
first error) and the finishing step again before it embeds it (server/pdf/archive.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import facturx
from lxml import etree

from server.errors import PermanentError

FILENAME = "factur-x.xml"
MIME_TYPE = "text/xml"
#: Profiles whose XML is the invoice itself (its legal content): the PDF is its alternative
#: rendering. MINIMUM and BASIC WL carry data only.
ALTERNATIVE_PROFILES = ("basic", "en16931", "extended")


@dataclasses.dataclass(frozen=True, slots=True)
class Invoice:
    """A checked Factur-X XML."""

    xml: bytes
    profile: str  # minimum, basicwl, basic, en16931, extended

    @property
    def relationship(self) -> str:
        """Its AFRelationship in the PDF."""
        return "Alternative" if self.profile in ALTERNATIVE_PROFILES else "Data"

    def xmp(self, info: Mapping[str, str]) -> bytes:
        """An XMP packet declaring a PDF/A-3b Factur-X invoice of this profile, with the
        document information `info` (title, author, subject)."""
        data: bytes = facturx.generate_xmp_bytes("factur-x", self.profile, None, dict(info))
        return data


def check(xml: bytes, profile: str | None) -> Invoice:
    """The XML as a Factur-X invoice of `profile` (or of the profile it names); PermanentError
    with the first problem: not XML, not Factur-X, another profile, or what the schema says."""
    try:
        tree = etree.fromstring(
            xml, parser=etree.XMLParser(resolve_entities=False, no_network=True)
        )
    except etree.XMLSyntaxError as exc:
        raise PermanentError(f"is not well-formed XML: {exc}") from None
    try:
        flavor = facturx.get_flavor(tree)
    except Exception:
        flavor = None
    if flavor not in ("factur-x", "facturx"):
        raise PermanentError("is not a Factur-X (CrossIndustryInvoice) XML")
    try:
        named = facturx.get_level(tree, "factur-x")
    except Exception as exc:
        raise PermanentError(f"names no Factur-X profile: {_first_line(exc)}") from None
    if profile is not None and named != profile:
        raise PermanentError(f"names the profile {named}, not {profile}")
    try:
        facturx.xml_check_xsd(tree, flavor="factur-x", level=named)
    except Exception as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise PermanentError(f"does not follow the Factur-X {named} schema: {cause}") from None
    return Invoice(xml, named)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
