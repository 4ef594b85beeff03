"""Files written so that readers never see half of them."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and rename.

    Creates the parent directories. Raises OSError from the file system; on error the old file (if
    any) is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def stale_files(root: Path, files: dict[str, str]) -> list[str]:
    """The relative paths of ``files`` (relative path -> text) whose file under ``root`` is missing,
    unreadable or different (a generator's ``--check``)."""
    stale = []
    for rel, text in files.items():
        try:
            same = (root / rel).read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            stale.append(rel)
    return stale


def write_tree(root: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` (relative path -> text) under ``root``, each atomically (:func:`atomic_write`);
    returns the paths written. Every directory is created and every target checked first, so a
    root that is a file, a directory that cannot be created or a target that is a directory fails
    before anything is written. Raises OSError naming the path (``filename``)."""
    paths = [root / rel for rel in files]
    for path in paths:  # nothing is created until every target is known to be writable
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
        existing = path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(existing))
        if not os.access(existing, os.W_OK):
            raise PermissionError(13, "Permission denied", str(existing))
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    for path, text in zip(paths, files.values()):
        atomic_write(path, text)
    return paths
