"""Tests on bucketed latency histograms, one look at a time: location, spread, tail, quantiles
(pure numpy/scipy; no backend, no config object).

:class:`HistContext` holds one look's per-node bucket counts of the canary and the baseline on their
common bucket bounds and runs the tests of docs/canary.md (1a-1e) on them. :mod:`gpuobs.canary.analyzer`
queries the counts, gives each test its alpha and group-sequential boundary, and decides; this module
only estimates.

Shapes and units: counts ``(units, B+1)`` per side, a unit being a serving node (the analyzer's
``config.node_label``), the last axis the buckets of the ``B`` common finite bounds in ``le`` order
(seconds) then ``+Inf``; ``x`` ``(B+1,)`` the buckets' log centres (:func:`~gpuobs.canary.stats.bin_log_centres`);
requests and effective sample sizes per unit ``(units,)`` (``increase()`` extrapolation and
clustering removed from the latter); node effects on the log scale (a node's latencies scaled by
``exp(nu)``, spread ``tau``). Effects and intervals are on the user's scale: ratio - 1.

The tests, each at its share of the metric's alpha (:meth:`HistContext.test`):

* **location**: mean log latency (the geometric mean's change), the between-node variance estimated
  from the baseline's nodes (DerSimonian-Laird, :func:`~gpuobs.canary.stats.clustered`) and pooled
  with the configured node spread; that tau^2 serves the other tests through each one's slope.
* **spread**: the within-node standard deviation of log latency (ratio of the canary's to the
  baseline's), its variance from the baseline's kurtosis.
* **pNN quantiles**: the share of canary requests above the baseline's pNN bucket bound, exact
  binomial tail (:func:`~gpuobs.canary.stats.exceedance_z`), read as the quantile's change through
  binormal tails (Dorfman & Alf 1969; Metz 1978; :meth:`HistContext._quantile_mapping`).
* **tail**: a grouped two-sample log-rank (Savage 1956; Prentice & Gloeckler 1978) test on the
  requests above the baseline's p90 bound, every bucket scored from the pooled sample, its null
  exact by FFT convolution (:func:`score_sum_z`), reported as the p99 change it implies
  (:meth:`HistContext._tail`).

Also: :func:`node_spread_assumption` (the node-spread assumption in words, when it carries weight) and
:func:`errors_needed` (the canary requests an error-ratio metric needs to pass, for the analyzer's
outlook, as the tests' ``need`` is for the histogram metrics).

Errors: :class:`NoData` (no usable data for a test or metric) and :class:`NotApplicable` (a layout
that cannot support a test); the analyzer turns them into the test's NoData / ``n/a``.
"""

from __future__ import annotations

import functools
import math
from math import log1p
from typing import Any, Callable

import numpy as np
from scipy.stats import norm

from gpuobs.canary.config import quantile_of
from gpuobs.canary.sequential import binomial_upper_bound
from gpuobs.canary.stats import (CANARY_VARIANCE_PRIOR, Clustered, clustered, exceedance_z, tail_threshold,
                                 unit_moments)

# the tail test (``HistContext._tail``) compares the requests above the baseline's bound nearest its p90
TAIL_FROM = 0.9
TAIL_REPORT_Q = 0.99  # the tail test reports (and passes on) the change of this quantile it implies
SCORE_GRID_CELLS = 64  # grid cells per score range in the tail test's exact null (score_sum_z)
# A quantile test is n/a when its nearest bucket bound is further than this from the quantile in
# probit units of the baseline's share (1.0: the share above the bound is 16-84% for p50, 0.04-9% for
# p99; a lognormal's latency at the bound is within a factor exp(sigma) of the quantile). Further out
# the test measures another quantile: with buckets 0.1, 0.5, 2.5, 10 s the p99 test sat on the p90
# test's bound (0.5 s, 12% above) and the p50 test on 0.1 s (94% above), whose change says little
# about the median's. The location test still covers such a layout.
QUANTILE_BOUND_PROBIT = 1.0
# the quantile tests' tail-shape factor (binormal slope, ``_quantile_mapping``) is clamped to this range
BETA_RANGE = (0.5, 2.0)


