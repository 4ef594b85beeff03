"""The README is a newcomer's page and the docs stay whole: title first, the two commands before any other
code block, under 80 lines; every relative link (and its anchor) resolves; nothing points outside the
repository; the fault list in docs/faults.md is the simulator's fault catalogue."""

from __future__ import annotations

import re
from pathlib import Path

from gpuobs.exporter.sim.actions import NODE_ACTIONS
from gpuobs.exporter.sim.faults import KINDS

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code spans (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept),
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", _FENCE.sub("", path.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_readme_opens_with_the_title_and_the_two_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert lines[0] == "# gpuobs"
    assert len(lines) < 80, f"README.md has {len(lines)} lines"
    first_block = _FENCE.search(text)
    assert first_block is not None
    assert "make up" in first_block.group(0) and "make test" in first_block.group(0)
    paragraph = text[len(lines[0]):first_block.start()].strip().split("\n\n")[0]
    assert paragraph and not paragraph.startswith("#"), "a paragraph follows the title"


def test_readme_links_every_doc_page():
    linked = set(re.findall(r"\]\((docs/[a-z0-9-]+\.md)(?:#[^)]*)?\)", README.read_text()))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "README's documentation list lacks these pages"


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in _LINK.findall(_prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            rel = page.relative_to(REPO)
            if not dest.exists():
                broken.append(f"{rel}: {target} (no such file)")
                continue
            if REPO not in dest.parents and dest != REPO:
                broken.append(f"{rel}: {target} (outside the repository)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{rel}: {target} (no such heading)")
    assert broken == []


def test_nothing_refers_to_files_outside_the_repository():
    bad = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"design §|design\.md|\.\./shared|shared/", line):
                bad.append(f"{page.relative_to(REPO)}:{n}: {line.strip()}")
    assert bad == []


def _faults_page() -> str:
    return (REPO / "docs" / "faults.md").read_text()


def test_fault_table_names_exactly_the_catalogue():
    rows = re.findall(r"^\| `([a-z-]+)` \(|^\| `([a-z-]+)` \|", _faults_page(), re.M)
    table = {a or b for a, b in rows} - set(NODE_ACTIONS)  # the node actions' table, on the same page
    assert table == set(KINDS)


def test_fault_kinds_line_names_exactly_the_catalogue():
    line = re.search(r"^Kinds: (.*?)\n\(", _faults_page(), re.M | re.S)
    assert line is not None, "docs/faults.md lists the kinds on a 'Kinds:' line"
    named = re.findall(r"`([a-z-]+)`", line.group(1))
    assert named == sorted(named, key=list(KINDS).index) and set(named) == set(KINDS)


def test_no_file_cites_the_design_document_outside_the_repository():
    """Code comments, docstrings, rule files, runbooks and the Makefile say what they mean or name a file in
    the repository instead of a section of a design document that is not in it."""
    roots = ["Makefile", "gpuobs", "runbooks", "compose", "prometheus", "alertmanager", "deploy", "bench", "scripts",
             "tests"]
    bad = []
    for root in roots:
        base = REPO / root
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            if not path.is_file() or path == Path(__file__) or path.suffix in {".pyc", ".png", ".sqlite"}:
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            bad += [f"{path.relative_to(REPO)}: {m}" for m in re.findall(r".{0,30}(?:design §|design\.md).{0,10}", text)]
    assert bad == []
