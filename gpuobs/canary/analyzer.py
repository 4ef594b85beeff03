"""Canary analyzer: reads canary and baseline from a Prometheus-API backend, applies the statistics of
:mod:`gpuobs.canary.stats` and :mod:`gpuobs.canary.sequential`, and returns a :class:`Verdict`.

Usage by a rollout controller, one call per interval with the window growing from the stage start::

    analyzer = Analyzer(PromClient(url), load_config(), canary='track="canary"', baseline='track="baseline"')
    state = AnalysisState()                      # optional; persist state.to_dict() between looks
    verdict = analyzer.analyze(stage_start, time.time(), state)
    verdict.verdict in ("PROMOTE", "HOLD", "ROLLBACK"); verdict.final -> no alpha left

Every look uses all data since ``start`` (cumulative ``increase()`` of the histogram buckets and
counters), and the sequential boundaries keep the false-rollback rate at the configured alpha
however many looks are taken. With ``state`` the boundaries use the information of the looks that
actually happened; without it the analyzer assumes one look every ``config.interval_s`` (steady
traffic) so a stateless caller (``gpuobs canary analyze``, an Argo web metric) gets the same test.

**A look never reaches back before the first scrape.** The counter metrics (histograms, errors) are read
from ``max(start, first canary sample + step, first baseline sample + step)``, where a side's first
sample is ``min(min_over_time(timestamp(<series>{<side>})[<window + step>s:<step>s]))`` at ``end``
(a subquery over ``timestamp()`` of a bare selector: the raw sample's time in Prometheus 2.42 and
in VictoriaMetrics 1.79, where ``timestamp`` is the ``rollupTlast`` rollup; accurate to one step,
never earlier than the true first sample). Why: ``increase()`` over a window holding a series' first sample
differs between engines. PromQL starts at the first sample inside the window. MetricsQL
(VictoriaMetrics v1.79.5, ``app/vmselect/promql/rollup.go``, ``rollupDelta``), when no sample
precedes the window, assumes the counter was 0 before the first sample if
``abs(first) < 10 * (abs(second - first) + 1)`` and starts at the first sample otherwise; the rule
is applied per series, so in a histogram some ``le`` buckets of one engine are counted from zero
and others are not, and the quantiles shift (one look on identical data said ROLLBACK through
VictoriaMetrics and PROMOTE through Prometheus: bench/README.md, "Scale bench"). With a sample
before the window start both engines take the difference from it (VictoriaMetrics: the sample
before the window, ``prevValue``/``realPrevValue``; Prometheus: the first sample in the window,
extrapolated) and agree. The clamp uses the later of the two sides because a fresh baseline
(Kayenta-style, deployed with the canary) starts inside the window just as the canary does; a
series created later than its side's first (an engine joining mid-stage) is not covered. The
stage's time fraction (alpha spending) still counts from ``start``; each metric reports its
``data_start``.

Errors: :class:`~gpuobs.promapi.prometheus.PrometheusUnavailable` and the other PrometheusError types are
raised, never turned into a verdict; empty results, NaN and too few samples give NoData (HOLD).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from gpuobs.canary.config import CanaryConfig, MetricSpec, parse_selector
from gpuobs.canary.sequential import (
    MIN_INFO_GROWTH,
    binomial_upper_bound,
    group_sequential_boundaries,
    planned_looks,
    rate_ratio_interval,
    rate_ratio_log_evalue,
)
from gpuobs.canary.stats import (
    CLASS_NAMES,
    Shift,
    classify,
    harmful,
    histogram_quantile,
    log_shift,
    paired_shift,
    parse_buckets,
)
from gpuobs.canary.verdict import MetricResult, Verdict, combine
from gpuobs.core import log
from gpuobs.promapi.prometheus import PromClient, QueryResult

LOG = log.get("canary")


class NoData(Exception):
    """Internal: a metric has no usable data; the message becomes its NoData reason."""


@dataclass
class AnalysisState:
    """Looks already tested, per metric: ``[(time fraction, information), ...]``. JSON-friendly.

    Pass the same object (or one rebuilt with :meth:`from_dict`) to every look of one stage; start
    a new one for the next stage. Looks must come in time order.
    """

    looks: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"looks": {metric: [[t, info], ...]}}``."""
        return {"looks": {k: [list(p) for p in v] for k, v in self.looks.items()}}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "AnalysisState":
        """Inverse of :meth:`to_dict`. Raises ValueError on a malformed document."""
        try:
            return cls({str(k): [(float(t), float(i)) for t, i in v] for k, v in (doc.get("looks") or {}).items()})
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed analysis state: {exc}") from None


