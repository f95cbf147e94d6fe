"""Word templates: a .docx whose text carries Jinja placeholders, loops and conditions in
docxtpl's convention (`{{ name }}`, `{% if %}`, `{%tr for %}` for table rows, `{%p if %}` for
paragraphs), filled with a job's data by docxtpl in the sandbox and budget of HTML templates
(server/render/sandbox.py, server/render/templates.py), off the event loop. LibreOffice then
converts the filled file like any Office file (server/render/office.py).

An image is placed where the template prints a data value of the form
`{"image": REF, "width_mm": 40, "height_mm": 20}` (REF an image asset's id, or a path of the
job's `assets`; either size optional: one alone keeps the image's proportions, none is its own
size).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import io
import re
import threading
import zipfile
from collections.abc import Mapping
from typing import Any

from server.errors import PermanentError
from server.files import office_formats
from server.files.assets import Asset, is_id
from server.render import templates
from server.render.limits import Budget

IMAGE = "image"
IMAGE_SIZES = ("width_mm", "height_mm")
#: The image types Word (and python-docx, which places them) reads.
IMAGE_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF"}
MAX_IMAGE_MM = 2000
#: How much of a paragraph an error quotes.
QUOTE_CHARS = 80
_LINE = re.compile(r" on line (\d+)")
_TAG = re.compile(r"<[^>]+>")

Path = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ImageValue:
    """An image a job's data asks for: where it is in the data, and what it names."""

    path: Path
    ref: str
    width_mm: float | None
    height_mm: float | None

    @property
    def where(self) -> str:
        return written(self.path)


def written(path: Path, root: str = "data") -> str:
    """A data path as an error names it: data.items[2].photo."""
    text = root
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else f".{key}"
    return text


def images(data: Any, root: str = "data") -> tuple[list[ImageValue], list[tuple[str, str]]]:
    """The image values of `data` (objects with an `image` key), and the problems of those
    written wrong, each with its data path (under `root`)."""
    found: list[ImageValue] = []
    problems: list[tuple[str, str]] = []
    pending: list[tuple[Path, Any]] = [((), data)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, list):
            pending.extend(((*path, i), item) for i, item in enumerate(value))
        elif isinstance(value, dict) and IMAGE in value:
            image, why = _image(path, value)
            if image is not None:
                found.append(image)
            else:
                problems.append((written(path, root), why))
        elif isinstance(value, dict):
            pending.extend(((*path, key), item) for key, item in value.items())
    found.sort(key=lambda image: image.where)
    return found, sorted(problems)


def _image(path: Path, value: dict[str, Any]) -> tuple[ImageValue | None, str]:
    ref = value[IMAGE]
    if not isinstance(ref, str) or not ref:
        return None, "image must be an image asset's id or a path of the job's assets"
    extra = sorted(key for key in value if key != IMAGE and key not in IMAGE_SIZES)
    if extra:
        return None, (
            f"an image takes {IMAGE}, {' and '.join(IMAGE_SIZES)} only; {extra[0]!r} is not one"
        )
    sizes: list[float | None] = []
    for name in IMAGE_SIZES:
        size = value.get(name)
        if size is not None and (
            isinstance(size, bool)
            or not isinstance(size, int | float)
            or not 0 < size <= MAX_IMAGE_MM
        ):
            return None, f"{name} must be a number of millimetres above 0, at most {MAX_IMAGE_MM}"
        sizes.append(None if size is None else float(size))
    return ImageValue(path, ref, sizes[0], sizes[1]), ""


def image_asset(image: ImageValue, mapped: Mapping[str, str]) -> str | None:
    """The asset id an image names: itself, or the one its path in `assets` maps to."""
    return image.ref if is_id(image.ref) else mapped.get(image.ref)


