"""index.html: the report's blocks as one self-contained page. Images are embedded as base64
PNG data URIs, styles are inline: the file opens anywhere on its own, mailed or archived. The
page is at most 1,200 px wide and every table fits it: its cells wrap at spaces, and inside a
long word where they must (overflow-wrap: anywhere lets a cell shrink below its longest word,
so an auto-layout table never needs more than the page; no scroll box, which would unstick the
headers)."""

from __future__ import annotations

import base64
import re
from html import escape
from pathlib import Path

from harness.report.doc import Block, Code, Heading, Image, Items, Text, fmt

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222 }
h1, h2, h3 { margin-top: 1.6em } code { background: #f3f3f3; padding: 0 .2em; border-radius: 3px }
table { border-collapse: collapse; font-size: 12px; margin: .5em 0 1em; table-layout: auto }
th, td { border: 1px solid #ccc; padding: 2px 6px; overflow-wrap: anywhere }
th { background: #f3f3f3; position: sticky; top: 0 } td { text-align: right } td:first-child { text-align: left }
img { max-width: 100%; border: 1px solid #eee } nav a { margin-right: 1em }
pre { background: #f3f3f3; padding: .5em; overflow-x: auto; white-space: pre-wrap; word-break: break-all }
"""


def _inline(text: str) -> str:
    """Escaped text with `code` and **bold** spans (bold outside code spans only)."""
    parts = re.split(r"(`[^`]+`)", escape(text))
    return "".join(f"<code>{p[1:-1]}</code>" if p.startswith("`") and p.endswith("`") and len(p) > 1
                   else re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", p) for p in parts)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _image(root: Path, b: Image) -> str:
    data = base64.b64encode((root / b.path).read_bytes()).decode()
    return f'<p><img alt="{escape(b.alt)}" src="data:image/png;base64,{data}"></p>'


def _block(root: Path, b: Block) -> str:
    if isinstance(b, Heading):
        return f'<h{b.level} id="{_slug(b.text)}">{_inline(b.text)}</h{b.level}>'
    if isinstance(b, Text):
        return f"<p>{_inline(b.text)}</p>"
    if isinstance(b, Image):
        return _image(root, b)
    if isinstance(b, Items):
        return "<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>"
    if isinstance(b, Code):
        return f"<pre><code>{escape(b.text)}</code></pre>"
    head = "".join(f"<th>{escape(h)}</th>" for h in b.head)
    rows = "".join("<tr>" + "".join(f"<td>{escape(fmt(c))}</td>" for c in row) + "</tr>" for row in b.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def page(blocks: list[Block], title: str, root: Path) -> str:
    """root: the report directory the blocks' image paths are relative to."""
    nav = " ".join(f'<a href="#{_slug(b.text)}">{escape(b.text)}</a>' for b in blocks
                   if isinstance(b, Heading) and b.level == 2)
    body = "\n".join(_block(root, b) for b in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n<nav>{nav}</nav>\n{body}\n</body></html>\n")
