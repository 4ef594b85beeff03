"""Cumulative Prometheus histograms fed with numpy arrays of observations.

Bucket boundaries are upper bounds (``le``); an observation equal to a boundary falls in that
bucket, as in prometheus_client. ``observe_many`` is vectorised so a node can record thousands of
per-token latencies per tick cheaply.
"""

from __future__ import annotations

import numpy as np

from gpuobs.exporter.exposition import Family, label_string
from gpuobs.reference.buckets import (  # noqa: F401
    COLLECTIVE_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    STEP_BUCKETS,
    TTFT_BUCKETS,
)


class Histogram:
    """One histogram series: per-bucket counts (non-cumulative internally), sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count", "_rows")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = np.asarray(bounds, dtype=float)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # last slot = +Inf overflow
        self.sum = 0.0
        self.count = 0
        self._rows: tuple[tuple, list[tuple[str, str]]] | None = None  # (name, labels) -> rendered names/labels

    def observe_many(self, values: np.ndarray) -> None:
        """Record observations (seconds); NaN values are rejected with ValueError."""
        if values.size == 0:
            return
        if np.isnan(values).any():
            raise ValueError("histogram observation is NaN")
        idx = np.searchsorted(self.bounds, values, side="left")
        self.counts += np.bincount(idx, minlength=self.counts.size)
        self.sum += float(values.sum())
        self.count += int(values.size)

    def samples(self, name: str, labels: list[tuple[str, str]]) -> list[tuple[str, str, float]]:
        """(sample name, label string, value) rows: cumulative ``_bucket`` per le, ``_sum``, ``_count``.

        The sample names and label strings are rendered once per (name, labels) and reused."""
        key = (name, tuple(labels))
        if self._rows is None or self._rows[0] != key:
            heads = [(f"{name}_bucket", label_string(labels + [("le", _fmt_le(b))])) for b in self.bounds]
            heads.append((f"{name}_bucket", label_string(labels + [("le", "+Inf")])))
            heads += [(f"{name}_sum", label_string(labels)), (f"{name}_count", label_string(labels))]
            self._rows = (key, heads)
        values = np.cumsum(self.counts).astype(float).tolist() + [self.sum, float(self.count)]
        return [(n, ls, v) for (n, ls), v in zip(self._rows[1], values)]


def _fmt_le(bound: float) -> str:
    """``le`` label text as prometheus_client writes it (``1.0``, ``0.25``, ``2560.0``)."""
    return repr(float(bound))


def histogram_family(name: str, help_text: str, series: list[tuple[list[tuple[str, str]], Histogram]]) -> Family:
    """A histogram Family from ``[(labels, Histogram), ...]``; samples carry their own suffixed names."""
    fam = Family(name, "histogram", help_text, None)
    for labels, h in series:
        fam.samples.extend(h.samples(name, labels))
    return fam