def image_problems(
    data: Any, mapped: Mapping[str, str], known: Mapping[str, Asset], root: str = "data"
) -> list[tuple[str, str]]:
    """What is wrong with the images `data` asks for, by data path (under `root`): written
    wrong, unknown, or not an image Word takes."""
    found, problems = images(data, root)
    kinds = ", ".join(IMAGE_TYPES.values())
    for image in found:
        asset_id = image_asset(image, mapped)
        if asset_id is None:
            why = (
                f"{image.ref!r} is neither an asset id nor a path of assets: give the id POST "
                "/v1/assets answered, or map the path in assets"
            )
        elif (asset := known.get(asset_id)) is None:
            why = f"no asset {asset_id}: upload it with POST /v1/assets"
        elif asset.content_type not in IMAGE_TYPES:
            why = f"the asset {asset_id} is {asset.content_type}: a Word template places {kinds}"
        else:
            continue
        problems.append((f"{written(image.path, root)}.{IMAGE}", why))
    return problems


# --- filling ----------------------------------------------------------------------------------


def _where(document: Any, source: str) -> str:
    """Which part of the document docxtpl is rendering, in words."""
    if not source.startswith("<"):
        return "its document properties"
    part = str(getattr(document.current_rendering_part, "partname", "")).lstrip("/")
    if part == "word/document.xml":
        return "its body"
    for kind in ("header", "footer", "footnotes"):
        if kind in part:
            return f"its {kind} ({part})"
    return part or "its body"


def _described(message: str, name: str, where: str, source: str) -> str:
    """A template error about the XML docxtpl made of a part, told by the text of the
    paragraph it is on (docxtpl starts a line at each paragraph) instead of its line number."""
    line = _LINE.search(message)
    if line is None:
        return f"{name}: {message} ({where})"
    lines = source.splitlines()
    number = int(line.group(1))
    text = _TAG.sub("", lines[number - 1]).strip() if 0 < number <= len(lines) else ""
    if len(text) > QUOTE_CHARS:
        text = text[: QUOTE_CHARS - 1] + "…"
    shown = message[: line.start()] + message[line.end() :]
    at = f" at “{text}”" if text else ""
    return f"{name}: {shown}{at} ({where})"


class _Part:
    """A part docxtpl renders, in the sandbox, under the fill's budget."""

    def __init__(self, fill: _Fill, source: str, where: str) -> None:
        self._fill, self._source, self._where = fill, source, where

    def render(self, context: dict[str, Any]) -> str:
        try:
            return templates.render(self._source, context, budget=self._fill.budget)
        except _Unplaceable:
            raise
        except PermanentError as exc:
            message = _described(str(exc), self._fill.name, self._where, self._source)
            raise PermanentError(message) from None


class _Verbatim:
    """A part checked for syntax and left as written (a dry run of docxtpl's steps)."""

    def __init__(self, source: str) -> None:
        self._source = source

    def render(self, context: dict[str, Any]) -> str:
        return self._source


class _Fill:
    """The Jinja environment docxtpl is given: its from_string compiles in the sandbox. When
    `checking`, each part is only checked for syntax (_Invalid says why)."""

    def __init__(self, document: Any, name: str, budget: Budget, *, checking: bool = False):
        self.document, self.name, self.budget, self.checking = document, name, budget, checking

    def from_string(self, source: str) -> _Part | _Verbatim:
        where = _where(self.document, source)
        if self.checking:
            problem = templates.check(source)
            if problem is not None:
                raise _Invalid(_described(problem, self.name, where, source))
            return _Verbatim(source)
        return _Part(self, source, where)


class _Invalid(Exception):
    """A Word template that does not compile; the message says where and why."""


class _Unplaceable(PermanentError):
    """An image python-docx cannot place; the message names it by its data path."""


def _open(template: bytes, name: str) -> Any:
    """The docxtpl document of these bytes; PermanentError when they are not a readable .docx."""
    # Imported here: docxtpl loads python-docx and lxml, which only Word templates need.
    from docxtpl import DocxTemplate

    found = office_formats.detect(template)
    if found is not office_formats.DOCX:
        what = "not an Office file" if found is None else found.label
        raise PermanentError(
            f"{name} is {what} by its content: a Word template is a Word document (.docx)"
        )
    document = DocxTemplate(io.BytesIO(template))
    try:
        document.init_docx()
    except (ValueError, KeyError, zipfile.BadZipFile, SyntaxError) as exc:
        # lxml's XMLSyntaxError is a SyntaxError.
        raise PermanentError(f"{name} cannot be read as a Word document: {exc}") from None
    return document


