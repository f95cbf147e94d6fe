"""Markdown → a printable HTML document: CommonMark with GitHub's tables, strikethrough and task
lists (markdown-it-py), in a clean built-in stylesheet. Raw HTML is kept, as CommonMark says:
the document is the tenant's own, printed under the same network policy as a template."""

from __future__ import annotations

from markdown_it import MarkdownIt
from mdit_py_plugins.tasklists import tasklists_plugin

# Parsing keeps no state between documents: one parser serves every thread.
_parser = MarkdownIt("commonmark").enable(["table", "strikethrough"]).use(tasklists_plugin)

STYLESHEET = """
@page { margin: 18mm 16mm; }
html { font: 11pt/1.55 -apple-system, "Segoe UI", "Helvetica Neue", Arial, "Liberation Sans",
       "DejaVu Sans", sans-serif; color: #1f2328; }
body { margin: 0; }
h1, h2, h3, h4, h5, h6 { line-height: 1.25; margin: 1.4em 0 0.6em; break-after: avoid; }
h1 { font-size: 2em; border-bottom: 1px solid #d1d9e0; padding-bottom: 0.3em; }
h2 { font-size: 1.5em; border-bottom: 1px solid #d1d9e0; padding-bottom: 0.3em; }
h3 { font-size: 1.25em; }
h1:first-child, h2:first-child, h3:first-child { margin-top: 0; }
p, ul, ol, dl, table, pre, blockquote { margin: 0 0 1em; }
a { color: #0969da; text-decoration: none; }
code, pre { font-family: "SFMono-Regular", Menlo, Consolas, "Liberation Mono", "DejaVu Sans Mono",
            monospace; font-size: 0.9em; }
code { background: #eff1f3; border-radius: 4px; padding: 0.15em 0.35em; }
pre { background: #f6f8fa; border-radius: 6px; padding: 0.9em 1em; white-space: pre-wrap;
      break-inside: avoid; }
pre code { background: none; padding: 0; }
blockquote { color: #59636e; border-left: 0.25em solid #d1d9e0; padding: 0 1em; margin-left: 0; }
table { border-collapse: collapse; break-inside: auto; }
tr { break-inside: avoid; }
th, td { border: 1px solid #d1d9e0; padding: 0.35em 0.8em; }
th { background: #f6f8fa; font-weight: 600; }
img { max-width: 100%; }
hr { border: 0; border-top: 1px solid #d1d9e0; margin: 1.5em 0; }
ul.contains-task-list { list-style: none; padding-left: 1.2em; }
.task-list-item-checkbox { margin: 0 0.4em 0 -1.2em; vertical-align: middle; }
del, s { color: #59636e; }
"""


def to_html(text: str) -> str:
    """The document for Markdown `text` (already through Jinja2)."""
    body = _parser.render(text)
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<style>{STYLESHEET}</style></head><body>{body}</body></html>"
    )
