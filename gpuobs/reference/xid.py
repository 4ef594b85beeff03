"""The Xid catalogue: code -> name, severity, recommended action.

Source: ``data/xid_catalog.csv``, copied from the project's shared reference data (NVIDIA Xid
Catalog, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html; NVSentinel's
fatal/non-fatal mapping; k8s-device-plugin's application-error list). ``severity`` is gpuobs's
mapping: ``critical`` = reset GPU / reboot node / RMA path, ``warning`` = the rest, ``info`` =
NVIDIA says ignore.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from importlib import resources

#: Xid codes that ticket (runbooks/xid.md) even though the catalogue marks some of them ``info``:
#: 63 row remap pending, 92 high SBE rate, 94 contained memory error, and the application-class
#: codes 13, 31, 43, 45, 68 (k8s-device-plugin internal/rm/health.go).
TICKETED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 63, 68, 92, 94})

#: Xids DCGM's Xid fields (DCGM_FI_DEV_XID_ERRORS, DCGM_EXP_XID_ERRORS_COUNT) never carry: on Xid 79 the
#: GPU falls off the bus before DCGM can read the event, and recovery (GPU reset or reboot) restarts
#: the host engine with no Xid state (NVIDIA/DCGM issue #162). Only the kernel log records them.
DCGM_UNREPORTABLE_XIDS: frozenset[int] = frozenset({79})


@dataclass(frozen=True)
class XidInfo:
    """One catalogue row. ``message`` is the name without the ``[RM_CODE]`` suffix."""

    code: int
    name: str
    severity: str
    recommended_action: str
    source: str

    @property
    def message(self) -> str:
        return re.sub(r"\s*\[[A-Z0-9_]+\]\s*$", "", self.name).strip()


@functools.cache
def catalog() -> dict[int, XidInfo]:
    """All catalogue rows keyed by Xid code. Raises RuntimeError if the packaged CSV is malformed."""
    text = resources.files("gpuobs.reference").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8")
    rows: dict[int, XidInfo] = {}
    for row in csv.DictReader(text.splitlines()):
        try:
            code = int(row["xid"])
        except (KeyError, ValueError) as exc:
            raise RuntimeError(f"xid_catalog.csv: bad xid value in row {row!r}") from exc
        rows[code] = XidInfo(code, row["name"], row["severity"], row["recommended_action"], row["source"])
    return rows


def message(code: int) -> str:
    """Human message for an Xid code; codes outside the catalogue get a generic message."""
    info = catalog().get(code)
    return info.message if info else f"Xid {code} (not in the gpuobs catalogue)"


def critical_codes() -> list[int]:
    """Codes that page: catalogue severity ``critical`` (reset GPU / reboot node / RMA)."""
    return sorted(c for c, i in catalog().items() if i.severity == "critical")


def ticket_codes() -> list[int]:
    """Codes that ticket: catalogue severity ``warning`` plus the ticketed list :data:`TICKETED_XIDS`."""
    crit = set(critical_codes())
    return sorted(
        c for c, i in catalog().items()
        if c not in crit and (i.severity == "warning" or c in TICKETED_XIDS)
    )