def _placed(
    data: dict[str, Any], document: Any, name: str, files: Mapping[str, tuple[str, bytes]]
) -> dict[str, Any]:
    """`data` with each image value in it made a picture docxtpl places where it is printed."""
    found, problems = images(data)
    if problems:
        raise PermanentError(f"{name}: {problems[0][0]}: {problems[0][1]}")
    if not found:
        return data
    from docx.shared import Mm
    from docxtpl import InlineImage

    class Picture(InlineImage):  # type: ignore[misc]  # docxtpl has no type hints
        def __init__(self, image: ImageValue, data: bytes) -> None:
            width = None if image.width_mm is None else Mm(image.width_mm)
            height = None if image.height_mm is None else Mm(image.height_mm)
            super().__init__(document, io.BytesIO(data), width=width, height=height)
            self.image = image

        def _insert_image(self) -> str:
            self.image_descriptor.seek(0)
            try:
                placed: str = super()._insert_image()
            except Exception as exc:  # python-docx's image errors have no common base
                why = str(exc) or f"its bytes are not a readable image ({type(exc).__name__})"
                raise _Unplaceable(
                    f"{name}: the image at {self.image.where} cannot be placed: {why}"
                ) from None
            return placed

    filled = copy.deepcopy(data)
    for image in found:
        mapped = image.ref if image.ref in files else None
        if mapped is None:
            raise PermanentError(f"{name}: the image at {image.where} ({image.ref}) is not stored")
        owner: Any = filled
        for key in image.path[:-1]:
            owner = owner[key]
        owner[image.path[-1]] = Picture(image, files[mapped][1])
    return filled


def _fill(
    template: bytes,
    name: str,
    data: dict[str, Any],
    files: Mapping[str, tuple[str, bytes]],
    budget: Budget,
) -> bytes:
    document = _open(template, name)
    context = _placed(data, document, name, files)
    try:
        document.render(context, jinja_env=_Fill(document, name, budget))
        out = io.BytesIO()
        document.save(out)
    except PermanentError:
        raise
    except Exception as exc:  # docxtpl and python-docx on a file of the client's: its fault
        raise PermanentError(
            f"{name} cannot be filled as a Word template: {type(exc).__name__}: {exc}"
        ) from None
    return out.getvalue()


async def fill(
    template: bytes,
    name: str,
    data: dict[str, Any],
    files: Mapping[str, tuple[str, bytes]],
    *,
    timeout_s: float,
) -> bytes:
    """The Word template `name` (its bytes) filled with `data`, its images from `files` (path
    or id → (content type, bytes)), in a worker thread within `timeout_s`; every failure is a
    PermanentError naming the file."""
    budget = Budget(timeout_s)
    try:
        return await asyncio.to_thread(_fill, template, name, data, files, budget)
    finally:
        # A cancelled job stops its thread at the template's next step.
        budget.cancelled = True


# --- checking at submission -------------------------------------------------------------------

#: Answers by asset id (its content's hash, so an answer never goes stale), the oldest dropped.
_checked: collections.OrderedDict[tuple[str, str], str | None] = collections.OrderedDict()
_checked_lock = threading.Lock()
CHECKED_SIZE = 256


def _check(template: bytes, name: str) -> str | None:
    try:
        document = _open(template, name)
        document.render({}, jinja_env=_Fill(document, name, Budget(None), checking=True))
    except _Invalid as exc:
        return str(exc)
    except PermanentError as exc:
        return str(exc)
    except Exception as exc:  # as _fill: a file of the client's, refused rather than a 500
        return f"{name} cannot be filled as a Word template: {type(exc).__name__}: {exc}"
    return None


async def check(template: bytes, name: str, asset_id: str) -> str | None:
    """Why the Word template `name` cannot be filled (not a .docx, unreadable, a Jinja syntax
    error, told by where it is), or None; read in a worker thread, answers kept by asset id."""
    key = (asset_id, name)  # the answer names the file
    if key in _checked:
        return _checked[key]
    problem = await asyncio.to_thread(_check, template, name)
    with _checked_lock:
        _checked[key] = problem
        while len(_checked) > CHECKED_SIZE:
            _checked.popitem(last=False)
    return problem
