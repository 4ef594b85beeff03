"""Canary analyzer: reads canary and baseline from a Prometheus-API backend, applies the statistics of
:mod:`gpuobs.canary.stats`, :mod:`gpuobs.canary.histstats` and :mod:`gpuobs.canary.sequential`, and
returns a :class:`Verdict`. This module queries and decides (windows, alphas, boundaries,
classification, outlook); the estimators and tests are those modules' and read no backend or config.

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

Histogram metrics run several tests (issue 18, docs/canary.md 1a-1e; computed by
:class:`~gpuobs.canary.histstats.HistContext`): the location shift, quantile
tests (share of canary requests above the baseline's pNN bucket bound, exact binomial tail), a
tail test (log-rank on the requests above the baseline's p90 bound, exact null) and a spread test, each at its share of the metric's alpha with its own group-sequential boundary
(weighted Bonferroni across tests, Lan-DeMets spending across looks), all compared per serving node
(``config.node_label``) with the between-node variance estimated from the baseline's nodes
(DerSimonian-Laird), read over the look's window and ``config.node_history_s`` before it. ``config.warmup_s`` of data after ``start`` is excluded, and every look says
whether a PROMOTE is reachable within the horizon (``Verdict.promote_reachable``).

**A look never reaches back before the first scrape.** The counter metrics (histograms, errors) are read
from ``max(start, first canary sample + m, first baseline sample + m)``, ``m`` = -1 s on Prometheus's
own engine and one step less 1 s elsewhere (``FIRST_SAMPLE_MARGIN_S``; the engine from
``/api/v1/status/buildinfo``, :func:`~gpuobs.promapi.prometheus.prometheus_engine`), where a side's first
sample is ``min(min_over_time(timestamp(<series>{<side>})[<window + step>s:<step>s]))`` at ``end``
(a subquery over ``timestamp()`` of a bare selector: the raw sample's time in Prometheus 2.42 and
in VictoriaMetrics 1.79, where ``timestamp`` is the ``rollupTlast`` rollup; accurate to one step,
never earlier than the true first sample). For a histogram ``<series>`` is its ``_count``
(:func:`first_sample_series`): a histogram's buckets and count are exposed together from the
child's creation and stamped by the same scrape, so the count's first sample is the buckets', read
from one series per node instead of one per bucket (a subquery costs per series and step: one
look's 14 first-sample queries at 128 nodes took 0.27 s through VictoriaMetrics 1.79 and 1.31 s
through Prometheus 2.42 on the buckets, 0.04 s and 0.10 s on the counts; bench/README.md, "Scale
bench"). Why: ``increase()`` over a window holding a series' first sample differs between engines. PromQL starts at the first sample inside the window. MetricsQL
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
series created later than its side's first (an engine joining mid-stage) is not covered. Why one
step less 1 s (14 s at 15 s scrapes): the first sample is outside the window and the second inside
it, 1 s from its start, in every engine: Prometheus 2.x's closed ranges, Prometheus 3.x's left-open
ones (``(t - range, t]``: a window starting one full step after the first sample began exactly on the
second and left it out) and VictoriaMetrics (whose ``prevValue`` is then the first sample). A window
starting 1 s after the first sample (tried, issue 26) keeps the first step's requests but has
Prometheus extrapolate each ``le`` series 14 s back to the window's start, clipped at each series'
own zero point, so the buckets are stretched unequally: early looks' z had an sd of 1.04 instead of
0.96 and healthy canaries were rolled back 1.2% of the time (bench/README.md). On Prometheus's
engine (Prometheus 2.x and 3.x, Thanos, Mimir: PromQL never counts a series from zero) the window
starts 1 s *before* the first sample instead: ``increase()`` then starts at that sample and
extrapolates at most 1 s back (clipped at each series' zero point), so the first scrape step's
requests count, as VictoriaMetrics counts them from its ``prevValue``. That step is about 5% of a
fresh canary's requests at look 10; on the bench's Prometheus fake it raised the power against a
+10% regression by look 10 from 71.5% to 75.6% on the same 800 runs (the VictoriaMetrics fake, which
read that step already: 76.2%; bench/README.md, issue 26). A backend that does not say it is Prometheus keeps the
margin that is right on every engine. The
stage's time fraction (alpha spending) still counts from ``start``; each metric reports its
``data_start``.

**Every instant query is answered at the time it names** (``params=``
:data:`~gpuobs.promapi.prometheus.AT_TIME_PARAMS`, ``nocache=1``; Prometheus ignores it).
VictoriaMetrics otherwise evaluates an instant query within ``-search.latencyOffset`` of now
(:func:`gpuobs.mixin.placement.vm_latency_offset_s`: 16 s at 15 s scrapes; 20 s in the native HA
stack when this was found) at now minus the offset, so a look ending now
read every window that much earlier than the one cut after the first samples (14 s after the first
sample at 15 s scrapes), the first sample fell back inside it and fresh series were
counted from zero: one look at the same moment, 90 s after an HA stack started (128 nodes, shard 0),
through VictoriaMetrics TTFT -39.7 % on 478 canary requests, through the shard replica -4.0 % on
321; with the parameter -5.6 % on 338 against -3.1 % on 341 (bench/README.md, "Scale bench"). The
``series`` metrics' range queries do without it: VictoriaMetrics holds their last points back either
way (``adjustLastPoints``), and both sides are paired step by step.

Errors: :class:`~gpuobs.promapi.prometheus.PrometheusUnavailable` and the other PrometheusError types are
raised, never turned into a verdict; empty results, NaN, vanished series, a missing error series and
too few samples give NoData, and a critical NoData metric makes the look HOLD (never PROMOTE).
"""

