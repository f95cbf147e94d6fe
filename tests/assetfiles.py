"""Files for asset tests, made here: a PNG of one colour and size, a font of its own name."""

from __future__ import annotations

import functools
import hashlib
import io
import struct
import zlib

from fontTools.fontBuilder import FontBuilder
from fontTools.pens.ttGlyphPen import TTGlyphPen

FONT_FAMILY = "PressroomBrandTest"
FONT_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def asset_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def png(rgb: tuple[int, int, int], width: int = 8, height: int = 8) -> bytes:
    """A truecolour PNG filled with one colour (its size tells it apart in a PDF)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


@functools.cache
def font() -> bytes:
    """A TrueType font named FONT_FAMILY: every letter a box, no system font is like it."""
    glyphs = [".notdef", "space", *FONT_LETTERS]
    builder = FontBuilder(1000, isTTF=True)
    builder.setupGlyphOrder(glyphs)
    builder.setupCharacterMap({ord(" "): "space", **{ord(ch): ch for ch in FONT_LETTERS}})
    outlines = {}
    for name in glyphs:
        pen = TTGlyphPen(None)
        if name != "space":
            pen.moveTo((100, 0))
            pen.lineTo((100, 700))
            pen.lineTo((500, 700))
            pen.lineTo((500, 0))
            pen.closePath()
        outlines[name] = pen.glyph()
    builder.setupGlyf(outlines)
    builder.setupHorizontalMetrics({name: (600, 100) for name in glyphs})
    builder.setupHorizontalHeader(ascent=800, descent=-200)
    builder.setupNameTable(
        {"familyName": FONT_FAMILY, "styleName": "Regular", "psName": f"{FONT_FAMILY}-Regular"}
    )
    builder.setupOS2(sTypoAscender=800, sTypoDescender=-200, usWinAscent=800, usWinDescent=200)
    builder.setupPost()
    out = io.BytesIO()
    builder.save(out)
    return out.getvalue()
