"""Statistics on real numbers: bucket estimators, group-sequential boundaries, e-processes.

Error-rate claims are checked by simulation against the very functions the analyzer uses.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from gpuobs.canary.sequential import (
    Spending,
    binomial_upper_bound,
    group_sequential_boundaries,
    planned_looks,
    rate_ratio_interval,
    rate_ratio_log_evalue,
)
from gpuobs.canary.stats import (
    HIGH,
    INCONCLUSIVE,
    LOW,
    NODATA,
    PASS,
    bin_counts,
    bin_log_centres,
    classify,
    harmful,
    histogram_quantile,
    log_shift,
    paired_shift,
    parse_buckets,
)
from gpuobs.exporter.sim.latency import sample_ttft
from gpuobs.reference.buckets import TTFT_BUCKETS

TTFT = np.asarray(TTFT_BUCKETS)


def binned(rng: np.random.Generator, n: int, mult: float = 1.0) -> np.ndarray:
    return np.bincount(np.searchsorted(TTFT, sample_ttft(rng, n, mult), side="left"), minlength=TTFT.size + 1)


# ---- bucket handling -----------------------------------------------------------------------------
def test_parse_buckets_sorts_merges_and_clips():
    bounds, counts = parse_buckets([("+Inf", 10.0), ("0.5", 6.0), ("0.1", 2.0), ("1", 5.0), ("1.0", 0.5)])
    assert bounds.tolist() == [0.1, 0.5, 1.0]
    assert counts.tolist() == [2.0, 4.0, 0.0, 4.5]  # le=1 sums to 5.5; 5.5 < 6 is clipped to 0
    with pytest.raises(ValueError, match="Inf"):
        parse_buckets([("0.1", 1.0)])
    with pytest.raises(ValueError, match="NaN"):
        parse_buckets([("0.1", math.nan), ("+Inf", 1.0)])
    with pytest.raises(ValueError, match="not a number"):
        parse_buckets([("fast", 1.0), ("+Inf", 1.0)])
    assert bin_counts(np.array([[1, 3, 3, 7]])).tolist() == [[1, 2, 0, 4]]


def test_bin_log_centres():
    got = bin_log_centres(np.array([1.0, 2.0, 4.0]))
    assert np.allclose(np.exp(got), [0.5, math.sqrt(2), math.sqrt(8), 8.0])
    with pytest.raises(ValueError):
        bin_log_centres(np.array([0.0, 1.0]))


def test_histogram_quantile_matches_prometheus_interpolation():
    bounds = np.array([0.1, 0.25, 0.5, 1.0])
    counts = np.array([10.0, 40.0, 30.0, 15.0, 5.0])  # total 100, last 5 in +Inf
    # p50: rank 50 -> end of (0.1, 0.25]; p90: rank 90 in (0.5, 1] at (90-80)/15; p99: +Inf bucket -> 1.0
    assert histogram_quantile(0.5, bounds, counts) == pytest.approx(0.25)
    assert histogram_quantile(0.9, bounds, counts) == pytest.approx(0.5 + 0.5 * 10 / 15)
    assert histogram_quantile(0.99, bounds, counts) == pytest.approx(1.0)
    assert histogram_quantile(0.05, bounds, counts) == pytest.approx(0.05)  # first bucket starts at 0
    assert math.isnan(histogram_quantile(0.5, bounds, np.zeros(5)))
    two = histogram_quantile(0.5, bounds, np.stack([counts, counts * 2]))
    assert two.shape == (2,) and np.allclose(two, 0.25)


# ---- latency shift ------------------------------------------------------------------------------
def test_log_shift_recovers_a_multiplicative_regression():
    rng = np.random.default_rng(11)
    s = log_shift(binned(rng, 400_000, 1.2), binned(rng, 400_000), TTFT)
    assert math.expm1(float(s.effect)) == pytest.approx(0.193, abs=0.01)  # bucketing reads +20% as ~+19.3%
    # standard error ~ sigma * sqrt(2/n) with the bucketed sigma (~0.6)
    assert float(s.se) == pytest.approx(0.6 * math.sqrt(2 / 400_000), rel=0.1)


def test_log_shift_z_is_standard_normal_under_no_difference():
    rng = np.random.default_rng(5)
    canary = np.stack([binned(rng, 600) for _ in range(1500)])
    baseline = np.stack([binned(rng, 11_400) for _ in range(1500)])
    z = log_shift(canary, baseline, TTFT).z
    assert z.shape == (1500,)
    assert abs(z.mean()) < 0.08 and z.std() == pytest.approx(1.0, abs=0.06)


def test_log_shift_effective_counts_and_tiny_groups():
    rng = np.random.default_rng(2)
    c, b = binned(rng, 1000), binned(rng, 1000)
    full, clustered = log_shift(c, b, TTFT), log_shift(c, b, TTFT, np.array(250.0), np.array(250.0))
    assert float(clustered.effect) == float(full.effect)
    assert float(clustered.se) == pytest.approx(2 * float(full.se), rel=0.02)  # sqrt(1000/250)
    one = np.zeros(TTFT.size + 1)
    one[8] = 1
    assert math.isnan(float(log_shift(one, b, TTFT).effect))
    # all canary samples in one bucket: the shrunk variance keeps z finite
    same = np.zeros(TTFT.size + 1)
    same[8] = 50
    assert math.isfinite(float(log_shift(same, b, TTFT).z))


def test_paired_shift_relative_and_autocorrelation_inflation():
    t = np.arange(40)
    base = 2.0 + 0.1 * np.sin(t / 3)
    s = paired_shift(base * 1.1, base, relative=True)
    assert float(s.effect) == pytest.approx(math.log(1.1)) and float(s.se) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(3)
    ar = np.zeros(400)
    for i in range(1, 400):
        ar[i] = 0.8 * ar[i - 1] + rng.standard_normal()
    s = paired_shift(ar, np.zeros(400), relative=False)
    iid_se = ar.std(ddof=1) / math.sqrt(400)
    assert float(s.se) / iid_se == pytest.approx(3.0, rel=0.2)  # sqrt((1+0.8)/(1-0.8)) = 3
    short = paired_shift(np.array([1.0, math.nan]), np.array([1.0, 2.0]), relative=False)
    assert math.isnan(float(short.effect)) and float(short.n_canary) == 1


def test_classify_precedence_and_harm_direction():
    codes = classify(np.array([False, True, True, True, True]), np.array([True, True, False, False, False]),
                     np.array([False, False, True, False, False]), np.array([True, True, True, True, False]))
    assert codes.tolist() == [NODATA, HIGH, LOW, PASS, INCONCLUSIVE]
    assert harmful(codes, "increase").tolist() == [False, True, False, False, False]
    assert harmful(codes, "decrease").tolist() == [False, False, True, False, False]
    assert harmful(codes, "either").tolist() == [False, True, True, False, False]
    with pytest.raises(ValueError):
        harmful(codes, "up")


# ---- group-sequential boundaries ----------------------------------------------------------------
def test_single_look_boundary_is_the_normal_quantile():
    c = group_sequential_boundaries(Spending(0.025, 1.0, 1.0, 1.0), [1.0], [1.0])
    assert c[0] == pytest.approx(norm.isf(0.025), abs=2e-3)


def test_twenty_looks_keep_the_crossing_probability_at_the_spent_alpha():
    sp = Spending(0.01)
    k = 20
    c = group_sequential_boundaries(sp, [j / k for j in range(1, k + 1)], list(range(1, k + 1)))
    rng = np.random.default_rng(0)
    z = np.cumsum(rng.standard_normal((200_000, k)), 1) / np.sqrt(np.arange(1, k + 1))
    crossed = np.maximum.accumulate(z >= c, axis=1)
    for look in (5, 10, 20):
        assert crossed[:, look - 1].mean() == pytest.approx(sp.cumulative(look / k), abs=0.0008)
    # a repeated fixed-level test at the same per-look level is far worse: the problem being solved
    assert (z >= norm.isf(0.01)).any(1).mean() > 0.05


@pytest.mark.parametrize("c, i_prev, i_new", [(2.5, 1, 2), (3.0, 19, 20), (math.inf, 1, 1.5), (2.8, 100, 101),
                                              (9.99, 1, 40), (-7.99, 3, 4), (2.6123, 7, 7.3)])
def test_banded_propagation_equals_the_dense_kernel(c, i_prev, i_new):
    """The recursion's banded kernel (sequential._propagate) against the dense product it replaced."""
    from gpuobs.canary import sequential as S

    z = np.arange(S.Z_LO, S.Z_HI + S.H / 2, S.H)
    g = norm.pdf(z) * (z < 2.9) + 0.1 * norm.pdf(z, 1.0, 0.5)  # a sub-density with a cut and a bump
    keep = z < c
    u, gu = z[keep], g[keep]
    if math.isfinite(c) and c > u[-1]:
        u, gu = np.append(u, c), np.append(gu, np.interp(c, z, g))
    w = np.zeros(u.size)
    w[:-1] += np.diff(u) / 2
    w[1:] += np.diff(u) / 2
    r, sd = math.sqrt(i_prev / i_new), math.sqrt(1 - i_prev / i_new)
    dense = (w * gu) @ norm.pdf(z[None, :], r * u[:, None], sd) if u.size >= 2 else np.zeros_like(z)
    banded = S._propagate(z, g, c, i_prev, i_new)
    assert np.abs(banded - dense).max() <= 1e-12 * max(1.0, float(dense.max()))


