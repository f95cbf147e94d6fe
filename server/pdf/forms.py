"""AcroForm fields: listed (GET /v1/assets/{id}/fields, and the check of `fill_form` at
submission), filled from a job's data, and flattened into the pages' content, with pikepdf's
form API (its appearance streams: what a reader shows is what the field holds)."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping
from typing import Any

import pikepdf
from pikepdf.form import (
    CheckboxField,
    ChoiceField,
    DefaultAppearanceStreamGenerator,
    Form,
    RadioButtonGroup,
    SignatureField,
    TextField,
)

from server.errors import PermanentError
from server.pdf import join


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field of a form: its fully qualified name, kind, value and the values it takes
    (server/schemas/assets.py's FormField, as GET /v1/assets/{id}/fields shows it)."""

    name: str
    kind: str
    value: str | bool | None
    options: tuple[str, ...] = ()
    read_only: bool = False

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.kind,
            "value": self.value,
            "options": list(self.options),
            "read_only": self.read_only,
        }


class UnusablePdf(Exception):
    """A PDF that cannot be an input: encrypted, or not a PDF qpdf can read."""


@dataclasses.dataclass(frozen=True, slots=True)
class Inspected:
    """What submission and the fields route read of an uploaded PDF."""

    pages: int
    title: str | None
    fields: tuple[Field, ...]


def inspect(data: bytes) -> Inspected:
    """The page count, title and form fields of `data`; UnusablePdf says why it cannot be used."""
    pdf = open_input(data)
    with pdf:
        title = pdf.docinfo.get("/Title")
        return Inspected(
            len(pdf.pages), str(title) if title is not None else None, tuple(fields(pdf))
        )


def open_input(data: bytes) -> pikepdf.Pdf:
    """An uploaded PDF opened for reading or finishing; UnusablePdf when it is encrypted (even
    one that opens without a password: its owner restricted changes) or unreadable."""
    try:
        pdf = pikepdf.open(io.BytesIO(data))
    except pikepdf.PasswordError:
        raise UnusablePdf("is encrypted with a password: upload it without one") from None
    except pikepdf.PdfError as exc:
        raise UnusablePdf(f"is not a PDF that can be read ({join.reason(exc)})") from None
    if pdf.is_encrypted:
        pdf.close()
        raise UnusablePdf(
            "is encrypted (its owner restricts changes): upload it without encryption"
        )
    return pdf


def fields(pdf: pikepdf.Pdf) -> list[Field]:
    """The document's form fields, in the form's order (none when it has no form)."""
    if "/AcroForm" not in pdf.Root:
        return []
    found = []
    for name, field in Form(pdf).items():
        found.append(_describe(name, field))
    return found


def _describe(name: str, field: Any) -> Field:
    read_only = bool(getattr(field, "is_read_only", False))
    if isinstance(field, TextField):
        return Field(name, "text", str(field.value), read_only=read_only)
    if isinstance(field, CheckboxField):
        return Field(name, "checkbox", bool(field.checked), read_only=read_only)
    if isinstance(field, RadioButtonGroup):
        # In the order of its buttons (pikepdf's states come from a set).
        states = tuple(dict.fromkeys(str(o.on_value).lstrip("/") for o in field.options))
        chosen = str(field.value).lstrip("/") if field.value is not None else None
        return Field(name, "radio", None if chosen == "Off" else chosen, states, read_only)
    if isinstance(field, ChoiceField):
        options = tuple(str(o.export_value) for o in field.options)
        value = field.value
        return Field(name, "choice", None if value is None else str(value), options, read_only)
    if isinstance(field, SignatureField):
        return Field(name, "signature", None, read_only=read_only)
    return Field(name, "button", None, read_only=read_only)


def unknown(names: Mapping[str, Any], known: list[Field]) -> list[str]:
    """The names in `names` that are not fields of the form `known`."""
    have = {field.name for field in known}
    return [name for name in names if name not in have]


def fill(pdf: pikepdf.Pdf, values: Mapping[str, Any]) -> None:
    """Set each named field to its value (a text field takes text or a number, a checkbox a
    boolean, a choice or a radio group one of its options), with appearance streams made.
    PermanentError names a field the form lacks or a value the field cannot take."""
    known = fields(pdf)
    missing = unknown(values, known)
    if missing:
        have = ", ".join(f.name for f in known) or "none"
        raise PermanentError(f"fill_form: the PDF has no field {missing[0]!r} (its fields: {have})")
    form = Form(pdf, DefaultAppearanceStreamGenerator)
    for name, value in values.items():
        _set(name, form[name], value)


def _set(name: str, field: Any, value: Any) -> None:
    where = f"fill_form: the field {name!r}"
    if isinstance(field, CheckboxField):
        if not isinstance(value, bool):
            raise PermanentError(f"{where} is a checkbox: its value must be true or false")
        field.checked = value
        return
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PermanentError(f"{where} takes text, and its value is {type(value).__name__}")
    text = str(value)
    if isinstance(field, TextField):
        field.value = text
    elif isinstance(field, RadioButtonGroup | ChoiceField):
        described = _describe(name, field)
        if text not in described.options:
            choices = ", ".join(described.options)
            raise PermanentError(f"{where} takes one of {choices}, not {text!r}")
        if isinstance(field, RadioButtonGroup):
            field.value = pikepdf.Name("/" + text)
        else:
            field.value = text
    else:
        raise PermanentError(f"{where} is a {_describe(name, field).kind} and cannot be filled")


def flatten(pdf: pikepdf.Pdf) -> None:
    """Form fields and annotations drawn into the pages' content: no field is left to edit."""
    if "/AcroForm" in pdf.Root:
        pdf.generate_appearance_streams()
    pdf.flatten_annotations("all")
