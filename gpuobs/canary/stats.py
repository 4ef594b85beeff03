"""Estimators for canary-versus-baseline comparisons from Prometheus data (pure numpy).

Request-level information comes from histogram buckets: the increase of each ``_bucket`` counter over
the analysis window is the number of requests whose latency fell in that bucket, so a window holds
every request binned at the histogram's resolution, not a handful of per-interval quantile points.

Latency effect (:func:`log_shift`): the difference of the mean log latency of canary and baseline,
each request represented by its bucket's geometric midpoint. ``exp(effect) - 1`` is the relative
change of the geometric-mean latency; under a multiplicative regression (every request ``x (1+d)``,
the usual model of a slower release) it is also the relative change of every quantile, p99 included.
Working on the log scale makes the estimate insensitive to the heavy right tail that dominates an
arithmetic mean of latencies. Under "no difference" canary and baseline bucket counts have the same
distribution, so the estimate is centred on 0 whatever the bucket layout: the false-rollback
guarantee does not depend on bucket resolution. Under a real regression bucketing biases the
estimate slightly; with vLLM's buckets and the simulator's latency model, a true +10% reads +9.7%
(TTFT) and +9.9% (ITL), a true +20% reads +19.3% and +20.8% (2 million requests per group).

Every function is vectorised over leading axes (the benchmark evaluates 1,000 runs at once); the
last axis of a counts array is the bucket axis (finite buckets in ``le`` order, then ``+Inf``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

# Pseudo-observations of the baseline's variance mixed into the canary's (see log_shift).
CANARY_VARIANCE_PRIOR = 10.0

NODATA, INCONCLUSIVE, PASS, HIGH, LOW = 0, 1, 2, 3, 4
CLASS_NAMES = ("NoData", "Inconclusive", "Pass", "High", "Low")


def parse_buckets(pairs: Iterable[tuple[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Prometheus ``(le, cumulative count)`` pairs -> (finite bounds ``(B,)``, per-bucket counts ``(B+1,)``).

    Duplicate ``le`` values (the same bound written ``1`` and ``1.0`` by two exporters) are summed.
    Counts that decrease with ``le`` (possible after ``increase()`` extrapolation) are clipped at 0.
    Raises ValueError when there is no ``+Inf`` bucket, an ``le`` is not a number, or a count is NaN.
    """
    acc: dict[float, float] = {}
    for le, value in pairs:
        try:
            bound = float(le)
        except ValueError:
            raise ValueError(f"bucket bound le={le!r} is not a number") from None
        if math.isnan(value):
            raise ValueError(f"bucket le={le} is NaN")
        acc[bound] = acc.get(bound, 0.0) + float(value)
    if math.inf not in acc:
        raise ValueError("histogram has no le=\"+Inf\" bucket")
    bounds = np.array(sorted(b for b in acc if b != math.inf), dtype=float)
    cumulative = np.array([acc[b] for b in bounds] + [acc[math.inf]], dtype=float)
    return bounds, bin_counts(cumulative)


def bin_counts(cumulative: np.ndarray) -> np.ndarray:
    """Cumulative ``le`` counts ``(..., B+1)`` -> per-bucket counts, negatives clipped to 0."""
    cumulative = np.asarray(cumulative, dtype=float)
    return np.clip(np.diff(cumulative, axis=-1, prepend=0.0), 0.0, None)


def bin_log_centres(bounds: np.ndarray) -> np.ndarray:
    """Log of each bucket's representative value, shape ``(B+1,)``.

    ``(b[i-1], b[i]]`` -> geometric midpoint; the first bucket ``(0, b[0]]`` -> ``b[0]/2``; the
    overflow bucket ``(b[-1], +Inf)`` -> ``2 b[-1]``. Raises ValueError unless bounds are positive
    and strictly increasing (latency histograms are).
    """
    b = np.asarray(bounds, dtype=float)
    if b.ndim != 1 or b.size == 0 or b[0] <= 0 or np.any(np.diff(b) <= 0):
        raise ValueError("log-scale bucket estimates need positive, strictly increasing bounds")
    lb = np.log(b)
    return np.concatenate(([lb[0] - math.log(2.0)], (lb[:-1] + lb[1:]) / 2.0, [lb[-1] + math.log(2.0)]))


