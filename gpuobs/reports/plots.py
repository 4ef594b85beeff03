"""PNG plots for the reports (matplotlib, Agg; no window is ever opened).

The backend is set to Agg when this module is imported, unless the process already imported
``matplotlib.pyplot`` (then its choice stands; this module never uses pyplot anyway: figures are
:class:`matplotlib.figure.Figure` objects drawn on an Agg canvas, which is thread-safe and needs no
display). Every function returns PNG bytes.

Text that comes from Prometheus labels is passed through :func:`plain` so matplotlib's mathtext
never interprets a ``$`` in a label, and a legend label starting with ``_`` is not dropped.
"""

from __future__ import annotations

import datetime as dt
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
from matplotlib.ticker import FuncFormatter  # noqa: E402

WIDTH_IN, HEIGHT_IN, DPI = 9.5, 3.1, 100

#: Marker colours and line styles per event kind (drill timeline, rollout stages). Markers are
#: vertical lines in dark, muted colours none of which is in :data:`DATA_COLORS`, so an event can
#: never be mistaken for a series.
MARKER_STYLE: dict[str, tuple[str, str]] = {
    "injected": ("#8b0000", "-"),
    "firing": ("#8d6e63", "--"),
    "paged": ("#6a1b9a", "-."),
    "cleared": ("#33691e", (0, (6, 2, 1, 2))),
    "resolved": ("#263238", ":"),
    "stage": ("#78909c", (0, (2, 3))),
}
#: Data series colours: the Okabe-Ito colour-blind-safe palette (Okabe & Ito, "Color Universal
#: Design", 2008) less its yellow, which does not show on white; disjoint from MARKER_STYLE's.
DATA_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
#: Data line styles, cycled with the colours: two series with identical values still show as a
#: wide solid line with a narrower dashed one on top (later series are drawn narrower).
DATA_STYLES = ("-", "--", "-.", ":")
#: Units whose axis starts at zero: counts, rates of counts, ratios, up/down. A count that moves
#: from 1 to 2 must not fill the plot's height as if it had doubled from nothing.
ZERO_BASED_UNITS = frozenset({"GPUs", "Xids", "errors", "rows", "up", "per second", "requests per second",
                              "ratio", "count", "requests", "pages", "alerts", "share"})
#: Smallest y-span, relative to the largest magnitude shown: a 0.5% gap between two latency lines
#: stays a 0.5% gap on the axis (1/20 of its height) instead of filling it.
MIN_REL_SPAN = 0.1


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


def y_limits(values: Sequence[float], zero_based: bool, min_rel_span: float = MIN_REL_SPAN
             ) -> tuple[float, float] | None:
    """y-axis ``(low, high)`` for the finite ``values`` (None when there are none: matplotlib's default).

    ``zero_based`` (counts, ratios, rates): the axis includes 0. Otherwise the span is at least
    ``min_rel_span`` times the largest magnitude, centred on the data; a 5% margin is added either way
    (never below 0 for zero-based non-negative data)."""
    ys = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not ys:
        return None
    lo, hi = min(ys), max(ys)
    if zero_based:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        if hi == lo:
            hi = lo + 1.0  # all zero: a 0..1 axis, not matplotlib's -0.05..0.05
    else:
        need = min_rel_span * max(abs(lo), abs(hi))
        if hi - lo < need:
            mid = (hi + lo) / 2.0
            lo, hi = mid - need / 2.0, mid + need / 2.0
        if hi == lo:  # all zero
            lo, hi = -0.5, 0.5
    pad = 0.05 * (hi - lo)
    low = lo - pad if not (zero_based and lo >= 0) else 0.0
    return low, hi + pad


