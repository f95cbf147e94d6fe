"""A batch's bodies: many documents in one call, each a job with a stable business key, and
the batch as GET /v1/batches/{id} shows it."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from server.options import RenderOptions
from server.options.finishing import Sign
from server.queue.jobs import JobState
from server.schemas.common import QUERY, REQUEST, Channel, Limit, WebhookUrl
from server.schemas.jobs import JobRequest
from server.schemas.listing import Cursor

MAX_BATCH_ITEMS = 1000
MAX_KEY_CHARS = 200


class _ItemKey(BaseModel):
    model_config = REQUEST

    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)] = Field(
        description="The item's stable business key: one job per key and tenant."
    )

    @model_validator(mode="before")
    @classmethod
    def _count(cls, data: Any, info: ValidationInfo) -> Any:
        # Items are validated in order: this counter is the index of the item being validated.
        if info.context is not None:
            info.context["item"] = info.context.get("item", -1) + 1
        return data

    @field_validator("key", mode="before")
    @classmethod
    def _printable_once(cls, key: Any, info: ValidationInfo) -> Any:
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS or not key.isprintable():
            raise ValueError(f"must be a string of 1 to {MAX_KEY_CHARS} printable characters")
        if info.context is not None:
            first = info.context.setdefault("keys", {}).setdefault(key, info.context["item"])
            if first != info.context["item"]:
                raise ValueError(f"{key!r} is also the key of items[{first}]")
        return key


class BatchItem(JobRequest, _ItemKey):
    """A job, plus its stable business key."""

    @field_validator("options")
    @classmethod
    def _joinable(cls, options: RenderOptions | None, info: ValidationInfo) -> Any:
        # BatchRequest.combine is validated before the items and says so in the context.
        if options is not None and options.image and (info.context or {}).get("combine"):
            raise ValueError(
                f"the batch joins its items' PDFs (combine), and this item makes an image "
                f"(output {options.output!r})"
            )
        return options


class CombineOptions(BaseModel):
    """How a batch's items are joined into one PDF."""

    model_config = REQUEST

    outline: bool = Field(
        True,
        description="One outline entry (bookmark) per item, titled with its key, at its first "
        "page; the item's own outline (options.outline) goes below it.",
    )
    sign: Sign | None = Field(
        None,
        description="Sign the combined file, as options.sign signs a job's. The items' own "
        "signatures cover their own files only and are left out of it.",
    )


def _combine(value: Any, info: ValidationInfo) -> Any:
    if value is True:
        value = {}
    elif value is False or value is None:
        return None
    if not isinstance(value, dict):
        raise PydanticCustomError(
            "combine_type", 'must be true, false or an object such as {"outline": false}'
        )
    if info.context is not None:
        info.context["combine"] = True
    return value


def _boolean_too(schema: dict[str, Any]) -> None:
    schema["anyOf"].insert(0, {"type": "boolean"})


def _joined_items_print_pdfs(schema: dict[str, Any]) -> None:
    """With combine, every item prints a PDF (see BatchItem._joinable)."""
    pdf = {"anyOf": [{"type": "null"}, {"properties": {"output": {"enum": [None, "pdf"]}}}]}
    no_combine = {"properties": {"combine": {"enum": [None, False]}}}
    pdf_items = {"properties": {"items": {"items": {"properties": {"options": pdf}}}}}
    schema["dependentSchemas"] = {"combine": {"anyOf": [no_combine, pdf_items]}}