@dataclass(frozen=True)
class Shift:
    """A two-group effect estimate (arrays broadcast over runs when vectorised).

    ``effect``: canary minus baseline on the analysis scale (log ratio for latency, absolute or log
    ratio for gauges). ``se``: its standard error. ``info``: the statistical information proxy used to
    place the look on the group-sequential time scale (proportional to ``1/se**2`` for a fixed
    spread). ``n_canary`` / ``n_baseline``: sample counts (requests, or paired steps).
    """

    effect: np.ndarray
    se: np.ndarray
    info: np.ndarray
    n_canary: np.ndarray
    n_baseline: np.ndarray

    @property
    def z(self) -> np.ndarray:
        """Standardised effect ``effect / se`` (0 when both are 0, +-inf when only se is 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.asarray(self.effect / self.se, dtype=float)
        return np.where(self.se > 0, z, np.where(self.effect == 0, 0.0, np.sign(self.effect) * np.inf))


def log_shift(canary: np.ndarray, baseline: np.ndarray, bounds: np.ndarray,
              n_eff_canary: np.ndarray | None = None, n_eff_baseline: np.ndarray | None = None) -> Shift:
    """Log-scale location shift between two bucketed latency samples.

    ``canary``, ``baseline``: per-bucket counts ``(..., B+1)`` (see :func:`parse_buckets`); ``bounds``:
    finite bounds in seconds ``(B,)``. Returns a :class:`Shift` with ``effect`` = mean log latency of
    the canary minus the baseline's (``exp(effect)-1`` = relative change) and a Welch standard error.

    The canary's variance is shrunk towards the baseline's with ``CANARY_VARIANCE_PRIOR`` pseudo
    observations, so a small canary sample that happens to sit in one bucket (sample variance 0)
    does not produce an infinite z. ``n_eff_*`` (optional, <= counts) replace the sample counts in the
    variance when observations are clustered: ITL has one observation per token, correlated within a
    request, so the analyzer passes the request count (a conservative design effect).
    Groups with fewer than 2 observations give NaN.
    """
    x = bin_log_centres(bounds)
    c = np.asarray(canary, dtype=float)
    b = np.asarray(baseline, dtype=float)
    nc, nb = c.sum(-1), b.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mc, mb = (c * x).sum(-1) / nc, (b * x).sum(-1) / nb
        vc = (c * (x - mc[..., None]) ** 2).sum(-1) / (nc - 1)
        vb = (b * (x - mb[..., None]) ** 2).sum(-1) / (nb - 1)
        vc = (nc * vc + CANARY_VARIANCE_PRIOR * vb) / (nc + CANARY_VARIANCE_PRIOR)
        ec = nc if n_eff_canary is None else np.minimum(nc, n_eff_canary)
        eb = nb if n_eff_baseline is None else np.minimum(nb, n_eff_baseline)
        se = np.sqrt(vc / ec + vb / eb)
        info = 1.0 / (1.0 / ec + 1.0 / eb)
    ok = (nc >= 2) & (nb >= 2) & (ec > 0) & (eb > 0)
    nan = np.nan
    return Shift(np.where(ok, mc - mb, nan), np.where(ok, se, nan), np.where(ok, info, nan), nc, nb)


def histogram_quantile(q: float, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Prometheus' ``histogram_quantile`` on per-bucket counts ``(..., B+1)``; NaN when empty.

    Linear interpolation inside the bucket that holds rank ``q * total``; the first bucket starts at
    0; a rank in the ``+Inf`` bucket returns the highest finite bound (source: prometheus/promql
    quantile.go, bucketQuantile).
    """
    b = np.asarray(bounds, dtype=float)
    c = np.asarray(counts, dtype=float)
    cum = np.cumsum(c, axis=-1)
    total = cum[..., -1]
    rank = q * total
    idx = np.argmax(cum >= rank[..., None], axis=-1)
    upper_all = np.concatenate((b, [b[-1]]))
    lower_all = np.concatenate(([0.0], b))
    upper, lower = upper_all[idx], lower_all[idx]
    in_bucket = np.take_along_axis(c, idx[..., None], -1)[..., 0]
    before = np.take_along_axis(cum, idx[..., None], -1)[..., 0] - in_bucket
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(in_bucket > 0, (rank - before) / in_bucket, 1.0)
    value = np.where(idx == b.size, b[-1], lower + (upper - lower) * frac)
    return np.where(total > 0, value, np.nan)


