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
