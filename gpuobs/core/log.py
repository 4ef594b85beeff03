"""Structured logging: one JSON object per line on stderr.

Each record carries ``ts`` (RFC 3339 UTC), ``level``, ``component``, ``msg`` and any extra
``fields`` passed with ``extra={"fields": {...}}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys


class JsonFormatter(logging.Formatter):
    """Formats a LogRecord as one JSON line: ts, level, component, msg, fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "component": record.name.removeprefix("gpuobs."),
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            doc["fields"] = fields
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever ``sys.stderr`` is when a record is emitted, not the one at setup:
    a caller that swaps stderr (pytest's capture, a daemon redirecting it to its log file) would
    otherwise leave the handler writing to a closed stream ("--- Logging error ---")."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ / setStream assign it; always stderr
        pass


def setup(level: str = "info") -> None:
    """Route the ``gpuobs`` logger tree to stderr as JSON lines at ``level``."""
    root = logging.getLogger("gpuobs")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        root.setLevel(level.upper())
        return
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


def get(component: str) -> logging.Logger:
    """Logger for one component, e.g. ``get("pager")`` -> logger ``gpuobs.pager``."""
    return logging.getLogger(f"gpuobs.{component}")
