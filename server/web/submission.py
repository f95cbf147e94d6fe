"""What POST /v1/jobs and POST /v1/batches share: the stored templates and assets a body
names (looked up before validation, in one query each), its Factur-X invoices, uploaded PDFs
and Word templates checked, and the NewJob row a validated request becomes."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import asyncpg

import server
from server import options, tracing
from server.errors import PermanentError
from server.files import assets, library
from server.files.assets import Asset, AssetCache, Upload
from server.files.library import Ref, StoredTemplate
from server.options import finishing
from server.options.finishing import data_at, page_order
from server.pipeline import vault
from server.problems import invalid
from server.queue.jobs import NewJob
from server.render import docx
from server.schemas.common import Checks, parse_template_id
from server.schemas.jobs import JobRequest, office_asset


async def templates_named(
    pool: asyncpg.Pool, tenant: str, bodies: Iterable[Any]
) -> dict[Ref, StoredTemplate]:
    """The stored templates these job bodies name with template_id (unknown ones are missing:
    validation reports them with the bodies' other problems)."""
    refs = [
        ref
        for body in bodies
        if isinstance(body, dict) and (ref := parse_template_id(body.get("template_id")))
    ]
    return await library.find(pool, tenant, refs)


class _Stored(Protocol):
    """What the lookup reads of a stored template (files.library.StoredTemplate)."""

    @property
    def assets(self) -> Mapping[str, str]: ...

    @property
    def options(self) -> Mapping[str, Any]: ...

    @property
    def name(self) -> str: ...

    @property
    def docx(self) -> str | None: ...


def _ids(body: Any, word: bool = False) -> list[str]:
    """The asset ids a body (or a stored template) names: in its asset map, as its Office file
    or Word template, in the finishing options (attachments, an image stamp, a Factur-X XML)
    and, for a Word template (`word`), as images in its data."""
    if not isinstance(body, dict):
        return []
    mapped = body.get("assets")
    ids = list(mapped.values()) if isinstance(mapped, dict) else []
    ids += finishing.asset_ids(body.get("options"))
    for source in ("office", "docx"):
        if assets.is_id(file := body.get(source)):
            ids.append(file)
    if word or body.get("docx") is not None:
        ids += [image.ref for image in docx.images(body.get("data"))[0] if assets.is_id(image.ref)]
    pdfs = body.get("pdfs")
    ids += [ref for ref in pdfs if assets.is_id(ref)] if isinstance(pdfs, list) else []
    return [value for value in ids if isinstance(value, str)]


async def assets_named(
    pool: asyncpg.Pool,
    tenant: str,
    bodies: Iterable[Any],
    stored: Iterable[_Stored] = (),
    pending: Iterable[Upload] = (),
) -> dict[str, Asset]:
    """The tenant's assets the bodies and the `stored` templates (their assets and options)
    name, in one query, with `pending` uploads counted as stored; unknown ids are missing, and
    validation reports them."""
    stored = list(stored)
    # Only a Word template's data is read for images: an HTML job's data may be large.
    words = {t.name for t in stored if t.docx is not None}
    ids = [i for body in bodies for i in _ids(body, _template_name(body) in words)]
    ids += [
        i for t in stored for i in _ids({"assets": t.assets, "options": t.options, "docx": t.docx})
    ]
    found = await assets.find(pool, tenant, ids) if ids else {}
    for upload in pending:
        found.setdefault(
            upload.id, Asset(upload.id, upload.size, upload.content_type, dt.datetime.now(dt.UTC))
        )
    return found


def _template_name(body: Any) -> str | None:
    ref = parse_template_id(body.get("template_id")) if isinstance(body, dict) else None
    return ref[0] if ref else None


def new_job(job: JobRequest, tenant: str, checks: Checks, *, cache_default: bool) -> NewJob:
    """The job to insert for a validated request: its source, its options as shown, with
    cookie and header values sealed apart (server/pipeline/vault.py), and its render cache key
    when it uses the cache (as it asks, else as its tenant's default: `cache_default`)."""
    ref = parse_template_id(job.template_id)
    source, text = "template", job.template
    stored = checks.templates[ref] if ref else None
    if stored is not None:
        text = stored.html
    elif job.page_url is not None:
        source, text = "page_url", job.page_url
    elif job.markdown is not None:
        source, text = "markdown", job.markdown
    paths = job.assets
    if job.pdfs is not None:
        # In the asset map, under its path or its id, so DELETE /v1/assets keeps it meanwhile.
        source, text = "pdfs", json.dumps([_part(ref) for ref in job.pdfs])
        paths = {**job.assets, **{ref: ref for ref in job.pdfs if assets.is_id(ref)}}
    if job.office is not None:
        # Its file is the job's one asset, under its path or its id: the name its errors give.
        source, text = "office", job.office
        paths = {job.office: office_asset(job.office, job.assets) or job.office}
    word = _word_template(job, checks)
    if word is not None:
        # The file under its name (a stored version's: name@version.docx), the images the data
        # names by id under their ids, so DELETE /v1/assets keeps them meanwhile.
        source, (text, asset_id) = "docx", word
        found, _ = docx.images(job.data)
        images = {image.ref: image.ref for image in found if assets.is_id(image.ref)}
        paths = {**job.assets, **images, text: asset_id}
    assert text is not None  # JobRequest requires one source
    job_assets = assets.job_assets(paths, checks.assets)
    cache_key = None
    if job.uses_cache(cache_default):
        cache_key = render_cache_key(
            {
                "source": source,
                "text": text,
                "template": [stored.name, stored.version] if stored else None,
                "data": job.data,
                "options": job.options.model_dump(exclude_defaults=True) if job.options else {},
                "assets": job_assets,
            },
            secret=checks.settings.secret,
        )
    job_id = uuid.uuid4()
    shown, sealed = job.options, None
    if shown is not None:
        shown, sealed = vault.hide(shown, secret=checks.settings.secret, job_id=job_id)
    return NewJob(
        tenant=tenant,
        template=text,
        data=job.data,
        options=options.to_json(shown) if shown else {},
        metadata=job.metadata,
        channel=job.channel,
        max_attempts=job.max_attempts or checks.settings.max_attempts,
        priority=job.priority,
        webhook_url=job.webhook_url,
        run_at=job.run_at,
        assets=job_assets,
        id=job_id,
        source=source,
        secrets=sealed,
        traceparent=tracing.traceparent(),  # the request's span: the job's attempts go under it
        template_name=stored.name if stored else None,
        template_version=stored.version if stored else None,
        cache_key=cache_key,
    )


def render_cache_key(made_of: dict[str, Any], *, secret: str) -> str:
    """The render cache's key of a job: what makes its PDF (its source's text, stored template,
    data, options, assets by id) and Pressroom's version, as sorted compact JSON, hashed with
    HMAC-SHA256 keyed with PRESSROOM_SECRET: cookie and header values and passwords count, and
    the key kept on the job is no digest of them that could be guessed at."""
    text = json.dumps(
        {**made_of, "pressroom": server.version()},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=_plain,
    )
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def _plain(value: Any) -> Any:
    """An option's value as the cache key reads it: a secret's own value, else its text."""
    reveal = getattr(value, "get_secret_value", None)
    return reveal() if callable(reveal) else str(value)


def _word_template(job: JobRequest, checks: Checks) -> tuple[str, str] | None:
    """A Word template job's file: its name and asset id (None for another job)."""
    if job.docx is not None:
        return job.docx, office_asset(job.docx, job.assets) or job.docx
    ref = parse_template_id(job.template_id)
    stored = checks.templates[ref] if ref else None
    if stored is None or stored.docx is None:
        return None
    return stored.docx_name, stored.docx


async def check_docx(
    cache: AssetCache,
    tenant: str,
    jobs: list[JobRequest],
    checks: Checks,
    pending: Iterable[Upload] = (),
    prefix: str = "",
) -> None:
    """422 naming what keeps each Word template job from being filled: an image its data names
    that is unknown or not an image Word takes (by data path), a Jinja syntax error in an
    uploaded template (read off the event loop; a stored one was checked when stored), a stored
    template's file no longer stored, an image output."""
    problems: list[tuple[str, str]] = []
    uploads = {upload.id: upload.data for upload in pending}
    for index, job in enumerate(jobs):
        word = _word_template(job, checks)
        if word is None:
            continue
        where = prefix.format(index=index)
        name, asset_id = word
        problems += [
            (f"{where}{f}", m) for f, m in docx.image_problems(job.data, job.assets, checks.assets)
        ]
        if job.docx is None:  # a stored version
            if job.options is not None and job.options.image:
                problems.append(
                    (f"{where}options.output", "a Word template becomes a PDF: leave it out")
                )
            if asset_id not in checks.assets:
                problems.append(
                    (
                        f"{where}template_id",
                        f"the Word file of {name} ({asset_id}) is no longer stored: store a "
                        "new version of the template",
                    )
                )
            continue
        try:
            data = uploads.get(asset_id) or await cache.get(tenant, asset_id)
        except FileNotFoundError:
            problems.append((f"{where}docx", f"the bytes of {name} are gone: upload it again"))
            continue
        if (problem := await docx.check(data, name, asset_id)) is not None:
            problems.append((f"{where}docx", problem))
    if problems:
        raise invalid(problems, "The Word template cannot be filled.")


def _part(ref: str) -> dict[str, str]:
    """A `pdfs` job's file as its row keeps it: its path in the asset map and the title of its
    outline entry (a file name without .pdf; empty for an id: the PDF's own title)."""
    title = "" if assets.is_id(ref) else ref.rpartition("/")[2].removesuffix(".pdf")
    return {"path": ref, "title": title}


async def check_pdfs(
    cache: AssetCache,
    tenant: str,
    jobs: list[JobRequest],
    pending: Iterable[Upload] = (),
    prefix: str = "",
) -> None:
    """422 naming each uploaded PDF a `pdfs` job cannot use (encrypted, unreadable), a page
    `select_pages` names past the end of its files, a `fill_form` field they lack, and a
    `fill_form` data path the job's data lacks (read off the event loop)."""
    problems: list[tuple[str, str]] = []
    uploads = {upload.id: upload.data for upload in pending}
    for index, job in enumerate(jobs):
        where = prefix.format(index=index)
        given = job.options
        filling = given.fill_form.fields if given is not None and given.fill_form else {}
        for name, path in filling.items():
            try:
                data_at(job.data, path)
            except ValueError as exc:
                problems.append((f"{where}options.fill_form.fields.{name}", str(exc)))
        if job.pdfs is None:
            continue
        # Imported here: pikepdf loads with the first pdfs job, not with the API.
        from server.pdf import forms

        read: list[forms.Inspected] = []
        for number, ref in enumerate(job.pdfs):
            asset_id = ref if assets.is_id(ref) else job.assets[ref]
            try:
                data = uploads.get(asset_id) or await cache.get(tenant, asset_id)
                read.append(await asyncio.to_thread(forms.inspect, data))
            except forms.UnusablePdf as exc:
                problems.append((f"{where}pdfs[{number}]", f"the PDF {ref} {exc}"))
            except FileNotFoundError:
                problems.append(
                    (f"{where}pdfs[{number}]", f"the bytes of {ref} are gone: upload it again")
                )
        if len(read) < len(job.pdfs) or given is None:
            continue
        count = sum(pdf.pages for pdf in read)
        if given.select_pages is not None:
            try:
                page_order(given.select_pages, count)
            except ValueError as exc:
                problems.append((f"{where}options.select_pages", str(exc)))
        known = [field for pdf in read for field in pdf.fields]
        for name in forms.unknown(filling, known):
            have = ", ".join(sorted({f.name for f in known})) or "none"
            problems.append(
                (
                    f"{where}options.fill_form.fields.{name}",
                    f"the PDFs have no field {name!r} (theirs: {have}; "
                    "GET /v1/assets/{id}/fields lists them)",
                )
            )
    if problems:
        raise invalid(problems, "The PDFs cannot be finished as asked.")


async def check_invoices(
    cache: AssetCache,
    tenant: str,
    jobs: list[JobRequest],
    pending: Iterable[Upload] = (),
    prefix: str = "",
) -> None:
    """422 naming the first problem of each Factur-X XML the jobs embed (checked against its
    schema off the event loop); `prefix` is how the body names a job (items[0])."""
    problems = []
    uploads = {upload.id: upload.data for upload in pending}
    for index, job in enumerate(jobs):
        invoice = job.options.facturx if job.options is not None else None
        if invoice is None:
            continue
        xml = uploads.get(invoice.xml)
        if xml is None:
            xml = await cache.get(tenant, invoice.xml)
        try:
            await asyncio.to_thread(_check_invoice, xml, invoice.profile)
        except PermanentError as exc:
            where = prefix.format(index=index)
            problems.append((f"{where}options.facturx.xml", f"the XML {exc}"))
    if problems:
        raise invalid(problems, "The Factur-X XML is not a valid invoice.")


def _check_invoice(xml: bytes, profile: str | None) -> None:
    # Imported here, in the thread: factur-x loads pypdf and lxml, which the API needs only
    # for an invoice.
    from server.pdf import invoices

    invoices.check(xml, profile)