from __future__ import annotations

import math
import time
from math import log1p
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from gpuobs.canary.config import CanaryConfig, MetricSpec, fill_selector, parse_selector
from gpuobs.canary.histstats import HistContext, NoData, NotApplicable, errors_needed, node_spread_assumption
from gpuobs.canary.sequential import (MIN_INFO_GROWTH, binomial_upper_bound, group_sequential_boundaries,
                                      planned_looks, rate_ratio_interval, rate_ratio_log_evalue)
from gpuobs.canary.stats import (CLASS_NAMES, Clustered, Shift, bin_log_centres, classify, common_bounds,
                                 fold_nonpositive, harmful, histogram_quantile, paired_shift, parse_buckets, rebin,
                                 unit_moments)
from gpuobs.canary.verdict import MetricResult, Verdict, assumptions, combine, deciding_tests, design_line
from gpuobs.core import log
from gpuobs.promapi.prometheus import AT_TIME_PARAMS, PromClient, QueryResult, prometheus_engine

LOG = log.get("canary")
# Tests that can roll back but need not pass for PROMOTE. The tail test estimates the p99 change through
# a fitted tail (extended past the baseline's last request), an interval that the p99 test gives
# directly; requiring both to pass held healthy canaries: with Prometheus' default buckets 26% of
# healthy canaries were still HOLD at the deadline (79 of 88 blocked by the tail test), 15% before it.
HARM_ONLY_TESTS = frozenset({"tail"})
# A look of a series born inside its window starts this much before the series' first sample on
# Prometheus's engine, one step less this after it elsewhere (module docstring): PromQL then counts from
# the first sample; MetricsQL takes the first sample, before the window, as the start.
FIRST_SAMPLE_MARGIN_S = 1.0
OUTLOOK_MARGIN = 1.5  # "out of reach" = the horizon brings less than 1/1.5 of the requests needed


