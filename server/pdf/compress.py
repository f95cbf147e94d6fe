"""The `compress` step: images stored once however often they recur, optionally downsampled to
a resolution, unused resources dropped, and the file written with object streams.

An image's resolution is the one it is shown at: its pixels over the size the page draws it
(the current transformation matrix at its `Do`, through any form XObjects), the largest where
it is drawn more than once. An image drawn nowhere a page's content reaches (a pattern, an
annotation) is left as it is, as are masks, images with a colour key and indexed colours.
"""

from __future__ import annotations

import hashlib
import io
import math
import zlib
from collections.abc import Iterator

import pikepdf
from pikepdf import Name
from PIL import Image

from server.options.finishing import Compress

#: Where the image is drawn: a page's or a form XObject's resources, and the name it has there.
_Use = tuple[pikepdf.Dictionary, str]


def save_arguments() -> dict[str, object]:
    """What pikepdf's save takes to write a compressed file."""
    return {
        "object_stream_mode": pikepdf.ObjectStreamMode.generate,
        "compress_streams": True,
    }


def compress(pdf: pikepdf.Pdf, options: Compress) -> None:
    """Deduplicate the images, downsample those shown above `options.image_dpi`, drop what no
    page uses (the file is then written with save_arguments())."""
    deduplicate(pdf)
    if options.image_dpi is not None:
        downsample(pdf, options.image_dpi, options.jpeg_quality)
    pdf.remove_unreferenced_resources()


def deduplicate(pdf: pikepdf.Pdf) -> int:
    """Point every use of an image at the first image with the same bytes and dictionary;
    how many uses were pointed elsewhere."""
    first: dict[bytes, pikepdf.Object] = {}
    moved = 0
    for resources, name in _image_uses(pdf):
        image = resources.XObject[name]
        key = _fingerprint(image)
        kept = first.setdefault(key, image)
        if kept.objgen != image.objgen:
            resources.XObject[name] = kept
            moved += 1
    return moved


def _fingerprint(image: pikepdf.Object) -> bytes:
    digest = hashlib.sha256(image.read_raw_bytes())
    for key in sorted(image.keys()):
        if key == "/Length":
            continue
        value = image[key]
        if key == "/SMask" and isinstance(value, pikepdf.Stream):
            digest.update(b"/SMask" + _fingerprint(value))
        else:
            digest.update(key.encode() + repr(value).encode())
    return digest.digest()


def _image_uses(pdf: pikepdf.Pdf) -> Iterator[_Use]:
    """Every (resources, name) naming an image, on the pages and in their form XObjects."""
    seen: set[tuple[int, int]] = set()
    pending = [page.obj.get("/Resources") for page in pdf.pages]
    while pending:
        resources = pending.pop()
        if not isinstance(resources, pikepdf.Dictionary):
            continue
        if resources.is_indirect:
            if resources.objgen in seen:
                continue
            seen.add(resources.objgen)
        xobjects = resources.get("/XObject")
        if not isinstance(xobjects, pikepdf.Dictionary):
            continue
        for name in list(xobjects.keys()):
            xobject = xobjects[name]
            if not isinstance(xobject, pikepdf.Stream):
                continue
            if xobject.get("/Subtype") == Name.Image:
                yield resources, name
            elif xobject.get("/Subtype") == Name.Form and xobject.objgen not in seen:
                seen.add(xobject.objgen)
                pending.append(xobject.get("/Resources"))


def shown_dpi(pdf: pikepdf.Pdf) -> dict[tuple[int, int], float]:
    """Each drawn image (by object) and the highest resolution any page shows it at."""
    found: dict[tuple[int, int], float] = {}
    for page in pdf.pages:
        _walk(page.obj, pikepdf.Matrix(), found, depth=0)
    return found


