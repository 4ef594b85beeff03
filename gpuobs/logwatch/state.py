"""The agent's durable state: the source position and every counter, saved together atomically.

Saving counts and position in ONE atomic write (temp file + rename) is what makes a restart lose
and duplicate nothing: either both the lines of a batch and the position after them are on disk,
or neither is, and the restarted agent re-reads exactly the lines it had not saved.

File: JSON, ``{"version": 1, "source": <kind>, "position": {...}, "xid": [...], "sxid": [...],
"fallen": {...}, "recovery": {...}, "uuids": {...}, "lines": n, "unparsed": n, "lost": n}``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

VERSION = 1


class StateError(ValueError):
    """The state file exists but cannot be used (names the file and the problem)."""


@dataclass
class Counts:
    """Counters and boot-scoped gauges.

    ``xid``: (pci_bus_id, gpu_instance or "", code) -> [count, last event unix time];
    ``sxid``: (device, pci_bus_id, code, "fatal"|"non-fatal") -> [count, last event unix time];
    ``fallen``: pci_bus_id -> unix time the GPU fell off the bus (this boot);
    ``recovery``: pci_bus_id -> NV2080_CTRL_GPU_RECOVERY_ACTION value of the last Xid 154 (this boot);
    ``uuids``: pci_bus_id -> UUID learned from "GPU at PCI" lines.
    """

    xid: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)
    sxid: dict[tuple[str, str, int, str], list[float]] = field(default_factory=dict)
    fallen: dict[str, float] = field(default_factory=dict)
    recovery: dict[str, int] = field(default_factory=dict)
    uuids: dict[str, str] = field(default_factory=dict)
    lines: int = 0
    unparsed: int = 0
    lost: int = 0
    last_line_at: float = 0.0

    def new_boot(self) -> None:
        """The host rebooted: GPUs are back on the bus and recovery actions are reset."""
        self.fallen.clear()
        self.recovery.clear()


def save(path: Path, source: str, position: dict, c: Counts) -> None:
    """Write the state atomically (temp file in the same directory, fsync, rename)."""
    doc = {"version": VERSION, "source": source, "position": position,
           "xid": [[b, gi, code, n, t] for (b, gi, code), (n, t) in sorted(c.xid.items())],
           "sxid": [[d, b, code, f, n, t] for (d, b, code, f), (n, t) in sorted(c.sxid.items())],
           "fallen": c.fallen, "recovery": c.recovery, "uuids": c.uuids,
           "lines": c.lines, "unparsed": c.unparsed, "lost": c.lost, "last_line_at": c.last_line_at}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load(path: Path, source: str) -> tuple[dict | None, Counts]:
    """(position, counts) from ``path``; (None, empty Counts) if the file does not exist.

    Raises StateError if the file is unreadable, malformed, or was written for another source kind
    (a position of one kind means nothing to another).
    """
    if not path.exists():
        return None, Counts()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("version") != VERSION:
            raise StateError(f"{path}: state version {doc.get('version')!r}, expected {VERSION}")
        if doc.get("source") != source:
            raise StateError(f"{path}: state was written for source {doc.get('source')!r}, not {source!r}; "
                             "use another --state-file or delete it to start over")
        c = Counts(
            xid={(str(b), str(gi), int(code)): [int(n), float(t)] for b, gi, code, n, t in doc["xid"]},
            sxid={(str(d), str(b), int(code), str(f)): [int(n), float(t)] for d, b, code, f, n, t in doc["sxid"]},
            fallen={str(k): float(v) for k, v in doc["fallen"].items()},
            recovery={str(k): int(v) for k, v in doc["recovery"].items()},
            uuids={str(k): str(v) for k, v in doc["uuids"].items()},
            lines=int(doc["lines"]), unparsed=int(doc["unparsed"]), lost=int(doc["lost"]),
            last_line_at=float(doc.get("last_line_at", 0.0)))
        position = doc["position"]
        if not isinstance(position, dict):
            raise StateError(f"{path}: 'position' must be an object")
        return position, c
    except StateError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateError(f"{path}: damaged state file ({type(exc).__name__}: {exc}); "
                         "move it away to start from the source's default position") from None
