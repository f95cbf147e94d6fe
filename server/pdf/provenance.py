"""Provenance and reproducible bytes: what made a PDF, in its XMP metadata and on its job, and
a file that is the same, byte for byte, whenever the same inputs make it.

What made it: Pressroom's version, the engine and its version, the stored template
(name@version) if any, the SHA-256 of the job's data (its JSON with sorted keys and no
spaces, so the same values hash alike however they were written) and of each asset (an asset
id is the SHA-256 of its bytes), and the finishing steps, in the order they run. The XMP holds
them in a namespace of Pressroom's own (NAMESPACE, prefix `pressroom`); a PDF/A declares that
namespace in a PDF/A extension schema, as PDF/A wants of every property outside the standard
schemas (Factur-X does the same for its own).

Reproducible: Chromium writes the time of printing into the document information (CreationDate,
ModDate), the only bytes of its PDF that change from one print of a page to the next, and no
document ID. The dates are removed (from the XMP too: Factur-X's library writes the time into
it), not replaced by the job's times, which differ between two jobs of the same inputs; the
job keeps its own times (created_at, finished_at). The document ID is a digest of the file's
contents (qpdf's deterministic one when the file is written whole). So the same template
version, data, options, assets and engine give the same file (an attachment is dated when its
asset was uploaded, PDF/A's sRGB profile has a fixed date, a stamp's resources fixed names).
Not so for an encrypted PDF (AES-256 draws a fresh key salt and IVs each time, and qpdf derives
no ID without them), nor a signed one (the signature holds its time).

The XMP is written in the pass the PDF goes through anyway: the finishing steps' single write
(server/pdf/finishing.py) when the job has any, before PDF/A reads the metadata and before the
signature, which covers it; otherwise one pass of its own (`seal`), which also sets the
document information the options ask for. That pass appends the new information and the XMP to
the printed file as an incremental update (server/pdf/update.py: about 0.3 ms for a one-page
PDF here, against 1 ms to write it whole through qpdf); the information it supersedes stays in
the file with its dates blanked, so the bytes still depend on the inputs alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import json
import re
from typing import Any
from xml.sax.saxutils import escape

import pikepdf
from lxml import etree

from server.options import RenderOptions
from server.options.values import FINISHED_BY
from server.pdf import docinfo, update

NAMESPACE = "https://pressroom.dev/ns/provenance/1.0/"
PREFIX = "pressroom"
_RDF = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
_EXTENSION = "http://www.aiim.org/pdfa/ns/extension/"
_SCHEMA = "http://www.aiim.org/pdfa/ns/schema#"
_PROPERTY = "http://www.aiim.org/pdfa/ns/property#"
_DATES = ("xmp:CreateDate", "xmp:ModifyDate", "xmp:MetadataDate")
#: Each XMP property, its PDF/A value type, and what it holds.
PROPERTIES = {
    "Version": ("Text", "The version of Pressroom that made the PDF"),
    "Engine": ("Text", "The engine that printed the PDF, and its version"),
    "Template": ("Text", "The stored template, as name@version (absent: none)"),
    "DataSHA256": ("Text", "SHA-256 of the job's data as sorted, compact JSON"),
    "Assets": ("seq Text", "Each asset the job used: its path or option, then its SHA-256"),
    "Finishing": ("seq Text", "The finishing steps, in the order they ran"),
}
#: Finishing steps by the options that ask for them, in the order they run (FINISHED_BY is
#: that order but for the metadata step, which also runs for title, author, subject, keywords).
_STEP_ORDER = ("select_pages", "rotate", "fill_form", "flatten", "metadata", "stamp",
               "attachments", "facturx", "pdfa", "compress", "encrypt", "sign")  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Provenance:
    """What made one PDF (see the module's text)."""

    pressroom: str
    engine: str
    template: str | None
    data_sha256: str
    #: By the page's path (assets), or the option that names it: sha256:… (its id).
    assets: dict[str, str]
    finishing: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """As the job shows it (`provenance`)."""
        return {
            "pressroom": self.pressroom,
            "engine": self.engine,
            "template": self.template,
            "data_sha256": self.data_sha256,
            "assets": dict(self.assets),
            "finishing": list(self.finishing),
        }


def data_sha256(data: Any) -> str:
    """The SHA-256 (hex) of the job's data as sorted, compact JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def steps(options: RenderOptions) -> tuple[str, ...]:
    """The finishing steps the options ask for, in the order they run."""
    asked = {name for name in FINISHED_BY if getattr(options, name) not in (None, False)}
    if options.document_info():
        asked.add("metadata")
    if options.facturx is not None:
        asked.add("pdfa")  # a Factur-X invoice is a PDF/A-3b
    return tuple(step for step in _STEP_ORDER if step in asked)


def page_assets(assets: dict[str, Any] | None) -> dict[str, str]:
    """The job's page files (its `assets`: path → {"id", "content_type"}) by path → id."""
    return {
        path: str(entry["id"] if isinstance(entry, dict) else entry)
        for path, entry in (assets or {}).items()
    }


def finishing_assets(options: RenderOptions) -> dict[str, str]:
    """The assets the finishing options name, by the option that names each."""
    named: dict[str, str] = {}
    if options.stamp is not None and options.stamp.asset is not None:
        named["options.stamp.asset"] = options.stamp.asset
    for index, attachment in enumerate(options.attachments or ()):
        named[f"options.attachments[{index}].asset"] = attachment.asset
    if options.facturx is not None:
        named["options.facturx.xml"] = options.facturx.xml
    return named


def write(pdf: pikepdf.Pdf, provenance: Provenance, *, pdfa: bool) -> None:
    """Record `provenance` in the document's XMP and take the dates of printing out of it and
    of the document information; with `pdfa`, declare the namespace as PDF/A wants."""
    for name in ("/CreationDate", "/ModDate"):
        if name in pdf.docinfo:
            del pdf.docinfo[name]
    if "/Metadata" not in pdf.Root and not pdfa:
        # Chromium's PDF has no XMP: the packet is written out whole, a third of the cost of
        # this pass through pikepdf's XMP editor (about 1.4 ms of 2.2 per one-page PDF here).
        pdf.Root.Metadata = pdf.make_stream(_packet(provenance), Type=pikepdf.Name.Metadata)
        pdf.Root.Metadata.Subtype = pikepdf.Name.XML
        return
    pikepdf.models.PdfMetadata.register_xml_namespace(NAMESPACE, PREFIX)
    with pdf.open_metadata(set_pikepdf_as_editor=False, update_docinfo=False) as meta:
        for key in _DATES:
            if key in meta:
                del meta[key]
        meta[f"{PREFIX}:Version"] = provenance.pressroom
        meta[f"{PREFIX}:Engine"] = provenance.engine
        if provenance.template is not None:
            meta[f"{PREFIX}:Template"] = provenance.template
        meta[f"{PREFIX}:DataSHA256"] = provenance.data_sha256
        if provenance.assets:
            meta[f"{PREFIX}:Assets"] = [f"{k} {v}" for k, v in sorted(provenance.assets.items())]
        if provenance.finishing:
            meta[f"{PREFIX}:Finishing"] = list(provenance.finishing)
    if pdfa:
        _declare(pdf)


def _packet(provenance: Provenance) -> bytes:
    """A whole XMP packet holding `provenance` and nothing else."""
    fields = {
        "Version": provenance.pressroom,
        "Engine": provenance.engine,
        "Template": provenance.template,
        "DataSHA256": provenance.data_sha256,
    }
    lists = {
        "Assets": [f"{k} {v}" for k, v in sorted(provenance.assets.items())],
        "Finishing": list(provenance.finishing),
    }
    body = "".join(
        f"<{PREFIX}:{name}>{escape(value)}</{PREFIX}:{name}>"
        for name, value in fields.items()
        if value is not None
    )
    body += "".join(
        f"<{PREFIX}:{name}><rdf:Seq>"
        + "".join(f"<rdf:li>{escape(item)}</rdf:li>" for item in items)
        + f"</rdf:Seq></{PREFIX}:{name}>"
        for name, items in lists.items()
        if items
    )
    return (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n'
        f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="{_RDF}">'
        f'<rdf:Description rdf:about="" xmlns:{PREFIX}="{NAMESPACE}">{body}</rdf:Description>'
        '</rdf:RDF></x:xmpmeta>\n<?xpacket end="w"?>'
    ).encode()


def read(pdf: pikepdf.Pdf) -> dict[str, Any]:
    """The provenance properties of the document's XMP, by name (Version, Engine, …)."""
    pikepdf.models.PdfMetadata.register_xml_namespace(NAMESPACE, PREFIX)
    meta = pdf.open_metadata()
    return {name: meta[f"{PREFIX}:{name}"] for name in PROPERTIES if f"{PREFIX}:{name}" in meta}


def _declare(pdf: pikepdf.Pdf) -> None:
    """Add Pressroom's namespace to the XMP's PDF/A extension schemas (made if absent)."""
    root = etree.fromstring(pdf.Root.Metadata.read_bytes())
    rdf = root.find(f"{{{_RDF}}}RDF")
    assert rdf is not None
    bag = rdf.find(f"{{{_RDF}}}Description/{{{_EXTENSION}}}schemas/{{{_RDF}}}Bag")
    if bag is None:
        names = {"pdfaExtension": _EXTENSION, "pdfaSchema": _SCHEMA, "pdfaProperty": _PROPERTY}
        description = etree.SubElement(rdf, f"{{{_RDF}}}Description", nsmap=names)
        description.set(f"{{{_RDF}}}about", "")
        bag = etree.SubElement(
            etree.SubElement(description, f"{{{_EXTENSION}}}schemas"), f"{{{_RDF}}}Bag"
        )
    for schema in bag.findall(f"{{{_RDF}}}li"):
        if schema.findtext(f"{{{_SCHEMA}}}namespaceURI") == NAMESPACE:
            return
    item = etree.SubElement(bag, f"{{{_RDF}}}li")
    item.set(f"{{{_RDF}}}parseType", "Resource")
    for tag, text in (("schema", "Pressroom provenance"), ("namespaceURI", NAMESPACE),
                      ("prefix", PREFIX)):  # fmt: skip
        etree.SubElement(item, f"{{{_SCHEMA}}}{tag}").text = text
    listed = etree.SubElement(etree.SubElement(item, f"{{{_SCHEMA}}}property"), f"{{{_RDF}}}Seq")
    for name, (value_type, description) in PROPERTIES.items():
        entry = etree.SubElement(listed, f"{{{_RDF}}}li")
        entry.set(f"{{{_RDF}}}parseType", "Resource")
        for tag, text in (("name", name), ("valueType", value_type), ("category", "internal"),
                          ("description", description)):  # fmt: skip
            etree.SubElement(entry, f"{{{_PROPERTY}}}{tag}").text = text
    packet = etree.tostring(root.getroottree(), encoding="utf-8")
    pdf.Root.Metadata = pdf.make_stream(packet, Type=pikepdf.Name.Metadata)
    pdf.Root.Metadata.Subtype = pikepdf.Name.XML


def save_arguments(options: RenderOptions) -> dict[str, Any]:
    """pikepdf's save() arguments for reproducible bytes: a document ID derived from the
    contents, which qpdf cannot derive for an encrypted file (its ID is random then)."""
    return {} if options.encrypt is not None else {"deterministic_id": True}


def sealed(pdf: bytes, options: RenderOptions, provenance: Provenance) -> bytes:
    """A PDF with no finishing step through its one pass: the document information the options
    ask for, the dates of printing out, the provenance in, a deterministic document ID. As an
    incremental update where the file allows one (server/pdf/update.py), else written whole."""
    with pikepdf.open(io.BytesIO(pdf)) as document:
        docinfo.set_fields(document, options.document_info())
        updated = _appended(pdf, document, provenance)
        if updated is not None:
            return updated
        write(document, provenance, pdfa=False)
        out = io.BytesIO()
        document.save(out, **save_arguments(options))
    return out.getvalue()


#: A date of the document information, as Chromium and LibreOffice write it: a literal string.
_DATE = re.compile(rb"(/(?:CreationDate|ModDate)\s*\()([^()\\]*)(\))")


def _appended(pdf: bytes, document: pikepdf.Pdf, provenance: Provenance) -> bytes | None:
    """`pdf` with the document information of `document` (open on it, its fields set), without
    the dates of printing, and the provenance's XMP, appended as an incremental update; None
    for a file that cannot take one here (the caller writes it whole). The information it
    replaces stays in its place with its dates blanked, so that the bytes depend on the inputs
    alone (the module's text)."""
    file = update.Updatable.of(pdf)
    info = document.trailer.get("/Info")
    if file is None or info is None or not info.is_indirect or "/Metadata" in document.Root:
        return None
    old = file.body(info.objgen[0])
    if old is None or "/Encrypt" in document.trailer:
        return None
    blanked, dates = _DATE.subn(lambda m: m[1] + b" " * len(m[2]) + m[3], pdf[old])
    if dates != pdf[old].count(b"Date"):
        return None  # a date written otherwise: left to the whole write
    for name in ("/CreationDate", "/ModDate"):
        if name in document.docinfo:
            del document.docinfo[name]
    root = document.Root.unparse(resolved=True)
    number = int(document.trailer.Size)
    packet = _packet(provenance)
    changed = {
        info.objgen[0]: document.docinfo.unparse(resolved=True),
        document.Root.objgen[0]: root.removesuffix(b">>") + b" /Metadata %d 0 R>>" % number,
        number: b"<</Type /Metadata /Subtype /XML /Length %d>>\nstream\n%s\nendstream"
        % (len(packet), packet),
    }
    refs = {"Root": document.Root.objgen, "Info": info.objgen}
    trailer = {b"Size": b"%d" % (number + 1)}
    trailer |= {name.encode(): b"%d %d R" % objgen for name, objgen in refs.items()}
    return file.appended(pdf[: old.start] + blanked + pdf[old.stop :], changed, trailer)


async def seal(pdf: bytes, options: RenderOptions, provenance: Provenance) -> bytes:
    """`sealed` off the event loop (CPU work)."""
    return await asyncio.to_thread(sealed, pdf, options, provenance)
