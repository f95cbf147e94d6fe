"""One PDF for a batch (combine) on a real database with the fake renderer: the join in item
order with one outline entry per key, its states on GET and on the streams, a failed item and
its retry, two processes joining once, bad input, retention."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import uuid
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import pikepdf
import pytest
from pypdf import PdfReader

from server.errors import PermanentError
from server.keys import COMBINER, POOL, SETTINGS, STORAGE
from server.options import RenderOptions
from server.pipeline.combiner import Combiner
from server.queue import combine, retention
from server.queue.lease import Outcome
from server.render.chromium import Assets, RenderResult
from tests.conftest import RunningApp
from tests.integration.test_batches import all_events, post_batch, read_until
from tests.pdfs import FakeRenderer
from tests.processes import PressroomProcess
from tests.sse import Message
from tests.timings import as_env, quick

KEYS = ["march-ana", "march-bo", "march-cy"]
ITEMS = [
    {"key": key, "template": "<p>Statement {{who}}</p>", "data": {"who": key.split("-")[1]}}
    for key in KEYS
]


def page_text(html: str) -> str:
    """What the fake renderer writes into each PDF: the page's text without its tags."""
    return re.sub(r"<[^>]+>", "", html)


def labelled() -> FakeRenderer:
    return FakeRenderer(text_of=page_text)


def outline_of(data: bytes) -> list[tuple[str, int, list[str]]]:
    """Each top-level outline entry: its title, the page it opens (0-based), its children."""
    with pikepdf.open(BytesIO(data)) as pdf:
        pages = {page.obj.objgen: n for n, page in enumerate(pdf.pages)}
        with pdf.open_outline() as tree:
            return [
                (
                    item.title,
                    pages[item.destination[0].objgen],
                    [child.title for child in item.children],
                )
                for item in tree.root
            ]


def texts(data: bytes) -> list[str]:
    return [page.extract_text().strip() for page in PdfReader(BytesIO(data)).pages]


async def get_json(api: RunningApp, path: str) -> dict[str, Any]:
    async with api.http.get(api.url(path)) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def download(api: RunningApp, url: str) -> bytes:
    async with api.http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "application/pdf"
        return await resp.read()


def batch_done(batch_id: str) -> Callable[[Message], bool]:
    return lambda m: m.event == "batch.done" and m.json["batch"]["id"] == batch_id


def combined_states(got: list[Message], batch_id: str) -> list[str]:
    """The combined file's status in each of the batch's events, repeats folded."""
    states: list[str] = []
    for m in got:
        if m.event.startswith("batch.") and m.json["batch"]["id"] == batch_id:
            state = m.json["batch"]["combined"]["status"]
            if not states or states[-1] != state:
                states.append(state)
    return states


