"""The README's layout section stays true: every package folder has a row, every doc is linked."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _layout() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Layout")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_every_package_folder_has_a_layout_row():
    rows = set(re.findall(r"^\| `(gpuobs/[a-z_]+/)` \|", _layout(), re.M))
    folders = {f"gpuobs/{p.parent.name}/" for p in (REPO / "gpuobs").glob("*/__init__.py")}
    assert folders - rows == set(), "README layout lacks rows for these packages"
    assert rows - folders == set(), "README layout names packages that do not exist"


def test_every_doc_page_is_linked_from_the_layout():
    linked = set(re.findall(r"\]\((docs/[a-z0-9-]+\.md)\)", _layout()))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "README layout does not link these docs"
    assert linked - pages == set(), "README layout links docs that do not exist"


def test_every_module_a_layout_row_names_exists():
    """A row that names a module (`` `simfleet.py` ``, `` `ha.py` ``) names one in its own folder (or, by
    its path from the repository, `` `gpuobs/core/fleet.py` ``, anywhere)."""
    missing = []
    for folder, text in re.findall(r"^\| `(gpuobs/[a-z_]+/)` \| (.*)$", _layout(), re.M):
        for name in re.findall(r"`([a-z_/]+\.py)`", text):
            if not (REPO / (name if name.startswith("gpuobs/") else folder + name)).is_file():
                missing.append(folder + name)
    assert missing == [], "README layout names modules that do not exist"
