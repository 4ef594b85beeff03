"""A simulated serving fleet behind a fake Prometheus query API that computes ``increase()`` the way
Prometheus 2.42 does, for the canary benchmark (bench/bench_canary.py) and unit tests.

Why not the real Prometheus: the benchmark needs hundreds of thousands of looks; the real engine is
checked against this fake on the same scrapes in tests/canary/test_prom_fleet.py (promtool, real
Prometheus 2.42 PromQL engine), so the fake's answers are the engine's answers.

:class:`Fleet` holds, per run, scrapes of one canary pod and ``pods - 1`` baseline pods: every pod is
scraped every ``scrape_s`` seconds at its own phase; each scrape records the cumulative
``_bucket``/``_count`` counters of the TTFT histogram and ``request_success_total`` per
``finished_reason`` (stop, error) (and, optionally, further histograms such as ITL), with labels ``job="vllm"``, ``track``, ``instance``.
:class:`FakeSession` stands in for ``requests.Session`` inside :class:`gpuobs.promapi.prometheus.PromClient`,
so the client's request building, response decoding and the analyzer's parsing all run.

Supported expressions (exactly what the analyzer sends; anything else raises AssertionError):
``sum by (le, <label>) (increase(M{..}[Ws]))``, ``sum by (<label>) (increase(M{..}[Ws]))``,
``sum(increase(M{..}[Ws]))``, ``min(count_over_time(M{..}[Ws]))``, and the analyzer's first-sample
query ``min(min_over_time(timestamp(M{..})[Rs:Ss]))`` (a subquery: steps at multiples of ``S`` within
``[at - R, at]``, each step taking the newest sample at or before it within the 5 min lookback, whose
timestamp the ``min`` keeps); matchers ``name="value"``.

``increase()`` (source: prometheus/prometheus v2.42.0 promql/functions.go, extrapolatedRate, and
promql/engine.go matrixIterSlice): the samples with ``start <= t <= end``; fewer than two -> no
result; ``last - first`` plus, for each decrease (counter reset), the value before it; then
extrapolated: durationToStart/End from the first/last sample to the window's edges, durationToStart
clipped to the counter's zero point ``sampled * first / result`` when the result is positive and
the first value >= 0; each edge extrapolated fully when closer than 1.1 average sample intervals,
else by half an interval; result x (sampled + toStart + toEnd) / sampled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_Q_BY = re.compile(r"^sum by \(([a-z_, ]+)\) \(increase\(([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}\[(\d+)s\]\)\)$")
_Q_SUM = re.compile(r"^sum\(increase\(([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}\[(\d+)s\]\)\)$")
_Q_COUNT = re.compile(r"^min\(count_over_time\(([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}\[(\d+)s\]\)\)$")
_Q_FIRST = re.compile(r"^min\(min_over_time\(timestamp\(([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}\)\[(\d+)s:(\d+)s\]\)\)$")
LOOKBACK_S = 300.0  # Prometheus' default --query.lookback-delta
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')
_ANY_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
REASONS = ("stop", "error")


def _matches(value: str, op: str, want: str) -> bool:
    """One label matcher, as Prometheus applies it (regexes fully anchored)."""
    if op in ("=", "!="):
        return (value == want) == (op == "=")
    return bool(re.fullmatch(want, value)) == (op == "=~")


def increase(t: np.ndarray, v: np.ndarray, start: float, end: float, left_open: bool = False) -> np.ndarray | None:
    """Prometheus 2.42 ``increase()`` of the series sampled at times ``t`` (S,) with values ``v``
    (S, ...) over [start, end]; vectorised over the trailing axes (e.g. the ``le`` buckets of one
    pod, which share scrape times). None when fewer than two samples fall in the window.
    ``left_open``: Prometheus 3.x's range selectors, ``(start, end]`` (a sample exactly at the window's
    start is not in it; the extrapolation is unchanged: prometheus/prometheus v3.0.0
    docs/migration.md, "Range selectors and the lookback delta are now left-open", and
    promql/engine.go matrixIterSlice)."""
    sel = ((t > start) if left_open else (t >= start)) & (t <= end)
    ts, vs = t[sel], v[sel]
    if ts.size < 2:
        return None
    result = vs[-1] - vs[0]
    drops = vs[1:] < vs[:-1]
    result = result + np.where(drops, vs[:-1], 0.0).sum(0)
    to_start, to_end = ts[0] - start, end - ts[-1]
    sampled = ts[-1] - ts[0]
    avg = sampled / (ts.size - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        to_zero = np.where((result > 0) & (vs[0] >= 0), sampled * vs[0] / np.where(result > 0, result, 1.0), np.inf)
    to_start = np.minimum(to_start, to_zero)
    thr = avg * 1.1
    ext = sampled + np.where(to_start < thr, to_start, avg / 2) + (to_end if to_end < thr else avg / 2)
    return result * (ext / sampled)  # the factor first, as Prometheus multiplies


def _vm_scrape_interval(ts: np.ndarray, default: float) -> float:
    """VictoriaMetrics v1.79.5 ``getScrapeInterval``: the 0.6 quantile of the first 20 sample gaps."""
    if ts.size < 2:
        return default
    gaps = np.diff(ts[:21])
    out = float(np.quantile(gaps, 0.6))
    return out if out > 0 else default


def _vm_max_prev_interval(scrape: float) -> float:
    """VictoriaMetrics v1.79.5 ``getMaxPrevInterval`` (seconds): how far before a window's start the
    previous sample may lie to serve as the window's starting value."""
    for limit, extra in ((2.0, 4.0), (4.0, 2.0), (8.0, 1.0), (16.0, 0.5), (32.0, 0.25)):
        if scrape <= limit:
            return scrape + extra * scrape
    return scrape + scrape / 8


