"""docs/layout.md (the repository layout, moved out of the README) stays true: every package folder has a
row, every doc is linked."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _layout() -> str:
    return (REPO / "docs" / "layout.md").read_text()


def test_every_package_folder_has_a_layout_row():
    rows = set(re.findall(r"^\| `(gpuobs/[a-z_]+/)` \|", _layout(), re.M))
    folders = {f"gpuobs/{p.parent.name}/" for p in (REPO / "gpuobs").glob("*/__init__.py")}
    assert folders - rows == set(), "docs/layout.md lacks rows for these packages"
    assert rows - folders == set(), "docs/layout.md names packages that do not exist"


def test_every_doc_page_is_linked_from_the_layout():
    linked = {f"docs/{name}" for name in re.findall(r"\]\(([a-z0-9-]+\.md)\)", _layout())}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "docs/layout.md does not link these docs"
    assert linked - pages == set(), "docs/layout.md links docs that do not exist"


def test_every_module_a_layout_row_names_exists():
    """A row that names a module (`` `simfleet.py` ``, `` `ha.py` ``) names one in its own folder (or, by
    its path from the repository, `` `gpuobs/core/fleet.py` ``, anywhere)."""
    missing = []
    for folder, text in re.findall(r"^\| `(gpuobs/[a-z_]+/)` \| (.*)$", _layout(), re.M):
        for name in re.findall(r"`([a-z_/]+\.py)`", text):
            if not (REPO / (name if name.startswith("gpuobs/") else folder + name)).is_file():
                missing.append(folder + name)
    assert missing == [], "docs/layout.md names modules that do not exist"