def test_repeat_looks_and_the_horizon():
    sp = Spending(0.01)
    c = group_sequential_boundaries(sp, [0.2, 0.4, 0.41, 0.8, 1.0, 1.1], [2, 4, 4.02, 8, 10, 11])
    assert c[2] == c[1]  # information grew < 2%: the same look again
    assert np.all(np.isfinite(c[:5])) and c[5] == math.inf  # nothing left after the horizon


def test_spending_shape_and_validation():
    sp = Spending(0.01, main_until=0.5, main_share=0.85, rho=2.0)
    assert sp.cumulative(0.0) == 0.0
    assert sp.cumulative(0.5) == pytest.approx(0.01 * (0.85 + 0.15 * 0.5))
    assert sp.cumulative(1.0) == pytest.approx(0.01) and sp.cumulative(3.0) == pytest.approx(0.01)
    assert sp.with_alpha(0.002).cumulative(1.0) == pytest.approx(0.002)
    with pytest.raises(ValueError):
        Spending(0.7)


def test_planned_looks_skip_untested_looks():
    times, infos = planned_looks(elapsed=150, interval=30, horizon=600, n_now=300, min_n=100, info_now=50.0)
    assert times == pytest.approx([60 / 600, 90 / 600, 120 / 600, 150 / 600])  # look at 30 s had 60 < 100
    assert infos == pytest.approx([20.0, 30.0, 40.0, 50.0])
    assert planned_looks(10, 30, 600, 5, 100, 1.0) == ([10 / 600], [1.0])
    with pytest.raises(ValueError):
        planned_looks(0, 30, 600, 5, 100, 1.0)