def paired_shift(canary: np.ndarray, baseline: np.ndarray, relative: bool) -> Shift:
    """Effect between two aligned time series (one value per step, e.g. from ``query_range``).

    ``relative=True`` compares ``log(canary/baseline)`` (steps with a non-positive value are dropped),
    else ``canary - baseline``. Pairing by timestamp removes load swings common to both groups. Steps
    are autocorrelated, so the standard error of the mean difference is inflated by the AR(1) factor
    ``(1+r)/(1-r)`` with ``r`` the lag-1 autocorrelation clipped to [0, 0.9] (a batch-means style
    correction; time-series metrics are advisory by default for this reason). NaN steps are dropped.
    """
    c = np.asarray(canary, dtype=float)
    b = np.asarray(baseline, dtype=float)
    keep = np.isfinite(c) & np.isfinite(b)
    if relative:
        keep &= (c > 0) & (b > 0)
    c, b = c[keep], b[keep]
    d = np.log(c / b) if relative else c - b
    n = float(d.size)
    if n < 3:
        nan = np.float64(np.nan)
        return Shift(nan, nan, nan, np.float64(n), np.float64(n))
    var = float(d.var(ddof=1))
    dc = d - d.mean()
    denom = float((dc * dc).sum())
    r = float((dc[1:] * dc[:-1]).sum() / denom) if denom > 0 else 0.0
    r = min(max(r, 0.0), 0.9)
    se = math.sqrt(var / n * (1 + r) / (1 - r))
    return Shift(np.float64(d.mean()), np.float64(se), np.float64(n), np.float64(n), np.float64(n))


def classify(has_data: np.ndarray, high: np.ndarray, low: np.ndarray, passed: np.ndarray) -> np.ndarray:
    """Kayenta-style classification codes (:data:`CLASS_NAMES`), vectorised.

    ``high`` / ``low``: the canary is shown above / below the baseline at the metric's error level;
    ``passed``: the interval's harmful end lies within the allowed effect. Precedence: NoData, High,
    Low, Pass, Inconclusive.
    """
    has_data = np.asarray(has_data, dtype=bool)
    out = np.full(np.broadcast(has_data, high, low, passed).shape, INCONCLUSIVE, dtype=np.int8)
    out = np.where(passed, PASS, out)
    out = np.where(low, LOW, out)
    out = np.where(high, HIGH, out)
    return np.where(has_data, out, NODATA).astype(np.int8)


def harmful(code: np.ndarray, direction: str) -> np.ndarray:
    """True where a classification is harmful for a metric whose harm ``direction`` is
    ``increase`` (High is harmful), ``decrease`` (Low) or ``either`` (both)."""
    if direction == "increase":
        return np.asarray(code) == HIGH
    if direction == "decrease":
        return np.asarray(code) == LOW
    if direction == "either":
        return np.isin(code, (HIGH, LOW))
    raise ValueError(f"direction must be increase, decrease or either, got {direction!r}")


