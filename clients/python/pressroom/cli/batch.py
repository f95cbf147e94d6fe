"""pressroom batch: a manifest of documents rendered into a folder, safe to run again. The state
file (`BatchState`) remembers what a run did; `BatchRun` follows the batch's events."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path

from pressroom.cli.terminal import (
    EXIT_FAILED,
    EXIT_OK,
    Display,
    UsageError,
    bar,
    read_json_object,
    read_text,
)
from pressroom.client import FINAL_STATES, AsyncClient, Json, PressroomError, write_atomically

STATE_FILE = ".pressroom-batch.json"
STATE_VERSION = 1
# The combined PDF (--combine), where BatchRun tracks it beside the items' keys (an item id
# cannot start with a parenthesis).
COMBINED = "(combined)"
DOWNLOADS_AT_ONCE = 4
# Without news from the event stream for this long, the batch is read again (a safety net).
RECONCILE_S = 15.0
STREAM_OPEN_WAIT_S = 5.0
# Item ids name files in OUTDIR: no separators, no leading dot.
ITEM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}")


def load_manifest(path: Path) -> list[Json]:
    """The manifest as batch items: [{"id", "html" | "template_id", "data", "options"}], each
    html (and a data given as a file name) read relative to the manifest."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"cannot read the manifest {path}: {exc}") from None
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{path} must hold a non-empty JSON list of documents")
    items: list[Json] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"{path}: item {index}"
        if not isinstance(entry, dict):
            raise UsageError(f"{where} must be an object")
        unknown = set(entry) - {"id", "html", "template_id", "data", "options"}
        if unknown:
            raise UsageError(f"{where}: unknown field {sorted(unknown)[0]!r}")
        key = entry.get("id")
        if not isinstance(key, str) or not ITEM_ID.fullmatch(key):
            raise UsageError(
                f"{where}: id must be a file-name-safe string (letters, digits, ._@+-)"
            )
        if key in seen:
            raise UsageError(f"{where}: the id {key!r} appears twice")
        seen.add(key)
        item: Json = {"key": key}
        if ("html" in entry) == ("template_id" in entry):
            raise UsageError(f"{where}: give html (a file) or template_id")
        if "html" in entry:
            item["template"] = read_text(str(path.parent / entry["html"]))
        else:
            item["template_id"] = entry["template_id"]
        data = entry.get("data", {})
        if isinstance(data, str):
            data = read_json_object(str(path.parent / data))
        item["data"] = data
        if "options" in entry:
            item["options"] = entry["options"]
        items.append(item)
    return items