async def test_items_are_joined_in_order_with_an_outline_entry_per_key(
    start_app: Callable[..., Any],
) -> None:
    renderer = labelled()
    api: RunningApp = await start_app(renderer=renderer, render_slots=2)
    async with all_events(api) as stream:
        status, batch = await post_batch(api, {"items": ITEMS, "combine": True})
        assert status == 202, batch
        assert batch["status"] == "running" and batch["combined"]["status"] in (
            "pending",
            "running",
        )
        assert batch["links"]["pdf"] == f"/v1/batches/{batch['id']}/pdf"
        got = await read_until(stream, batch_done(batch["id"]))

    # The batch is done only once its file is: batch.done carries it, with a signed link.
    done = got[-1].json["batch"]
    assert combined_states(got, batch["id"]) == ["pending", "running", "done"]
    assert [m.event for m in got if m.event.startswith("batch.")].count("batch.done") == 1
    combined = done["combined"]
    assert combined["status"] == "done" and combined["pages"] == 3 and combined["error"] is None
    assert combined["url"].startswith(api.url(f"/v1/batches/{batch['id']}/pdf?"))
    data = await download(api, combined["url"])
    assert len(data) == combined["bytes"]
    assert texts(data) == ["Statement ana", "Statement bo", "Statement cy"]
    assert outline_of(data) == [(key, n, []) for n, key in enumerate(KEYS)]

    shown = await get_json(api, f"/v1/batches/{batch['id']}")
    assert shown["status"] == "done" and shown["combined"]["status"] == "done"
    assert shown["finished_at"] == done["finished_at"] == combined["finished_at"]
    assert await download(api, api.url(shown["links"]["pdf"])) == data  # as the tenant
    assert await download(api, shown["combined"]["url"]) == data

    # The same request again is the same batch; without combine it is another one.
    status, again = await post_batch(api, {"items": ITEMS, "combine": {"outline": True}})
    assert status == 200 and again["id"] == batch["id"]
    status, plain = await post_batch(api, {"items": ITEMS})
    assert status == 202 and plain["id"] != batch["id"] and plain["combined"] is None
    assert "pdf" not in plain["links"]
    async with api.http.get(api.url(f"/v1/batches/{plain['id']}/pdf")) as resp:
        assert resp.status == 404

    # A new batch of items already done is joined at once, nothing rendered again.
    rendered = len(renderer.rendered)
    async with all_events(api) as stream:
        status, reused = await post_batch(api, {"items": ITEMS[::-1], "combine": True})
        assert status == 202 and reused["id"] != batch["id"]
        got = await read_until(stream, batch_done(reused["id"]))
    data = await download(api, got[-1].json["batch"]["combined"]["url"])
    assert texts(data) == ["Statement cy", "Statement bo", "Statement ana"]
    assert len(renderer.rendered) == rendered


async def test_the_outline_can_be_left_out_and_items_keep_their_own(
    start_app: Callable[..., Any],
) -> None:
    class WithOutline(FakeRenderer):
        """PDFs of two pages, the first item's with an outline of its own."""

        async def render(self, html: str, options: RenderOptions, **kwargs: Any) -> RenderResult:
            await super().render(html, options, **kwargs)
            pdf = pikepdf.new()
            for _ in range(2):
                pdf.add_blank_page()
            if "ana" in html:
                with pdf.open_outline() as tree:
                    tree.root.append(pikepdf.OutlineItem("Summary", 0))
                    tree.root.append(pikepdf.OutlineItem("Lines", 1))
            out = BytesIO()
            pdf.save(out)
            return RenderResult(data=out.getvalue(), pages=2, warnings=[])

    api: RunningApp = await start_app(renderer=WithOutline(), render_slots=1)
    async with all_events(api) as stream:
        _, nested = await post_batch(api, {"items": ITEMS, "combine": True})
        _, flat = await post_batch(
            api,
            {
                "items": [{**i, "key": i["key"] + "-flat"} for i in ITEMS],
                "combine": {"outline": False},
            },
        )
        waiting = {nested["id"], flat["id"]}

        def both_done(m: Message) -> bool:
            if m.event == "batch.done":
                waiting.discard(m.json["batch"]["id"])
            return not waiting

        await read_until(stream, both_done)
    nested = await get_json(api, f"/v1/batches/{nested['id']}")
    data = await download(api, nested["combined"]["url"])
    assert outline_of(data) == [
        ("march-ana", 0, ["Summary", "Lines"]),
        ("march-bo", 2, []),
        ("march-cy", 4, []),
    ]
    flat = await get_json(api, f"/v1/batches/{flat['id']}")
    assert flat["combined"]["outline"] is False and flat["combined"]["pages"] == 6
    with pikepdf.open(BytesIO(await download(api, flat["combined"]["url"]))) as pdf:
        assert "/Outlines" not in pdf.Root and len(pdf.pages) == 6


class FailsWhileMarked(FakeRenderer):
    """Fails for good every page that holds `marker` (while it is set)."""

    marker: str | None = None

    async def render(
        self,
        html: str,
        options: RenderOptions,
        *,
        timeout_s: float,
        assets: Assets | None = None,
    ) -> RenderResult:
        if self.marker is not None and self.marker in html:
            raise PermanentError("the statement could not be printed")
        return await super().render(html, options, timeout_s=timeout_s, assets=assets)