class Analyzer:
    """Judges one canary against one baseline with ``config``'s metrics.

    ``canary`` / ``baseline``: PromQL label matchers injected into every query (e.g.
    ``track="canary"``). Raises :class:`~gpuobs.canary.config.ConfigError` on a bad selector.
    """

    def __init__(self, client: PromClient, config: CanaryConfig, canary: str, baseline: str):
        self.client = client
        self.config = config
        self.canary = parse_selector(canary, "--canary")
        self.baseline = parse_selector(baseline, "--baseline")

    def analyze(self, start: float, end: float | None = None, state: AnalysisState | None = None) -> Verdict:
        """Analyse the window [start, end] (unix seconds; ``end`` defaults to now).

        Returns the :class:`Verdict`; updates ``state`` with this look. Raises ValueError when the
        window is empty or earlier than a look already in ``state``; PrometheusError subclasses when
        the backend fails.
        """
        end = time.time() if end is None else float(end)
        if end <= start:
            raise ValueError(f"empty analysis window: start={start} end={end}")
        results = []
        for spec in self.config.metrics:
            res = MetricResult(spec.name, spec.title or spec.name, spec.kind, spec.unit, spec.scale, spec.direction,
                               spec.critical, self.config.metric_alpha(spec))
            try:
                {"histogram": self._histogram, "errors": self._errors, "series": self._series}[spec.kind](
                    spec, res, start, end, state)
            except NoData as why:
                res.classification, res.reason = "NoData", str(why)
            results.append(res)
        verdict, reasons, warnings = combine(results)
        frac = (end - start) / self.config.horizon_s
        if verdict == "HOLD" and frac >= 1.0:
            reasons.append("the analysis horizon is reached: later looks cannot change the latency verdicts; "
                           "treat this HOLD as inconclusive (e.g. Argo inconclusiveLimit, or end the stage)")
        out = Verdict(verdict, reasons, warnings, results, self.canary, self.baseline, start, end, frac,
                      frac >= 1.0, self.config.alpha)
        LOG.info("canary analysis", extra={"fields": {
            "verdict": verdict, "window_s": round(end - start, 1), "time_fraction": round(frac, 3),
            "metrics": {m.name: m.classification for m in results}}})
        return out

    # ---- helpers ----------------------------------------------------------------------------------
    def _instant(self, expr: str, end: float, what: str) -> QueryResult:
        res = self.client.query(expr, at=end)
        if res.has_nan:
            raise NoData(f"NaN in the {what} result")
        return res

    def _boundary(self, spec: MetricSpec, alpha: float, start: float, end: float, n: float, info: float,
                  state: AnalysisState | None) -> tuple[float, dict[str, float]]:
        cfg = self.config
        t_now = (end - start) / cfg.horizon_s
        spending = cfg.spending.with_alpha(alpha)
        if state is None:
            times, infos = planned_looks(end - start, cfg.interval_s, cfg.horizon_s, n, spec.min_samples, info)
        else:
            prior = state.looks.setdefault(spec.name, [])
            if prior and t_now < prior[-1][0]:
                raise ValueError(f"look at t={t_now:.3f} is earlier than the last recorded look t={prior[-1][0]:.3f}")
            times, infos = [p[0] for p in prior] + [t_now], [p[1] for p in prior] + [info]
            if not prior or info >= prior[-1][1] * MIN_INFO_GROWTH:
                prior.append((t_now, info))
        c = float(group_sequential_boundaries(spending, times, infos)[-1])
        return c, {"t": round(t_now, 4), "info": info, "tested_looks": float(len(times))}

    def _judge(self, spec: MetricSpec, res: MetricResult, shift: Shift, start: float, end: float,
               state: AnalysisState | None) -> None:
        """Boundary, repeated confidence interval and classification of a z-statistic metric."""
        side_alpha = res.alpha / 2 if spec.direction == "either" else res.alpha
        c, res.look = self._boundary(spec, side_alpha, start, end, float(shift.n_canary), float(shift.info), state)
        if spec.kind == "series" and math.isfinite(c):
            # few, estimated-variance steps: the same tail probability on Student's t (n-1 df)
            c = float(student_t.isf(norm.sf(c), max(1.0, float(shift.n_canary) - 1)))
        effect, se = float(shift.effect), float(shift.se)
        lo, hi = (effect - c * se, effect + c * se) if math.isfinite(c) else (-math.inf, math.inf)
        rel = spec.scale == "relative"

        def conv(v: float) -> float:  # an effect threshold on the analysis scale
            return math.log1p(max(v, -1 + 1e-12)) if rel else v

        up_harm, down_harm = spec.direction in ("increase", "either"), spec.direction in ("decrease", "either")
        high = lo > (conv(spec.min_effect) if up_harm else 0.0)
        low = hi < (conv(-spec.min_effect) if down_harm else 0.0)
        passed = (not up_harm or hi < conv(spec.allowed_effect)) and (not down_harm or lo > conv(-spec.allowed_effect))
        code = int(classify(True, high, low, passed))
        res.classification = CLASS_NAMES[code]
        res.harmful = bool(harmful(code, spec.direction))
        to_user = math.expm1 if rel else (lambda v: v)
        res.effect = to_user(effect)
        res.interval = (to_user(lo), to_user(hi))
        res.evidence.update(z=float(shift.z), boundary=c)

    def first_sample(self, series: str, spec: MetricSpec, selector: str, start: float, end: float) -> float | None:
        """Unix time of the earliest sample of ``series`` (a metric name) matching ``spec``'s matchers and
        ``selector`` within [start - step, end], or None when there is none: one instant query at ``end``,
        ``min(min_over_time(timestamp(series{...})[range:step]))``, valid PromQL and MetricsQL. Accurate
        to one ``step`` (a later sample may be found when the scrape interval is shorter than ``step``);
        a series older than the range gives a time before ``start``. Raises PrometheusError subclasses."""
        step = max(1, round(self.config.step_s))
        rng = max(1, round(end - start)) + step
        q = f"min(min_over_time(timestamp({series}{{{spec.selector(selector)}}})[{rng}s:{step}s]))"
        value = self.client.query(q, at=end).scalar()
        return value if value is not None and math.isfinite(value) else None

    def _data_window(self, spec: MetricSpec, res: MetricResult, series: str, start: float, end: float) -> str:
        """The ``increase()`` range for a counter metric: from ``start`` or, when either side's ``series``
        begins after ``start - step``, from that side's first sample + ``step`` (module docstring).
        Sets ``res.data_start``. Raises NoData when that leaves no window before ``end``."""
        data_start = start
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            first = self.first_sample(series, spec, sel, start, end)
            if first is not None and first + self.config.step_s > data_start:
                data_start = first + self.config.step_s
                if data_start >= end - 1:
                    res.data_start = data_start
                    raise NoData(f"the {side}'s first {series} sample is at {first:.0f}; a look reads from one step "
                                 f"({self.config.step_s:g} s) after it and needs a later end than {end:.0f}")
        res.data_start = data_start
        if data_start > start:
            LOG.info("canary look starts after the first scrape", extra={"fields": {
                "metric": spec.name, "start": start, "data_start": data_start}})
        return f"{max(1, round(end - data_start))}s"

    # ---- metric kinds -----------------------------------------------------------------------------
    def _histogram(self, spec: MetricSpec, res: MetricResult, start: float, end: float,
                   state: AnalysisState | None) -> None:
        window = self._data_window(spec, res, f"{spec.metric}_bucket", start, end)
        groups = {}
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            q = f"sum by (le) (increase({spec.metric}_bucket{{{spec.selector(sel)}}}[{window}]))"
            r = self._instant(q, end, side)
            if r.empty:
                raise NoData(f"no {spec.metric} buckets for the {side}")
            try:
                bounds, counts = parse_buckets((s.labels.get("le", ""), s.value) for s in r.samples)
            except ValueError as exc:
                raise NoData(f"{side}: {exc}") from None
            n_eff = None
            if spec.clustered_by:
                qc = f"sum(increase({spec.clustered_by}_count{{{spec.selector(sel)}}}[{window}]))"
                n_eff = self._instant(qc, end, f"{side} request-count").scalar()
                if n_eff is None:
                    raise NoData(f"no {spec.clustered_by}_count for the {side} (needed to count requests)")
            groups[side] = (bounds, counts, n_eff)
        (bc, cc, ec), (bb, cb, eb) = groups["canary"], groups["baseline"]
        if bc.shape != bb.shape or not np.allclose(bc, bb):
            raise NoData("canary and baseline have different bucket boundaries")
        res.n_canary, res.n_baseline = float(cc.sum()), float(cb.sum())
        for side, counts in (("canary", cc), ("baseline", cb)):
            total = float(counts.sum())
            if total < spec.min_samples:
                raise NoData(f"{side} has {total:.0f} requests in the window, needs {spec.min_samples:.0f}")
        for side, counts in (("canary", cc), ("baseline", cb)):
            desc = {f"p{int(q * 100)}": float(histogram_quantile(q, bc, counts)) for q in (0.5, 0.9, 0.99)}
            getattr(res, side).update(desc)
        shift = log_shift(cc, cb, bc, ec, eb)
        if not np.isfinite(shift.effect):
            raise NoData("too few observations to estimate a spread")
        if ec is not None:
            res.evidence["n_eff_canary"] = float(min(ec, res.n_canary))
        self._judge(spec, res, shift, start, end, state)

    def _errors(self, spec: MetricSpec, res: MetricResult, start: float, end: float,
                state: AnalysisState | None) -> None:
        window = self._data_window(spec, res, spec.metric, start, end)
        counts = {}
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            total = self._instant(f"sum(increase({spec.metric}{{{spec.selector(sel)}}}[{window}]))", end, side).scalar()
            if total is None:
                raise NoData(f"no {spec.metric} series for the {side}")
            q = f"sum(increase({spec.metric}{{{spec.selector(sel, spec.error_matchers)}}}[{window}]))"
            errors = self._instant(q, end, f"{side} error").scalar() or 0.0
            counts[side] = (min(errors, total), total)
        (e_c, n_c), (e_b, n_b) = counts["canary"], counts["baseline"]
        res.n_canary, res.n_baseline = n_c, n_b
        for side, (_, n) in counts.items():
            if n < spec.min_samples:
                raise NoData(f"{side} has {n:.0f} requests in the window, needs {spec.min_samples:.0f}")
        p_c, p_b = e_c / n_c, e_b / n_b
        thr = math.log(1 / res.alpha)
        log_e = float(rate_ratio_log_evalue(e_c, n_c, e_b, n_b, 1.0, upper=True))
        log_e_low = float(rate_ratio_log_evalue(e_c, n_c, e_b, n_b, 1.0, upper=False))
        upper_c = float(binomial_upper_bound(e_c, n_c, res.alpha))
        high = log_e >= thr and p_c - p_b > spec.min_effect
        code = int(classify(True, high, log_e_low >= thr, upper_c <= p_b + spec.allowed_effect))
        res.classification, res.harmful = CLASS_NAMES[code], bool(harmful(code, "increase"))
        lo, hi = rate_ratio_interval(e_c, n_c, e_b, n_b, res.alpha)
        res.effect = p_c / p_b - 1 if p_b > 0 else (math.inf if p_c > 0 else math.nan)
        res.interval = (lo - 1, hi - 1)
        res.canary.update(ratio=p_c, errors=e_c, upper_bound=upper_c)
        res.baseline.update(ratio=p_b, errors=e_b)
        res.evidence = {"log_e": log_e, "threshold": thr}

    def _series(self, spec: MetricSpec, res: MetricResult, start: float, end: float,
                state: AnalysisState | None) -> None:
        values = {}
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            r = self.client.query_range(spec.query.replace("$selector", sel), start, end, self.config.step_s)
            if r.empty:
                raise NoData(f"no data for the {side}")
            if len(r.series) > 1:
                raise NoData(f"the {side} query returned {len(r.series)} series; aggregate it to one")
            values[side] = dict(zip(r.series[0].timestamps, r.series[0].values))
        common = sorted(set(values["canary"]) & set(values["baseline"]))
        c = np.array([values["canary"][t] for t in common])
        b = np.array([values["baseline"][t] for t in common])
        shift = paired_shift(c, b, spec.scale == "relative")
        res.n_canary = res.n_baseline = float(shift.n_canary)
        if shift.n_canary < spec.min_samples or not np.isfinite(shift.effect):
            raise NoData(f"{shift.n_canary:.0f} usable paired steps, needs {spec.min_samples:.0f}")
        res.canary["mean"] = float(np.nanmean(c))
        res.baseline["mean"] = float(np.nanmean(b))
        self._judge(spec, res, shift, start, end, state)