# ---- error counts -----------------------------------------------------------------------------------
def test_rate_ratio_evalue_keeps_alpha_over_twenty_looks():
    rng = np.random.default_rng(9)
    runs, looks, alpha = 20_000, 20, 0.05
    per_c, per_b = rng.poisson(60, (runs, looks)), rng.poisson(1140, (runs, looks))
    n_c, n_b = np.cumsum(per_c, 1), np.cumsum(per_b, 1)
    e_c, e_b = np.cumsum(rng.binomial(per_c, 0.01), 1), np.cumsum(rng.binomial(per_b, 0.01), 1)
    log_e = rate_ratio_log_evalue(e_c, n_c, e_b, n_b)
    assert log_e.shape == (runs, looks)
    assert (log_e >= math.log(1 / alpha)).any(1).mean() <= alpha


def test_rate_ratio_detects_a_large_regression_and_interval_covers_it():
    # 1.05% canary vs 0.05% baseline over 10 intervals at 60 / 1140 requests: ~6 vs ~6 errors
    log_e = float(rate_ratio_log_evalue(6, 600, 6, 11_400))
    assert log_e > math.log(1000)
    lo, hi = rate_ratio_interval(6, 600, 6, 11_400, 0.001)
    assert 1.0 < lo < 19.0 < hi  # the observed ratio is 19
    assert rate_ratio_interval(0, 600, 0, 11_400, 0.001) == (0.0, math.inf)
    assert float(rate_ratio_log_evalue(0, 600, 30, 11_400, upper=False)) < math.log(1000)


def test_binomial_upper_bound_values_and_anytime_coverage():
    ub = binomial_upper_bound(np.array([0, 6, 60]), np.array([600, 600, 600]), 0.001)
    assert ub[0] == pytest.approx(0.0129, abs=0.001) and 0.01 < ub[1] < 0.04 and 0.1 < ub[2] < 0.2
    assert math.isnan(float(binomial_upper_bound(0, 0, 0.01)))
    rng = np.random.default_rng(4)
    p, alpha = 0.02, 0.05
    n = np.cumsum(rng.poisson(60, (3000, 20)), 1)
    x = np.cumsum(rng.binomial(np.diff(n, prepend=0, axis=1), p), 1)
    miss = (binomial_upper_bound(x, n, alpha) < p).any(1).mean()
    assert miss <= alpha