async def test_a_failed_item_fails_the_combined_file_and_its_retry_joins_again(
    start_app: Callable[..., Any],
) -> None:
    renderer = FailsWhileMarked(text_of=page_text)
    renderer.marker = "Statement bo"
    api: RunningApp = await start_app(renderer=renderer, render_slots=1)
    async with all_events(api) as stream:
        status, batch = await post_batch(api, {"items": ITEMS, "combine": True})
        assert status == 202
        got = await read_until(stream, batch_done(batch["id"]))
        done = got[-1].json["batch"]
        assert done["counts"]["failed"] == 1
        assert done["combined"]["status"] == "failed" and "url" not in done["combined"]
        assert done["combined"]["error"] == (
            "item 'march-bo' failed: the statement could not be printed"
        )
        async with api.http.get(api.url(f"/v1/batches/{batch['id']}/pdf")) as resp:
            assert resp.status == 409
            assert "failed" in (await resp.json())["detail"]

        renderer.marker = None
        failed = next(i for i in batch["items"] if i["key"] == "march-bo")
        async with api.http.post(api.url(f"/v1/jobs/{failed['job_id']}/retry")) as resp:
            assert resp.status == 202
        got = await read_until(stream, batch_done(batch["id"]))
    assert combined_states(got, batch["id"]) == ["pending", "running", "done"]
    combined = got[-1].json["batch"]["combined"]
    assert combined["error"] is None and combined["attempts"] == 1
    data = await download(api, combined["url"])
    assert texts(data) == ["Statement ana", "Statement bo", "Statement cy"]


async def test_two_processes_join_a_batch_exactly_once(start_app: Callable[..., Any]) -> None:
    first: RunningApp = await start_app(renderer=labelled(), render_slots=2)
    second: RunningApp = await start_app(renderer=labelled(), render_slots=2)
    items = [{"key": f"k{n}", "template": "<p>Page {{n}}</p>", "data": {"n": n}} for n in range(8)]
    async with all_events(second) as stream:
        status, batch = await post_batch(first, {"items": items, "combine": True})
        assert status == 202
        got = await read_until(stream, batch_done(batch["id"]))
    assert texts(await download(second, got[-1].json["batch"]["combined"]["url"])) == [
        f"Page {n}" for n in range(8)
    ]
    pool = first.app[POOL]
    events = await pool.fetch(
        "SELECT type, payload->'combined'->>'status' AS combined FROM job_events "
        "WHERE type LIKE 'batch.%' AND payload->>'id' = $1 ORDER BY xid, id",
        batch["id"],
    )
    assert [e["type"] for e in events].count("batch.done") == 1
    assert [e["combined"] for e in events].count("running") == 1, "claimed once"
    row = await pool.fetchrow("SELECT attempts, status FROM batch_combines")
    assert (row["attempts"], row["status"]) == (1, "done")
    files = first.app[STORAGE].root / "default" / "batches" / batch["id"]  # type: ignore[attr-defined]
    assert [f.name for f in files.iterdir()] == ["1.pdf"]
    assert first.app[COMBINER].joined + second.app[COMBINER].joined == 1


