"""PNG plots for the reports (matplotlib, Agg; no window is ever opened).

The backend is set to Agg when this module is imported, unless the process already imported
``matplotlib.pyplot`` (then its choice stands; this module never uses pyplot anyway: figures are
:class:`matplotlib.figure.Figure` objects drawn on an Agg canvas, which is thread-safe and needs no
display). Every function returns PNG bytes.

Text that comes from Prometheus labels is passed through :func:`plain` so matplotlib's mathtext
never interprets a ``$`` in a label, and a legend label starting with ``_`` is not dropped.
"""

from __future__ import annotations

import io
import math
import sys
from dataclasses import dataclass
from typing import Sequence

import matplotlib

if "matplotlib.pyplot" not in sys.modules:
    matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

WIDTH_IN, HEIGHT_IN, DPI = 9.5, 3.1, 100

#: Marker colours and line styles per event kind (drill timeline, rollout stages).
MARKER_STYLE: dict[str, tuple[str, str]] = {
    "injected": ("#c62828", "-"),
    "firing": ("#ef6c00", "--"),
    "paged": ("#6a1b9a", "-."),
    "cleared": ("#2e7d32", "-"),
    "resolved": ("#1565c0", ":"),
    "stage": ("#546e7a", "--"),
}


@dataclass(frozen=True)
class Line:
    """One plotted series: legend ``label``, x values (seconds or minutes), y values."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``x``; ``kind`` picks its style from :data:`MARKER_STYLE`."""

    x: float
    label: str
    kind: str = "stage"


@dataclass(frozen=True)
class Span:
    """A shaded band from ``x0`` to ``x1`` (e.g. a rollout stage), labelled inside the plot."""

    x0: float
    x1: float
    label: str
    color: str = "#90a4ae"


def plain(text: object) -> str:
    """Text safe for matplotlib: ``$`` escaped (no mathtext), no leading underscore."""
    s = str(text).replace("$", r"\$")
    return " " + s if s.startswith("_") else s


def _finite(ys: Sequence[float]) -> list[float]:
    return [y if isinstance(y, (int, float)) and math.isfinite(y) else math.nan for y in ys]


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _no_data(ax, why: str) -> None:
    ax.text(0.5, 0.5, plain(why), transform=ax.transAxes, ha="center", va="center", color="#6b7385", fontsize=10)


def timeseries_png(title: str, ylabel: str, lines: Sequence[Line], markers: Sequence[Marker] = (),
                   spans: Sequence[Span] = (), xlabel: str = "seconds since injection",
                   xlim: tuple[float, float] | None = None, empty_note: str = "no data in this window",
                   logy: bool = False) -> bytes:
    """Lines over time with vertical ``markers`` and shaded ``spans``; a "no data" note when empty."""
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN))
    ax = fig.add_subplot()
    ax.set_title(plain(title), fontsize=10, loc="left")
    ax.set_xlabel(plain(xlabel), fontsize=8)
    ax.set_ylabel(plain(ylabel), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    drawn = 0
    for line in lines:
        ys = _finite(line.ys)
        if not any(math.isfinite(y) for y in ys):
            continue
        ax.plot(list(line.xs), ys, label=plain(line.label), linewidth=1.3)
        drawn += 1
    if logy and drawn:
        ax.set_yscale("log")
    for i, span in enumerate(spans):
        ax.axvspan(span.x0, span.x1, color=span.color, alpha=0.10 if i % 2 else 0.20, linewidth=0)
        ax.text(span.x0, 1.0, " " + plain(span.label), transform=ax.get_xaxis_transform(), fontsize=7,
                va="top", ha="left", color="#37474f", clip_on=True)
    seen: set[str] = set()
    for m in markers:
        if m.x is None or not math.isfinite(m.x):
            continue
        color, style = MARKER_STYLE.get(m.kind, MARKER_STYLE["stage"])
        label = plain(m.label)
        ax.axvline(m.x, color=color, linestyle=style, linewidth=1.2,
                   label=label if label not in seen else None)
        seen.add(label)
    if xlim is not None:
        ax.set_xlim(*xlim)
    if not drawn:
        _no_data(ax, empty_note)
    if drawn or seen:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _png(fig)


def _edges(bounds: Sequence[float]) -> list[float]:
    """Plot edges for buckets ``(-, b0], (b0, b1], ..., (b_last, +Inf)`` on a log axis."""
    b = [float(x) for x in bounds]
    first = b[0] / (b[1] / b[0]) if len(b) > 1 and b[0] > 0 else b[0] / 2
    return [first, *b, b[-1] * 2]


def distribution_png(title: str, unit: str, bounds: Sequence[float],
                     groups: Sequence[tuple[str, Sequence[float]]]) -> bytes:
    """Canary-vs-baseline histogram from bucket counts: per-bucket share (left) and CDF (right).

    ``bounds`` are the finite ``le`` bounds (ascending, > 0); each group is ``(legend, counts)`` with
    ``len(bounds) + 1`` per-bucket (non-cumulative) counts, the last one the +Inf bucket.
    """
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN))
    left, right = fig.subplots(1, 2)
    left.set_title(plain(f"{title}: share of requests per bucket"), fontsize=9, loc="left")
    right.set_title(plain(f"{title}: cumulative share"), fontsize=9, loc="left")
    drawn = 0
    edges = _edges(bounds) if bounds else []
    used: list[int] = []  # indices of non-empty buckets: the x range shown
    for label, counts in groups:
        total = float(sum(counts))
        if not bounds or total <= 0 or len(counts) != len(bounds) + 1:
            continue
        used += [i for i, c in enumerate(counts) if c > 0]
        share = [c / total for c in counts]
        left.stairs(share, edges, label=plain(label), linewidth=1.4)
        cum, acc = [], 0.0
        for s in share:
            acc += s
            cum.append(acc)
        right.step(edges[1:], cum, where="post", label=plain(label), linewidth=1.4)
        drawn += 1
    for ax in (left, right):
        ax.set_xlabel(plain(f"bucket upper bound ({unit})"), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.set_xscale("log")
    right.set_ylim(0, 1.02)
    if used:
        lo, hi = max(0, min(used) - 1), min(len(edges) - 1, max(used) + 2)
        for ax in (left, right):
            ax.set_xlim(edges[lo], edges[hi])
    if drawn:
        right.legend(loc="lower right", fontsize=7)
    else:
        _no_data(left, "no requests in the window")
        _no_data(right, "no requests in the window")
    return _png(fig)
