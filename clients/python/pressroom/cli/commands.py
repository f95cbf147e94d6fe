"""pressroom submit | jobs | watch | batch: the command line on the Python client. Here are the
parsers, the dispatch, and submit, jobs and watch; batch is `batch.py`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from pressroom.cli.batch import run_batch
from pressroom.cli.terminal import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Display,
    UsageError,
    bar,
    read_json_object,
    read_text,
)
from pressroom.client import AsyncClient, Json, PressroomError

CLIENT_COMMANDS = frozenset({"submit", "jobs", "watch", "batch"})
#: Options whose values are always text: `-o title=2024` means the string "2024", where other
#: values are read as JSON. The server's own test (tests/unit/test_client_options.py) holds
#: this list to its options model, which the client cannot import.
TEXT_OPTIONS = frozenset(
    {
        "author",
        "css",
        "footer_html",
        "format",
        "header_html",
        "media",
        "output",
        "page_ranges",
        "pdfa",
        "select_pages",
        "subject",
        "title",
        "user_agent",
        "wait_for_expression",
        "wait_for_selector",
        "wait_until",
    }
)


def add_client_parsers(commands: Any) -> None:
    """Add submit, jobs, watch and batch to the `pressroom` subcommands."""
    submit = commands.add_parser("submit", help="render a template file to PDF, showing progress")
    submit.add_argument("template", nargs="?", help="a Jinja2 HTML template file (- for stdin)")
    submit.add_argument("--template-id", help="a stored template instead: NAME or NAME@VERSION")
    submit.add_argument("--data", help="a JSON file with the template's data (- for stdin)")
    submit.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a render option, repeatable: format=A5, landscape=true, margin.top=1cm",
    )
    submit.add_argument("--out", help="save the PDF to this file (implies --wait)")
    submit.add_argument("--wait", action="store_true", help="follow the job until it ends")

    jobs = commands.add_parser("jobs", help="list recent jobs, newest first")
    jobs.add_argument("--status", choices=["queued", "running", "done", "failed", "cancelled"])
    jobs.add_argument("--limit", type=int, default=20, help="how many (default 20, at most 200)")
    jobs.add_argument("--json", action="store_true", help="print the jobs as JSON")

    watch = commands.add_parser("watch", help="follow every job's events as they happen")
    watch.add_argument("--job", help="one job's events only (from its first)")
    watch.add_argument("--last-event-id", type=int, help="resume after this event id")
    watch.add_argument("--json", action="store_true", help="print each event as a JSON line")

    batch = commands.add_parser(
        "batch", help="render a manifest of documents into a folder; safe to run again"
    )
    batch.add_argument("manifest", help='JSON list of {"id", "html", "data", "options"}')
    batch.add_argument("outdir", help="where the PDFs (and the state file) go")
    batch.add_argument(
        "--combine",
        metavar="PDF",
        help="also join the documents, in manifest order, into this one PDF (a bookmark per id)",
    )

    for command in (submit, jobs, watch, batch):
        command.add_argument("--url", help="the server (PRESSROOM_URL, else http://127.0.0.1:8080)")
        command.add_argument("--api-key", help="an API key (PRESSROOM_API_KEY)")


def run_client_command(args: argparse.Namespace) -> int:
    """Run one of CLIENT_COMMANDS; returns the exit code."""
    command: Callable[[AsyncClient, argparse.Namespace], Awaitable[int]] = {
        "submit": submit,
        "jobs": list_jobs,
        "watch": watch,
        "batch": run_batch,
    }[args.command]

    async def main() -> int:
        async with AsyncClient(args.url, args.api_key) as client:
            return await command(client, args)

    try:
        return asyncio.run(main())
    except (UsageError, PressroomError) as exc:
        print(f"pressroom: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK if args.command == "watch" else EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader has gone (`pressroom watch | head`): end quietly, as filters do. Standard
        # output points at /dev/null from here, or the exit's own flush fails again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


# --- input ------------------------------------------------------------------------------


def parse_options(pairs: list[str]) -> Json:
    """`key=value` pairs as an options object; `a.b=v` sets a nested field (margin.top=1cm).
    Values are JSON where that reads naturally (true, 0.8, {...}); text options stay text."""
    options: Json = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--option {pair!r} must look like KEY=VALUE")
        value: Any = raw
        if name.split(".")[0] not in TEXT_OPTIONS:
            with contextlib.suppress(ValueError):
                value = json.loads(raw)
        *parents, leaf = name.split(".")
        target = options
        for parent in parents:
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                raise UsageError(f"--option {pair!r}: {parent} is not an object")
        target[leaf] = value
    return options


# --- progress ---------------------------------------------------------------------------


def describe_job(job: Json, *, tty: bool) -> str:
    status = job["status"]
    percent = 100 if status == "done" else job.get("progress") or 0
    detail = ""
    if job.get("attempts", 0) > 1 or (status == "queued" and job.get("attempts")):
        detail = f"  attempt {job['attempts']}/{job['max_attempts']}"
    if status in ("failed", "cancelled") or (status == "queued" and job.get("error")):
        detail += f"  {job.get('error') or ''}".rstrip()
    if tty:
        return f"{bar(percent)} {percent:3d}%  {status:<9} job {job['id']}{detail}"
    shown = f" {percent}%" if status == "running" and job.get("progress") is not None else ""
    return f"job {job['id']} {status}{shown}{detail}"


# --- submit, jobs, watch ----------------------------------------------------------------


async def submit(client: AsyncClient, args: argparse.Namespace) -> int:
    if (args.template is None) == (args.template_id is None):
        raise UsageError("give a template file or --template-id (one of them)")
    template = await asyncio.to_thread(read_text, args.template) if args.template else None
    data = await asyncio.to_thread(read_json_object, args.data) if args.data else {}
    options = parse_options(args.option) or None
    job = await client.submit(
        template=template, template_id=args.template_id, data=data, options=options
    )
    if not (args.wait or args.out):
        print(job["id"])
        return EXIT_OK
    display = Display(sys.stdout)
    display.status(describe_job(job, tty=display.tty))

    def show(event: Json) -> None:
        if isinstance(event.get("job"), dict):
            display.status(describe_job(event["job"], tty=display.tty))

    final = await client.wait(job["id"], on_event=show)
    display.status(describe_job(final, tty=display.tty))
    display.done()
    if final["status"] != "done":
        reason = final.get("error") or final["status"]
        print(f"pressroom: job {final['id']} {final['status']}: {reason}", file=sys.stderr)
        return EXIT_FAILED
    if args.out:
        saved = await client.download(final, args.out)
        pages = final.get("pages")
        print(
            f"saved {saved} ({pages} page{'s' if pages != 1 else ''}, {final.get('bytes')} bytes)"
        )
    else:
        print(final["url"])
    return EXIT_OK


async def list_jobs(client: AsyncClient, args: argparse.Namespace) -> int:
    page = await client.list(status=args.status, limit=args.limit)
    if args.json:
        print(json.dumps(page["items"], indent=2))
        return EXIT_OK
    print(f"{'ID':<36}  {'STATUS':<9}  {'CREATED':<19}  {'PAGES':>5}  ERROR")
    for job in page["items"]:
        created = str(job.get("created_at", ""))[:19].replace("T", " ")
        pages = "" if job.get("pages") is None else str(job["pages"])
        error = (job.get("error") or "").splitlines()[0][:60] if job.get("error") else ""
        print(f"{job['id']:<36}  {job['status']:<9}  {created:<19}  {pages:>5}  {error}")
    return EXIT_OK


def describe_event(event: Json) -> str:
    ident = event.get("event_id") or "-"
    kind = event.get("type", "?")
    if isinstance(event.get("batch"), dict):
        batch = event["batch"]
        counts = " ".join(f"{name}={count}" for name, count in batch["counts"].items() if count)
        combined = batch.get("combined")
        if isinstance(combined, dict):
            counts += f" combined={combined['status']}"
        return f"{ident} {kind:<14} batch {batch['id']} {batch['progress']}% {counts}"
    if isinstance(event.get("job"), dict):
        job = event["job"]
        extra = f" {job['progress']}%" if job.get("progress") is not None else ""
        if job.get("error") and job["status"] != "done":
            extra += f" {job['error']}"
        return f"{ident} {kind:<14} job {job['id']} {job['status']}{extra}"
    return f"{ident} {kind} {event.get('reason', '')}".rstrip()


async def watch(client: AsyncClient, args: argparse.Namespace) -> int:
    async for event in client.events(args.job, args.last_event_id):
        print(json.dumps(event) if args.json else describe_event(event), flush=True)
    return EXIT_OK