async def test_combine_is_refused_for_images_and_bad_values_and_nothing_is_stored(
    api: RunningApp,
) -> None:
    async with api.http.post(
        api.url("/v1/templates"),
        json={
            "name": "card",
            "html": "<p>card</p>",
            "options": {"output": "png"},
            "publish": True,
        },
    ) as resp:
        assert resp.status == 201
    items = [
        {"key": "a", "template": "<p>a</p>"},
        {"key": "b", "template": "<p>b</p>", "options": {"output": "webp"}},
        {"key": "c", "template_id": "card"},
    ]
    status, problem = await post_batch(api, {"items": items, "combine": True})
    assert status == 422, problem
    assert [e["field"] for e in problem["errors"]] == ["items[1].options", "items[2].options"]
    assert "output 'webp'" in problem["errors"][0]["message"]
    cases: list[tuple[Any, str, str]] = [
        ("yes", "combine", "must be true, false or an object"),
        (1, "combine", "must be true, false or an object"),
        ({"outline": "no"}, "combine.outline", "valid boolean"),
        ({"colour": "red"}, "combine.colour", "is not a known field"),
        ({"sign": {}}, "combine.sign", "this server has no signing key"),
        ({"sign": {"field": "a b"}}, "combine.sign.field", "should match pattern"),
    ]
    for value, field, message in cases:
        status, problem = await post_batch(api, {"items": items[:1], "combine": value})
        assert status == 422, (value, problem)
        [error] = problem["errors"]
        assert error["field"] == field and message in error["message"], (value, error)
    pool = api.app[POOL]
    assert await pool.fetchval("SELECT count(*) FROM batches") == 0
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    # Images are fine where nothing is joined.
    status, _ = await post_batch(api, {"items": items, "combine": False})
    assert status == 202


async def test_retention_deletes_the_combined_file_with_its_batch(
    api: RunningApp,
) -> None:
    async with all_events(api) as stream:
        _, batch = await post_batch(api, {"items": ITEMS, "combine": True})
        await read_until(stream, batch_done(batch["id"]))
    pool, storage = api.app[POOL], api.app[STORAGE]
    key = f"default/batches/{batch['id']}/1.pdf"
    assert (await storage.get(key)).startswith(b"%PDF-")
    assert await retention.sweep_batches(pool, storage, older_than_days=1) == 0
    await pool.execute(
        "UPDATE batch_combines SET finished_at = $1", dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
    )
    assert await retention.sweep_batches(pool, storage, older_than_days=1) == 1
    async with api.http.get(api.url(f"/v1/batches/{batch['id']}")) as resp:
        assert resp.status == 404
    try:
        await storage.get(key)
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("the combined file is still stored")
    # Its jobs are the job sweep's: still there.
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 3


class HeldWhileMarked(FakeRenderer):
    """Holds every page that holds `marker` at the gate; the others print at once."""

    def __init__(self, marker: str) -> None:
        super().__init__(text_of=page_text)
        self.marker = marker
        self.held = asyncio.Event()

    async def render(
        self,
        html: str,
        options: RenderOptions,
        *,
        timeout_s: float,
        assets: Assets | None = None,
    ) -> RenderResult:
        if self.marker in html:
            await self.held.wait()
        return await super().render(html, options, timeout_s=timeout_s, assets=assets)