class NoData(Exception):
    """A metric, or one of its histogram tests, has no usable data; the message becomes its NoData
    reason (raised here and by :mod:`gpuobs.canary.analyzer`, which reports it, never raises it on)."""


class NotApplicable(NoData):
    """A histogram test that the bucket layout cannot support (the tail test when every request
    above the p90 bound falls in one bucket). The analyzer reports the test as ``n/a`` and leaves it out
    of the metric's verdict, its alpha unspent: a layout cannot make a metric unpassable."""


def _expm1(v: float) -> float:
    """``exp(v) - 1`` that saturates instead of overflowing (a Student-t boundary with ~1 degree of
    freedom, from two baseline nodes, can be astronomically wide)."""
    return math.expm1(min(v, 700.0))


# the prior's share of the node-spread estimate above which a look reports the assumption
PRIOR_NOTE_WEIGHT = 0.25
# Baseline nodes with history (node_history) from which the between-node spread is the data's alone
# (DerSimonian-Laird with a Satterthwaite Student-t boundary, no node_spread prior): with 19 such
# nodes the prior's 4 df carried about a quarter of the weight and cost about 4 points of +10% power
# at looks 10 and 20, while the data-only estimate holds the test's size for real spreads of 0-5%
# (issue 26; bench/README.md). Below this the assumption stays (a dev stack's 2 nodes: 1 df).
DATA_DECIDES_NODES = 10
# The within-node design is taken for a canary node whose pre-stage offset is atypical only when the
# offset is also this many of its own sampling sd from 0 (HistContext._within_node). The offset is
# part of the within-node statistic: choosing that design because the offset read large chose it when
# the offset's sampling error was large, and the error then entered the test with that sign (a 100-300
# request pre-stage period, no node spread: within-node looks had a location z sd of 2.2, and 0.33% of
# all looks crossed z = 3, 2.5x its level). At 4 sd a pre-stage reading that is noise alone picks the
# design about once in 16,000 looks.
OFFSET_OWN_Z = 4.0


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


def node_spread_assumption(ctx: "HistContext", unit: str, spread: float, prior_df: float, kb: int,
                           kc: int) -> tuple[str, str]:
    """The node-spread assumption when it carries weight (few nodes), else ``("", "")``.

    Returns ``(assumption, note)``: the assumption in words that do not depend on the metric (the
    nodes, degrees of freedom and the prior's weight; said once per verdict,
    :func:`gpuobs.canary.verdict.assumptions`), and the metric's own note, the node sd it used
    (relative, e.g. ``node sd 2.7% used``). ``spread``: the configured node_spread (relative sd);
    ``prior_df``: its degrees of freedom; ``kb``/``kc``: baseline/canary units."""
    try:
        loc = ctx.location_stat()
    except (ValueError, ZeroDivisionError, FloatingPointError):
        return "", ""
    d = loc.node_df
    if ctx.design == "within-node":
        drift, drift_df = ctx.drift
        weight = 1.0 if d == 0 or math.isinf(drift_df) else drift_df / (drift_df + d)
        if weight < PRIOR_NOTE_WEIGHT:
            return "", ""
        src = (f"the {unit}s' own change between the pre-stage period and the stage cannot be estimated from "
               f"{kb} baseline and {kc} canary {unit}(s); assuming the configured node_drift {drift:.1%}"
               if d == 0 else
               f"the {unit}s' drift between the pre-stage period and the stage from {kb} baseline and {kc} canary "
               f"{unit}(s) ({d} df) pooled with the assumed node_drift {drift:.1%} ({drift_df:g} df, "
               f"{weight:.0%} of the weight)")
        return (f"{src}; a canary {unit} whose speed changed by more than that for reasons of its own can be "
                f"rolled back", f"node term sd {math.expm1(math.sqrt(loc.tau2 * ctx.g)):.1%} after removing "
                f"the canary's own offset (the node_drift assumption carries {weight:.0%} of the weight)")
    weight = 1.0 if d == 0 or math.isinf(prior_df) else prior_df / (prior_df + d)
    if weight < PRIOR_NOTE_WEIGHT:
        return "", ""
    used = math.expm1(math.sqrt(loc.tau2))
    if d == 0:
        src = (f"{kb} baseline and {kc} canary {unit}(s) cannot estimate node-to-node variation; assuming the "
               f"configured node_spread {spread:.1%}")
    else:
        src = (f"node-to-node variation from {kb} baseline and {kc} canary {unit}(s) ({d} df) pooled with the "
               f"assumed node_spread {spread:.1%} ({prior_df:g} df, {weight:.0%} of the weight)")
    return (f"{src}; a canary {unit} that differs from the baseline by more than the assumed spread can be "
            f"rolled back (more baseline {unit}s let the data decide)",
            f"node sd {used:.1%} used (the node_spread assumption carries {weight:.0%} of the weight)")