# ---- bucket layouts ------------------------------------------------------------------------------
def fold_nonpositive(bounds: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop bounds <= 0 (OpenTelemetry's default layout starts at ``le="0"``), folding their counts
    into the first positive bucket: a latency of exactly 0 is counted as "at most the first positive
    bound". ``counts`` ``(..., B+1)``. Raises ValueError when no positive finite bound is left."""
    b = np.asarray(bounds, dtype=float)
    c = np.asarray(counts, dtype=float)
    k = int(np.sum(b <= 0))
    if k == 0:
        return b, c
    if k >= b.size:
        raise ValueError("histogram has no positive finite bucket bound")
    head = c[..., :k + 1].sum(-1, keepdims=True)
    return b[k:], np.concatenate((head, c[..., k + 1:]), axis=-1)


def common_bounds(layouts: Iterable[np.ndarray]) -> np.ndarray:
    """Bounds present in every layout (relative tolerance 1e-9): the finest layout onto which all
    of them can be re-binned exactly (a cumulative count at a shared bound is exact in each)."""
    out: np.ndarray | None = None
    for b in layouts:
        b = np.asarray(b, dtype=float)
        if out is None:
            out = b
        elif b.shape != out.shape or not np.array_equal(b, out):
            if b.size == 0:
                return np.zeros(0)
            keep = np.abs(out[:, None] - b[None, :]).min(1) <= 1e-9 * np.abs(out)
            out = out[keep]
    return np.asarray(out if out is not None else [], dtype=float)


def rebin(bounds: np.ndarray, counts: np.ndarray, new_bounds: np.ndarray) -> np.ndarray:
    """Per-bucket ``counts`` ``(..., B+1)`` on ``bounds`` -> per-bucket counts on ``new_bounds``,
    a subset of ``bounds`` (see :func:`common_bounds`): adjacent buckets are merged."""
    b = np.asarray(bounds, dtype=float)
    nb = np.asarray(new_bounds, dtype=float)
    if b.shape == nb.shape and np.array_equal(b, nb):
        return np.asarray(counts, dtype=float)
    idx = np.abs(b[None, :] - nb[:, None]).argmin(1)
    cum = np.cumsum(np.asarray(counts, dtype=float), axis=-1)
    picked = np.concatenate((cum[..., idx], cum[..., -1:]), axis=-1)
    return np.clip(np.diff(picked, axis=-1, prepend=0.0), 0.0, None)


# ---- clustered comparisons: the serving node is the unit that varies ----------------------------
def dl_tau2(values: np.ndarray, variances: np.ndarray) -> float:
    """Between-unit variance by the DerSimonian-Laird method-of-moments estimator (DerSimonian &
    Laird 1986, "Meta-analysis in clinical trials", Controlled Clinical Trials 7: tau^2 =
    max(0, (Q - (k-1)) / (S1 - S2/S1)), Q Cochran's heterogeneity statistic, S1/S2 the sums of the
    inverse-variance weights and of their squares). ``values``: one estimate per unit (node/pod);
    ``variances``: their within-unit sampling variances. NaN with fewer than 2 usable units."""
    tau2, df = dl_tau2_groups([(values, variances)])
    return tau2 if df > 0 else math.nan


def dl_tau2_groups(groups: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[float, int]:
    """DerSimonian-Laird between-unit variance pooled over groups that may differ in mean (canary
    and baseline nodes: each group keeps its own weighted mean, as in a meta-regression on the group
    indicator): ``tau^2 = max(0, (sum Q_g - df) / sum (S1_g - S2_g/S1_g))``, ``df = sum (k_g - 1)``.
    ``groups``: ``(values (k_g,), within-unit variances (k_g,))``; units with a non-finite value or a
    non-positive variance are skipped. Returns ``(tau^2, df)``; ``(nan, 0)`` when no group has two
    usable units."""
    q = denom = 0.0
    df = 0
    for values, variances in groups:
        x = np.asarray(values, dtype=float)
        v = np.asarray(variances, dtype=float)
        ok = np.isfinite(x) & np.isfinite(v) & (v > 0)
        x, v = x[ok], v[ok]
        if x.size < 2:
            continue
        w = 1.0 / v
        mu = float((w * x).sum() / w.sum())
        q += float((w * (x - mu) ** 2).sum())
        denom += float(w.sum() - (w * w).sum() / w.sum())
        df += int(x.size) - 1
    if df == 0:
        return math.nan, 0
    return (max(0.0, (q - df) / denom) if denom > 0 else 0.0), df


def within_variance(groups: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """Typical within-unit sampling variance of the units :func:`dl_tau2_groups` uses: the harmonic
    mean of their variances (``units / sum of inverse-variance weights``); NaN when none is usable."""
    n = s1 = 0.0
    for values, variances in groups:
        x = np.asarray(values, dtype=float)
        v = np.asarray(variances, dtype=float)
        ok = np.isfinite(x) & np.isfinite(v) & (v > 0)
        n += float(ok.sum())
        s1 += float((1.0 / v[ok]).sum())
    return n / s1 if s1 > 0 else math.nan


def effective_df(tau2_hat: float, df: int, v_within: float, tau2_ref: float) -> float:
    """Degrees of freedom that a DerSimonian-Laird estimate from ``df`` (``k - 1``) units carries
    about tau^2: ``df x (tau^2 / (tau^2 + v))^2`` with ``v`` the units' within-unit sampling
    variance (:func:`within_variance`) and tau^2 the larger of the estimate and ``tau2_ref`` (the
    assumed spread).

    Source: with (nearly) equal within-unit variances, Q ~ (1 + tau^2/v) chi^2 on ``df`` degrees of
    freedom, so the method-of-moments estimate has sampling variance about ``2 (tau^2 + v)^2 / df``
    (Biggerstaff & Tweedie 1997, "Incorporating variability in estimates of heterogeneity in the
    random effects model in meta-analysis", Stat. Med. 16), while a scaled chi-square estimate on
    ``d`` degrees of freedom has ``2 tau^4 / d``: equating them gives ``d``. Counting all ``k - 1``
    degrees of freedom, as if the nodes' means were exact, made the Student-t boundary too narrow
    when the nodes' request noise is comparable to their spread (20 pods at 40 req/s and a 3% real
    spread: the canary's location test rolled back 1.2-2.2% of healthy canaries against its 0.58%
    share; in about half of them the estimate had come out near 0 by chance). Taking the larger of
    the estimate and the assumption keeps a chance zero from discounting the data to nothing when
    the assumption says there is spread to measure."""
    if df <= 0 or not math.isfinite(tau2_hat):
        return float(df)
    ref = max(tau2_hat, tau2_ref)
    if not math.isfinite(v_within) or ref + v_within <= 0:
        return float(df)
    return float(df) * (ref / (ref + v_within)) ** 2


def moderated_tau2(tau2_hat: float, df: float, prior_tau2: float, prior_df: float) -> tuple[float, float]:
    """Between-node variance from ``df`` degrees of freedom of data pooled with a prior.

    The prior is a scaled inverse-chi-square law with ``prior_df`` degrees of freedom and scale
    ``prior_tau2`` (the config's ``node_spread`` on the log scale, squared); the data's estimate
    ``tau2_hat`` carries ``df`` degrees of freedom. The pooled value is the precision-weighted
    average ``(prior_df prior_tau2 + df tau2_hat) / (prior_df + df)`` with ``prior_df + df`` degrees of
    freedom: the conjugate update of a normal variance (Gelman et al., "Bayesian Data Analysis",
    3rd ed., section 3.3) and the moderated variance of Smyth 2004 ("Linear models and empirical
    Bayes methods for assessing differential expression in microarray experiments", Stat. Appl.
    Genet. Mol. Biol. 3: s~^2 = (d0 s0^2 + d s^2)/(d0 + d), a t statistic on d0 + d df). With
    ``df = 0`` it is the prior (``prior_df`` degrees of freedom); ``prior_df = inf`` fixes tau^2 at
    the prior; ``prior_df = 0`` is the data alone (NaN when ``df = 0`` too).
    Returns ``(tau2, degrees of freedom)``.
    """
    if math.isinf(prior_df):
        return float(prior_tau2), math.inf
    if df == 0 or not math.isfinite(tau2_hat):
        return (float(prior_tau2), float(prior_df)) if prior_df > 0 else (math.nan, 0.0)
    d = float(df)
    return (prior_df * prior_tau2 + d * tau2_hat) / (prior_df + d), prior_df + d


@dataclass(frozen=True)
class Clustered:
    """A two-group comparison whose units (nodes/pods) vary: ``effect`` (canary minus baseline),
    ``se`` (requests plus between-unit variance), ``df`` (Satterthwaite degrees of freedom; inf when
    the between-unit part is nil or fixed), ``tau2`` (between-unit variance used), ``tau2_source``
    (how it was obtained, for reports), ``info`` (1/se^2), ``tau2_df`` (degrees of freedom of tau2:
    nodes' plus the prior's), ``node_df`` (the nodes' share of them)."""

    effect: float
    se: float
    df: float
    tau2: float
    tau2_source: str
    info: float
    tau2_df: float = math.inf
    node_df: int = 0

    @property
    def z(self) -> float:
        if self.se > 0:
            return self.effect / self.se
        return 0.0 if self.effect == 0 else math.copysign(math.inf, self.effect)


def clustered(effect: float, v_requests: float, w_canary: np.ndarray, w_baseline: np.ndarray,
              unit_groups: list[tuple[np.ndarray, np.ndarray]], tau2_prior: float,
              prior_df: float = 0.0, label: str = "nodes") -> Clustered:
    """Widen a request-level comparison for between-node variation.

    Model: unit ``u`` of a group has a true value ``theta + delta*[canary] + nu_u``, nu_u ~ (0, tau^2)
    independent across units (GPU binning, thermals, noisy neighbours; canary and baseline on
    different nodes). The request-weighted group estimates then differ by ``delta`` plus noise of
    variance ``v_requests + tau^2 (sum w_c^2 + sum w_b^2)``, ``w`` the request shares of the units in
    their group (one canary pod: sum w_c^2 = 1, so the canary's own node effect is never averaged
    away). tau^2 is estimated from the units' spread around their own group's mean
    (:func:`dl_tau2_groups` over ``unit_groups``: the baseline's nodes and, where there are several,
    the canary's), pooled with the prior ``tau2_prior`` carrying ``prior_df`` degrees of freedom
    (:func:`moderated_tau2`), and never below the nodes' own estimate (the prior may widen a
    comparison, not narrow it: a fleet whose real spread exceeds ``node_spread`` keeps the data's
    estimate): with many nodes the data dominate, with two or three baseline nodes (a dev stack: 1 df
    from the data) the prior does, instead of a 1-df estimate whose Student-t boundary no healthy
    canary can pass. The nodes' estimate enters with its effective degrees of freedom
    (:func:`effective_df`: fewer than ``k - 1`` while the nodes' own request noise is comparable to
    tau^2). The uncertainty of tau^2 is carried by Satterthwaite degrees of freedom
    ``V^2 / ((tau^2 g)^2 / df_tau)`` for a Student-t boundary. ``label`` names the nodes' data in
    ``tau2_source`` (e.g. "nodes with history" when the baseline's group was read over a longer
    window than the look's: :meth:`gpuobs.canary.analyzer.Analyzer._node_history`).
    """
    g = float(np.sum(np.square(w_canary)) + np.sum(np.square(w_baseline)))
    tau2_hat, d = dl_tau2_groups(unit_groups)
    d_eff = effective_df(tau2_hat, d, within_variance(unit_groups), tau2_prior)
    tau2, df_tau = moderated_tau2(tau2_hat, d_eff, tau2_prior, prior_df)
    if d > 0 and math.isfinite(prior_df) and tau2_hat > tau2:
        # the assumption widens a comparison, never narrows it below what the nodes show: with many
        # nodes and a real spread above node_spread the data's estimate stands (its false-rollback
        # rate is the data's), with few nodes the pooled degrees of freedom still apply
        tau2 = tau2_hat
    if math.isnan(tau2):  # no node degrees of freedom and no prior weight: the prior value, fixed
        tau2, df_tau = float(tau2_prior), math.inf
    if d == 0:
        source = "prior"
    elif prior_df == 0 or math.isinf(prior_df):
        source = f"{label}, {d} df" if prior_df == 0 else "prior"
    else:
        source = f"{label}, {d} df + prior, {prior_df:g} df"
    var = v_requests + tau2 * g
    df = var * var / ((tau2 * g) ** 2 / df_tau) if tau2 > 0 and math.isfinite(df_tau) else math.inf
    se = math.sqrt(var) if var > 0 else 0.0
    return Clustered(float(effect), se, df, tau2, source, 1.0 / var if var > 0 else math.inf, df_tau, d)


def unit_moments(counts: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-unit (count, mean, sum of squared deviations) of bucket centres ``x`` from counts ``(U, B+1)``;
    non-finite where a unit's counts overflow (callers check ``np.isfinite``)."""
    c = np.asarray(counts, dtype=float)
    n = c.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = (c * x).sum(-1) / n
        ss = (c * (x - np.nan_to_num(m)[:, None]) ** 2).sum(-1)
    return n, m, ss


def tail_threshold(bounds: np.ndarray, counts: np.ndarray, q: float) -> int:
    """Index ``j`` of the bound whose share of ``counts`` above it is closest to ``1 - q`` on the log
    scale, among bounds with a share strictly between 0 and 1; -1 when none."""
    c = np.asarray(counts, dtype=float)
    total = c.sum()
    if total <= 0:
        return -1
    above = 1.0 - np.cumsum(c)[:-1] / total  # share above bound j
    ok = (above > 0) & (above < 1)
    if not ok.any():
        return -1
    dist = np.where(ok, np.abs(np.log(np.where(ok, above, 1.0)) - math.log(1 - q)), np.inf)
    return int(np.argmin(dist))


def exceedance_z(x_c: float, n_c: float, p0: float) -> float:
    """z of "the canary's share above the threshold exceeds p0" from the binomial tail: the mid-p
    style continuity-corrected upper tail ``P(X >= x + 1/2)`` of Binomial(n, p0), extended to the
    non-integer counts ``increase()`` returns through the regularized incomplete beta function
    (``P(X >= k) = I_p0(k, n-k+1)``), mapped to the normal scale. Unlike ``(p - p0)/se`` it keeps
    its level with 1-10 expected events (the p99 tail of a few hundred requests), where the normal
    approximation rolls back healthy canaries several times too often."""
    from scipy.special import betainc

    if n_c <= 0 or not 0 < p0 < 1:
        return math.nan
    a = x_c + 0.5
    if a >= n_c + 1:
        return 8.0
    upper = float(betainc(a, n_c - a + 1.0, p0)) if a > 0 else 1.0
    lower_x = x_c - 0.5
    if lower_x < 0:  # x = 0: mid-p lower tail, half the probability of no event
        low = 0.5 * float((1 - p0) ** n_c)
    elif lower_x == 0:
        low = float((1 - p0) ** n_c)
    else:
        # P(X <= x - 1/2) = I_{1-p0}(n - x + 1/2, x + 1/2), not 1 - I_p0(...): the difference loses the
        # lower tail below ~1e-16 (z < -8.3), where it read 0 and every such z was -37
        low = float(betainc(max(n_c - lower_x, 1e-9), lower_x + 1.0, 1.0 - p0))
    # two-sided continuity: above the mean use the upper tail, below it the lower tail
    from scipy.stats import norm as _norm

    if x_c >= n_c * p0:
        return float(_norm.isf(max(upper, 1e-300))) if upper < 0.5 else 0.0
    return -float(_norm.isf(max(low, 1e-300))) if low < 0.5 else 0.0