def zero_based_unit(unit: str) -> bool:
    """Whether an axis in ``unit`` starts at zero (:data:`ZERO_BASED_UNITS`)."""
    return unit in ZERO_BASED_UNITS


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Legend labels made unique: a repeated one gets `` #2``, `` #3``... (first stays as is)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def data_style(i: int, n: int) -> dict:
    """matplotlib keyword arguments for the ``i``-th of ``n`` data lines: colour, style, width
    (earlier lines wider, so identical lines stay visible), drawn above the markers."""
    width = 1.3 if n <= 1 else max(1.1, 2.8 - 1.7 * i / (n - 1))
    return {"color": DATA_COLORS[i % len(DATA_COLORS)],
            "linestyle": DATA_STYLES[(i // len(DATA_COLORS) + i) % len(DATA_STYLES)],
            "linewidth": width, "zorder": 3 + i}


def _no_data(ax, why: str) -> None:
    ax.text(0.5, 0.5, plain(why), transform=ax.transAxes, ha="center", va="center", color="#6b7385", fontsize=10)


def timeseries_png(title: str, ylabel: str, lines: Sequence[Line], markers: Sequence[Marker] = (),
                   spans: Sequence[Span] = (), xlabel: str = "seconds since injection",
                   xlim: tuple[float, float] | None = None, empty_note: str = "no data in this window",
                   logy: bool = False, zero_based: bool | None = None, utc_origin: float | None = None) -> bytes:
    """Lines over time with vertical ``markers`` and shaded ``spans``; a "no data" note when empty.

    ``zero_based``: the y-axis starts at 0 (default: :func:`zero_based_unit` of ``ylabel``); else it
    spans at least :data:`MIN_REL_SPAN` of the values' magnitude (:func:`y_limits`). ``utc_origin``
    (epoch s): x values are seconds since that instant and the x-axis is labelled in UTC clock time
    (``HH:MM:SS``, date in the axis label). Repeated legend labels are numbered (:func:`unique_labels`)."""
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN))
    ax = fig.add_subplot()
    ax.set_title(plain(title), fontsize=10, loc="left")
    ax.set_ylabel(plain(ylabel), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    if utc_origin is not None:
        day = dt.datetime.fromtimestamp(utc_origin, dt.timezone.utc).strftime("%Y-%m-%d")
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _pos: dt.datetime.fromtimestamp(utc_origin + x, dt.timezone.utc).strftime("%H:%M:%S")))
        xlabel = f"time (UTC, {day})"
    ax.set_xlabel(plain(xlabel), fontsize=8)
    drawn, shown = 0, []
    visible = [line for line in lines if any(math.isfinite(y) for y in _finite(line.ys))]
    for i, (line, label) in enumerate(zip(visible, unique_labels([plain(x.label) for x in visible]))):
        ys = _finite(line.ys)
        ax.plot(list(line.xs), ys, label=label, **data_style(i, len(visible)))
        shown += ys
        drawn += 1
    if logy and drawn:
        ax.set_yscale("log")
    elif drawn:
        limits = y_limits(shown, zero_based_unit(ylabel) if zero_based is None else zero_based)
        if limits:
            ax.set_ylim(*limits)
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
        ax.axvline(m.x, color=color, linestyle=style, linewidth=1.0, alpha=0.9, zorder=2,
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
    good = [(label, counts) for label, counts in groups
            if bounds and float(sum(counts)) > 0 and len(counts) == len(bounds) + 1]
    for i, ((_, counts), label) in enumerate(zip(good, unique_labels([plain(g[0]) for g in good]))):
        total = float(sum(counts))
        style = data_style(i, len(good))
        used += [j for j, c in enumerate(counts) if c > 0]
        share = [c / total for c in counts]
        left.stairs(share, edges, label=label, **style)
        cum, acc = [], 0.0
        for s in share:
            acc += s
            cum.append(acc)
        right.step(edges[1:], cum, where="post", label=label, **style)
        drawn += 1
    for ax in (left, right):
        ax.set_xlabel(plain(f"bucket upper bound ({unit})"), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.set_xscale("log")
    right.set_ylim(0, 1.02)
    if drawn:
        left.set_ylim(bottom=0)
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
