"""Self-contained HTML for the reports: one file, no network, everything escaped.

A report opens from a laptop on an air-gapped network, from an attachment, or from a ticket, so
nothing in it may point anywhere but the runbook links: plots are PNGs embedded as
``data:image/png;base64`` URIs, the style sheet is inline, there is no script, and a
Content-Security-Policy meta tag tells the browser to load nothing else. Every piece of text that
came from outside (labels, hostnames, alert names, rollout ids) passes through :func:`esc`;
builders take plain strings and escape them, and only :class:`Raw` (built here) is inserted as is.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:1100px;
color:#1d2330;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #d6dae3}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #d6dae3;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f1f3f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:.15em .7em;border-radius:.3em;font-weight:600;color:#fff}
.ok{background:#2e7d32}.bad{background:#c62828}.warn{background:#ef6c00}.info{background:#546e7a}
.muted{color:#6b7385}figure{margin:1em 0}figcaption{font-size:.85em;color:#4a5263}
img{max-width:100%;height:auto;border:1px solid #e3e6ec}code{font-size:.9em}
ul.notes li{margin:.15em 0}
"""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Raw:
    """A fragment of HTML built by this module (already escaped); inserted verbatim."""

    html: str

    def __str__(self) -> str:
        return self.html


def esc(value: object) -> str:
    """Escape any value for use in HTML text or a double-quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def cell(value: object) -> str:
    """A table cell's inner HTML: :class:`Raw` as is, anything else escaped."""
    return value.html if isinstance(value, Raw) else esc(value)


def join(parts: Iterable[Raw | str], sep: str = "") -> Raw:
    """Concatenate fragments (strings are escaped)."""
    return Raw(sep.join(cell(p) for p in parts))


def link(url: str | None, text: str | None = None) -> Raw:
    """An ``<a>`` for http(s) URLs; anything else (``javascript:``, relative paths) is shown as text."""
    if not url:
        return Raw('<span class="muted">-</span>')
    label = esc(text if text is not None else url)
    if str(url).lower().startswith(("http://", "https://")):
        return Raw(f'<a href="{esc(url)}" rel="noreferrer noopener">{label}</a>')
    return Raw(f"<code>{esc(url)}</code>")


def badge(text: str, kind: str) -> Raw:
    """A coloured label; ``kind`` is one of ok, bad, warn, info."""
    kind = kind if kind in ("ok", "bad", "warn", "info") else "info"
    return Raw(f'<span class="badge {kind}">{esc(text)}</span>')


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[int] = ()) -> Raw:
    """A table; ``numeric`` column indices are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        tds = "".join(f'<td class="num">{cell(v)}</td>' if i in numeric else f"<td>{cell(v)}</td>"
                      for i, v in enumerate(row))
        body.append(f"<tr>{tds}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="muted">none</td></tr>')
    return Raw(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def kv_table(pairs: Iterable[tuple[str, object]]) -> Raw:
    """A two-column key/value table (keys as header cells)."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in pairs)
    return Raw(f"<table><tbody>{rows}</tbody></table>")


def bullet_list(items: Iterable[object], empty: str = "none") -> Raw:
    """A ``<ul>`` of escaped items, or a muted ``empty`` text."""
    lis = "".join(f"<li>{cell(i)}</li>" for i in items)
    return Raw(f'<ul class="notes">{lis}</ul>' if lis else f'<p class="muted">{esc(empty)}</p>')


def figure(png: bytes, caption: str, alt: str | None = None) -> Raw:
    """An embedded PNG (base64 data URI) with a caption. Raises ValueError if ``png`` is not a PNG."""
    if not png.startswith(PNG_SIGNATURE):
        raise ValueError("figure() needs PNG bytes")
    data = base64.b64encode(png).decode("ascii")
    return Raw(f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt or caption)}">'
               f"<figcaption>{esc(caption)}</figcaption></figure>")


def section(title: str, *parts: Raw | str) -> Raw:
    """An ``<h2>`` section; string parts become escaped paragraphs."""
    body = "".join(p.html if isinstance(p, Raw) else f"<p>{esc(p)}</p>" for p in parts)
    return Raw(f"<section><h2>{esc(title)}</h2>{body}</section>")


def paragraph(*parts: Raw | str) -> Raw:
    """A ``<p>`` of mixed escaped text and fragments."""
    return Raw(f"<p>{join(parts).html}</p>")


def page(title: str, subtitle: Raw | str, sections: Iterable[Raw], generated_at: float) -> str:
    """The complete document."""
    body = "".join(s.html for s in sections)
    when = utc(generated_at)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{esc(title)}</h1><p>{cell(subtitle)}</p>{body}"
            f"<p class=\"muted\">Generated by gpuobs at {esc(when)}.</p></body></html>\n")


def utc(epoch: float | None) -> str:
    """``2025-06-01 12:00:03Z`` for an epoch, ``-`` when unknown."""
    if epoch is None or not isinstance(epoch, (int, float)) or not math.isfinite(epoch):
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def num(value: object, digits: int = 4) -> str:
    """A number with ``digits`` significant digits; ``-`` for None/NaN; other values as text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "-" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        return f"{value:.{digits}g}"
    return str(value)


def seconds(value: float | None) -> str:
    """``12.3 s`` or ``-``."""
    return "-" if value is None else f"{value:.1f} s"