class BatchRequest(BaseModel):
    """Many documents in one call; an item without webhook_url or channel takes the batch's."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra=_joined_items_print_pdfs
    )

    webhook_url: WebhookUrl | None = Field(None, description="Where to POST the items' events.")
    channel: Channel | None = Field(
        None, description="The batch's channel (its events are on it), and its items'."
    )
    combine: Annotated[CombineOptions | None, BeforeValidator(_combine)] = Field(
        None,
        description="Join the items' PDFs, in item order, into one file once every item is "
        "done (combined, on GET and in batch.done): true, or how. Every item must print a "
        "PDF, not an image.",
        json_schema_extra=_boolean_too,
    )
    items: Annotated[list[BatchItem], Field(min_length=1, max_length=MAX_BATCH_ITEMS)] = Field(
        description="The documents, one job per key."
    )


class BatchCounts(BaseModel):
    queued: int = Field(description="Items queued.")
    running: int = Field(description="Items running.")
    done: int = Field(description="Items done.")
    failed: int = Field(description="Items failed.")
    cancelled: int = Field(description="Items cancelled.")


class BatchItemSummary(BaseModel):
    key: str = Field(description="The item's key.")
    job_id: uuid.UUID = Field(description="Its job.")
    status: JobState = Field(description="Its job's state.")
    error: str | None = Field(None, description="Its job's last error.")
    pages: int | None = Field(None, description="Pages, once done.")
    url: str | None = Field(None, description="Signed download URL, once done.")
    cached_from: uuid.UUID | None = Field(
        None,
        description="The job that rendered its file, for an item served from the render cache "
        "(cache); null for one that rendered its own.",
    )


class BatchLinks(BaseModel):
    self: str = Field(description="The batch.")
    events: str = Field(description="The stream its progress events come on.")
    pdf: str | None = Field(None, description="The combined PDF once done (a batch with combine).")


class BatchCombined(BaseModel):
    """The one PDF of a batch with combine: its items' PDFs joined in item order."""

    status: Literal["pending", "running", "done", "failed"] = Field(
        description="pending until every item is done and the join starts; failed when an "
        "item failed or was cancelled (retrying it joins again) or the join itself failed."
    )
    outline: bool = Field(description="One outline entry per item, titled with its key.")
    signed: bool = Field(False, description="Whether it is signed (combine.sign).")
    attempts: Annotated[int, Field(ge=0)] = Field(description="Joins started.")
    error: str | None = Field(description="Why it failed: the item's key and error, or the join's.")
    pages: int | None = Field(description="Pages, once done.")
    bytes: int | None = Field(description="Size of the file, once done.")
    finished_at: dt.datetime | None = Field(description="Done or failed at.")
    url: str | None = Field(None, description="Signed, expiring download URL (once done).")


class Batch(BaseModel):
    id: uuid.UUID = Field(description="The batch's id.")
    status: Literal["running", "done"] = Field(
        description="done once every item is final and, with combine, the join is over."
    )
    total: int = Field(description="Items.")
    counts: BatchCounts = Field(description="Items by state.")
    progress: Annotated[int, Field(ge=0, le=100)] = Field(description="Percent final.")
    webhook_url: str | None = Field(description="The batch's webhook URL.")
    channel: str | None = Field(description="The batch's channel, as submitted.")
    created_at: dt.datetime = Field(description="Submitted at.")
    finished_at: dt.datetime | None = Field(
        description="When the last item finished (with combine: when the join ended)."
    )
    combined: BatchCombined | None = Field(description="The combined PDF (null without combine).")
    items: list[BatchItemSummary] = Field(description="In submission order.")
    links: BatchLinks = Field(description="What can be done with it.")


class BatchListQuery(BaseModel):
    """GET /v1/batches: the page."""

    model_config = QUERY

    limit: Limit = Field(50, description="Batches per page.")
    cursor: Cursor | None = Field(None, description="next_cursor of the previous page.")


class BatchSummary(BaseModel):
    """A batch as the list shows it: the batch without its items."""

    id: uuid.UUID = Field(description="The batch's id.")
    status: Literal["running", "done"] = Field(description="As the batch's own.")
    total: int = Field(description="Items.")
    counts: BatchCounts = Field(description="Items by state.")
    progress: Annotated[int, Field(ge=0, le=100)] = Field(description="Percent final.")
    webhook_url: str | None = Field(description="The batch's webhook URL.")
    channel: str | None = Field(description="The batch's channel, as submitted.")
    created_at: dt.datetime = Field(description="Submitted at.")
    finished_at: dt.datetime | None = Field(description="As the batch's own.")
    combined: BatchCombined | None = Field(description="The combined PDF (null without combine).")
    links: BatchLinks = Field(description="What can be done with it.")


class BatchList(BaseModel):
    items: list[BatchSummary] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")
