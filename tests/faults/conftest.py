"""The fault suite's result table: every fault test adds rows with :func:`record`; the table is printed
at the end of the session (and written to ``$GPUOBS_FAULT_TABLE`` when set)."""

from __future__ import annotations

import os

ROWS: list[tuple[str, str, str, str]] = []


def record(surface: str, tried: str, held: str, ok: bool) -> None:
    """One table row: what was tried against ``surface``, what was measured, and whether it held."""
    ROWS.append((surface, tried, held, "held" if ok else "FAILED"))


def table() -> str:
    head = ("surface", "tried", "measured", "result")
    widths = [max(len(r[i]) for r in [head, *ROWS]) for i in range(4)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, ROWS)])


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    terminalreporter.section("fault suite")
    terminalreporter.write_line(table())
    path = os.environ.get("GPUOBS_FAULT_TABLE")
    if path:
        with open(path, "w") as fh:
            fh.write(table() + "\n")
