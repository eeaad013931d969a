"""A self-contained HTML report: text, tables and PNG figures embedded as data URIs.

The page references nothing outside itself (no scripts, style sheets or images by address), so it
can be mailed, archived or opened from any folder.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#1a1a1a}
h1{font-size:1.6em;border-bottom:2px solid #333}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #bbb}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}figure{margin:1em 0}img{max-width:100%}
caption{text-align:left;font-size:.9em;color:#444;padding:.3em 0;caption-side:top}figcaption{font-size:.85em;color:#444}
td.pass{color:#17692a;background:#e3f4e6;font-weight:600}td.miss{color:#a3161b;background:#fbe4e4;font-weight:600}
"""


@dataclass(frozen=True)
class Table:
    """A table: a caption, a header row and body rows of already formatted cells (str, or `Verdict`)."""

    caption: str
    header: Sequence[str]
    rows: Sequence[Sequence[object]]


@dataclass(frozen=True)
class Verdict:
    """A cell that judges: its text says the verdict in words ("met", "missed"), and the colour repeats it."""

    text: str
    ok: bool

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Figure:
    """A PNG figure, from a file or from bytes."""

    caption: str
    png: bytes | Path


@dataclass
class Section:
    heading: str
    blocks: list = field(default_factory=list)  # str (a paragraph), Table or Figure


def _cell(value: object) -> str:
    text = html.escape(str(value))
    if isinstance(value, Verdict):
        return f'<td class="{"pass" if value.ok else "miss"}">{text}</td>'
    return f"<td>{text}</td>"


def _block(block) -> str:
    if isinstance(block, str):
        return f"<p>{html.escape(block)}</p>"
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in block.header)
        body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in block.rows)
        return f"<table><caption>{html.escape(block.caption)}</caption><tr>{head}</tr>{body}</table>"
    if isinstance(block, Figure):
        data = block.png if isinstance(block.png, bytes) else Path(block.png).read_bytes()
        if not data.startswith(b"\x89PNG"):
            raise ValueError(f"figure {block.caption!r} is not a PNG")
        uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        return f'<figure><img alt="{html.escape(block.caption)}" src="{uri}"><figcaption>{html.escape(block.caption)}</figcaption></figure>'
    raise TypeError(f"cannot render a {type(block).__name__} block; use str, Table or Figure")


def render(title: str, sections: Sequence[Section], path: str | Path) -> Path:
    """Write the report to `path` and return it."""
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.heading)}</h2>")
        parts.extend(_block(b) for b in section.blocks)
    parts.append("</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
