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

Histogram metrics run several tests (issue 18, docs/canary.md 1a-1e): the location shift, quantile
tests (share of canary requests above the baseline's pNN bucket bound, exact binomial tail), a
tail test (log-rank on the requests above the baseline's p90 bound, exact null) and a spread test, each at its share of the metric's alpha with its own group-sequential boundary
(weighted Bonferroni across tests, Lan-DeMets spending across looks), all compared per serving node
(``config.node_label``) with the between-node variance estimated from the baseline's nodes
(DerSimonian-Laird), read over the look's window and ``config.node_history_s`` before it. ``config.warmup_s`` of data after ``start`` is excluded, and every look says
whether a PROMOTE is reachable within the horizon (``Verdict.promote_reachable``).

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
raised, never turned into a verdict; empty results, NaN, vanished series, a missing error series and
too few samples give NoData, and a critical NoData metric makes the look HOLD (never PROMOTE).
"""

from __future__ import annotations

import functools
import math
import time
from math import log1p
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from gpuobs.canary.config import CanaryConfig, MetricSpec, fill_selector, parse_selector, quantile_of
from gpuobs.canary.sequential import (MIN_INFO_GROWTH, binomial_upper_bound, group_sequential_boundaries,
                                      planned_looks, rate_ratio_interval, rate_ratio_log_evalue)
from gpuobs.canary.stats import (CANARY_VARIANCE_PRIOR, CLASS_NAMES, Clustered, Shift, bin_log_centres, classify,
                                 clustered, common_bounds, exceedance_z, fold_nonpositive, harmful,
                                 histogram_quantile, paired_shift, parse_buckets, rebin, unit_moments)
from gpuobs.canary.verdict import MetricResult, Verdict, combine
from gpuobs.core import log
from gpuobs.promapi.prometheus import PromClient, QueryResult

LOG = log.get("canary")
# the tail test (``_HistContext._tail``) compares the requests above the baseline's bound nearest its p90
TAIL_FROM = 0.9
# Tests that can roll back but need not pass for PROMOTE. The tail test estimates the p99 change through
# a fitted tail (extended past the baseline's last request), an interval that the p99 test gives
# directly; requiring both to pass held healthy canaries: with Prometheus' default buckets 26% of
# healthy canaries were still HOLD at the deadline (79 of 88 blocked by the tail test), 15% before it.
HARM_ONLY_TESTS = frozenset({"tail"})
TAIL_REPORT_Q = 0.99  # the tail test reports (and passes on) the change of this quantile it implies
SCORE_GRID_CELLS = 64  # grid cells per score range in the tail test's exact null (score_sum_z)
TAIL_TOP_SHARE = 0.01  # the tail test pools the top buckets holding less than this share of the tail
# A quantile test is n/a when its nearest bucket bound is further than this from the quantile in
# probit units of the baseline's share (1.0: the share above the bound is 16-84% for p50, 0.04-9% for
# p99; a lognormal's latency at the bound is within a factor exp(sigma) of the quantile). Further out
# the test measures another quantile: with buckets 0.1, 0.5, 2.5, 10 s the p99 test sat on the p90
# test's bound (0.5 s, 12% above) and the p50 test on 0.1 s (94% above), whose change says little
# about the median's. The location test still covers such a layout.
QUANTILE_BOUND_PROBIT = 1.0
# the quantile tests' tail-shape factor (binormal slope, ``_quantile_mapping``) is clamped to this range
BETA_RANGE = (0.5, 2.0)
OUTLOOK_MARGIN = 1.5  # "out of reach" = the horizon brings less than 1/1.5 of the requests needed


class NoData(Exception):
    """Internal: a metric has no usable data; the message becomes its NoData reason."""


class NotApplicable(NoData):
    """Internal: a histogram test that the bucket layout cannot support (the tail test when the
    baseline's tail above p90 falls in one bucket group). The test is reported as ``n/a`` and left
    out of the metric's verdict, its alpha unspent: a layout cannot make a metric unpassable."""


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
        # the node-spread assumption is part of why: few nodes, the prior decides the intervals' width
        reasons.extend(f"assumption: {m.name}: {n}" for m in results if m.critical for n in m.notes
                       if "node_spread" in n)
        reachable, outlook = self._outlook(results, a, end)
        if not reachable and verdict == "HOLD":
            reasons.extend(outlook)
        elif not reachable:
            warnings.extend(outlook)
        frac = max(0.0, (end - a) / (cfg.horizon_s - cfg.warmup_s))
        if verdict == "HOLD" and frac >= 1.0:
            reasons.append("the analysis horizon is reached: later looks cannot change the latency verdicts; "
                           "treat this HOLD as inconclusive (e.g. Argo inconclusiveLimit, or end the stage)")
        out = Verdict(verdict, reasons, warnings, results, self.canary, self.baseline, start, end, frac,
                      frac >= 1.0, self.config.alpha, promote_reachable=reachable, warmup_s=cfg.warmup_s)
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
        res = self.client.query(expr, at=end)
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

    def _node_history(self, spec: MetricSpec, data_start: float, end: float, common: np.ndarray,
                      x: np.ndarray, per_observation: float = 1.0) -> tuple[np.ndarray, np.ndarray, float] | None:
        """The baseline's nodes over a longer window, for the between-node spread only.

        Reads ``sum by (le, <node_label>) (increase(<metric>_bucket{<baseline>}[H]))`` at ``end``, ``H``
        reaching ``config.node_history_s`` before ``data_start`` (the look's own window start), cut
        one step after the baseline's first sample as :meth:`_data_window` does. The baseline is the
        fleet that was serving before the stage: a node's speed (GPU binning, thermals, neighbours)
        is a property of the node, so its deviation from the other nodes is measured over ~30 times
        the requests of an early look. Returns ``(per-node mean log latency (k,), their sampling
        variances (k,), history seconds used)``, nodes with at least 2 requests, on the ``common``
        bounds (``x``: their log centres); None when disabled, when the window is no longer than the
        look's or when the query is empty (the look's own window is then used). ``per_observation``:
        effective requests per observation (``clustered_by`` metrics such as ITL count requests, not
        tokens: the look's baseline ratio of requests to observations), scaling the sample sizes.
        Raises PrometheusError subclasses."""
        cfg = self.config
        if cfg.node_history_s <= 0:
            return None
        series = f"{spec.metric}_bucket"
        lo = data_start - cfg.node_history_s
        first = self.first_sample(series, spec, self.baseline, lo, end)
        if first is not None and first + cfg.step_s > lo:
            lo = first + cfg.step_s
        if lo >= data_start - cfg.step_s:
            return None
        sel = spec.selector(self.baseline)
        q = f"sum by (le, {cfg.node_label}) (increase({series}{{{sel}}}[{max(1, round(end - lo))}s]))"
        try:
            r = self._instant(q, end, "baseline history")
        except NoData:
            return None
        pairs: dict[str, list[tuple[str, float]]] = {}
        for smp in r.samples:
            pairs.setdefault(smp.labels.get(cfg.node_label, ""), []).append((smp.labels.get("le", ""), smp.value))
        counts = []
        for pp in pairs.values():
            try:
                b, c = fold_nonpositive(*parse_buckets(pp))
            except ValueError:
                continue  # a node with a broken layout tells nothing about the spread
            counts.append(rebin(b, c, common))
        if len(counts) < 2:
            return None
        n, m, ss = unit_moments(np.array(counts), x)
        ok = n >= 2
        if ok.sum() < 2:
            return None
        s2 = float(ss[ok].sum() / max(n[ok].sum() - ok.sum(), 1.0))
        return m[ok], s2 / (n[ok] * per_observation), end - lo

    def _histogram(self, spec: MetricSpec, res: MetricResult, start: float, end: float,
                   state: AnalysisState | None) -> None:
        """Location, quantile and spread tests of a latency histogram (docs/canary.md).

        Queries, per side: ``sum by (le, <node_label>) (increase(<metric>_bucket{...}[W]))``, the
        sample count of ``<metric>_count`` (see :meth:`_samples_factor`) and, for ``clustered_by``,
        the request count per node. Units are the values of ``config.node_label``; series without
        it form one unit.
        """
        cfg = self.config
        window = self._data_window(spec, res, f"{spec.metric}_bucket", start, end)
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
        ctx = _HistContext(common, x, cc, cb, nc_u, nb_u, ec_u, eb_u, log1p(cfg.node_spread), cfg.node_spread_df,
                           history)
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
        note = _node_spread_note(ctx, unit, cfg.node_spread, cfg.node_spread_df, len(nb_u), len(nc_u))
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
        window = self._data_window(spec, res, spec.metric, start, end)
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
        res.needed_canary = _errors_needed(p_b0, spec.allowed_effect, self.config.alpha) if n_b > 0 else None
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


def _expm1(v: float) -> float:
    """``exp(v) - 1`` that saturates instead of overflowing (a Student-t boundary with ~1 degree of
    freedom, from two baseline nodes, can be astronomically wide)."""
    return math.expm1(min(v, 700.0))


# the prior's share of the node-spread estimate above which a look reports the assumption
PRIOR_NOTE_WEIGHT = 0.25


def _tail_top_group(counts: np.ndarray) -> int:
    """Index of the first bucket of the pooled top group: the last bucket from which the buckets up
    to the top hold at least ``TAIL_TOP_SHARE`` of ``counts`` (0 when the total is 0)."""
    c = np.asarray(counts, dtype=float)
    total = float(c.sum())
    if not total > 0:
        return 0
    from_top = np.cumsum(c[::-1])[::-1] / total
    ok = np.nonzero(from_top >= TAIL_TOP_SHARE)[0]
    return int(ok[-1]) if ok.size else 0


def _pool_top(counts: np.ndarray, top: int) -> np.ndarray:
    """``counts`` with the buckets from index ``top`` on summed into one (see ``_tail_top_group``)."""
    return np.concatenate((counts[:top], [counts[top:].sum()]))


def score_sum_z(scores: np.ndarray, probs: np.ndarray, counts: np.ndarray, m: float) -> float:
    """z of "a sum of ``m`` independent draws of ``scores`` (probabilities ``probs``) is at least the
    observed one", the observed draws being ``counts`` per score scaled to ``m`` in all: the mid-p
    upper tail ``P(S > observed) + P(S = observed)/2`` mapped to the normal scale.

    Exact for the scores rounded to a grid of ``span / G`` (``G`` >= ``SCORE_GRID_CELLS`` cells,
    up to 2^17 / m): the observed sum is read on the same grid, so the test stays exact for the
    rounded scores (a score moves by at most ``span / 2G``); the distribution of the sum is the
    ``m``-fold convolution, by FFT, of the one-draw distribution; ``m`` is rounded to an integer
    (``increase()``'s counts are not). Beyond 4,000 draws the normal approximation is used, its
    error being small by then. Returns 0.0 for ``m`` < 1 or a single score value."""
    s = np.asarray(scores, dtype=float)
    pi = np.asarray(probs, dtype=float)
    k = int(round(m))
    mu = float((pi * s).sum())
    var = float((pi * s * s).sum()) - mu * mu
    if k < 1 or not var > 0:
        return 0.0
    x = np.asarray(counts, dtype=float)
    if not x.sum() > 0:
        return 0.0
    if k > 4000:
        return float(m * ((x * s).sum() / x.sum() - mu) / math.sqrt(m * var))
    n_fft = 1 << max(10, min(17, math.ceil(math.log2(k * SCORE_GRID_CELLS + 1))))
    lo, span = float(s.min()), float(s.max() - s.min())
    cells = (n_fft - 1) // k
    h = span / cells
    idx = np.rint((s - lo) / h).astype(int)
    one = np.zeros(n_fft)
    np.add.at(one, idx, pi)
    pmf = np.clip(np.fft.irfft(np.fft.rfft(one) ** k, n_fft), 0.0, None)
    at = k * float((x * idx).sum() / x.sum())  # the observed sum on the grid, scaled to k draws
    at = min(max(at, 0.0), float(n_fft - 1))
    tail_above = np.concatenate((np.cumsum(pmf[::-1])[::-1][1:], [0.0]))  # P(S_grid > i)
    i0 = int(math.floor(at))
    i1 = min(i0 + 1, n_fft - 1)
    f = at - i0
    mid0 = tail_above[i0] + 0.5 * pmf[i0]
    mid1 = tail_above[i1] + 0.5 * pmf[i1]
    p = (1 - f) * mid0 + f * mid1
    p = min(max(p, 1e-300), 1.0)
    return float(norm.isf(p))


def _savage_scores(counts: np.ndarray) -> tuple[np.ndarray, float]:
    """Grouped log-rank (Savage) scores of buckets with ``counts`` (ordered by latency) and their
    variance under those counts' shares: ``(scores, V)``; empty buckets score 0 (see ``_tail``)."""
    c = np.asarray(counts, dtype=float)
    total = float(c.sum())
    if not total > 0:
        return np.zeros_like(c), 0.0
    pi = c / total
    s_hi = np.clip(1.0 - np.cumsum(pi), 0.0, 1.0)
    s_lo = np.concatenate(([1.0], s_hi[:-1]))

    def xlogx(v: np.ndarray) -> np.ndarray:
        return np.where(v > 0, v * np.log(np.where(v > 0, v, 1.0)), 0.0)

    with np.errstate(divide="ignore", invalid="ignore"):
        scores = np.where(pi > 0, -(xlogx(s_lo) - xlogx(s_hi)) / np.where(pi > 0, pi, 1.0), 0.0)
    return scores, float((pi * scores * scores).sum())


def _node_spread_note(ctx: "_HistContext", unit: str, spread: float, prior_df: float, kb: int, kc: int) -> str:
    """The node-spread assumption in words when it carries weight (few nodes), else ``""``."""
    try:
        loc = ctx.location_stat()
    except (ValueError, ZeroDivisionError, FloatingPointError):
        return ""
    d = loc.node_df
    weight = 1.0 if d == 0 or math.isinf(prior_df) else prior_df / (prior_df + d)
    if weight < PRIOR_NOTE_WEIGHT:
        return ""
    used = math.expm1(math.sqrt(loc.tau2))
    if d == 0:
        src = (f"{kb} baseline and {kc} canary {unit}(s) cannot estimate node-to-node variation; assuming the "
               f"configured node_spread {spread:.1%}")
    else:
        src = (f"node-to-node variation from {kb} baseline and {kc} canary {unit}(s) ({d} df) pooled with the "
               f"assumed node_spread {spread:.1%} ({prior_df:g} df, {weight:.0%} of the weight)")
    return (f"{src}: node sd {used:.1%} used; a canary {unit} that differs from the baseline by more than "
            f"the assumed spread can be rolled back (more baseline {unit}s let the data decide)")


def _errors_needed(p_b: float, allowed: float, alpha: float) -> float:
    """Canary requests at which a canary erring at the baseline's ratio ``p_b`` passes (its anytime
    upper bound <= p_b + allowed); inf beyond 1e8 requests, NaN when p_b is unknown. ``p_b`` is
    rounded to 2 significant digits (a prediction, cached across looks)."""
    if not math.isfinite(p_b):
        return math.nan
    return _errors_needed_cached(float(f"{p_b:.2g}"), allowed, alpha)


@functools.lru_cache(maxsize=256)
def _errors_needed_cached(p_b: float, allowed: float, alpha: float) -> float:
    n = np.logspace(0, 8, 321)
    ok = binomial_upper_bound(p_b * n, n, alpha) <= p_b + allowed
    return float(n[np.argmax(ok)]) if ok.any() else math.inf


class _HistContext:
    """The per-node bucket counts of one look and the tests on them (see docs/canary.md).

    ``cc``/``cb``: counts ``(units, B+1)`` on the common ``bounds``; ``nc``/``nb``: requests per unit;
    ``ec``/``eb``: effective sample sizes per unit (``increase()`` extrapolation and clustering
    removed); ``tau_loc``: the prior node spread on the log scale, used with < 2 baseline units.
    Each test returns a dict: ``stat`` (:class:`Clustered`), ``n`` (canary requests), ``effect``
    (user scale), ``interval(c)`` (user-scale interval at boundary c), optional ``z``, ``what``,
    ``needed(c1)`` inputs, ``extra`` (descriptive fields).
    """

    def __init__(self, bounds, x, cc, cb, nc, nb, ec, eb, tau_loc, prior_df, history=None):
        self.bounds, self.x, self.cc, self.cb, self.nc, self.nb, self.ec, self.eb = bounds, x, cc, cb, nc, nb, ec, eb
        self.tau_loc, self.prior_df, self.history = tau_loc, prior_df, history
        self.Nc, self.Nb, self.Ec, self.Eb = nc.sum(), nb.sum(), ec.sum(), eb.sum()
        self.wc, self.wb = nc / self.Nc, nb / self.Nb
        self.g = float((self.wc ** 2).sum() + (self.wb ** 2).sum())
        self.r = self.Ec / self.Eb
        self.pb = cb.sum(0)
        # baseline survival at each bound (share of requests above it), for the quantile tests
        self.surv = 1.0 - np.cumsum(self.pb)[:-1] / self.Nb
        _, self.mc_u, self.ssc = unit_moments(cc, x)
        _, self.mb_u, self.ssb = unit_moments(cb, x)
        kc, kb = int((nc > 0).sum()), int((nb > 0).sum())
        self.s2b = float(self.ssb.sum() / max(self.Nb - kb, 1.0))
        self.s2c = float(self.ssc.sum() / max(self.Nc - kc, 1.0))
        self._loc: Clustered | None = None

    def test(self, name: str) -> dict[str, Any]:
        if name == "location":
            return self._location()
        if name == "spread":
            return self._spread()
        if name == "tail":
            return self._tail()
        return self._quantile(name, quantile_of(name))

    def _needed(self, c1_var: float, margin: float, tau2: float) -> float:
        """Canary sample size at which ``c1 * se`` fits inside ``margin`` (c1 folded into c1_var)."""
        den = margin * margin - tau2
        return c1_var / den if den > 0 else math.inf

    def location_stat(self) -> Clustered:
        """The location comparison; its between-node variance (DerSimonian-Laird on the baseline
        nodes' mean log latency, the most precise per-node statistic) also serves the quantile tests."""
        if self._loc is None:
            mean_c = float((self.cc.sum(0) * self.x).sum() / self.Nc)
            mean_b = float((self.pb * self.x).sum() / self.Nb)
            s2c = (self.Ec * self.s2c + CANARY_VARIANCE_PRIOR * self.s2b) / (self.Ec + CANARY_VARIANCE_PRIOR)
            v_req = s2c / self.Ec + self.s2b / self.Eb
            okb, okc = self.nb >= 2, self.nc >= 2
            if self.history is not None:  # the baseline's nodes over node_history (Analyzer._node_history)
                base_group = (self.history[0], self.history[1])
            else:
                base_group = (self.mb_u[okb], self.s2b / self.eb[okb])
            groups = [base_group, (self.mc_u[okc], s2c / self.ec[okc])]
            self._loc = clustered(mean_c - mean_b, v_req, self.wc, self.wb, groups, self.tau_loc ** 2, self.prior_df,
                                  label="nodes" if self.history is None else "nodes with history")
        return self._loc

    def _location(self) -> dict[str, Any]:
        cl = self.location_stat()
        e = cl.effect

        def interval(c: float) -> tuple[float, float]:
            return _expm1(e - c * cl.se), _expm1(e + c * cl.se)

        return {"stat": cl, "n": self.Nc, "effect": math.expm1(e), "interval": interval,
                "what": "mean log latency (geometric mean)",
                "need": lambda c1, allowed: self._needed(c1 * c1 * self.s2b * (1 + self.r), log1p(allowed),
                                                         c1 * c1 * cl.tau2 * self.g)}

    def _spread(self) -> dict[str, Any]:
        if self.s2c <= 0 or self.s2b <= 0:
            raise NoData("no spread within the buckets")
        dev4 = (self.cb * (self.x - np.nan_to_num(self.mb_u)[:, None]) ** 4).sum()
        kappa = max(float(dev4 / (self.Nb * self.s2b ** 2)), 1.5)
        e = 0.5 * math.log(self.s2c / self.s2b)
        v_req = (kappa - 1) / 4 * (1 / self.Ec + 1 / self.Eb)
        groups = []
        for n_u, ss_u, e_u in ((self.nb, self.ssb, self.eb), (self.nc, self.ssc, self.ec)):
            ok = n_u >= 3
            s2u = ss_u[ok] / (n_u[ok] - 1)
            with np.errstate(divide="ignore"):
                vals = np.where(s2u > 0, 0.5 * np.log(np.where(s2u > 0, s2u, 1.0)), np.nan)
            groups.append((vals, (kappa - 1) / (4 * e_u[ok])))
        # node effects scale a node's latencies (a shift of its log latency) and leave its spread as
        # it is: the prior for the spread test's between-node variance is 0, with the same weight
        cl = clustered(e, v_req, self.wc, self.wb, groups, 0.0, self.prior_df)

        def interval(c: float) -> tuple[float, float]:
            return _expm1(e - c * cl.se), _expm1(e + c * cl.se)

        return {"stat": cl, "n": self.Nc, "effect": math.expm1(e), "interval": interval,
                "what": "within-node standard deviation of log latency (ratio - 1)",
                "need": lambda c1, allowed: self._needed(c1 * c1 * (kappa - 1) / 4 * (1 + self.r), log1p(allowed),
                                                         c1 * c1 * cl.tau2 * self.g)}

    def _tail(self) -> dict[str, Any]:
        """Tail-shape test: a two-sample log-rank (Savage) test on the requests above the baseline's
        p90 bucket bound, conditional on how many there are.

        Statistic: the bound ``b`` of :func:`tail_threshold` at 0.9 (the p90 test's); on the buckets
        above it the baseline's conditional survival ``S_lo``/``S_hi`` at each bucket's lower/upper
        bound gives the bucket's score ``-(S_lo ln S_lo - S_hi ln S_hi) / (S_lo - S_hi)``: the score
        of a Lehmann (proportional hazards) alternative ``S_canary = S_base^theta`` in grouped data
        at ``theta = 1``, mean 0 under the baseline, variance ``V`` (Savage 1956, "Contributions to
        the theory of rank order statistics: the two-sample case", Ann. Math. Stat. 27; for grouped
        data Prentice & Gloeckler 1978, Biometrics 34). It is the locally most powerful rank test
        for a tail that got heavier, and it uses only the baseline's shares at the bounds, no
        density or distribution family. Its estimate is the one-step log "stretch" ``e = mean canary
        score / V`` (``theta = exp(-e)``), variance ``(1/m_c + 1/m_b) / V`` (``m`` the effective
        requests above ``b``). ``effect`` and the interval are reported as the change of the p99
        that ``theta`` implies (``TAIL_REPORT_Q``; the baseline's survival log-log interpolated), so
        the interval reads like the pNN tests' (on vLLM's TTFT buckets a tail hazard ratio of 1.25 is
        p99 +15%, +25% is a ratio of 1.42). It is a harm-only test (``HARM_ONLY_TESTS``): it rolls
        back, and PROMOTE leaves the p99 bound to the p99 test.

        Why, besides the pNN tests: a regression that stretches only the tail (bench shape "tail:
        p99 +30%, median unchanged") changes the share above the p99 bound from 1.0% to 2.2%, a
        handful of requests at canary traffic, while it moves every request above p90 (12% of
        them). Fixed sample of 1,140 canary requests, vLLM's TTFT buckets, one look at alpha 0.27%
        (bench/canary_oracle.py): the p99 exceedance test catches 72%, this test 86%, the
        Neyman-Pearson oracle that knows the alternative exactly 88%. Conditioning on the count
        above ``b`` keeps the test about the shape: a uniform slowdown is the location test's.

        The buckets at the top holding together less than ``TAIL_TOP_SHARE`` (1%) of the baseline's
        requests above ``b`` are pooled into one, capping a score at ``-ln 0.01 = 4.6``: one canary
        request in a bucket the baseline reaches once an hour is not a verdict, and the baseline's
        share of such a bucket is too uncertain to score by. The z is exact, not normal: the canary's
        score sum has few large values (at 1,140 canary requests the normal approximation rejected
        at 0.44% for a 0.27% boundary, 2.5x), so its upper tail (mid-p) is computed from the
        distribution of a sum of ``m`` independent scores (:func:`score_sum_z`) and widened by the
        baseline's and the nodes' variance as the pNN tests' z is.

        Node heterogeneity: a node scaled by ``exp(nu)`` moves the mean score by ``slope x nu``
        (slope from the baseline's survival, log-log interpolated between bounds and shifted by
        +-5%), so the between-node variance is ``slope^2 tau^2`` with the location test's tau^2.
        Raises NoData when the baseline has no bound near its p90 or the canary has no request
        above ``b``; NotApplicable when the baseline's tail falls in one bucket group (a coarse
        layout such as 0.1, 0.5, 2.5, 10 s: bench "A/A, coarse buckets", where a NoData here held
        every healthy canary to the deadline)."""
        from gpuobs.canary.stats import tail_threshold

        j = tail_threshold(self.bounds, self.pb, TAIL_FROM)
        if j < 0:
            raise NoData("no bucket bound inside the baseline's distribution near its p90")
        b = float(self.bounds[j])
        pb_t = self.pb[j + 1:]
        mb = float(pb_t.sum())
        top = _tail_top_group(pb_t)
        pooled_b = _pool_top(pb_t, top)
        scores, v = _savage_scores(pooled_b)
        if not v > 0:
            raise NotApplicable(f"the baseline's requests above {b:g} fall in one bucket group (the layout "
                                f"cannot resolve the tail's shape)")
        xc = self.cc[:, j + 1:].sum(0)
        xc = _pool_top(xc, top)
        m = float(xc.sum())
        if not m > 0:
            raise NoData(f"no canary request above the baseline's p90 bound {b:g}")
        mc_eff, mb_eff = m * self.Ec / self.Nc, mb * self.Eb / self.Nb
        e = float((xc * scores).sum() / m) / v
        v_c0 = 1.0 / (mc_eff * v)
        v_req = v_c0 + 1.0 / (mb_eff * v)
        full = np.concatenate((scores[:top], np.full(pb_t.size - top, scores[top])))
        slope = self._tail_slope(j, full) / v
        loc = self.location_stat()
        tau2 = slope * slope * loc.tau2
        var = v_req + tau2 * self.g
        df = var * var / ((tau2 * self.g) ** 2 / loc.tau2_df) if tau2 > 0 and math.isfinite(loc.tau2_df) else math.inf
        cl = Clustered(e, math.sqrt(var), df, tau2, loc.tau2_source, 1.0 / var, loc.tau2_df, loc.node_df)
        # the canary's score sum is skewed (few, large scores at the top): its z is read from the exact
        # null distribution of a sum of mc_eff scores, then widened like the quantile tests' z
        pi = pooled_b / mb
        z_exact = score_sum_z(scores, pi, xc, mc_eff)
        z = z_exact * math.sqrt(v_c0) / cl.se if cl.se > 0 else z_exact
        p_tail = mb / self.Nb
        q_ref = min(1.0 - TAIL_REPORT_Q, 0.5 * p_tail)  # the share above the reported quantile
        s_ref = q_ref / p_tail  # its survival within the tail
        x_ref = self._bound_at(q_ref)

        def qeff(log_stretch: float) -> float:
            # Lehmann: canary tail survival = baseline's ^ exp(-log_stretch); the canary's p99 is the
            # baseline's latency whose share above is p_tail * s_ref ^ exp(log_stretch)
            ln_share = math.log(p_tail) + math.exp(min(log_stretch, 50.0)) * math.log(s_ref)
            return self._bound_at(math.exp(max(ln_share, -700.0))) / x_ref - 1.0

        def interval(c: float) -> tuple[float, float]:
            return qeff(e - c * cl.se), qeff(e + c * cl.se)

        def need(c1: float, allowed: float) -> float:
            share = self._share_above(x_ref * (1 + allowed))
            if not 0 < share < q_ref:  # beyond the layout's resolution: no prediction
                return math.nan
            margin = math.log(math.log(share / p_tail) / math.log(s_ref))
            return self._needed(c1 * c1 * (1 + self.r) / (v * p_tail), margin, c1 * c1 * cl.tau2 * self.g)

        return {"stat": cl, "n": self.Nc, "z": z, "effect": qeff(e), "interval": interval, "need": need,
                "what": (f"tail shape above the baseline's p90 bound {b:g} (log-rank), as the p{TAIL_REPORT_Q * 100:g} "
                         f"change it implies"),
                "extra": {"threshold": b, "share_canary": m / self.Nc, "share_baseline": p_tail,
                          "tail_hazard_ratio": math.exp(e)}}

    def _tail_slope(self, j: int, scores: np.ndarray, delta: float = 0.05) -> float:
        """d(mean tail score)/d(nu) for latencies scaled by exp(nu): the baseline's survival at the
        bounds above ``j`` read at ``bound x exp(-+delta)`` (log-log interpolation, :meth:`_share_above`),
        renormalised above bound ``j``, central difference."""
        finite = self.bounds[j:]
        pos = self.surv[j:] > 0

        def mean_score(nu: float) -> float:
            s = np.array([self._share_above(float(x) * math.exp(-nu)) if ok else 0.0 for x, ok in zip(finite, pos)])
            if not s[0] > 0:
                return 0.0
            probs = -np.diff(np.concatenate((s, [0.0]))) / s[0]
            return float((np.clip(probs, 0.0, None) * scores).sum())

        return (mean_score(delta) - mean_score(-delta)) / (2 * delta)

    def _log_surv(self) -> tuple[np.ndarray, np.ndarray]:
        ok = self.surv > 0
        return np.log(self.bounds[ok]), np.log(self.surv[ok])

    def _bound_at(self, share: float) -> float:
        """Baseline latency with ``share`` of requests above it (log-log interpolation of the survival
        between bucket bounds). Below the smallest positive share the last segment's log-log slope is
        extended (a Pareto tail; it overstates a lognormal's, which steepens), up to the layout's
        largest bound: clamping there instead read every share beyond the baseline's last request as
        that bound, so a tail test's interval collapsed to "no change" exactly when the canary's tail
        went further than the baseline's (unit test ``test_tail_test_catches_...``). Above the largest
        share it is clamped to the layout's range."""
        lb, ls = self._log_surv()
        ln_share = math.log(max(share, 1e-300))
        if ls.size >= 2 and ln_share < ls[-1]:
            slope = (ls[-1] - ls[-2]) / (lb[-1] - lb[-2]) if lb[-1] > lb[-2] else 0.0
            if slope < 0:
                # clamped in log space: a very small share over a shallow slope overflowed exp()
                return float(math.exp(min(lb[-1] + (ln_share - ls[-1]) / slope, math.log(self.bounds[-1]))))
        return float(np.exp(np.interp(ln_share, ls[::-1], lb[::-1])))

    def _share_above(self, value: float) -> float:
        lb, ls = self._log_surv()
        return float(np.exp(np.interp(math.log(value), lb, ls)))

    def _density_at(self, j: int) -> float:
        """Density of the baseline's log latency at bound ``j`` (share of requests per unit of log
        latency), ``-dS/dln x = S(b) h(b)`` with ``h`` the log-log hazard slope ``-dln S/dln x``,
        averaged over the buckets on either side of ``b``.

        A node whose latencies are scaled by ``exp(nu)`` moves the share above ``b`` by this density
        times ``nu``, so the quantile tests' between-node variance is ``density^2 x tau^2``. The
        secant of ``S`` across the neighbouring bounds (used before) underestimates the density at a
        tail bound two to three-fold in variance on vLLM's TTFT buckets (lognormal sigma 0.6: 0.028
        against 0.046 at the p99 bound 1.0 s, 0.51 against 0.67 at the median), which under-widened
        the p50/p90/p99 tests: with a 3% node spread their z had sd 1.12-1.22 instead of 1 (A/A
        false rollbacks 1.4%, bench "A/A, node spread 3%"). The averaged log-log slopes read 0.050
        and 0.67 there (lognormal: 0.046, 0.665). Falls back to the secant when a side is empty."""
        b, s = self.bounds, self.surv
        js = s[j]
        slopes = []
        if j > 0 and s[j - 1] > 0 and js > 0:
            slopes.append(math.log(s[j - 1] / js) / math.log(b[j] / b[j - 1]))
        if j + 1 < b.size and s[j + 1] > 0 and js > 0:
            slopes.append(math.log(js / s[j + 1]) / math.log(b[j + 1] / b[j]))
        if slopes:
            return float(js * max(0.0, sum(slopes) / len(slopes)))
        lo_j, hi_j = max(j - 1, 0), min(j + 1, b.size - 1)
        dlog = math.log(b[hi_j] / b[lo_j]) if hi_j > lo_j else 1.0
        return abs(float(s[lo_j] - s[hi_j])) / dlog

    def _quantile_mapping(self, j: int, q: float, pc: float) -> Callable[[float], float]:
        """Map the canary's share above bound ``j`` to the change of its quantile ``q``: a function
        ``share -> q_canary / q_baseline - 1`` (the test's effect) with ``.interval(lo, hi, c)``, the
        interval's ends for the share interval ``[lo, hi]`` at ``c``. Raises NotApplicable when neither
        bucket next to the bound has baseline requests on both its sides (no slope to read by).

        Model: binormal tails (the two-parameter model of ROC analysis, Dorfman & Alf 1969, J. Math.
        Psychol. 6; Metz 1978, Semin. Nucl. Med. 8): ``Phi^-1(S_canary(x)) = a + beta Phi^-1(S_base(x))``
        near the quantile, with ``Phi^-1(S_base)`` linear in log latency (exact for a lognormal, and
        for a lognormal scaled, spread or stretched above a point). ``beta`` comes from the canary's
        and the baseline's shares above this bound and above a reference bound nearer the median
        (the bound of quantile ``1 - sqrt(1 - q)``: p90's for p99, ~p68's for p90), clamped to
        ``BETA_RANGE``; 1 (a uniform scale) for ``q <= 0.5`` or without a usable reference bound. The
        baseline's probit slope per unit log latency is its secant over the bucket below ``j``
        (hundreds of baseline requests there; the bucket above has a handful). The interval adds, on
        each end, ``c`` times the sd that the reference share's sampling error gives the log
        quantile ratio through ``beta`` (delta method at that end; it grows with the distance from
        the canary's share at the end to the quantile's level).

        Why not the baseline's survival read at the canary's share (the mapping before): that is
        the change of the quantile at the canary's level, not at ``q``, and the log-log interpolation
        it used across vLLM's 1.0-2.5 s bucket is far from a lognormal's. A tail stretched so that
        p99 is +30% (bench "tail") moves the share above 1.0 s to 2.2%, which it read as +21%, inside
        the +25% allowed: 10% of such canaries were PROMOTED. This mapping reads +28% on the same
        shares (+30% with the exact lognormal survival); with ``beta``'s sampling error in the
        interval, 1 of 80 was promoted (bench/README.md).
        """
        from gpuobs.canary.stats import tail_threshold

        def share(x: np.ndarray, jj: int) -> float:
            return float(x[:, jj + 1:].sum()) / max(float(x.sum()), 1e-300)

        def probit(p: float) -> float:
            return float(norm.isf(min(max(p, 1e-12), 1.0 - 1e-12)))

        zb = probit(share(self.cb, j))
        z_q = probit(1.0 - q)
        b = float(self.bounds[j])
        slope = math.nan
        if j > 0:
            zb_lo = probit(share(self.cb, j - 1))
            if zb > zb_lo and 0 < share(self.cb, j - 1) < 1:
                slope = (zb - zb_lo) / math.log(b / float(self.bounds[j - 1]))
        if not math.isfinite(slope) and j + 1 < self.bounds.size and share(self.cb, j + 1) > 0:
            zb_hi = probit(share(self.cb, j + 1))
            if zb_hi > zb:
                slope = (zb_hi - zb) / math.log(float(self.bounds[j + 1]) / b)
        if not math.isfinite(slope):
            # neither neighbouring bucket holds baseline requests on both sides (e.g. bounds 0.25, 100 s):
            # the share's change cannot be read as a latency change (the old reading clamped it to 0, a
            # vacuous pass)
            raise NotApplicable(f"no baseline requests in the buckets next to the bound {b:g}: the layout "
                                f"cannot turn a share change there into a latency change")
        ref: tuple[float, float] | None = None  # (canary's probit at the reference bound, baseline's gap)
        if q > 0.5:
            jr = tail_threshold(self.bounds, self.pb, 1.0 - math.sqrt(1.0 - q))
            zb_r = probit(share(self.cb, jr)) if 0 <= jr < j else math.inf
            if zb - zb_r > 0:
                ref = (probit(share(self.cc, jr)), zb - zb_r)

        zc_obs = probit(pc)
        beta = 1.0 if ref is None else min(max((zc_obs - ref[0]) / ref[1], BETA_RANGE[0]), BETA_RANGE[1])
        ln_qb = (z_q - zb) / slope  # log(baseline's quantile / b)

        def qeff(p: float) -> float:
            ln_qc = (z_q - probit(p)) / (beta * slope)
            return math.expm1(min(ln_qc - ln_qb, 700.0))

        def beta_width(p: float, c: float) -> float:
            """c x sd of log(quantile ratio) at the share ``p`` from the reference share's sampling error
            (through beta; delta method, at ``p``)."""
            if ref is None or not BETA_RANGE[0] < beta < BETA_RANGE[1]:
                return 0.0
            pr = share(self.cc, jr)
            sd_r = math.sqrt(pr * (1 - pr) / self.Ec) / max(float(norm.pdf(ref[0])), 1e-300)
            return c * abs(z_q - probit(p)) / (beta * beta * ref[1] * slope) * sd_r

        def interval(lo: float, hi: float, c: float) -> tuple[float, float]:
            a, b_ = math.log1p(qeff(lo)), math.log1p(qeff(hi))
            return math.expm1(a - beta_width(lo, c)), math.expm1(min(b_ + beta_width(hi, c), 700.0))

        qeff.beta = beta  # type: ignore[attr-defined]  # for diagnostics
        qeff.interval = interval  # type: ignore[attr-defined]
        return qeff

    def _quantile(self, name: str, q: float) -> dict[str, Any]:
        from gpuobs.canary.stats import tail_threshold

        j = tail_threshold(self.bounds, self.pb, q)
        if j < 0:
            raise NoData(f"no bucket bound inside the baseline's distribution near its {name}")
        b = float(self.bounds[j])
        above = float(self.pb[j + 1:].sum() / max(float(self.pb.sum()), 1e-300))
        if abs(float(norm.isf(above)) - float(norm.isf(1.0 - q))) > QUANTILE_BOUND_PROBIT:
            raise NotApplicable(f"no bucket bound near the baseline's {name}: the nearest, {b:g}, has {above:.1%} "
                                f"of requests above it, not {(1.0 - q) * 100:g}% (the layout cannot resolve this quantile)")
        xb_u = self.cb[:, j + 1:].sum(-1)
        xc = float(self.cc[:, j + 1:].sum())
        p0 = float(xb_u.sum() / self.Nb)
        pc = xc / self.Nc
        v_c0 = p0 * (1 - p0) / self.Ec
        v_b = p0 * (1 - p0) / self.Eb
        # a node shifted by nu on the log scale moves the share above b by the density of log latency
        # at b times nu (see _density_at)
        slope = self._density_at(j)
        loc = self.location_stat()
        tau2 = (slope ** 2) * loc.tau2  # a node shifted by nu moves the share above b by slope * nu
        var = v_c0 + v_b + tau2 * self.g
        df = var * var / ((tau2 * self.g) ** 2 / loc.tau2_df) if tau2 > 0 and math.isfinite(loc.tau2_df) else math.inf
        cl = Clustered(pc - p0, math.sqrt(var), df, tau2, loc.tau2_source, 1.0 / var, loc.tau2_df, loc.node_df)
        z_exact = exceedance_z(xc * self.Ec / self.Nc, self.Ec, p0)
        z = z_exact * math.sqrt(v_c0) / cl.se if cl.se > 0 else z_exact

        qeff = self._quantile_mapping(j, q, pc)

        def interval(c: float) -> tuple[float, float]:
            # score-type: the lower end with the null variance (the test's), the upper end with the
            # larger of the observed and null shares (never narrower than the test's own variance)
            pm = max(pc, p0)
            se_up = math.sqrt(pm * (1 - pm) / self.Ec + v_b + cl.tau2 * self.g)
            return qeff.interval(pc - c * cl.se, pc + c * se_up, c)

        def need(c1: float, allowed: float) -> float:
            if b / (1 + allowed) < self.bounds[0]:  # below the layout's resolution: no prediction
                return math.nan
            margin = self._share_above(b / (1 + allowed)) - p0
            return self._needed(c1 * c1 * p0 * (1 - p0) * (1 + self.r), margin, c1 * c1 * cl.tau2 * self.g)

        return {"stat": cl, "n": self.Nc, "z": z, "effect": qeff(pc), "interval": interval, "need": need,
                "what": f"share of requests above the baseline's {name} bucket bound {b:g}",
                "extra": {"threshold": b, "share_canary": pc, "share_baseline": p0}}