def increase_vm(t: np.ndarray, v: np.ndarray, start: float, end: float) -> np.ndarray | None:
    """VictoriaMetrics (MetricsQL) ``increase()`` of samples at ``t`` (S,) with values ``v`` (S, ...)
    over the window ``(start, end]``, vectorised over the trailing axes; None where it returns NaN.
    Source: VictoriaMetrics v1.79.5 app/vmselect/promql (the version Debian ships here). eval.go
    fetches samples from ``start - maxSilenceInterval`` (5 min) on; rollup.go ``removeCounterResets``
    adds the value before each decrease to every later value (``correction += prevValue``, or only the
    drop when it is under an eighth of the value: a partial reset); ``doInternal`` takes the samples
    with ``start < t <= end``, ``prevValue`` = the last sample at or before ``start`` when it is newer
    than ``start - getMaxPrevInterval(scrape interval)`` and a sample follows ``start``, and
    ``realPrevValue`` = that sample at any age; ``rollupDelta``: without ``prevValue``, ``last -
    realPrevValue`` when there is one, else the counter is assumed to start at 0 when its first value is
    below ``10 x (|second - first| + 1)``, otherwise the first sample is the start; no extrapolation.
    An instant query's ``realNextValue`` (a sample after ``end``) is absent."""
    fetched = (t > start - LOOKBACK_S) & (t <= end)
    ts = t[fetched]
    if ts.size == 0:
        return None
    vs = np.array(v[fetched], dtype=float, copy=True)
    correction = np.zeros(vs.shape[1:])
    prev = vs[0].copy()
    for k in range(vs.shape[0]):
        cur = vs[k].copy()
        drop = prev - cur
        correction = correction + np.where(drop > 0, np.where(drop * 8 < prev, drop, prev), 0.0)
        prev = cur
        vs[k] = cur + correction
    i = int(np.searchsorted(ts, start, side="right"))
    window = vs[i:]
    max_prev = _vm_max_prev_interval(_vm_scrape_interval(ts, 300.0))
    if 0 < i < ts.size and ts[i - 1] > start - max_prev:
        return window[-1] - vs[i - 1]
    if window.shape[0] == 0:
        return None
    if i > 0:  # realPrevValue: the value did not change during the gap
        return window[-1] - vs[i - 1]
    d = window[1] - window[0] if window.shape[0] > 1 else np.zeros(window.shape[1:])
    from_zero = np.abs(window[0]) < 10 * (np.abs(d) + 1)
    if window.shape[0] == 1:
        return np.where(from_zero, window[0], 0.0)
    return np.where(from_zero, window[-1], window[-1] - window[0])