def score_upper(p: float, n: float, extra_var: float, c: float) -> float:
    """Upper end of the score (Wilson 1927, JASA 22) interval for a share ``p`` observed on ``n``
    (effective) requests, with ``extra_var`` added to the binomial variance (the baseline's share and
    the node term): the root ``u >= p`` of ``(u - p)^2 = c^2 (u (1 - u) / n + extra_var)``. The Wald
    end ``p + c sqrt(p (1 - p) / n)`` takes the variance at the observed share, so when a handful of
    requests lies above a bound and the count comes out low it is too short: at ~13 of 1,200 requests
    above the p99 bound and c = 2.33, Wald says 1.78%, the score bound 2.03%; a tail stretched to
    p99 +25% (share 2.07%) was PROMOTED 3% of the time instead of the 1% the pass side allows
    (bench/README.md, issue 26). Shape: floats in, float out (a share, at most 1)."""
    if not (n > 0 and c > 0):
        return 1.0
    a = c * c / n
    b = 2.0 * p + a
    disc = b * b - 4.0 * (1.0 + a) * (p * p - c * c * max(extra_var, 0.0))
    return min(1.0, (b + math.sqrt(max(disc, 0.0))) / (2.0 * (1.0 + a)))


def errors_needed(p_b: float, allowed: float, alpha: float) -> float:
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