@pytest.mark.slow
async def test_a_process_killed_mid_join_is_rescued_and_the_batch_joined_once(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick(monkeypatch, LEASE_S=2, RESCUE_INTERVAL_S=0.5)
    # This one renders and joins nothing: the process started below takes the join.
    renderer = HeldWhileMarked("Statement cy")
    api: RunningApp = await start_app(renderer=renderer, render_slots=2, run_background=False)
    pool, storage = api.app[POOL], api.app[STORAGE]
    env = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(api.app[SETTINGS].data_dir),
        "PRESSROOM_RENDER_SLOTS": "0",
        **as_env(LEASE_S=2, POLL_INTERVAL_S=0.5),
    }
    joiner = PressroomProcess("worker", env, tmp_path / "joiner.log")
    await joiner.start()  # it starts up while the items print
    try:
        async with all_events(api) as stream:
            _, batch = await post_batch(api, {"items": ITEMS, "combine": True})
            bo = next(i["job_id"] for i in batch["items"] if i["key"] == "march-bo")
            await read_until(stream, lambda m: m.event == "job.done" and m.json["job"]["id"] == bo)
            # The second item's file becomes a pipe: whoever reads it waits for a writer, as on
            # a storage that hangs, so the join is held mid-way (claimed, fetching) for certain.
            key = await pool.fetchval("SELECT object_key FROM jobs WHERE id = $1", uuid.UUID(bo))
            path = storage.root / key  # type: ignore[attr-defined]
            original = path.read_bytes()
            path.unlink()
            os.mkfifo(path)
            renderer.held.set()  # the last item prints: the join is due
            opening = asyncio.ensure_future(asyncio.to_thread(os.open, path, os.O_WRONLY))
            try:
                async with asyncio.timeout(60):
                    writer = await asyncio.shield(opening)  # the joiner is reading it now
            except TimeoutError:
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # lets the thread go
                raise AssertionError("the join never read the item:\n" + joiner.log()) from None
            held = await pool.fetchrow("SELECT status, attempts FROM batch_combines")
            assert (held["status"], held["attempts"]) == ("running", 1)
            joiner.kill()
            await joiner.stop()
            os.close(writer)
            path.unlink()
            path.write_bytes(original)

            # Its lease runs out; a process that joins takes it over.
            survivor: RunningApp = await start_app(renderer=labelled(), render_slots=0)
            got = await read_until(stream, batch_done(batch["id"]))
    finally:
        joiner.kill()
    combined = got[-1].json["batch"]["combined"]
    assert combined["status"] == "done" and combined["attempts"] == 2
    assert texts(await download(api, combined["url"])) == [
        "Statement ana",
        "Statement bo",
        "Statement cy",
    ]
    assert survivor.app[COMBINER].joined == 1
    events = await pool.fetch(
        "SELECT type, payload->'combined'->>'status' AS combined FROM job_events "
        "WHERE type LIKE 'batch.%' ORDER BY xid, id"
    )
    assert [e["combined"] for e in events].count("running") == 2
    assert [e["type"] for e in events].count("batch.done") == 1
    folder = storage.root / "default" / "batches" / batch["id"]  # type: ignore[attr-defined]
    assert [f.name for f in folder.iterdir()] == ["2.pdf"]


async def test_a_join_recorded_whose_answer_was_lost_keeps_its_file(
    start_app: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The done write commits but its answer never comes (a failover, a cut cable): the join
    # writes again, and must be told the file is its own, not delete the file the batch names.
    real = combine.finish_done
    calls: list[bool] = []
    attempts: asyncio.Queue[Outcome] = asyncio.Queue()
    attempt = Combiner._attempt

    async def reported(self: Combiner, held: Any) -> Outcome:
        outcome = await attempt(self, held)
        attempts.put_nowait(outcome)
        return outcome

    async def committed_then_cut(*args: Any, **kwargs: Any) -> bool:
        recorded = await real(*args, **kwargs)
        calls.append(recorded)
        if len(calls) == 1:
            raise ConnectionResetError("connection lost before the answer")
        return recorded

    monkeypatch.setattr(combine, "finish_done", committed_then_cut)
    monkeypatch.setattr(Combiner, "_attempt", reported)
    api: RunningApp = await start_app(renderer=labelled(), render_slots=2)
    async with all_events(api) as stream:
        status, batch = await post_batch(api, {"items": ITEMS, "combine": True})
        assert status == 202, batch
        got = await read_until(stream, batch_done(batch["id"]))
    # batch.done comes with the first write; the join goes on with its retry.
    async with asyncio.timeout(10):
        assert await attempts.get() == Outcome.DONE
    assert calls == [True, True], "written once, then recognised as already recorded"
    combined = got[-1].json["batch"]["combined"]
    assert combined["status"] == "done"
    assert texts(await download(api, combined["url"])) == [f"Statement {k[6:]}" for k in KEYS]
    assert api.app[COMBINER].joined == 1
    row = await api.app[POOL].fetchrow("SELECT attempts, status FROM batch_combines")
    assert (row["attempts"], row["status"]) == (1, "done")
    # Another attempt's write is still refused.
    other = combine.Claimed(
        batch_id=uuid.UUID(batch["id"]), tenant="default", attempt=2, max_attempts=3, outline=True
    )
    assert await real(api.app[POOL], other, worker_id="w", pages=1, size_bytes=1) is False
