"""Runbooks rendered to HTML for the console (Python-Markdown, https://python-markdown.github.io/).

Headings get ``id`` anchors slugged like GitHub's (lowercase, punctuation dropped, spaces to hyphens),
so every alert's ``runbook_url`` (``<base>/runbooks/<file>.md#<alertname-lowercase>``,
:func:`gpuobs.mixin.runbooks.runbook_url`) lands on its ``## <AlertName>`` section; links are real
``<a href>`` links (relative ones between runbooks keep working under ``/runbooks/``). Raw HTML in
the Markdown source is escaped, not passed through (runbooks are content, not markup).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import markdown
from markdown.extensions.toc import TocExtension

#: A runbook file name the console serves (no paths, no dot-files).
NAME = re.compile(r"[a-z0-9][a-z0-9-]*\.md")


def github_slug(text: str, separator: str = "-") -> str:
    """GitHub's heading anchor: lowercase, punctuation other than ``-`` and ``_`` dropped, each space a
    hyphen (``"GpuXidCritical"`` -> ``"gpuxidcritical"``, ``"One page per incident"`` ->
    ``"one-page-per-incident"``)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", separator)


class _EscapeHtml(markdown.extensions.Extension):
    """Drop Python-Markdown's raw-HTML pass-through: ``<tag>`` in the source is shown as text."""

    def extendMarkdown(self, md: markdown.Markdown) -> None:  # noqa: N802 (Python-Markdown's API)
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")


def render(text: str) -> tuple[str, list[tuple[int, str, str]]]:
    """Markdown -> ``(HTML fragment, [(level, anchor, heading text)])``."""
    md = markdown.Markdown(extensions=["fenced_code", "tables", _EscapeHtml(),
                                       TocExtension(slugify=github_slug, permalink=False)],
                           output_format="html")
    body = md.convert(text)
    heads: list[tuple[int, str, str]] = []

    def walk(tokens: list[dict]) -> None:
        for t in tokens:
            heads.append((t["level"], t["id"], t["name"]))
            walk(t["children"])

    walk(md.toc_tokens)  # type: ignore[attr-defined]
    return body, heads


def anchors(html_text: str) -> set[str]:
    """Every ``id="..."`` in rendered HTML (what a ``#fragment`` can land on)."""
    return set(re.findall(r'\sid="([^"]+)"', html_text))


def page(name: str, text: str) -> str:
    """A full HTML page for runbook ``name`` (its Markdown ``text``), with a table of contents."""
    body, heads = render(text)
    title = next((h for lvl, _, h in heads if lvl == 1), name)
    toc = "".join(f'<li class="l{lvl}"><a href="#{html.escape(a)}">{html.escape(h)}</a></li>'
                  for lvl, a, h in heads if lvl in (2, 3))
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)} - gpuobs runbook</title><style>"
        "body{font-family:sans-serif;max-width:60rem;margin:1rem auto;padding:0 1rem;line-height:1.45}"
        "pre{background:#f4f4f4;padding:.6rem;overflow:auto}code{background:#f4f4f4}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px}"
        ":target{background:#fff3b0}nav li.l3{margin-left:1rem}"
        "</style></head><body><p><a href=\"/\">&larr; incidents</a> | <a href=\"/runbooks/\">all runbooks</a> | "
        f"<a href=\"/runbooks/{html.escape(name)}?format=markdown\">Markdown source</a></p>"
        f"<nav><ul>{toc}</ul></nav>{body}</body></html>")


def index(runbooks_dir: Path) -> str:
    """HTML list of the runbooks in ``runbooks_dir``."""
    items = "".join(f'<li><a href="/runbooks/{html.escape(p.name)}">{html.escape(p.name)}</a></li>'
                    for p in sorted(runbooks_dir.glob("*.md")) if NAME.fullmatch(p.name))
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>gpuobs runbooks</title></head>"
            f"<body><p><a href=\"/\">&larr; incidents</a></p><h1>Runbooks</h1><ul>{items}</ul></body></html>")
