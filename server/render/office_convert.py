"""One long-lived LibreOffice, driven over UNO: run by the system Python (Debian's python3-uno is
built for /usr/bin/python3, which need not be the interpreter Pressroom runs in), never
imported by Pressroom (server/render/office.py starts it).

It reads JSON lines on stdin and answers each with one on stdout. The first line is the setup
({"soffice", "profile", "pipe", "start_timeout_s"}): it starts soffice.bin headless with that
user profile, accepting UNO on that pipe, connects, and answers {"ready": true, "pid": ...}.
Every later line is a conversion ({"input", "output", "page_ranges", "landscape",
"bookmarks"}), answered {"ok": true} or {"ok": false, "error": ..., "crashed": ...}. It ends,
with soffice, at the end of its input; once soffice is gone it answers what it can and ends.
"""

import json
import os
import subprocess
import sys
import time
from typing import Any

import uno
from com.sun.star.beans import PropertyValue

#: loadComponentFromURL: never run macros (MacroExecutionMode.NEVER_EXECUTE), never update
#: links to other files or sites (UpdateDocMode.NO_UPDATE).
NEVER_EXECUTE = 0
NO_UPDATE = 0
#: soffice's exit status after it made a new user profile: start it again to use it.
RESTART = 81
#: The PDF export filter of each kind of document, by the service its model supports.
FILTERS = (
    ("com.sun.star.sheet.SpreadsheetDocument", "calc_pdf_Export"),
    ("com.sun.star.presentation.PresentationDocument", "impress_pdf_Export"),
    ("com.sun.star.drawing.DrawingDocument", "draw_pdf_Export"),
    ("com.sun.star.text.TextDocument", "writer_pdf_Export"),
)


def prop(name: str, value: Any) -> Any:
    return PropertyValue(Name=name, Value=value)


def answer(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def launch(setup: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            setup["soffice"],
            "--headless",
            "--invisible",
            "--nologo",
            "--norestore",
            "--nodefault",
            "--nolockcheck",
            "--nofirststartwizard",
            "-env:UserInstallation=" + uno.systemPathToFileUrl(setup["profile"]),
            "--accept=pipe,name=" + setup["pipe"] + ";urp;StarOffice.ComponentContext",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start(setup: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Any]:
    """soffice.bin accepting UNO on the pipe, and the desktop reached through it."""
    process = launch(setup)
    local = uno.getComponentContext()
    resolver = local.ServiceManager.createInstanceWithContext(
        "com.sun.star.bridge.UnoUrlResolver", local
    )
    deadline = time.monotonic() + setup["start_timeout_s"]
    while True:
        try:
            context = resolver.resolve(
                "uno:pipe,name=" + setup["pipe"] + ";urp;StarOffice.ComponentContext"
            )
            break
        except Exception as exc:
            if process.poll() == RESTART:
                process = launch(setup)  # the first start in a new profile ends like this
            elif process.poll() is not None:
                raise RuntimeError(f"soffice exited with status {process.returncode}") from exc
            if time.monotonic() > deadline:
                raise RuntimeError("soffice did not accept UNO connections in time") from exc
            time.sleep(0.05)
    desktop = context.ServiceManager.createInstanceWithContext(
        "com.sun.star.frame.Desktop", context
    )
    return process, desktop


def landscape(document: Any) -> None:
    """Every sheet's page style turned to landscape (a spreadsheet's own format allows it)."""
    styles = document.StyleFamilies.getByName("PageStyles")
    for sheet in document.Sheets:
        style = styles.getByName(sheet.PageStyle)
        if not style.IsLandscape:
            width, height = style.Width, style.Height
            style.IsLandscape = True
            style.Width, style.Height = max(width, height), min(width, height)


def convert(desktop: Any, job: dict[str, Any]) -> dict[str, Any]:
    url = uno.systemPathToFileUrl(job["input"])
    document = desktop.loadComponentFromURL(
        url,
        "_blank",
        0,
        (
            prop("Hidden", True),
            prop("MacroExecutionMode", NEVER_EXECUTE),
            prop("UpdateDocMode", NO_UPDATE),
            prop("RepairPackage", False),
        ),
    )
    if document is None:
        return {"ok": False, "error": "LibreOffice cannot open it", "crashed": False}
    try:
        name = next((f for s, f in FILTERS if document.supportsService(s)), None)
        if name is None:
            return {
                "ok": False,
                "error": "it is not a document LibreOffice prints",
                "crashed": False,
            }
        if job["landscape"] and name == "calc_pdf_Export":
            landscape(document)
        data = [prop("ExportBookmarks", bool(job["bookmarks"])), prop("ExportNotes", False)]
        if job["page_ranges"]:
            data.append(prop("PageRange", job["page_ranges"]))
        document.storeToURL(
            uno.systemPathToFileUrl(job["output"]),
            (
                prop("FilterName", name),
                prop("FilterData", uno.Any("[]com.sun.star.beans.PropertyValue", tuple(data))),
            ),
        )
    finally:
        try:
            document.close(True)
        except Exception:
            pass
    return {"ok": True}


def alive(process: subprocess.Popen[bytes], desktop: Any) -> bool:
    """Whether soffice still answers: a conversion that failed may have failed because it died
    (its bridge breaks before the process can be reaped), or because the document was bad."""
    if process.poll() is not None:
        return False
    try:
        desktop.getComponents()  # one round trip over the bridge
    except Exception:
        return False
    return process.poll() is None


def main() -> int:
    setup = json.loads(sys.stdin.readline())
    try:
        process, desktop = start(setup)
    except Exception as exc:
        answer({"ready": False, "error": str(exc)})
        return 1
    answer({"ready": True, "pid": process.pid})
    try:
        for line in sys.stdin:
            job = json.loads(line)
            try:
                answer(convert(desktop, job))
            except Exception as exc:
                crashed = not alive(process, desktop)
                kind = type(exc).__name__.rpartition(".")[2]
                message = getattr(exc, "Message", "") or str(exc)
                answer({"ok": False, "error": f"{kind}: {message}", "crashed": crashed})
                if crashed:
                    return 1
    finally:
        try:
            desktop.terminate()
        except Exception:
            pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