def _open_state(outdir: Path) -> BatchState:
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        # Temporary files of writes cut short by an earlier run that was killed.
        for leftover in outdir.glob(".*.part"):
            leftover.unlink(missing_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot prepare {outdir}: {exc}") from None
    return BatchState.load(outdir)


def _fingerprint(items: list[Json], *, combine: bool) -> str:
    canonical = json.dumps(items, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # A combined batch is another batch: its state is not a plain one's.
    return hashlib.sha256(canonical.encode()).hexdigest() + (":combine" if combine else "")


def _is_pdf(path: Path) -> bool:
    try:
        with open(path, "rb") as pdf:
            return pdf.read(5) == b"%PDF-"
    except OSError:
        return False


@dataclasses.dataclass
class BatchState:
    """What a run has done so far, kept in OUTDIR/.pressroom-batch.json (written atomically):
    the accepted batch and job ids, which PDFs are saved, and where the combined one was."""

    path: Path
    server: str = ""
    manifest: str = ""
    batch_id: str | None = None
    items: dict[str, Json] = dataclasses.field(default_factory=dict)
    combined: str | None = None  # where the combined PDF was saved (--combine)

    @classmethod
    def load(cls, outdir: Path) -> BatchState:
        path = outdir / STATE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the state file {path}: {exc}") from None
        if raw.get("version") != STATE_VERSION:
            raise UsageError(f"{path} was written by another version; move it away to start over")
        return cls(
            path, raw["server"], raw["manifest"], raw["batch_id"], raw["items"], raw.get("combined")
        )

    def save(self) -> None:
        body = {
            "version": STATE_VERSION,
            "server": self.server,
            "manifest": self.manifest,
            "batch_id": self.batch_id,
            "items": self.items,
            "combined": self.combined,
        }
        write_atomically(self.path, (json.dumps(body, indent=1) + "\n").encode())

    def accept(self, batch: Json, *, server: str, manifest: str) -> None:
        """Record the server's answer; a saved PDF stays saved only if its job is the same."""
        if batch["id"] != self.batch_id:
            self.combined = None
        self.server, self.manifest, self.batch_id = server, manifest, batch["id"]
        before = self.items
        self.items = {}
        for item in batch["items"]:
            key, job_id = item["key"], item["job_id"]
            kept = before.get(key, {})
            saved = kept.get("saved", False) and kept.get("job_id") == job_id
            self.items[key] = {"job_id": job_id, "file": f"{key}.pdf", "saved": saved}

    def unsaved(self, outdir: Path) -> set[str]:
        """Keys not marked saved, or whose file is no longer there or no longer a PDF."""
        return {
            key
            for key, item in self.items.items()
            if not (item.get("saved") and _is_pdf(outdir / item["file"]))
        }

    def combined_saved(self, path: Path) -> bool:
        """Whether the combined PDF is saved at `path` (and is still there, a PDF)."""
        return self.combined == str(path) and _is_pdf(path)


class BatchRun:
    """Follows one batch: downloads each PDF once its job is done, notes failures."""

    def __init__(
        self,
        client: AsyncClient,
        state: BatchState,
        outdir: Path,
        todo: set[str],
        combined: Path | None = None,
    ) -> None:
        self.client = client
        self.state = state
        self.outdir = outdir
        #: Where the combined PDF goes, while it is still to be saved.
        self.combined = combined
        self.display = Display(sys.stdout)
        self.by_job = {item["job_id"]: key for key, item in state.items.items()}
        self.todo = todo
        self.failed: dict[str, str] = {}
        self.downloading: set[str] = set()
        self.counts: Json = {}
        self.news: asyncio.Queue[Json] = asyncio.Queue()
        self._state_lock = asyncio.Lock()
        self._downloads = asyncio.Semaphore(DOWNLOADS_AT_ONCE)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def finished(self) -> bool:
        items_over = not (self.todo - set(self.failed)) and not self.downloading
        return items_over and (self.combined is None or COMBINED in self.failed)

    async def run(self) -> None:
        opened = asyncio.Event()
        pump = asyncio.create_task(self._pump(opened), name="batch-events")
        try:
            # Subscribed before the batch is read: a change in between is not missed.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STREAM_OPEN_WAIT_S):
                    await opened.wait()
            await self._reconcile()
            while not self.finished:
                try:
                    async with asyncio.timeout(RECONCILE_S):
                        news = await self.news.get()
                except TimeoutError:
                    await self._reconcile()
                    continue
                await self._handle(news)
        finally:
            pump.cancel()
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(pump, *self._tasks, return_exceptions=True)
            self.display.done()

    async def _pump(self, opened: asyncio.Event) -> None:
        async for event in self.client.events(on_open=opened.set):
            self.news.put_nowait(event)

    async def _reconcile(self) -> None:
        """Read the whole batch and act on every item (after gaps, and at the start)."""
        assert self.state.batch_id is not None
        batch = await self.client.get_batch(self.state.batch_id)
        self.counts = batch["counts"]
        for item in batch["items"]:
            self._job_changed(item["key"], {"id": item["job_id"], **item})
        self._combined_changed(batch)
        self._show()

    def _combined_changed(self, batch: Json) -> None:
        """Once the batch is done, its combined PDF is saved, or its failure noted."""
        combined = batch.get("combined") or {}
        if self.combined is None or batch["status"] != "done" or COMBINED in self.downloading:
            return
        if combined.get("status") == "done":
            self.failed.pop(COMBINED, None)
            self.downloading.add(COMBINED)
            task = asyncio.create_task(self._save_combined(batch), name="download-combined")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif COMBINED not in self.failed:
            self.failed[COMBINED] = combined.get("error") or f"the join is {combined.get('status')}"
            self.display.say(f"failed combined PDF: {self.failed[COMBINED]}")

    async def _save_combined(self, batch: Json) -> None:
        assert self.combined is not None
        try:
            async with self._downloads:
                await self.client.download_combined(batch, self.combined)
            async with self._state_lock:
                self.state.combined = str(self.combined)
                await asyncio.to_thread(self.state.save)
        except PressroomError as exc:
            self.news.put_nowait({"type": "download-failed", "key": COMBINED, "error": str(exc)})
            return
        self.news.put_nowait({"type": "saved", "key": COMBINED, "path": str(self.combined)})

    async def _handle(self, news: Json) -> None:
        kind = news.get("type", "")
        if kind == "saved" or kind == "download-failed":
            self.downloading.discard(news["key"])
            if kind == "saved" and news["key"] == COMBINED:
                self.combined = None
                self.display.say(f"saved the combined PDF -> {news['path']}")
            elif kind == "saved":
                self.todo.discard(news["key"])
                self.display.say(f"saved {news['key']} -> {news['path']}")
            else:
                self.failed[news["key"]] = news["error"]
                self.display.say(f"failed {news['key']}: {news['error']}")
        elif kind.startswith("batch.") and news["batch"]["id"] == self.state.batch_id:
            self.counts = news["batch"]["counts"]
            if kind == "batch.done":
                await self._reconcile()
        elif kind.startswith("job.") and news["job"]["id"] in self.by_job:
            self._job_changed(self.by_job[news["job"]["id"]], news["job"])
        elif kind == "reset":
            await self._reconcile()
        self._show()

    def _job_changed(self, key: str, job: Json) -> None:
        status = job["status"]
        if status == "done" and key in self.todo and key not in self.downloading:
            self.failed.pop(key, None)
            self.downloading.add(key)
            task = asyncio.create_task(self._save(key, job), name=f"download-{key}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif status in FINAL_STATES and status != "done" and key not in self.failed:
            self.failed[key] = job.get("error") or status
            self.display.say(f"failed {key}: {self.failed[key]}")
        elif status not in FINAL_STATES:
            self.failed.pop(key, None)  # retried since

    async def _save(self, key: str, job: Json) -> None:
        path = self.outdir / self.state.items[key]["file"]
        try:
            async with self._downloads:
                await self.client.download(job, path)
            # Only once the file is in place is it marked saved.
            async with self._state_lock:
                self.state.items[key]["saved"] = True
                await asyncio.to_thread(self.state.save)
        except PressroomError as exc:
            self.news.put_nowait({"type": "download-failed", "key": key, "error": str(exc)})
            return
        self.news.put_nowait({"type": "saved", "key": key, "path": str(path)})

    def _show(self) -> None:
        total = len(self.state.items)
        saved = total - len(self.todo)
        failed = len(self.failed) - (COMBINED in self.failed)
        percent = 100 * (saved + failed) // total
        running = self.counts.get("running", 0)
        queued = self.counts.get("queued", 0)
        line = f"{saved}/{total} saved, {failed} failed, {running} running, {queued} queued"
        if self.combined is not None and not (self.todo - set(self.failed)):
            line += ", joining"
        if self.display.tty:
            self.display.status(f"{bar(percent)} {percent:3d}%  {line}")


async def run_batch(client: AsyncClient, args: argparse.Namespace) -> int:
    outdir = Path(args.outdir)
    combined = Path(args.combine) if args.combine else None
    items = await asyncio.to_thread(load_manifest, Path(args.manifest))
    state = await asyncio.to_thread(_open_state, outdir)
    fingerprint = _fingerprint(items, combine=combined is not None)
    batch = None
    if state.batch_id and state.manifest == fingerprint and state.server == client.url:
        with contextlib.suppress(PressroomError):  # gone (retention): submit again below
            batch = await client.get_batch(state.batch_id)
    if batch is None:
        # Idempotent by item key: after a crash before the state was written, this returns
        # the jobs already accepted instead of making new ones.
        batch = await client.create_batch(items, combine=combined is not None)
        state.accept(batch, server=client.url, manifest=fingerprint)
        await asyncio.to_thread(state.save)
    if combined is not None and await asyncio.to_thread(state.combined_saved, combined):
        combined = None
    todo = await asyncio.to_thread(state.unsaved, outdir)
    run = BatchRun(client, state, outdir, todo, combined)
    already = len(state.items) - len(run.todo)
    print(
        f"batch {batch['id']}: {len(state.items)} documents, {already} already saved",
        flush=True,
    )
    if run.todo or run.combined is not None:
        await run.run()
    saved = len(state.items) - len(run.todo)
    failed = {key: error for key, error in run.failed.items() if key != COMBINED}
    print(f"{saved} saved, {len(failed)} failed, in {outdir}", flush=True)
    for key, error in sorted(failed.items()):
        print(f"pressroom: {key} failed: {error}", file=sys.stderr)
    if COMBINED in run.failed:
        print(f"pressroom: the combined PDF failed: {run.failed[COMBINED]}", file=sys.stderr)
    return EXIT_FAILED if run.failed else EXIT_OK