def first_sample_series(spec: MetricSpec) -> str:
    """The series whose first sample dates ``spec``'s counters (module docstring): a histogram's
    ``_count`` (born with its buckets, one series per node instead of one per bucket), else the metric."""
    return f"{spec.metric}_count" if spec.kind == "histogram" else spec.metric


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
    ``track="canary"``). ``history``: the matchers of the within-node design's pre-stage query
    (:meth:`_pre_stage`), default ``baseline``: a rollout that relabels its canary nodes finds their
    pre-stage series under the baseline's labels; a driver upgrade, which selects nodes by their
    identity label (``Hostname=~"a|b"``), passes canary and baseline nodes together.
    ``pre_stage_end``: unix seconds at which the pre-stage period ends, when that is before the
    analysis window's start (a driver upgrade's batch: before the nodes were drained); default the
    window's start. ``within_only``: latency is judged only in the within-node design (NoData without
    pre-stage data): the baseline nodes are not comparable to the canary's (another GPU model).
    Raises :class:`~gpuobs.canary.config.ConfigError` on a bad selector.
    """

    def __init__(self, client: PromClient, config: CanaryConfig, canary: str, baseline: str,
                 history: str | None = None, pre_stage_end: float | None = None, within_only: bool = False):
        self.client = client
        self.config = config
        self.canary = parse_selector(canary, "--canary")
        self.baseline = parse_selector(baseline, "--baseline")
        self.history = parse_selector(history, "--history") if history else self.baseline
        self.pre_stage_end = pre_stage_end
        self.within_only = within_only
        # whether the backend evaluates PromQL with Prometheus's engine (prometheus_engine), asked once
        # per Analyzer at its first counter window
        self._promql_engine: bool | None = None

    def analyze(self, start: float, end: float | None = None, state: AnalysisState | None = None) -> Verdict:
        """Analyse the window [start, end] (unix seconds; ``end`` defaults to now).

        Returns the :class:`Verdict`; updates ``state`` with this look. Raises ValueError when the
        window is empty or earlier than a look already in ``state``; PrometheusError subclasses when
        the backend fails.
        """
        end = time.time() if end is None else float(end)
        if end <= start:
            raise ValueError(f"empty analysis window: start={start} end={end}")
        cfg = self.config
        a = start + cfg.warmup_s  # data of the warm-up is excluded
        results = []
        for spec in cfg.metrics:
            res = MetricResult(spec.name, spec.title or spec.name, spec.kind, spec.unit, spec.scale, spec.direction,
                               spec.critical, cfg.metric_alpha(spec))
            try:
                if end - a < 1.0:
                    raise NoData(f"warm-up: data before {a:.0f} ({cfg.warmup_s:g} s after the start) is excluded")
                {"histogram": self._histogram, "errors": self._errors, "series": self._series}[spec.kind](
                    spec, res, a, end, state)
            except NoData as why:
                res.classification, res.reason = "NoData", str(why)
            results.append(res)
        verdict, reasons, warnings = combine(results)
        reachable, outlook = self._outlook(results, a, end)
        if not reachable and verdict == "HOLD":
            reasons.extend(outlook)
        elif not reachable:
            warnings.extend(outlook)
        frac = max(0.0, (end - a) / (cfg.horizon_s - cfg.warmup_s))
        if verdict == "HOLD" and frac >= 1.0:
            reasons.append("the analysis horizon is reached: later looks cannot change the latency verdicts; "
                           "treat this HOLD as inconclusive (e.g. Argo inconclusiveLimit, or end the stage)")
        # the node-spread assumption is part of why (few nodes: the prior decides the intervals' width);
        # said once per look, not per metric or reason
        out = Verdict(verdict, reasons, warnings, results, self.canary, self.baseline, start, end, frac,
                      frac >= 1.0, self.config.alpha, promote_reachable=reachable, warmup_s=cfg.warmup_s,
                      deciding=deciding_tests(results) if verdict == "ROLLBACK" else [],
                      assumptions=assumptions(results), design=design_line(results))
        LOG.info("canary analysis", extra={"fields": {
            "verdict": verdict, "window_s": round(end - start, 1), "time_fraction": round(frac, 3),
            "metrics": {m.name: m.classification for m in results}}})
        return out

    def _outlook(self, results: list[MetricResult], a: float, end: float) -> tuple[bool, list[str]]:
        """Can a PROMOTE still be reached within the horizon? From the canary's observed request rate
        and each critical metric's ``needed_canary`` (canary requests at which a healthy canary's
        interval fits inside the allowed effect at the metric's alpha; set by the metric's judge),
        predicts the requests the horizon brings. Returns (reachable, reasons when it is not)."""
        cfg = self.config
        horizon = cfg.horizon_s - cfg.warmup_s
        out = []
        for m in results:
            # the canary's requests were counted from the metric's data_start (a fresh pod's window
            # starts one step after its first scrape), and the horizon brings them until a + horizon
            start_m = max(a, m.data_start) if m.data_start is not None else a
            elapsed = end - start_m
            if not m.critical or m.needed_canary is None or elapsed <= 0 or m.n_canary <= 0:
                continue
            expected = m.n_canary / elapsed * (a + horizon - start_m)
            # OUTLOOK_MARGIN: the first looks under-read the rate (a new pod's first scrape comes
            # after the stage start) and the baseline's error ratio is still rough; flag only stages
            # that fall clearly short
            if not math.isfinite(m.needed_canary) or expected * OUTLOOK_MARGIN < m.needed_canary:
                need = "cannot pass at any traffic (the node-to-node spread alone exceeds the allowed effect)" \
                    if not math.isfinite(m.needed_canary) else f"needs about {m.needed_canary:.0f} canary requests"
                out.append(f"PROMOTE is out of reach within the horizon: {m.name} {need}; at the observed "
                           f"{m.n_canary / elapsed:.2f} canary req/s the {horizon:g} s horizon brings about "
                           f"{expected:.0f}. Expect HOLD at the end unless the canary's traffic share or the "
                           f"stage length grows (or the metric's allowed_effect/alpha is relaxed)")
        return not out, out

    # ---- helpers ----------------------------------------------------------------------------------
    def _instant(self, expr: str, end: float, what: str) -> QueryResult:
        res = self.client.query(expr, at=end, params=AT_TIME_PARAMS)
        if res.has_nan:
            raise NoData(f"NaN in the {what} result")
        return res

    def _boundary(self, spec: MetricSpec, alpha: float, start: float, end: float, n: float, info: float,
                  state: AnalysisState | None, key: str = "", tail: bool = False,
                  pass_alpha: float = 0.0) -> tuple[float, dict[str, float]] | tuple[float, float, dict[str, float]]:
        """The harm-side boundary of this look at ``alpha`` (and, with ``pass_alpha`` > 0, the
        pass-side one: same looks, ``config.pass_spending`` at ``pass_alpha``), on the z scale, and
        the look's position."""
        cfg = self.config
        horizon = cfg.horizon_s - cfg.warmup_s  # ``start`` is the end of the warm-up
        t_now = (end - start) / horizon
        spending = (cfg.tail_spending if tail and cfg.tail_spending else cfg.spending).with_alpha(alpha)
        if state is None:
            times, infos = planned_looks(end - start, cfg.interval_s, horizon, n, spec.min_samples, info)
        else:
            prior = state.looks.setdefault(key or spec.name, [])
            if prior and t_now < prior[-1][0]:
                raise ValueError(f"look at t={t_now:.3f} is earlier than the last recorded look t={prior[-1][0]:.3f}")
            times, infos = [p[0] for p in prior] + [t_now], [p[1] for p in prior] + [info]
            if not prior or info >= prior[-1][1] * MIN_INFO_GROWTH:
                prior.append((t_now, info))
        c = float(group_sequential_boundaries(spending, times, infos)[-1])
        look = {"t": round(t_now, 4), "info": info, "tested_looks": float(len(times))}
        if not pass_alpha:
            return c, look
        pass_sp = (cfg.pass_spending or spending).with_alpha(pass_alpha)
        return c, float(group_sequential_boundaries(pass_sp, times, infos)[-1]), look

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
        value = self.client.query(q, at=end, params=AT_TIME_PARAMS).scalar()
        return value if value is not None and math.isfinite(value) else None

    def _data_window(self, spec: MetricSpec, res: MetricResult, series: str, start: float, end: float) -> str:
        """The ``increase()`` range for a counter metric: from ``start`` or, when either side's ``series``
        begins inside the window, from ``FIRST_SAMPLE_MARGIN_S`` before that side's first sample on
        Prometheus's engine, one step less that after it elsewhere (module docstring).
        Sets ``res.data_start``. Raises NoData when that leaves no window before ``end``."""
        data_start = start
        if self._promql_engine is None:
            self._promql_engine = prometheus_engine(self.client.build_info())
        # PromQL counts from the first sample inside the window: start just before it. Elsewhere (MetricsQL
        # would count a young le series from 0) keep the first sample before the window: it is the start.
        margin = -FIRST_SAMPLE_MARGIN_S if self._promql_engine else max(self.config.step_s - FIRST_SAMPLE_MARGIN_S,
                                                                        FIRST_SAMPLE_MARGIN_S)
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            first = self.first_sample(series, spec, sel, start, end)
            if first is not None and first + margin > data_start:
                data_start = first + margin
                if data_start >= end - 1:
                    res.data_start = data_start
                    raise NoData(f"the {side}'s first {series} sample is at {first:.0f}; a look reads from just "
                                 f"after it and needs a later end than {end:.0f}")
        res.data_start = data_start
        if data_start > start:
            LOG.info("canary look starts after the first scrape", extra={"fields": {
                "metric": spec.name, "start": start, "data_start": data_start}})
        return f"{max(1, round(end - data_start))}s"

    # ---- metric kinds -----------------------------------------------------------------------------
    def _samples_factor(self, metric: str, sel: str, window: str, end: float, side: str) -> float:
        """Share of an ``increase()`` that rests on observed samples.

        ``increase()`` extrapolates each series' sampled difference from its first and last sample
        in the window towards the window's edges (Prometheus 2.42 promql/functions.go,
        extrapolatedRate: by up to 1.1 average sample intervals per edge, or half an interval, and
        not below the point where the counter would be zero). A window with N samples of a series
        rests on (N-1) sample intervals while the result is stretched to about N of them, so the
        counts are about N/(N-1) times the observed ones: 2x at a 30 s window with 15 s scrapes.
        Treating them as exact counts overstates the information of early looks. The factor
        (N-1)/N, N the fewest samples of any series of the group (``min(count_over_time())``), is
        applied to the sample sizes used in variances and tests. Returns 1.0 when it cannot be read.
        """
        r = self._instant(f"min(count_over_time({metric}{{{sel}}}[{window}]))", end, f"{side} sample-count")
        n = r.scalar()
        if n is None or not math.isfinite(n) or n < 2:
            return 0.5 if n is not None and n < 2 else 1.0
        return (n - 1.0) / n

    def _baseline_nodes(self, spec: MetricSpec, lo: float, at: float, keep_before: float, common: np.ndarray,
                        what: str, selector: str | None = None) -> tuple[dict[str, np.ndarray], float] | None:
        """The baseline's bucket counts per node over ``[lo, at]``: ``sum by (le, <node_label>)
        (increase(<metric>_bucket{<baseline>}[at - lo]))`` evaluated at ``at``, ``lo`` cut one step after
        the baseline's first sample in the range (as :meth:`_data_window` cuts a look). Returns
        ``({node label value: counts (B+1,) on the common bounds}, the range's start used)``; None when
        the cut range ends later than ``keep_before - step`` or the answer is empty. A node whose
        layout is broken, lacks any of the ``common`` bounds (:func:`~gpuobs.canary.stats.rebin` would
        read each missing bound at its nearest one: a healthy canary whose pre-stage buckets lacked the
        look's 0.1-1 s bounds was rolled back at -58% within-node) or whose counts are not finite is
        left out. ``what`` names the query in NoData messages; ``selector``: the nodes' matchers (default
        the baseline's). Raises PrometheusError subclasses."""
        cfg = self.config
        series = f"{spec.metric}_bucket"
        selector = selector or self.baseline
        first = self.first_sample(first_sample_series(spec), spec, selector, lo, at)
        if first is not None and first + cfg.step_s > lo:
            lo = first + cfg.step_s
        if lo >= keep_before - cfg.step_s:
            return None
        sel = spec.selector(selector)
        q = f"sum by (le, {cfg.node_label}) (increase({series}{{{sel}}}[{max(1, round(at - lo))}s]))"
        try:
            r = self._instant(q, at, what)
        except NoData:
            return None
        pairs: dict[str, list[tuple[str, float]]] = {}
        for smp in r.samples:
            pairs.setdefault(smp.labels.get(cfg.node_label, ""), []).append((smp.labels.get("le", ""), smp.value))
        out = {}
        for node, pp in pairs.items():
            try:
                bounds, counts = fold_nonpositive(*parse_buckets(pp))
            except ValueError:
                continue
            if common_bounds([bounds, common]).size != common.size or not np.all(np.isfinite(counts)):
                continue
            out[node] = rebin(bounds, counts, common)
        return out, lo

    def _node_history(self, spec: MetricSpec, data_start: float, end: float, common: np.ndarray,
                      x: np.ndarray, per_observation: float = 1.0) -> tuple[np.ndarray, np.ndarray, float] | None:
        """The baseline's nodes over a longer window, for the between-node spread only.

        :meth:`_baseline_nodes` over ``config.node_history_s`` before ``data_start`` (the look's own
        window start) up to ``end``. The baseline is the fleet that was serving before the stage: a
        node's speed (GPU binning, thermals, neighbours) is a property of the node, so its deviation
        from the other nodes is measured over ~30 times the requests of an early look. Returns
        ``(per-node mean log latency (k,), their sampling variances (k,), history seconds used)``,
        nodes with at least 2 requests, on the ``common`` bounds (``x``: their log centres); None when
        disabled, when the window is no longer than the look's or when the query is empty (the look's
        own window is then used). ``per_observation``: effective requests per observation
        (``clustered_by`` metrics such as ITL count requests, not tokens: the look's baseline ratio of
        requests to observations), scaling the sample sizes. Raises PrometheusError subclasses."""
        cfg = self.config
        if cfg.node_history_s <= 0:
            return None
        got = self._baseline_nodes(spec, data_start - cfg.node_history_s, end, data_start, common, "baseline history")
        if got is None or len(got[0]) < 2:
            return None
        nodes, lo = got
        n, m, ss = unit_moments(np.array(list(nodes.values())), x)
        ok = n >= 2
        if ok.sum() < 2:
            return None
        s2 = float(ss[ok].sum() / max(n[ok].sum() - ok.sum(), 1.0))
        return m[ok], s2 / (n[ok] * per_observation), end - lo

    def _pre_stage(self, spec: MetricSpec, stage_start: float, common: np.ndarray) -> dict[str, np.ndarray]:
        """Every node's latency buckets under the baseline before the stage, for the within-node design
        (:meth:`gpuobs.canary.histstats.HistContext._within_node`).

        :meth:`_baseline_nodes` over ``config.pre_stage_s`` before ``stage_start``, evaluated at
        ``stage_start`` (an instant query at that time, valid PromQL and MetricsQL). A canary node
        that served the baseline release right before the stage (a release switched in place, a
        canary pod on the node the stable pod just left) has a series there under its own
        ``node_label`` value; a new pod on a new node has none. Returns ``{node: counts (B+1,)}`` on
        the ``common`` bounds; empty when disabled or when the query is empty. Series without the
        node label are left out (they cannot be matched to a canary node). Raises PrometheusError
        subclasses."""
        cfg = self.config
        if cfg.pre_stage_s <= 0:
            return {}
        got = self._baseline_nodes(spec, stage_start - cfg.pre_stage_s, stage_start, stage_start, common,
                                   "pre-stage baseline", self.history)
        return {} if got is None else {node: c for node, c in got[0].items() if node}

    def _histogram(self, spec: MetricSpec, res: MetricResult, start: float, end: float,
                   state: AnalysisState | None) -> None:
        """Location, quantile and spread tests of a latency histogram (docs/canary.md).

        Queries, per side: ``sum by (le, <node_label>) (increase(<metric>_bucket{...}[W]))``, the
        sample count of ``<metric>_count`` (see :meth:`_samples_factor`) and, for ``clustered_by``,
        the request count per node. Units are the values of ``config.node_label``; series without
        it form one unit.
        """
        cfg = self.config
        window = self._data_window(spec, res, first_sample_series(spec), start, end)
        unit = cfg.node_label
        sides: dict[str, dict[str, Any]] = {}
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            s = spec.selector(sel)
            q = f"sum by (le, {unit}) (increase({spec.metric}_bucket{{{s}}}[{window}]))"
            r = self._instant(q, end, side)
            if r.empty:
                raise NoData(f"no {spec.metric} buckets for the {side}")
            pairs: dict[str, list[tuple[str, float]]] = {}
            for smp in r.samples:
                pairs.setdefault(smp.labels.get(unit, ""), []).append((smp.labels.get("le", ""), smp.value))
            units = {}
            for u, pp in sorted(pairs.items()):
                try:
                    units[u] = fold_nonpositive(*parse_buckets(pp))
                except ValueError as exc:
                    raise NoData(f"{side}{' ' + unit + '=' + u if u else ''}: {exc}") from None
            factor = self._samples_factor(f"{spec.metric}_count", s, window, end, side)
            requests = None
            if spec.clustered_by:
                qc = f"sum by ({unit}) (increase({spec.clustered_by}_count{{{s}}}[{window}]))"
                rc = self._instant(qc, end, f"{side} request-count")
                if rc.empty:
                    raise NoData(f"no {spec.clustered_by}_count for the {side} (needed to count requests)")
                requests = {smp.labels.get(unit, ""): smp.value for smp in rc.samples}
            sides[side] = {"units": units, "factor": factor, "requests": requests}
        layouts = [b for sd in sides.values() for b, _ in sd["units"].values()]
        common = common_bounds(layouts)
        if common.size == 0:
            raise NoData("canary and baseline bucket layouts share no finite bound")
        if any(b.shape != common.shape for b in layouts):
            res.notes.append(f"bucket layouts differ; compared on the {common.size} bounds they share")
        data = {}
        for side, sd in sides.items():
            names = list(sd["units"])
            counts = np.array([rebin(b, c, common) for b, c in sd["units"].values()])
            n = counts.sum(-1)
            eff = n * sd["factor"]
            if sd["requests"] is not None:
                req = np.array([sd["requests"].get(u, 0.0) for u in names]) * sd["factor"]
                eff = np.minimum(eff, req)
            data[side] = (names, counts, n, eff)
        (_, cc, nc_u, ec_u), (_, cb, nb_u, eb_u) = data["canary"], data["baseline"]
        res.n_canary, res.n_baseline = float(nc_u.sum()), float(nb_u.sum())
        for side, total in (("canary", res.n_canary), ("baseline", res.n_baseline)):
            if total < spec.min_samples:
                res.needed_canary = spec.min_samples
                raise NoData(f"{side} has {total:.0f} requests in the window, needs {spec.min_samples:.0f}")
        for side, eff in (("canary", ec_u), ("baseline", eb_u)):
            if not float(eff.sum()) > 0:  # e.g. the clustered_by count is 0 while the buckets grew
                raise NoData(f"{side}: no effective requests in the window (the sample or request count is 0)")
        pc, pb = cc.sum(0), cb.sum(0)
        for side, counts in (("canary", pc), ("baseline", pb)):
            getattr(res, side).update({f"p{int(q * 100)}": float(histogram_quantile(q, common, counts))
                                       for q in (0.5, 0.9, 0.99)})
        res.evidence["nodes_canary"], res.evidence["nodes_baseline"] = float(len(nc_u)), float(len(nb_u))
        if spec.clustered_by:
            res.evidence["n_eff_canary"] = float(ec_u.sum() / sides["canary"]["factor"])
        x = bin_log_centres(common)
        alphas = spec.test_alpha(res.alpha)
        clustering = float(eb_u.sum() / max(nb_u.sum() * sides["baseline"]["factor"], 1e-9))
        history = self._node_history(spec, float(res.data_start if res.data_start is not None else start), end,
                                     common, x, min(1.0, clustering))
        pre_end = start - cfg.warmup_s
        pre = self._pre_stage(spec, pre_end if self.pre_stage_end is None else min(pre_end, self.pre_stage_end),
                              common)
        pre_arrays = None
        if pre:
            none = np.zeros(common.size + 1)
            (names_c, *_), (names_b, *_) = data["canary"], data["baseline"]
            pre_arrays = (np.array([pre.get(u, none) if u else none for u in names_c]),
                          np.array([pre.get(u, none) if u else none for u in names_b]), min(1.0, clustering))
        ctx = HistContext(common, x, cc, cb, nc_u, nb_u, ec_u, eb_u, log1p(cfg.node_spread), cfg.node_spread_df,
                          history, pre_arrays, (cfg.node_drift, cfg.node_drift_df), within_only=self.within_only)
        if history is not None:
            res.evidence["node_history_s"] = float(history[2])
        needed = []
        for name, _ in spec.tests:
            try:
                t = ctx.test(name)
            except NotApplicable as why:
                res.tests.append({"test": name, "classification": "n/a", "reason": str(why)})
                continue
            except NoData as why:
                res.tests.append({"test": name, "classification": "NoData", "reason": str(why)})
                continue
            row = self._decide_test(spec, name, t, alphas[name], start, end, state)
            res.tests.append(row)
            allowed = spec.allowed_effect if name == "location" else spec.quantile_allowed_effect
            if name not in HARM_ONLY_TESTS:
                needed.append(t["need"](float(norm.isf(alphas[name])), allowed))
        res.assumption, note = node_spread_assumption(ctx, unit, cfg.node_spread, cfg.node_spread_df, len(nb_u),
                                                      len(nc_u))
        res.design = ctx.design
        if ctx.design == "within-node":
            res.evidence["canary_node_offset"] = math.expm1(ctx.offset)
        res.design_note = ctx.design_note if (pre or ctx.design == "within-node") else \
            f"no pre-stage data under the baseline (pre_stage {cfg.pre_stage_s:g} s)"
        if note:
            res.notes.append(note)
        # in the unit of n_canary (observations: tokens for ITL), from effective requests
        res.needed_canary = (float(np.nanmax(needed)) * float(nc_u.sum() / max(ec_u.sum(), 1e-9))
                             if needed and not np.all(np.isnan(needed)) else None)
        self._combine_tests(spec, res)

    def _decide_test(self, spec: MetricSpec, name: str, t: dict[str, Any], alpha: float, start: float, end: float,
                     state: AnalysisState | None) -> dict[str, Any]:
        """Sequential boundary, interval and classification of one histogram test."""
        two_sided = spec.direction == "either"
        side_alpha = alpha / 2 if two_sided else alpha
        cl: Clustered = t["stat"]
        c, c_pass, look = self._boundary(spec, side_alpha, start, end, t["n"], cl.info, state,
                                         key=f"{spec.name}.{name}", tail=name != "location",
                                         pass_alpha=self.config.alpha / 2 if two_sided else self.config.alpha)
        c_normal = c
        if math.isfinite(cl.df):
            c, c_pass = (float(student_t.isf(norm.sf(v), max(1.0, cl.df))) if math.isfinite(v) else v
                         for v in (c, c_pass))
        z = t.get("z", cl.z)
        up_harm, down_harm = spec.direction in ("increase", "either"), spec.direction in ("decrease", "either")
        # the harmful end at the harm-side boundary, the passing end at the pass-side one (an
        # asymmetric repeated confidence interval, see config.pass_spending)
        lo_h, hi_h = t["interval"](c) if math.isfinite(c) else (-math.inf, math.inf)
        lo_p, hi_p = t["interval"](c_pass) if math.isfinite(c_pass) else (-math.inf, math.inf)
        lo_e, hi_e = (lo_h if up_harm else lo_p), (hi_p if up_harm else hi_h)
        allowed = spec.allowed_effect if name == "location" else spec.quantile_allowed_effect
        high = up_harm and z >= c and (spec.min_effect <= 0 or lo_h > spec.min_effect)
        low = z <= -c and hi_h < (-spec.min_effect if down_harm else 0.0)
        passed = (not up_harm or hi_p < allowed) and (not down_harm or lo_p > -allowed)
        if name in HARM_ONLY_TESTS:  # it can roll back; passing is the pNN tests' (see HARM_ONLY_TESTS)
            passed = True
        code = int(classify(True, high, low, passed))
        return {"test": name, "classification": CLASS_NAMES[code], "harmful": bool(harmful(code, spec.direction)),
                "effect": t["effect"], "interval": (lo_e, hi_e), "z": float(z), "boundary": float(c),
                "df": cl.df, "alpha": alpha, "node_tau": math.sqrt(cl.tau2), "node_tau_source": cl.tau2_source,
                "boundary_normal": c_normal, "boundary_pass": float(c_pass), "look": look, "what": t["what"],
                **t.get("extra", {})}

    @staticmethod
    def _combine_tests(spec: MetricSpec, res: MetricResult) -> None:
        """A metric is harmful when any test is; Pass when every test passes; else Inconclusive."""
        tests = [r for r in res.tests if r["classification"] != "n/a"]
        judged = [r for r in tests if r["classification"] != "NoData"]
        loc = next((r for r in tests if r["test"] == "location" and r["classification"] != "NoData"), None)
        head = loc or (judged[0] if judged else None)
        if head is None:
            raise NoData("; ".join(f"{r['test']}: {r.get('reason', '')}" for r in res.tests) or "no test")
        res.effect, res.interval = head["effect"], head["interval"]
        res.evidence.update(z=head["z"], boundary=head["boundary"])
        res.look = head.get("look")
        harm = [r for r in judged if r["harmful"]]
        if harm:
            res.harmful = True
            res.classification = harm[0]["classification"]
            res.reason = "harmful: " + ", ".join(r["test"] for r in harm)
        elif judged and len(judged) == len(tests) and all(r["classification"] in ("Pass", "Low") for r in judged):
            res.classification = "Pass" if any(r["classification"] == "Pass" for r in judged) else "Low"
        else:
            res.classification = "Inconclusive"
            missing = [r["test"] for r in res.tests if r["classification"] == "NoData"]
            if missing:
                res.reason = "no data for " + ", ".join(missing)

    def _errors(self, spec: MetricSpec, res: MetricResult, start: float, end: float,
                state: AnalysisState | None) -> None:
        """Error ratio: exact conditional e-process (see sequential.rate_ratio_log_evalue).

        A missing error series is missing evidence, not zero errors: vLLM creates every
        ``finished_reason`` child at start-up, so an absent ``finished_reason="error"`` series means
        a scrape, relabelling or exporter problem, and the metric is NoData (HOLD)."""
        window = self._data_window(spec, res, first_sample_series(spec), start, end)
        counts = {}
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            s = spec.selector(sel)
            total = self._instant(f"sum(increase({spec.metric}{{{s}}}[{window}]))", end, side).scalar()
            if total is None:
                raise NoData(f"no {spec.metric} series for the {side}")
            q = f"sum(increase({spec.metric}{{{spec.selector(sel, spec.error_matchers)}}}[{window}]))"
            errors = self._instant(q, end, f"{side} error").scalar()
            if errors is None:
                res.n_canary = total if side == "canary" else res.n_canary
                raise NoData(f"no {spec.error_matchers} series for the {side}: missing, not zero (every error "
                             "series must be exported, at 0 when there are none)")
            f = self._samples_factor(spec.metric, s, window, end, side)
            counts[side] = (min(errors, total) * f, total * f, total)
        (e_c, n_c, raw_c), (e_b, n_b, raw_b) = counts["canary"], counts["baseline"]
        res.n_canary, res.n_baseline = raw_c, raw_b
        p_b0 = e_b / n_b if n_b > 0 else math.nan
        # the pass side (PROMOTE) is an intersection-union test at the stage alpha (docs/canary.md, 5)
        res.needed_canary = errors_needed(p_b0, spec.allowed_effect, self.config.alpha) if n_b > 0 else None
        for side, raw in (("canary", raw_c), ("baseline", raw_b)):
            if raw < spec.min_samples:
                raise NoData(f"{side} has {raw:.0f} requests in the window, needs {spec.min_samples:.0f}")
        p_c, p_b = e_c / n_c, e_b / n_b
        thr = math.log(1 / res.alpha)
        log_e = float(rate_ratio_log_evalue(e_c, n_c, e_b, n_b, 1.0, upper=True))
        log_e_low = float(rate_ratio_log_evalue(e_c, n_c, e_b, n_b, 1.0, upper=False))
        upper_c = float(binomial_upper_bound(e_c, n_c, self.config.alpha))
        high = log_e >= thr and p_c - p_b > spec.min_effect
        code = int(classify(True, high, log_e_low >= thr, upper_c <= p_b + spec.allowed_effect))
        res.classification, res.harmful = CLASS_NAMES[code], bool(harmful(code, "increase"))
        lo, hi = rate_ratio_interval(e_c, n_c, e_b, n_b, res.alpha)
        res.effect = p_c / p_b - 1 if p_b > 0 else (math.inf if p_c > 0 else math.nan)
        res.interval = (lo - 1, hi - 1)
        res.canary.update(ratio=p_c, errors=e_c / counts["canary"][1] * raw_c if n_c else 0.0, upper_bound=upper_c)
        res.baseline.update(ratio=p_b, errors=e_b / counts["baseline"][1] * raw_b if n_b else 0.0)
        res.evidence = {"log_e": log_e, "threshold": thr}

    def _series(self, spec: MetricSpec, res: MetricResult, start: float, end: float,
                state: AnalysisState | None) -> None:
        if self.within_only:  # a series has no within-node design: levels of two GPU models differ by design
            raise NoData("not comparable: the baseline nodes are another GPU model (within-node design only)")
        values = {}
        for side, sel in (("canary", self.canary), ("baseline", self.baseline)):
            r = self.client.query_range(fill_selector(spec.query, sel), start, end, self.config.step_s)
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