@dataclass
class Pod:
    """One pod's scrapes in one run: ``t`` (S,), ``buckets`` (S, B+1) cumulative per ``le`` (last =
    +Inf = _count) of the session's main histogram, ``reasons`` (S, 2) cumulative stop/error;
    ``labels``; ``bounds`` its layout; ``hists``: further histograms by metric name, ``name ->
    (bounds, cumulative buckets (S, B+1))`` (e.g. ITL, and e2e for its ``_count``)."""

    labels: dict[str, str]
    t: np.ndarray
    buckets: np.ndarray
    reasons: np.ndarray
    bounds: tuple[float, ...]
    hists: dict[str, tuple[tuple[float, ...], np.ndarray]] = field(default_factory=dict)

    def histogram(self, name: str, main: str) -> tuple[tuple[float, ...], np.ndarray] | None:
        """(bounds, cumulative buckets) of histogram ``name``; None when the pod does not export it."""
        return (self.bounds, self.buckets) if name == main else self.hists.get(name)


@dataclass
class FakeResponse:
    status_code: int
    body: dict
    url: str = "http://fake-prometheus/api/v1/query"

    def json(self) -> dict:
        return self.body

    @property
    def text(self) -> str:
        return str(self.body)[:200]


@dataclass
class FakeSession:
    """``requests.Session`` stand-in answering from ``pods`` (a list of :class:`Pod`).

    ``empty_at``: evaluation times at which every query for ``empty_track`` returns an empty vector
    (a scrape or remote-read outage); ``gap_at``: times at which the ``finished_reason="error"``
    series of ``gap_track`` is absent. ``missing``: set by each look, True when a query of the look
    came back empty because of a gap (the benchmark checks no PROMOTE happens on such a look).
    ``left_open``: answer range selectors as Prometheus 3.x does (left-open windows).
    ``victoriametrics``: answer ``increase()`` as VictoriaMetrics does (:func:`increase_vm`) and the
    other range selectors left-open, as MetricsQL's windows are."""

    pods: list[Pod] = field(default_factory=list)
    metric: str = "vllm:time_to_first_token_seconds"
    errors_metric: str = "vllm:request_success_total"
    empty_at: frozenset = frozenset()
    empty_track: str = "canary"
    gap_at: frozenset = frozenset()
    gap_track: str = "canary"
    missing: bool = False
    calls: int = 0
    left_open: bool = False  # Prometheus 3.x range selectors, (t - range, t] (see increase())
    victoriametrics: bool = False  # MetricsQL's increase() (increase_vm); windows (t - range, t]

    def post(self, url: str, data: dict[str, Any], **_: Any) -> FakeResponse:
        return self._answer(url, data)

    def get(self, url: str, params: dict[str, Any] | None = None, **_: Any) -> FakeResponse:
        return self._answer(url, params or {})

    def _answer(self, url: str, params: dict[str, Any]) -> FakeResponse:
        self.calls += 1
        if url.endswith("/api/v1/status/buildinfo"):  # Prometheus's fields; VictoriaMetrics 1.79's empty data
            data = {} if self.victoriametrics else {"version": "3.0.0" if self.left_open else "2.42.0",
                                                     "revision": "fake", "branch": "HEAD", "goVersion": "go1.19"}
            return FakeResponse(200, {"status": "success", "data": data}, url)
        assert url.endswith("/api/v1/query"), url
        at = float(params["time"])
        result = self.evaluate(params["query"], at)
        data = {"resultType": "vector", "result": [{"metric": m, "value": [at, repr(float(v))]} for m, v in result]}
        return FakeResponse(200, {"status": "success", "data": data})

    def _increase(self, t: np.ndarray, v: np.ndarray, start: float, end: float) -> np.ndarray | None:
        if self.victoriametrics:
            out = increase_vm(t, v, start, end)
            return None if out is None else np.asarray(out, dtype=float)
        return increase(t, v, start, end, self.left_open)

    def _select(self, matchers: str, at: float) -> tuple[list[Pod], dict[str, str]]:
        want = dict(_MATCHER.findall(matchers))
        track = want.get("track")
        if track == self.empty_track and round(at, 3) in self.empty_at:
            self.missing = True
            return [], want
        pods = [p for p in self.pods if all(_matches(p.labels[k], op, v) for k, op, v in _ANY_MATCHER.findall(matchers)
                                            if k in p.labels)]
        return pods, want

    def evaluate(self, q: str, at: float) -> list[tuple[dict[str, str], float]]:
        """The vector ``q`` evaluates to at ``at``: [(labels, value)]."""
        m = _Q_BY.match(q)
        if m:
            by, name, matchers, w = [x.strip() for x in m.group(1).split(",")], m.group(2), m.group(3), float(m.group(4))
            pods, _ = self._select(matchers, at)
            acc: dict[tuple, float] = {}
            for p in pods:
                h = p.histogram(name.removesuffix("_bucket").removesuffix("_count"), self.metric)
                if h is None:
                    continue
                bounds, buckets = h
                if name.endswith("_bucket"):
                    inc = self._increase(p.t, buckets, at - w, at)
                    if inc is None:
                        continue
                    les = [repr(float(b)) for b in bounds] + ["+Inf"]
                    for le, val in zip(les, inc):
                        key = tuple((k, le if k == "le" else p.labels.get(k, "")) for k in by)
                        acc[key] = acc.get(key, 0.0) + float(val)
                elif name.endswith("_count"):
                    inc = self._increase(p.t, buckets[:, -1], at - w, at)
                    if inc is not None:
                        key = tuple((k, p.labels.get(k, "")) for k in by)
                        acc[key] = acc.get(key, 0.0) + float(inc)
            return [(dict(k), v) for k, v in acc.items()]
        m = _Q_SUM.match(q)
        if m:
            name, matchers, w = m.group(1), m.group(2), float(m.group(3))
            assert name == self.errors_metric, q
            pods, want = self._select(matchers, at)
            reason = want.get("finished_reason")
            if reason == "error" and pods and pods[0].labels.get("track") == self.gap_track and round(at, 3) in self.gap_at:
                self.missing = True
                return []
            cols = [REASONS.index(reason)] if reason else list(range(len(REASONS)))
            total, found = 0.0, False
            for p in pods:
                for c in cols:
                    inc = self._increase(p.t, p.reasons[:, c], at - w, at)
                    if inc is not None:
                        total, found = total + float(inc), True
            return [({}, total)] if found else []
        m = _Q_COUNT.match(q)
        if m:
            name, matchers, w = m.group(1), m.group(2), float(m.group(3))
            pods, _ = self._select(matchers, at)
            counts = [float(np.sum(((p.t > at - w) if self.left_open or self.victoriametrics else (p.t >= at - w)) & (p.t <= at)))
                      for p in pods]
            counts = [c for c in counts if c > 0]
            return [({}, min(counts))] if counts else []
        m = _Q_FIRST.match(q)
        if m:
            name, matchers, rng_s, step = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
            pods, _ = self._select(matchers, at)
            base = name.removesuffix("_bucket").removesuffix("_count")
            steps = np.arange(np.ceil((at - rng_s) / step) * step, at + 1e-9, step)
            firsts = []
            for p in pods:
                if name != self.errors_metric and p.histogram(base, self.metric) is None:
                    continue
                idx = np.searchsorted(p.t, steps, side="right") - 1
                ok = idx >= 0
                seen = p.t[idx[ok]]
                seen = seen[seen > steps[ok] - LOOKBACK_S]
                if seen.size:
                    firsts.append(float(seen.min()))
            return [({}, min(firsts))] if firsts else []
        raise AssertionError(f"the fake does not evaluate {q!r}")