class HistContext:
    """The per-node bucket counts of one look and the tests on them (see docs/canary.md).

    ``cc``/``cb``: counts ``(units, B+1)`` on the common ``bounds``; ``nc``/``nb``: requests per unit;
    ``ec``/``eb``: effective sample sizes per unit (``increase()`` extrapolation and clustering
    removed); ``tau_loc``: the prior node spread on the log scale, used with < 2 baseline units;
    ``history``: the baseline nodes over node_history (:meth:`gpuobs.canary.analyzer.Analyzer._node_history`);
    ``pre``: pre-stage counts per unit for the within-node design and ``drift``: ``(node_drift, node_drift_df)``
    from the config (:meth:`_within_node`; without both the design is between nodes). ``within_only``:
    the between-node comparison is not valid (the baseline nodes are another GPU model, whose latency
    differs by design: a driver upgrade's model with no node left on the old driver): the within-node
    design is taken whenever it can be, and every test raises :class:`NoData` when it cannot.
    Each test returns a dict: ``stat`` (:class:`Clustered`), ``n`` (canary requests), ``effect``
    (user scale), ``interval(c)`` (user-scale interval at boundary c), optional ``z``, ``what``,
    ``needed(c1)`` inputs, ``extra`` (descriptive fields).
    """

    def __init__(self, bounds, x, cc, cb, nc, nb, ec, eb, tau_loc, prior_df, history=None, pre=None, drift=None,
                 within_only: bool = False):
        self.bounds, self.x, self.cc, self.cb, self.nc, self.nb, self.ec, self.eb = bounds, x, cc, cb, nc, nb, ec, eb
        self.tau_loc, self.prior_df, self.history = tau_loc, prior_df, history
        self.pre, self.drift, self.within_only = pre, drift, within_only
        # the canary's node offset removed from every test's statistic (within-node design; 0 between
        # nodes) and why the design is what it is (location_stat)
        self.offset, self.design, self.design_note = 0.0, "between-node", ""
        self.within: dict[str, Any] | None = None
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
        if self.within_only:
            self.location_stat()  # NoData when the within-node design cannot be used
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
            if self.history is not None:  # the baseline's nodes over node_history (analyzer.Analyzer._node_history)
                base_group = (self.history[0], self.history[1])
            else:
                base_group = (self.mb_u[okb], self.s2b / self.eb[okb])
            groups = [base_group, (self.mc_u[okc], s2c / self.ec[okc])]
            # many baseline nodes with history measure the spread themselves: the node_spread assumption
            # is for small baselines (module constant DATA_DECIDES_NODES)
            prior_df = 0.0 if self.history is not None and len(self.history[0]) >= DATA_DECIDES_NODES else self.prior_df
            between = clustered(mean_c - mean_b, v_req, self.wc, self.wb, groups, self.tau_loc ** 2, prior_df,
                                label="nodes" if self.history is None else "nodes with history")
            within = self._within_node(between, v_req, s2c)
            if within is None and self.within_only:
                raise NoData("the within-node design is required (the baseline nodes are another GPU model) "
                             f"and cannot be used: {self.design_note}")
            self._loc = within or between
        return self._loc

    def _within_node(self, between: Clustered, v_req: float, s2c: float) -> Clustered | None:
        """The location comparison with each canary node compared with itself (a difference in
        differences), or None when the between-node one is kept; sets ``self.within`` for the other
        tests (:meth:`_pre_difference`).

        ``self.pre``: ``(canary nodes' pre-stage bucket counts (kc, B+1), the baseline nodes' (kb, B+1),
        effective requests per request)`` on the look's bounds, zeros for a node without pre-stage data
        (the analyzer reads them over ``pre_stage`` before the stage under the baseline's selector:
        :meth:`gpuobs.canary.analyzer.Analyzer._pre_stage`). Model: node ``u``'s log latency is
        ``mu_period + nu_u + delta_u,period + release effect``. Each test's statistic is compared as
        ``(canary - baseline during the stage) - (the same canary and baseline nodes before it)``, the
        nodes weighted by their request shares in the stage: the node offsets ``nu`` cancel (and
        fleet-wide drift ``mu``), and the node variance is the pre-stage statistics' sampling
        variance plus the drift of the offsets between the periods, ``tau_d^2 g``, in place of the
        between-node ``tau^2 g`` that no traffic removes. Nodes without pre-stage data keep their
        ``tau^2`` share. ``tau_d^2``: DerSimonian-Laird on the nodes' own changes of mean log latency
        (stage minus pre-stage; baseline nodes and, with several, canary nodes, each around its
        group's mean), pooled with the configured ``node_drift`` prior as :func:`clustered` pools the
        spread: the assumption is checked every look by the baseline nodes' changes, and offsets that
        moved widen the comparison. Source: the difference-in-differences design (Angrist & Pischke,
        "Mostly Harmless Econometrics", 2009, ch. 5); the pre-period as the covariate of CUPED (Deng,
        Xu, Kohavi & Walker, "Improving the sensitivity of online controlled experiments by utilizing
        pre-experiment data", WSDM 2013) at coefficient 1.

        Why each test's own pre-stage statistic and not one offset through each test's slope: the
        slope of a share above a tail bound rests on the few baseline requests in the bucket above
        it; multiplied by a real offset its noise became bias (in place, 5% node spread: in some runs
        the p99 bound's slope read 4x the lognormal's, and a +12% node's expected share 3.4% instead of 1.6%).

        The between-node comparison is kept when it is narrower and the canary's own pre-stage offset
        is one the between-node spread covers (within 2 sd of it) or its own sampling error could
        explain (within ``OFFSET_OWN_Z`` = 4 of its sd): that design assumes the canary's node is
        typical, which its pre-stage period can contradict (a canary node 6% slower than the fleet, no
        spread otherwise: picking by the smaller variance alone gave the location z a mean of +0.4
        and an sd of 1.3). The offset is independent of the release's effect but is part of the
        within-node statistic, so choosing that design because the offset read large must not be
        choosing it because its sampling error did (see ``OFFSET_OWN_Z``); a pre-stage period too
        short to show an offset clearly leaves the between-node comparison, as without one. The returned :class:`Clustered`'s ``tau2`` is
        the location's node variance divided by ``g``, ``tau2_df`` its Satterthwaite degrees of freedom."""
        if self.pre is None or self.drift is None:
            return None
        pc_cnt, pb_cnt, per_obs = self.pre
        pc_cnt, pb_cnt = np.asarray(pc_cnt, dtype=float), np.asarray(pb_cnt, dtype=float)
        npc, mcp, sscp = unit_moments(pc_cnt, self.x)
        npb, mbp, ssbp = unit_moments(pb_cnt, self.x)
        # a node's pre-stage moments must be finite (counts of ~1e308 overflow them)
        hc = (npc >= 2) & (self.nc > 0) & np.isfinite(mcp) & np.isfinite(sscp)
        hb = (npb >= 2) & (self.nb >= 2) & np.isfinite(mbp) & np.isfinite(ssbp)
        if not hc.any():
            self.design_note = "no canary node has pre-stage data under the baseline (a new pod or node)"
            return None
        if not hb.any():
            self.design_note = "no baseline node has pre-stage data"
            return None
        k_pre = int(hc.sum() + hb.sum())
        s2p = float((sscp[hc].sum() + ssbp[hb].sum()) / max(npc[hc].sum() + npb[hb].sum() - k_pre, 1.0))
        ecp, ebp = npc * per_obs, npb * per_obs  # effective pre-stage requests per node
        wcp = np.where(hc, self.wc, 0.0)
        wcp = wcp / wcp.sum()
        wbp = np.where(hb, self.wb, 0.0)
        wbp = wbp / wbp.sum()
        g_resid = float(((self.wc - wcp) ** 2).sum() + ((self.wb - wbp) ** 2).sum())
        resid = between.tau2 * g_resid  # nodes without pre-stage data keep their between-node share
        offset = float((wcp * np.nan_to_num(mcp)).sum() - (wbp * np.nan_to_num(mbp)).sum())
        var_pre = float(s2p * ((wcp[hc] ** 2 / ecp[hc]).sum() + (wbp[hb] ** 2 / ebp[hb]).sum()))
        okb, okc = hb & (self.nb >= 2), hc & (self.nc >= 2)
        groups = [(self.mb_u[okb] - mbp[okb], self.s2b / self.eb[okb] + s2p / ebp[okb]),
                  (self.mc_u[okc] - mcp[okc], s2c / self.ec[okc] + s2p / ecp[okc])]
        tau_d, drift_df = self.drift
        d = clustered(between.effect - offset, v_req + var_pre + resid, self.wc[hc], self.wb[hb], groups,
                      log1p(tau_d) ** 2, drift_df, label="the nodes' own changes")
        g_d = float((self.wc[hc] ** 2).sum() + (self.wb[hb] ** 2).sum())
        drift = d.tau2 * g_d
        node_var = var_pre + resid + drift
        between_var = between.tau2 * self.g
        atypical = abs(offset) >= max(2.0 * math.sqrt(between_var + var_pre), OFFSET_OWN_Z * math.sqrt(var_pre))
        if not node_var < between_var and not atypical and not self.within_only:
            self.design_note = (f"the within-node term (sd {math.expm1(math.sqrt(node_var)):.1%}: pre-stage "
                                f"sampling and drift sd {math.expm1(math.sqrt(d.tau2)):.1%}) is no narrower than "
                                f"the between-node one (sd {math.expm1(math.sqrt(between_var)):.1%}), and the "
                                f"canary's own offset ({math.expm1(offset):+.1%}) is within it")
            return None
        tau2_df = self._node_df(node_var, drift, d.tau2_df)
        self.within = {"hc": hc, "hb": hb, "wcp": wcp, "wbp": wbp, "cc": pc_cnt, "cb": pb_cnt, "ec": ecp,
                       "eb": ebp, "s2": s2p, "resid": resid, "drift": drift, "drift_df": d.tau2_df}
        self.offset, self.design = offset, "within-node"
        self.design_note = (f"{int(hc.sum())} of {int((self.nc > 0).sum())} canary and {int(hb.sum())} of "
                            f"{int((self.nb > 0).sum())} baseline node(s) compared with their own pre-stage period")
        return Clustered(d.effect, d.se, d.df, node_var / self.g if self.g > 0 else 0.0,
                         f"within-node: drift from {d.tau2_source}", d.info, tau2_df, d.node_df)

    @staticmethod
    def _node_df(total: float, random: float, random_df: float) -> float:
        """Satterthwaite degrees of freedom of a node variance ``total`` of which ``random`` is
        estimated on ``random_df`` degrees of freedom (the rest known)."""
        return total * total / (random * random / random_df) if random > 0 and math.isfinite(random_df) else math.inf

    def _pre_difference(self, stat: Callable[[np.ndarray], tuple[float, float]]) -> tuple[float, float]:
        """Within-node design: a test's statistic on the canary nodes' pre-stage counts minus the same on
        the baseline nodes', each side the stage-weighted mean over its nodes with pre-stage data, and
        that difference's sampling variance. ``stat(counts (B+1,)) -> (value, variance at one effective
        request)``; a node's variance is that over its effective pre-stage requests."""
        w = self.within
        out, var = 0.0, 0.0
        for sign, cnt, has, wt, eff in ((1.0, w["cc"], w["hc"], w["wcp"], w["ec"]),
                                        (-1.0, w["cb"], w["hb"], w["wbp"], w["eb"])):
            for i in np.nonzero(has)[0]:
                value, unit_var = stat(cnt[i])
                out += sign * wt[i] * value
                var += wt[i] ** 2 * unit_var / eff[i]
        return out, var

    def _within_var(self, slope2: float, pre_var: float) -> tuple[float, float]:
        """A test's node variance in the within-node design, ``(variance, Satterthwaite df)``: its
        pre-stage difference's sampling variance plus ``slope2`` (its statistic's squared
        sensitivity to a node's log-latency offset) times the drift and the nodes without pre-stage data."""
        w = self.within
        total = pre_var + slope2 * (w["resid"] + w["drift"])
        return total, self._node_df(total, slope2 * w["drift"], w["drift_df"])

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
        self.location_stat()
        if self.within is not None:
            # within-node design: the canary nodes' own pre-stage spread, less the baseline's (bucketing
            # makes a node's binned spread depend on its speed: a canary node 6% slower gave z +0.37)
            def half_log_var(c: np.ndarray) -> tuple[float, float]:
                n_u, m_u, ss_u = unit_moments(c[None, :], self.x)
                v_u = float(ss_u[0] / max(n_u[0] - 1.0, 1.0))
                return (0.5 * math.log(v_u) if v_u > 0 else 0.0), (kappa - 1) / 4

            delta, pre_var = self._pre_difference(half_log_var)
            e, v_req = e - delta, v_req + pre_var
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
        above it the pooled sample's (canary and baseline together) conditional survival ``S_lo``/``S_hi``
        at each bucket's lower/upper bound gives the bucket's score ``-(S_lo ln S_lo - S_hi ln S_hi) /
        (S_lo - S_hi)``: the score of a Lehmann (proportional hazards) alternative ``S_canary =
        S_base^theta`` in grouped data at ``theta = 1``, mean 0 over the pooled sample, variance ``V``
        (Savage 1956, "Contributions to the theory of rank order statistics: the two-sample case", Ann.
        Math. Stat. 27; for grouped data Prentice & Gloeckler 1978, Biometrics 34; the pooled sample's
        scores make it the two-sample log-rank test, Peto & Peto 1972, JRSS A 135). It is the locally
        most powerful rank test for a tail that got heavier, and it uses only the shares at the bounds,
        no density or distribution family. Its estimate is the one-step log "stretch" ``e = (mean canary
        score - mean baseline score) / V`` (``theta = exp(-e)``), variance ``(1/m_c + 1/m_b) / V``
        (``m`` the effective requests above ``b``). ``effect`` and the interval are reported as the
        change of the p99 that ``theta`` implies (``TAIL_REPORT_Q``; the baseline's survival log-log
        interpolated), so the interval reads like the pNN tests' (on vLLM's TTFT buckets a tail hazard
        ratio of 1.25 is p99 +15%, +25% is a ratio of 1.42). It is a harm-only test
        (``analyzer.HARM_ONLY_TESTS``): it rolls back, and PROMOTE leaves the p99 bound to the p99 test.

        Why, besides the pNN tests: a regression that stretches only the tail (bench shape "tail:
        p99 +30%, median unchanged") changes the share above the p99 bound from 1.0% to 2.2%, a
        handful of requests at canary traffic, while it moves every request above p90 (12% of
        them). Fixed sample of 1,140 canary requests, vLLM's TTFT buckets, one look at alpha 0.27%
        (bench/canary_oracle.py): the p99 exceedance test catches 72%, this test 86%, the
        Neyman-Pearson oracle that knows the alternative exactly 88%. Conditioning on the count
        above ``b`` keeps the test about the shape: a uniform slowdown is the location test's.

        Every bucket keeps its own score, the top ones included. On vLLM's TTFT buckets a p99 +30%
        tail moves the share in 2.5-5 s from 0.006% to 0.1% (1.2 canary requests at look 20 against
        0.07 when healthy), where most of the evidence is; pooling the buckets above 1 s (an earlier
        design, scores from the baseline's shares alone, where a bucket with one baseline request in
        an hour had no usable share) lowered the test's noncentrality at 1,200 canary requests from
        4.55 to 4.07 (the likelihood ratio's: 4.82). The null reads the pooled sample, so a bucket
        only the canary reached is scored from the canary's own requests (at most ``ln M``, ``M``
        the pooled requests above ``b``): one canary request far out is one draw of ``M`` in the
        permutation null, not a verdict. The z is exact, not normal: the canary's score sum has few
        large values (at 1,140 canary requests the normal approximation rejected at 0.44% for a 0.27%
        boundary, 2.5x), so its upper tail (mid-p) is computed from the distribution of a sum of
        ``m`` independent draws from the pooled sample (:func:`score_sum_z`; with replacement, its
        variance divided by the permutation's finite-population factor ``1 - m/M``) and widened by
        the nodes' variance as the pNN tests' z is.

        Node heterogeneity: a node scaled by ``exp(nu)`` moves the mean score by ``slope x nu``
        (slope from the baseline's survival, log-log interpolated between bounds and shifted by
        +-5%), so the between-node variance is ``slope^2 tau^2`` with the location test's tau^2.
        Raises NoData when the baseline has no bound near its p90 or the canary has no request
        above ``b``; NotApplicable when every request above ``b`` falls in one bucket (a coarse
        layout such as 0.1, 0.5, 2.5, 10 s with nothing above 2.5 s: bench "A/A, coarse buckets",
        where a NoData here held every healthy canary to the deadline)."""
        j = tail_threshold(self.bounds, self.pb, TAIL_FROM)
        if j < 0:
            raise NoData("no bucket bound inside the baseline's distribution near its p90")
        b = float(self.bounds[j])
        pb_t = self.pb[j + 1:]
        mb = float(pb_t.sum())
        xc = self.cc[:, j + 1:].sum(0)
        m = float(xc.sum())
        if not m > 0:
            raise NoData(f"no canary request above the baseline's p90 bound {b:g}")
        # the pooled sample's (canary + baseline) shares above b: the log-rank's scores and its null
        pooled = pb_t + xc
        scores, v = _savage_scores(pooled)
        if not v > 0:
            raise NotApplicable(f"the requests above {b:g} fall in one bucket (the layout cannot resolve "
                                f"the tail's shape)")
        mc_eff, mb_eff = m * self.Ec / self.Nc, mb * self.Eb / self.Nb
        mean_c = float((xc * scores).sum() / m)
        mean_b = float((pb_t * scores).sum() / mb)  # mb > 0: tail_threshold's bound has requests above it
        e_raw = (mean_c - mean_b) / v
        v_req = 1.0 / (mc_eff * v) + 1.0 / (mb_eff * v)
        slope = self._tail_slope(j, scores) / v
        loc = self.location_stat()
        p_tail = mb / self.Nb
        if self.within is not None:
            # within-node design: the canary nodes' own pre-stage mean score above b, less the baseline's
            def mean_score(c: np.ndarray) -> tuple[float, float]:
                above = c[j + 1:]
                m_pre = float(above.sum())
                return (float((above * scores).sum()) / m_pre / v if m_pre > 0 else 0.0), 1.0 / (p_tail * v)

            delta, pre_var = self._pre_difference(mean_score)
            node_var, node_df = self._within_var(slope * slope, pre_var)
        else:
            delta, node_var, node_df = 0.0, slope * slope * loc.tau2 * self.g, loc.tau2_df
        e = e_raw - delta
        var = v_req + node_var
        df = var * var / (node_var ** 2 / node_df) if node_var > 0 and math.isfinite(node_df) else math.inf
        cl = Clustered(e, math.sqrt(var), df, node_var / self.g if self.g > 0 else 0.0, loc.tau2_source, 1.0 / var,
                       node_df, loc.node_df)
        # the canary's score sum is skewed (few, large scores at the top): its z is read from the exact
        # distribution of a sum of mc_eff draws from the pooled sample (the permutation null, drawn with
        # replacement: its variance m V is the permutation's m V (1 - m/M) times 1 / (1 - m/M), removed),
        # then widened by the nodes' variance like the quantile tests' z
        pi = pooled / pooled.sum()
        fpc = max(1.0 - m / float(pooled.sum()), 1e-6)
        z_req = score_sum_z(scores, pi, xc, mc_eff) / math.sqrt(fpc) - delta / math.sqrt(v_req)
        z = z_req * math.sqrt(v_req) / cl.se if cl.se > 0 else z_req
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
        p_base = float(xb_u.sum() / self.Nb)
        pc = xc / self.Nc
        # a node shifted by nu on the log scale moves the share above b by the density of log latency
        # at b times nu (see _density_at)
        slope = self._density_at(j)
        loc = self.location_stat()
        if self.within is not None:
            # within-node design: the share the canary's own nodes showed before the stage, moved by the
            # baseline's change since
            def share(c: np.ndarray) -> tuple[float, float]:
                n = float(c.sum())
                return (float(c[j + 1:].sum()) / n if n > 0 else p_base), p_base * (1 - p_base)

            delta, pre_var = self._pre_difference(share)
            node_var, node_df = self._within_var(slope ** 2, pre_var)
        else:  # a node shifted by nu moves the share above b by slope * nu
            delta, node_var, node_df = 0.0, slope ** 2 * loc.tau2 * self.g, loc.tau2_df
        p0 = min(max(p_base + delta, 1e-9), 1.0 - 1e-9)
        v_c0 = p0 * (1 - p0) / self.Ec
        v_b = p_base * (1 - p_base) / self.Eb
        var = v_c0 + v_b + node_var
        df = var * var / (node_var ** 2 / node_df) if node_var > 0 and math.isfinite(node_df) else math.inf
        cl = Clustered(pc - p0, math.sqrt(var), df, node_var / self.g if self.g > 0 else 0.0, loc.tau2_source,
                       1.0 / var, node_df, loc.node_df)
        z_exact = exceedance_z(xc * self.Ec / self.Nc, self.Ec, p0)
        z = z_exact * math.sqrt(v_c0) / cl.se if cl.se > 0 else z_exact

        mapping = self._quantile_mapping(j, q, pc)
        node = 1.0 + mapping(p0) if delta else 1.0  # the canary nodes' own quantile factor (1 between nodes)

        def qeff(p: float) -> float:  # the release's change of the quantile, the node's offset removed
            return (1.0 + mapping(p)) / node - 1.0

        def interval(c: float) -> tuple[float, float]:
            # the lower end with the null variance (the test's); the upper end is the score (Wilson)
            # bound, the share p_u whose own binomial variance puts pc at c sd below it, never
            # narrower than the test's variance (score_upper)
            extra_var = v_b + cl.tau2 * self.g
            hi_share = max(score_upper(pc, self.Ec, extra_var, c), pc + c * math.sqrt(max(p0 * (1 - p0) / self.Ec + extra_var, 0.0)))
            lo, hi = mapping.interval(pc - c * cl.se, hi_share, c)
            return (1.0 + lo) / node - 1.0, (1.0 + hi) / node - 1.0

        def need(c1: float, allowed: float) -> float:
            if b / (1 + allowed) < self.bounds[0]:  # below the layout's resolution: no prediction
                return math.nan
            margin = self._share_above(b / (1 + allowed)) - p_base
            return self._needed(c1 * c1 * p0 * (1 - p0) * (1 + self.r), margin, c1 * c1 * cl.tau2 * self.g)

        extra = {"threshold": b, "share_canary": pc, "share_baseline": p_base}
        if delta:
            extra["share_expected"] = p0
        return {"stat": cl, "n": self.Nc, "z": z, "effect": qeff(pc), "interval": interval, "need": need,
                "what": f"share of requests above the baseline's {name} bucket bound {b:g}", "extra": extra}
