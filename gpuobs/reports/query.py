"""Prometheus access shared by the reports: range queries to plot lines, PromQL quoting, legends.

Error policy: :class:`~gpuobs.promapi.prometheus.PrometheusUnavailable` (connection refused, 5xx) and
:class:`~gpuobs.promapi.prometheus.PrometheusResponseError` (wrong URL, auth, garbage) concern every
query alike, so they propagate and stop the report; a query the server rejects
(:class:`~gpuobs.promapi.prometheus.PrometheusQueryError`) only costs its own panel, which then says why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from gpuobs.promapi.prometheus import (
    PromClient,
    PrometheusQueryError,
    QueryResult,
    Series,
)
from gpuobs.reports.plots import Line

#: Labels that never help tell two plotted series apart.
NOISE_LABELS = frozenset({"instance", "job", "UUID", "pci_bus_id", "device", "modelName",
                          "window_size_in_ms", "err_msg", "engine"})
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def client_for(url: str, timeout: float = 10.0) -> PromClient:
    """A client for the reports: one retry, short backoff (a report should fail fast, not hang).

    Raises ValueError for a URL that is not http(s)."""
    return PromClient(url, timeout=timeout, retries=1, backoff=0.5)


def quote(value: object) -> str:
    """A PromQL string literal for ``value`` (double quotes; backslash, quote and newline escaped)."""
    s = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def matchers(**labels: object) -> str:
    """``Hostname="h",gpu="0"`` from keyword labels; None values are left out."""
    return ",".join(f"{k}={quote(v)}" for k, v in labels.items() if v is not None)


def tidy(expr: str) -> str:
    """Drop the stray commas an empty substituted selector leaves (``{a="b",}``, ``{,a="b"}``)."""
    return expr.replace(",}", "}").replace("{,", "{")


def step_for(span_s: float, points: int = 400, minimum: float = 5.0) -> float:
    """A query step giving about ``points`` points over ``span_s`` seconds, never under ``minimum``."""
    return float(max(minimum, math.ceil(max(span_s, 1.0) / points)))


def legend(template: str, labels: Mapping[str, str], varying: Sequence[str]) -> str:
    """``template`` with ``{label}`` fields filled from ``labels`` (``?`` when absent). Without fields
    and with several series, the labels that differ between them (``varying``) are appended (the
    metric name alone, for ``__name__``)."""
    if _FIELD.search(template):
        return _FIELD.sub(lambda m: str(labels.get(m.group(1), "?")), template)
    extra = ", ".join(labels[k] if k == "__name__" else f"{k}={labels[k]}" for k in varying if k in labels)
    return f"{template} ({extra})" if extra else template


def natural_key(text: str) -> list:
    """Sort key putting ``rank 9`` before ``rank 10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def varying_labels(series: Sequence[Series], limit: int = 3) -> list[str]:
    """Label names whose values differ between ``series`` (noise labels excluded), at most ``limit``."""
    if len(series) < 2:
        return []
    keys = sorted({k for s in series for k in s.labels} - NOISE_LABELS)
    return [k for k in keys if len({s.labels.get(k) for s in series}) > 1][:limit]


@dataclass
class Fetched:
    """Lines of one panel and the notes (rejected queries, empty results) to print under it."""

    lines: list[Line] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    points: int = 0


def fetch_lines(client: PromClient, queries: Sequence[tuple[str, str]], start: float, end: float, step: float,
                origin: float, x_unit_s: float = 1.0) -> Fetched:
    """Run each ``(legend template, expr)`` over [start, end]; x = (t - origin) / x_unit_s.

    Propagates PrometheusUnavailable / PrometheusResponseError; a rejected query becomes a note."""
    out = Fetched()
    for template, expr in queries:
        try:
            res: QueryResult = client.query_range(expr, start, end, step)
        except PrometheusQueryError as exc:
            out.notes.append(f"query rejected ({exc.error_type}): {exc.message}: {expr}")
            continue
        series = [s for s in res.series if s.values]
        if not series:
            out.notes.append(f"no data: {expr}")
            continue
        varying = varying_labels(series)
        lines = [Line(legend(template, s.labels, varying), [(t - origin) / x_unit_s for t in s.timestamps],
                      list(s.values)) for s in series]
        out.lines.extend(sorted(lines, key=lambda line: natural_key(line.label)))
        out.points += sum(len(s.values) for s in series)
    return out