def _walk(
    owner: pikepdf.Object,
    ctm: pikepdf.Matrix,
    found: dict[tuple[int, int], float],
    depth: int,
) -> None:
    if depth > 8:  # forms drawing forms: deep enough for real documents, bounded for loops
        return
    resources = owner.get("/Resources")
    xobjects = resources.get("/XObject") if isinstance(resources, pikepdf.Dictionary) else None
    if not isinstance(xobjects, pikepdf.Dictionary):
        return
    stack: list[pikepdf.Matrix] = []
    current = ctm
    for instruction in pikepdf.parse_content_stream(owner, "q Q cm Do"):
        if not isinstance(instruction, pikepdf.ContentStreamInstruction):
            continue
        operands, op = instruction.operands, str(instruction.operator)
        if op == "q":
            stack.append(current)
        elif op == "Q":
            current = stack.pop() if stack else ctm
        elif op == "cm":
            current = pikepdf.Matrix(*(float(v) for v in operands)) @ current
        elif op == "Do":
            xobject = xobjects.get(str(operands[0]))
            if not isinstance(xobject, pikepdf.Stream):
                continue
            if xobject.get("/Subtype") == Name.Image:
                dpi = _dpi(xobject, current)
                key = xobject.objgen
                found[key] = max(found.get(key, 0.0), dpi)
            elif xobject.get("/Subtype") == Name.Form:
                matrix = xobject.get("/Matrix")
                inner = pikepdf.Matrix(*(float(v) for v in matrix)) if matrix else pikepdf.Matrix()
                _walk(xobject, inner @ current, found, depth + 1)


def _dpi(image: pikepdf.Stream, ctm: pikepdf.Matrix) -> float:
    """Pixels per inch along the image's sides, the lower of the two (points: 72 an inch)."""
    width_pt = math.hypot(ctm.a, ctm.b)
    height_pt = math.hypot(ctm.c, ctm.d)
    if width_pt <= 0 or height_pt <= 0:
        return 0.0
    return min(int(image.Width) * 72 / width_pt, int(image.Height) * 72 / height_pt)


def downsample(pdf: pikepdf.Pdf, dpi: int, quality: int) -> int:
    """Resample each image shown above `dpi` to `dpi`; how many were resampled."""
    resampled = 0
    done: set[tuple[int, int]] = set()
    shown = shown_dpi(pdf)
    for resources, name in _image_uses(pdf):
        image = resources.XObject[name]
        key = image.objgen
        if not isinstance(image, pikepdf.Stream) or key in done or shown.get(key, 0.0) <= dpi:
            continue
        done.add(key)
        if _resample(image, dpi / shown[key], quality):
            resampled += 1
    return resampled


def _resample(image: pikepdf.Stream, factor: float, quality: int) -> bool:
    if image.get("/ImageMask") or "/Mask" in image or "/Decode" in image:
        return False
    mask = image.get("/SMask")
    try:
        picture = pikepdf.PdfImage(image).as_pil_image()
        alpha = pikepdf.PdfImage(mask).as_pil_image() if isinstance(mask, pikepdf.Stream) else None
    except (pikepdf.PdfError, NotImplementedError, ValueError, OSError):
        return False  # a colour space or filter Pillow cannot decode: leave it
    if picture.mode not in ("RGB", "L") or (alpha is not None and alpha.mode != "L"):
        return False
    size = (max(1, round(picture.width * factor)), max(1, round(picture.height * factor)))
    smaller = picture.resize(size, Image.Resampling.LANCZOS)
    if image.get("/Filter") == Name.DCTDecode:
        out = io.BytesIO()
        smaller.save(out, format="JPEG", quality=quality, optimize=True)
        _replace(image, out.getvalue(), Name.DCTDecode, smaller)
    else:
        _replace(image, zlib.compress(smaller.tobytes(), 6), Name.FlateDecode, smaller)
    if alpha is not None and isinstance(mask, pikepdf.Stream):
        shrunk = alpha.resize(size, Image.Resampling.LANCZOS)
        _replace(mask, zlib.compress(shrunk.tobytes(), 6), Name.FlateDecode, shrunk)
    return True


def _replace(image: pikepdf.Stream, data: bytes, filter: Name, picture: Image.Image) -> None:
    image.write(data, filter=filter)
    image.ColorSpace = Name.DeviceRGB if picture.mode == "RGB" else Name.DeviceGray
    image.Width, image.Height, image.BitsPerComponent = picture.width, picture.height, 8
    if "/DecodeParms" in image:
        del image["/DecodeParms"]
