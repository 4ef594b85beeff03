"""Issue 18: missing evidence holds, robust bucket layouts, quantile/spread tests, node-to-node
variation, warm-up and the "cannot decide within the horizon" outlook.

Statistical checks use fixed seeds and assert rates with margins of 3 binomial standard errors of
the run count (a correct method fails such a check with probability < 0.3%)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import t as student_t

from gpuobs.canary.analyzer import Analyzer
from gpuobs.canary.config import ConfigError, load_config, parse_config
from gpuobs.promapi.prometheus import PromClient
from gpuobs.canary.sequential import Spending, group_sequential_boundaries
from gpuobs.canary.stats import (HIGH, NODATA, PASS, clustered, common_bounds, dl_tau2, dl_tau2_groups, effective_df,
                                 exceedance_z,
                                 fold_nonpositive, moderated_tau2, parse_buckets, rebin)
from gpuobs.canary.verdict import HOLD, PROMOTE, ROLLBACK, decide, rollout_false_rollback_bound
from gpuobs.exporter.sim.latency import sample_ttft
from gpuobs.reference.buckets import TTFT_BUCKETS
from tests.fakes.prometheus import FakePrometheus, fleet
from tests.canary.test_canary_cli import analyze_args, cli

CANARY, BASELINE = 'track="canary"', 'track="baseline"'
START, END = 10_000.0, 10_300.0
OTEL = (0.0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
PROM_DEFAULT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def analyze(data, config=None, start=START, end=END):
    with FakePrometheus(data) as fp:
        return Analyzer(PromClient(fp.url, retries=0), config or load_config(), CANARY, BASELINE).analyze(start, end)


def row(v, name):
    return next(m for m in v.metrics if m.name == name)


def binned(x, bounds):
    b = np.asarray(bounds, dtype=float)
    return b, np.bincount(np.searchsorted(b, x, side="left"), minlength=b.size + 1).astype(float)


def margin(p, n):
    return 3 * math.sqrt(p * (1 - p) / n)


# ---- layouts -------------------------------------------------------------------------------------
def test_le_zero_is_folded_and_layouts_merge_on_common_bounds():
    bounds, counts = parse_buckets([("0", 2.0), ("0.5", 10.0), ("1", 15.0), ("+Inf", 16.0)])
    b, c = fold_nonpositive(bounds, counts)
    assert b.tolist() == [0.5, 1.0] and c.tolist() == [10.0, 5.0, 1.0]
    with pytest.raises(ValueError):
        fold_nonpositive(np.array([0.0]), np.array([1.0, 2.0]))
    common = common_bounds([np.array([0.1, 0.25, 0.5, 1.0]), np.array([0.25, 1.0, 2.5])])
    assert common.tolist() == [0.25, 1.0]
    assert rebin(np.array([0.1, 0.25, 0.5, 1.0]), np.array([1, 2, 3, 4, 5.0]), common).tolist() == [3, 7, 5]


def test_otel_layout_with_le_zero_is_analysed():
    data = fleet(n_c=2400, n_b=45_600, err_b=20)
    rng = np.random.default_rng(3)
    for track, n in (("canary", 2400), ("baseline", 45_600)):
        data.histograms[track]["vllm:time_to_first_token_seconds"] = binned(sample_ttft(rng, n), OTEL)
    v = analyze(data)
    assert row(v, "ttft").classification != "NoData", row(v, "ttft").reason


def test_canary_with_a_new_bucket_layout_is_still_judged():
    """The release changed the layout (vLLM's -> Prometheus' default): compared on shared bounds."""
    data = fleet()
    rng = np.random.default_rng(4)
    data.histograms["canary"]["vllm:time_to_first_token_seconds"] = binned(sample_ttft(rng, 600, 1.5), PROM_DEFAULT)
    v = analyze(data)
    ttft = row(v, "ttft")
    assert v.verdict == "ROLLBACK" and ttft.harmful
    assert any("bucket layouts differ" in n for n in ttft.notes)


# ---- missing evidence ----------------------------------------------------------------------------
def test_missing_error_series_is_missing_not_zero_and_never_promotes():
    data = fleet(n_c=2400, n_b=45_600, err_b=20)
    del data.counters["canary"]["vllm:request_success_total"]["error"]
    v = analyze(data)
    er = row(v, "error_ratio")
    assert er.classification == "NoData" and "missing, not zero" in er.reason
    assert v.verdict == "HOLD" and row(v, "ttft").classification == "Pass"


def test_decide_never_promotes_without_critical_evidence():
    assert decide(np.array([PASS, NODATA]), np.array([False, False]), np.array([True, True])) == HOLD
    assert decide(np.array([PASS]), np.array([False]), np.array([False])) == HOLD  # no critical metric
    assert decide(np.array([HIGH, NODATA]), np.array([True, False]), np.array([True, True])) == ROLLBACK
    assert decide(np.array([PASS, PASS]), np.array([False, False]), np.array([True, True])) == PROMOTE
    assert rollout_false_rollback_bound(0.01, 4) == pytest.approx(0.04)


def test_advisory_only_selection_is_judged_and_does_not_crash(capsys):
    cfg = load_config().select(["e2e"])
    assert cfg.metrics[0].critical and cfg.metric_alpha(cfg.metrics[0]) == pytest.approx(cfg.alpha)
    with FakePrometheus(fleet(n_c=2400, n_b=45_600)) as fp:
        code = cli(analyze_args(fp.url, "--metric", "e2e"))
    out = capsys.readouterr()
    assert code in (0, 3) and out.out.startswith("Canary verdict:") and "Traceback" not in out.err
    full = load_config()
    assert full.select(["ttft"]).metric_alpha(full.metrics[0]) == pytest.approx(full.metric_alpha(full.metrics[0]))


# ---- quantile / spread tests ---------------------------------------------------------------------
def test_tail_only_regression_is_caught_by_the_p99_test():
    """p99 +30% with the median and p90 unchanged: the location test cannot see it, p99 does."""
    rng = np.random.default_rng(11)
    data = fleet(n_c=6000, n_b=114_000, err_b=57, series=False)
    x = sample_ttft(rng, 6000)
    q90 = 0.25 * math.exp(0.6 * 1.2815515655446004)
    k = 1 + math.log(1.3) / (0.6 * (2.3263478740408408 - 1.2815515655446004))
    x = np.where(x > q90, q90 * (x / q90) ** k, x)
    data.histograms["canary"]["vllm:time_to_first_token_seconds"] = binned(x, TTFT_BUCKETS)
    v = analyze(data, load_config().select(["ttft", "error_ratio"]))
    ttft = row(v, "ttft")
    tests = {t["test"]: t for t in ttft.tests}
    assert v.verdict == "ROLLBACK" and tests["p99"]["harmful"]
    assert not tests["p50"]["harmful"]
    lo, hi = tests["p99"]["interval"]
    assert lo > 0 and lo < tests["p99"]["effect"] < hi and "p99" in v.reasons[0]


def test_spread_increase_is_caught():
    rng = np.random.default_rng(12)
    data = fleet(n_c=1200, n_b=22_800, err_b=11, series=False)
    x = 0.25 * (sample_ttft(rng, 1200) / 0.25) ** (0.75 / 0.6)
    data.histograms["canary"]["vllm:time_to_first_token_seconds"] = binned(x, TTFT_BUCKETS)
    v = analyze(data, load_config().select(["ttft", "error_ratio"]))
    tests = {t["test"]: t for t in row(v, "ttft").tests}
    assert v.verdict == "ROLLBACK" and tests["spread"]["harmful"] and tests["spread"]["effect"] > 0.15


def test_exceedance_z_keeps_its_level_with_few_events():
    """Binomial(300, 1%) has 3 expected events; the mid-p tail must not exceed its nominal level
    (the normal approximation exceeds 0.5% about three times over)."""
    rng = np.random.default_rng(5)
    n, p0, runs = 300, 0.01, 20_000
    x = rng.binomial(n, p0, runs)
    z = np.array([exceedance_z(float(k), n, p0) for k in range(0, 40)])[x]
    rate = float(np.mean(z >= 2.5758))  # one-sided 0.5%
    assert rate <= 0.005 + margin(0.005, runs)
    naive = (x / n - p0) / math.sqrt(p0 * (1 - p0) / n)
    assert float(np.mean(naive >= 2.5758)) > 0.005 + margin(0.005, runs)  # why the exact tail is needed


def test_exceedance_z_is_monotone_far_below_the_expected_share():
    """Far below p0 the lower tail is below 1e-16: computed as 1 - upper tail it read 0 and the z was
    -37 for every count below about n p0 - 8.3 sd (602 of 1,200 at p0 0.625: -37 instead of -8.8). The
    within-node design's expected share moves p0 away from the observed one, where the quantile tests'
    z (scaled by their variance) then read -9.7 instead of -2.3."""
    n, p0 = 1200.0, 0.625
    sd = math.sqrt(n * p0 * (1 - p0))
    zs = [exceedance_z(float(x), n, p0) for x in (700, 650, 620, 602, 560, 500)]
    assert all(a > b for a, b in zip(zs, zs[1:])), zs
    for x, z in zip((700, 650, 620, 602, 560, 500), zs):
        assert z == pytest.approx((x - n * p0) / sd, abs=0.35), (x, z)
    assert exceedance_z(0.0, n, p0) > -40.0


def test_tail_test_catches_a_tail_stretch_with_more_evidence_than_p99():
    """The bench's tail shape (p99 +30%, p90 and median unchanged), 3,000 canary requests, last look of
    the stage: the log-rank tail test uses all 12% of requests above p90, the p99 test only the 1-2%
    above p99, so its z is larger; its effect is the p99 change the fitted tail implies (about +30%)."""
    rng = np.random.default_rng(21)
    data = fleet(n_c=3000, n_b=57_000, err_b=28, series=False)
    x = sample_ttft(rng, 3000)
    q90 = 0.25 * math.exp(0.6 * 1.2815515655446004)
    k = 1 + math.log(1.3) / (0.6 * (2.3263478740408408 - 1.2815515655446004))
    data.histograms["canary"]["vllm:time_to_first_token_seconds"] = binned(np.where(x > q90, q90 * (x / q90) ** k, x),
                                                                          TTFT_BUCKETS)
    # the stage's last look (the window is the whole horizon): the tail test spends its alpha late
    v = analyze(data, load_config().select(["ttft", "error_ratio"]).with_timing(horizon_s=END - START))
    tests = {t["test"]: t for t in row(v, "ttft").tests}
    tail = tests["tail"]
    assert v.verdict == "ROLLBACK" and tail["harmful"]
    # one short line per deciding test, each with its effect and interval
    assert {r.split(":")[0] for r in v.reasons} == {f"ttft {t}" for t in tests if tests[t].get("harmful")}
    assert any(r.startswith("ttft tail: High (+") and r.endswith("], between-node)") for r in v.reasons)
    assert tail["z"] > tail["boundary"] > 0 and tail["z"] > tests["p99"]["z"] and tail["tail_hazard_ratio"] > 1.2
    lo, hi = tail["interval"]
    assert 0 < lo < tail["effect"] < hi and 0.1 < tail["effect"] < 0.6 and lo < 0.3 < hi


@pytest.mark.parametrize("shape, true_change", [("tail", 0.30), ("uniform", 0.10), ("spread", 0.42)])
def test_p99_effect_reads_the_p99_change_not_the_share_above_one_bound(shape, true_change):
    """The p99 test's effect under the binormal tail mapping, on near-exact shares (200k canary
    requests): a tail stretched above p90 to p99 +30% was read as +21% by the uniform-scale mapping
    (inside the +25% allowed, and PROMOTED 10% of the time in the bench); it must read near +30%, a
    uniform +10% near +10%, and a spread increase (sigma 0.6 -> 0.75, p99 +42%) near +42%."""
    rng = np.random.default_rng(5)
    data = fleet(n_c=200_000, n_b=400_000, err_b=80, series=False)
    x = sample_ttft(rng, 200_000)
    q90 = 0.25 * math.exp(0.6 * 1.2815515655446004)
    if shape == "tail":
        k = 1 + math.log(1.3) / (0.6 * (2.3263478740408408 - 1.2815515655446004))
        x = np.where(x > q90, q90 * (x / q90) ** k, x)
    elif shape == "uniform":
        x = x * 1.1
    else:
        x = 0.25 * (x / 0.25) ** (0.75 / 0.6)
    data.histograms["canary"]["vllm:time_to_first_token_seconds"] = binned(x, TTFT_BUCKETS)
    data.histograms["baseline"]["vllm:time_to_first_token_seconds"] = binned(sample_ttft(rng, 400_000), TTFT_BUCKETS)
    v = analyze(data, load_config().select(["ttft", "error_ratio"]).with_timing(horizon_s=END - START))
    p99 = {t["test"]: t for t in row(v, "ttft").tests}["p99"]
    assert p99["effect"] == pytest.approx(true_change, abs=0.04), p99
    lo, hi = p99["interval"]
    assert lo < p99["effect"] < hi


@pytest.mark.parametrize("n, share", [(600, 0.0207), (1200, 0.0207), (3000, 0.0207), (1200, 0.05)])
def test_pnn_passing_end_is_the_score_bound_and_holds_its_level(n, share):
    """The pNN tests' passing end (PROMOTE needs it inside the allowed effect) is the upper end of the
    share above the bound. Exact binomial sums at the bench's p99 margin (a tail stretched to p99 +25%
    puts 2.07% above the 1.0 s bound) with c = 2.326 (one-sided 1%): the Wald end, variance at the
    observed share, lies below the true share in 1.7-3.5% of canaries (the bench PROMOTED 3% of such
    canaries: 6 of 200); the score bound at most 1%."""
    from scipy.stats import binom

    from gpuobs.canary.histstats import score_upper
    c = 2.3263478740408408
    xs = np.arange(0, int(n * share * 4) + 20)
    pmf = binom.pmf(xs, n, share)
    score_miss = sum(pr for x, pr in zip(xs, pmf) if score_upper(x / n, n, 0.0, c) < share)
    wald_miss = sum(pr for x, pr in zip(xs, pmf) if x / n + c * math.sqrt(x / n * (1 - x / n) / n) < share)
    assert score_miss <= 0.01 < wald_miss
    # extra variance (baseline share, node term) only widens it; a share of 0 still has a positive end
    assert score_upper(0.01, n, 1e-5, c) > score_upper(0.01, n, 0.0, c) > 0.01
    assert 0 < score_upper(0.0, n, 0.0, c) < 0.01 and score_upper(0.5, 0.0, 0.0, c) == 1.0


def test_quantile_test_without_a_bound_near_its_quantile_is_not_applicable():
    """Buckets 0.1, 0.5, 2.5, 10 s: the p99 test's nearest bound is the p90 test's (0.5 s, 12% above)
    and the p50 test's is 0.1 s (94% above); both are n/a, the p90 test runs."""
    rng = np.random.default_rng(3)
    data = fleet(n_c=6000, n_b=114_000, err_b=57, series=False)
    for track, n in (("canary", 6000), ("baseline", 114_000)):
        data.histograms[track]["vllm:time_to_first_token_seconds"] = binned(sample_ttft(rng, n), (0.1, 0.5, 2.5, 10.0))
    v = analyze(data, load_config().select(["ttft", "error_ratio"]).with_timing(horizon_s=END - START))
    tests = {t["test"]: t for t in row(v, "ttft").tests}
    assert tests["p99"]["classification"] == "n/a" and "no bucket bound near the baseline's p99" in tests["p99"]["reason"]
    assert tests["p50"]["classification"] == "n/a" and "0.1" in tests["p50"]["reason"]
    assert tests["p90"]["classification"] in ("Pass", "Inconclusive") and tests["p90"]["threshold"] == 0.5


def test_quantile_test_on_a_bound_with_empty_neighbours_is_not_applicable():
    """Bounds 0.25 and 100 s: the p50 bound has no baseline request above the next bound, so no slope
    turns the share's change into a latency change; the test is n/a (it passed with a (0, 0) interval)."""
    rng = np.random.default_rng(1)
    data = fleet(n_c=3000, n_b=30_000, err_b=10, series=False)
    for track, n in (("canary", 3000), ("baseline", 30_000)):
        data.histograms[track]["vllm:time_to_first_token_seconds"] = binned(sample_ttft(rng, n), (0.25, 100.0))
    v = analyze(data, load_config().select(["ttft", "error_ratio"]).with_timing(horizon_s=END - START))
    p50 = {t["test"]: t for t in row(v, "ttft").tests}["p50"]
    assert p50["classification"] == "n/a" and "cannot turn a share change" in p50["reason"]


def test_coarse_layout_leaves_the_tail_test_out_instead_of_holding_every_canary():
    """Coarse buckets: with 0.1, 0.5, 2.5, 10 s the few requests above 2.5 s give the tail test two
    buckets above the p90 bound (0.5 s) and it runs (not harmful); with 0.1, 0.5, 10 s every request
    above 0.5 s is in one bucket, the test cannot be computed and is reported n/a. A healthy canary
    passes either way (a NoData there held every healthy canary of bench "A/A, coarse buckets" to
    the deadline)."""
    for layout, tail_class in (((0.1, 0.5, 2.5, 10.0), "Pass"), ((0.1, 0.5, 10.0), "n/a")):
        rng = np.random.default_rng(31)
        data = fleet(n_c=6000, n_b=114_000, err_b=57, series=False)
        for track, n in (("canary", 6000), ("baseline", 114_000)):
            data.histograms[track]["vllm:time_to_first_token_seconds"] = binned(sample_ttft(rng, n), layout)
        v = analyze(data, load_config().select(["ttft", "error_ratio"]).with_timing(horizon_s=END - START))
        ttft = row(v, "ttft")
        tests = {t["test"]: t for t in ttft.tests}
        assert tests["tail"]["classification"] == tail_class, (layout, tests["tail"])
        if tail_class == "n/a":
            assert "one bucket" in tests["tail"]["reason"]
            assert "n/a" in v.table()
        assert ttft.classification == "Pass" and v.verdict == "PROMOTE"


def test_tail_test_z_is_exact_with_few_tail_requests():
    """Under the null, the z of a sum of few skewed log-rank scores (60 and 150 requests above p90,
    every bucket scored, up to -ln 0.00005) keeps its one-sided level at 0.5% and 0.27%; the normal
    approximation does not."""
    from gpuobs.canary.histstats import _savage_scores, score_sum_z

    rng = np.random.default_rng(8)
    p_tail = np.array([0.716, 0.183, 0.084, 0.0006, 0.00005])  # vLLM TTFT buckets above 0.5 s, sigma 0.6
    scores, v = _savage_scores(p_tail)
    pi = p_tail / p_tail.sum()
    assert scores.max() == pytest.approx(-math.log(pi[-1]), rel=0.05)
    runs = 20_000
    for m in (60, 150):
        x = rng.multinomial(m, pi, runs)
        uniq, inverse = np.unique(x, axis=0, return_inverse=True)
        z = np.array([score_sum_z(scores, pi, r, m) for r in uniq])[inverse.ravel()]
        naive = (x @ scores) / math.sqrt(m * v)
        for level, c in ((0.005, 2.5758), (0.0027, 2.7822)):
            assert float(np.mean(z >= c)) <= level + margin(level, runs)
        assert float(np.mean(naive >= 2.7822)) > 0.0027 + margin(0.0027, runs)  # why the exact tail is needed
    assert abs(float(np.mean(z))) < 0.05 and 0.9 < float(np.std(z)) < 1.1


def test_tail_test_holds_its_level_and_scores_every_bucket():
    """The tail test on one look's counts (one canary node, 19 baseline nodes, vLLM's TTFT buckets,
    the simulator's lognormal): healthy, its z exceeds 2.5 and 2.9 no more often than a normal z
    does (4,000 runs at 300 and 1,200 canary requests); with the bench's tail stretch (p99 +30%,
    median and p90 unchanged) at 1,200 canary requests it crosses 2.9 in at least 80% of 2,000 runs
    (82.8% measured; 78.3% when the buckets above 1 s were pooled into one, as before 2026-12-05:
    that design fails this check with probability about 0.97)."""
    from bench.canary_oracle import BOUNDS, bucket_probs, healthy_cdf, tail_cdf
    from gpuobs.canary.histstats import HistContext
    from gpuobs.canary.stats import bin_log_centres

    p, q = bucket_probs(healthy_cdf), bucket_probs(tail_cdf)
    x = bin_log_centres(BOUNDS)
    rng = np.random.default_rng(41)

    def z(n: int, probs: np.ndarray) -> float:
        cc = rng.multinomial(n, probs)[None, :].astype(float)
        cb = rng.multinomial(n, p, size=19).astype(float)
        nc, nb = cc.sum(1), cb.sum(1)
        return HistContext(BOUNDS, x, cc, cb, nc, nb, nc, nb, 0.015, 4.0).test("tail")["z"]

    from scipy.stats import norm
    for n in (300, 1200):
        zs = np.array([z(n, p) for _ in range(4000)])
        for c in (2.5, 2.9):
            level = float(norm.sf(c))
            assert float(np.mean(zs > c)) <= level + margin(level, 4000), (n, c)
    power = float(np.mean(np.array([z(1200, q) for _ in range(2000)]) > 2.9))
    assert power >= 0.80, power


# ---- node heterogeneity --------------------------------------------------------------------------
def test_dersimonian_laird_estimate():
    x, v = np.array([0.0, 0.1, -0.1, 0.2]), np.full(4, 0.001)
    w = 1 / v
    q = float((w * (x - x.mean()) ** 2).sum())
    assert dl_tau2(x, v) == pytest.approx((q - 3) / (w.sum() - (w * w).sum() / w.sum()))
    assert math.isnan(dl_tau2(np.array([1.0]), np.array([1.0])))
    assert dl_tau2(np.zeros(5), np.ones(5)) == 0.0


def test_node_spread_keeps_the_false_rollback_rate():
    """19 baseline nodes and one canary node, node effects sd 5% (log), per-node request noise:
    a one-sided test at 1% must reject at most 1% (+ margin); ignoring the nodes rejects far more."""
    rng = np.random.default_rng(7)
    runs, k, sd_req, tau = 4000, 19, 0.02, 0.05
    hits = naive = 0
    for _ in range(runs):
        nodes = rng.normal(0, tau, k + 1) + rng.normal(0, sd_req, k + 1)
        wb = np.full(k, 1 / k)
        cl = clustered(nodes[0] - nodes[1:].mean(), sd_req ** 2 * (1 + 1 / k), np.ones(1), wb,
                       [(nodes[1:], np.full(k, sd_req ** 2))], 0.015 ** 2, 4.0)
        c = 2.3263 if math.isinf(cl.df) else float(student_t.isf(0.01, cl.df))
        hits += cl.z >= c
        naive += (nodes[0] - nodes[1:].mean()) / (sd_req * math.sqrt(1 + 1 / k)) >= 2.3263
    assert hits / runs <= 0.01 + margin(0.01, runs)
    assert naive / runs > 0.05


def test_pooled_and_moderated_node_variance():
    """Canary and baseline nodes each around their own mean (a canary shifted by 1.0 adds nothing);
    the prior pools by degrees of freedom (Smyth 2004)."""
    xb, xc, v = np.array([0.0, 0.1, -0.1]), np.array([1.0, 1.2]), np.full(3, 0.001)
    tau_b, df_b = dl_tau2_groups([(xb, v)])
    tau_bc, df_bc = dl_tau2_groups([(xb, v), (xc, v[:2])])
    assert df_b == 2 and df_bc == 3 and tau_b == pytest.approx(dl_tau2(xb, v))
    w = 1 / 0.001
    q = w * ((xb - xb.mean()) ** 2).sum() + w * ((xc - xc.mean()) ** 2).sum()
    assert tau_bc == pytest.approx((q - 3) / ((3 * w - w) + (2 * w - w)))
    assert dl_tau2_groups([(np.array([1.0]), np.array([1.0]))]) == (pytest.approx(math.nan, nan_ok=True), 0)
    assert moderated_tau2(0.01, 1, 0.0004, 4.0) == pytest.approx(((4 * 0.0004 + 0.01) / 5, 5.0))
    assert moderated_tau2(math.nan, 0, 0.0004, 4.0) == (0.0004, 4.0)
    assert moderated_tau2(0.01, 18, 0.0004, math.inf) == (0.0004, math.inf)
    assert moderated_tau2(0.01, 18, 0.0004, 0.0) == (0.01, 18.0)


def test_two_baseline_nodes_hold_alpha_and_let_a_healthy_canary_pass():
    """The dev stack: one canary node, two baseline nodes, per-node request noise 1.5%. With node
    effects of sd 1.5% (the packaged node_spread) a one-sided 1% test on the moderated spread (1 df
    from the nodes + 4 from the prior) rejects at most 1% (+ margin); with identical nodes (the
    simulator's) a healthy canary's 99% upper bound is within +10% in most runs, more often than
    with the 1-df estimate alone (prior weight 0)."""
    rng = np.random.default_rng(11)
    runs, k, sd_req, allowed = 3000, 2, 0.015, math.log1p(0.10)
    prior = math.log1p(0.015) ** 2

    def one(tau: float, prior_df: float) -> tuple[bool, bool]:
        nodes = rng.normal(0, tau, k + 1) + rng.normal(0, sd_req, k + 1)
        cl = clustered(nodes[0] - nodes[1:].mean(), sd_req ** 2 * (1 + 1 / k), np.ones(1), np.full(k, 1 / k),
                       [(nodes[1:], np.full(k, sd_req ** 2))], prior, prior_df)
        c = float(student_t.isf(0.01, cl.df)) if math.isfinite(cl.df) else 2.3263
        return cl.z >= c, cl.effect + c * cl.se < allowed

    hits = sum(one(math.log1p(0.015), 4.0)[0] for _ in range(runs))
    assert hits / runs <= 0.01 + margin(0.01, runs)
    passed = sum(one(0.0, 4.0)[1] for _ in range(runs)) / runs
    passed_1df = sum(one(0.0, 0.0)[1] for _ in range(runs)) / runs
    assert passed > 0.85 and passed_1df < passed


def test_pass_side_spending_bounds_false_promotes():
    """Intersection-union: PROMOTE needs every test's passing end within its allowed effect, so a
    canary exactly at the allowed effect passes one test with probability <= that test's pass-side
    alpha (here 1%, spent linearly over 20 looks), whatever the other tests do."""
    rng = np.random.default_rng(5)
    runs, looks, alpha = 20000, 20, 0.01
    t = np.arange(1, looks + 1) / looks
    c = group_sequential_boundaries(Spending(alpha, 1.0, 1.0, 1.0), t.tolist(), t.tolist())
    paths = np.cumsum(rng.normal(0, 1, (runs, looks)), 1) / np.sqrt(np.arange(1, looks + 1))
    # effect - allowed = 0: the passing end effect + c se < allowed  <=>  z < -c
    rate = float(np.mean((paths < -c).any(1)))
    assert rate <= alpha + margin(alpha, runs)
    assert rate > alpha / 3  # the boundary spends its alpha, not far less


def test_single_baseline_node_uses_the_prior_and_says_so():
    data = fleet(n_c=2400, n_b=45_600, err_b=20)
    data.units = {"canary": 1, "baseline": 1}
    v = analyze(data)
    ttft = row(v, "ttft")
    assert "cannot estimate node-to-node variation" in ttft.assumption and "node_spread 1.5%" in ttft.assumption
    assert ttft.notes == ["node sd 1.5% used (the node_spread assumption carries 100% of the weight)"]
    loc = next(t for t in ttft.tests if t["test"] == "location")
    assert loc["node_tau_source"] == "prior" and loc["node_tau"] == pytest.approx(math.log1p(0.015))
    # said once: in the verdict's assumptions (one entry for every critical metric it applies to), not
    # in the reasons, and once in the text table
    assert len(v.assumptions) == 1 and v.assumptions[0].startswith("ttft, itl: 1 baseline and 1 canary instance(s)")
    assert not any("node_spread" in r for r in v.reasons)
    table = v.table()
    assert table.count(ttft.assumption) == 1 and "assumption: ttft, itl: 1 baseline and 1 canary" in table
    assert ttft.assumption not in v.table(assumptions=False)
    assert v.to_dict()["assumptions"] == v.assumptions


# ---- warm-up and outlook -------------------------------------------------------------------------
def test_warmup_excludes_the_start_of_the_stage():
    cfg = load_config().with_timing(warmup_s=60)
    assert cfg.warmup_s == 60
    v = analyze(fleet(), cfg, START, START + 30)
    assert v.verdict == "HOLD" and all("warm-up" in m.reason for m in v.metrics)
    with FakePrometheus(fleet()) as fp:
        Analyzer(PromClient(fp.url, retries=0), cfg, CANARY, BASELINE).analyze(START, END)
        queries = [r["params"]["query"][0] for r in fp.requests]
    # 300 s window minus 60 s of warm-up; the baseline-history queries (node spread only) end there too,
    # and the pre-stage ones (within-node design) are the node_history before the stage's start
    look = [q for q in queries if "increase" in q and "[2040s]" not in q and "[7200s]" not in q]
    assert look and all("[240s]" in q for q in look)
    assert all('track="baseline"' in q for q in queries if "[2040s]" in q or "[7200s]" in q)
    with pytest.raises(ConfigError, match="warmup"):
        load_config().with_timing(warmup_s=600)
    base = {"metrics": [{"name": "a", "kind": "histogram", "metric": "x", "allowed_effect": 0.1, "critical": True}]}
    assert parse_config({**base, "warmup": "90s"}).warmup_s == 90
    with pytest.raises(ConfigError, match="tests"):
        parse_config({"metrics": [{**base["metrics"][0], "tests": {"p100": 1}}]})


def test_node_history_config():
    base = {"metrics": [{"name": "a", "kind": "histogram", "metric": "x", "allowed_effect": 0.1, "critical": True}]}
    assert load_config().node_history_s == 1800
    assert parse_config(base).node_history_s == 1800
    assert parse_config({**base, "node_history": "1h"}).node_history_s == 3600
    assert parse_config({**base, "node_history": 0}).node_history_s == 0
    for bad in ("-5m", "soon", "8d", True):
        with pytest.raises(ConfigError, match="node_history"):
            parse_config({**base, "node_history": bad})
    with pytest.raises(ConfigError, match="node_history"):
        load_config().with_node_history(float("nan"))


def test_low_traffic_says_promote_is_out_of_reach_at_the_first_look():
    """5 req/s fleet, 5% canary: 0.25 canary req/s, 150 requests by the horizon; the error ratio
    alone needs several hundred."""
    data = fleet(n_c=120, n_b=2280, err_b=1, series=False)  # 8 minutes of a 5 req/s fleet
    v = analyze(data, start=START, end=START + 480)
    assert not v.promote_reachable and v.to_dict()["promote_reachable"] is False
    assert any("PROMOTE is out of reach" in r and "error_ratio" in r for r in v.reasons)
    healthy = analyze(fleet(n_c=2400, n_b=45_600, err_b=20))
    assert healthy.promote_reachable


def test_outlook_reads_the_canary_rate_over_its_data_window():
    """A canary first scraped 40 s before the look has its requests from data_start (26 s) on: the
    same 120 requests are a fast canary, not a 0.4 req/s one (that one is out of reach: above)."""
    data = fleet(n_c=120, n_b=2280, err_b=1, series=False)
    data.first_sample = {"canary": START + 260.0}
    v = analyze(data)
    assert row(v, "error_ratio").data_start == START + 274.0
    assert v.promote_reachable and not any("out of reach" in r for r in v.reasons)


def test_cli_warmup_flag_and_outlook_in_json(capsys):
    import json

    with FakePrometheus(fleet(n_c=120, n_b=2280, err_b=1, series=False)) as fp:
        code = cli(analyze_args(fp.url, "--warmup", "60s", "--json"))
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["warmup_s"] == 60 and doc["promote_reachable"] is False
    with FakePrometheus(fleet()) as fp:
        assert cli(analyze_args(fp.url, "--warmup", "soon")) == 2
    assert "--warmup" in capsys.readouterr().err


def test_noisy_nodes_count_their_effective_degrees_of_freedom():
    """19 baseline nodes whose own request noise equals their spread (3%: a few hundred requests per
    node, early in a stage) tell tau^2 with ~5 effective degrees of freedom, not 18 (Biggerstaff &
    Tweedie 1997). A one-sided 1% test on one canary node then keeps its level (+ margin); counting
    all 18 as if the nodes' means were exact rejects clearly more often on the same draws."""
    rng = np.random.default_rng(23)
    runs, k, sd_req, tau = 6000, 19, 0.03, 0.03
    assert effective_df(tau ** 2, k - 1, sd_req ** 2, 0.015 ** 2) == pytest.approx((k - 1) / 4)
    assert effective_df(0.0, k - 1, sd_req ** 2, 0.015 ** 2) == pytest.approx((k - 1) * (0.015 ** 2 / (
        0.015 ** 2 + sd_req ** 2)) ** 2)
    assert effective_df(math.nan, 0, 1.0, 0.0) == 0.0
    hits = naive = 0
    for _ in range(runs):
        nodes = rng.normal(0, tau, k + 1) + rng.normal(0, sd_req, k + 1)
        v = np.full(k, sd_req ** 2)
        cl = clustered(nodes[0] - nodes[1:].mean(), sd_req ** 2 * (1 + 1 / k), np.ones(1), np.full(k, 1 / k),
                       [(nodes[1:], v)], 0.015 ** 2, 4.0)
        c = 2.3263 if math.isinf(cl.df) else float(student_t.isf(0.01, cl.df))
        hits += cl.z >= c
        # the same comparison with the nodes' k - 1 degrees of freedom counted in full
        tau2_full, _ = moderated_tau2(dl_tau2(nodes[1:], v), k - 1, 0.015 ** 2, 4.0)
        tau2_full = max(tau2_full, dl_tau2(nodes[1:], v))
        var = sd_req ** 2 * (1 + 1 / k) + tau2_full * (1 + 1 / k)
        df_full = var * var / ((tau2_full * (1 + 1 / k)) ** 2 / (k - 1 + 4.0))
        naive += (nodes[0] - nodes[1:].mean()) / math.sqrt(var) >= float(student_t.isf(0.01, df_full))
    assert hits / runs <= 0.01 + margin(0.01, runs)
    assert naive > hits


def test_bound_at_clamps_a_tiny_share_over_a_shallow_tail_instead_of_overflowing():
    """``HistContext._bound_at`` extends the baseline's last survival segment past its last request.
    Over a nearly flat last segment a tiny share extrapolates to ``exp(>709)``: that raised
    OverflowError inside a look (the live rollout test's good release, CI of 2026-12-02). The reading
    is clamped to the layout's largest bound, in log space; shares inside the data still interpolate."""
    from gpuobs.canary.histstats import HistContext
    from gpuobs.canary.stats import bin_log_centres

    bounds = np.asarray(TTFT_BUCKETS, dtype=float)
    counts = np.zeros(bounds.size + 1)
    j05, j075 = list(bounds).index(0.5), list(bounds).index(0.75)
    counts[: j05 + 1] = 900.0 / (j05 + 1)   # 90% at or below 0.5 s
    counts[j05 + 1] = 1e-6                  # a nearly empty 0.5-0.75 s bucket: a flat last segment
    counts[j075 + 1] = 100.0                # 10% in 0.75-1.0 s, nothing above 1.0 s
    cb = counts[None, :]
    n = np.array([counts.sum()])
    ctx = HistContext(bounds, bin_log_centres(bounds), cb.copy(), cb, n, n, n, n, 0.015, 4.0)
    for share in (1e-12, 1e-300, 0.0):
        got = ctx._bound_at(share)
        assert math.isfinite(got) and got == pytest.approx(bounds[-1]), (share, got)
    # inside the data the reading inverts the baseline's survival
    for share in (0.5, 0.3, 0.15):
        assert ctx._share_above(ctx._bound_at(share)) == pytest.approx(share, rel=1e-9)


@pytest.mark.parametrize("nodes, prior", [(19, False), (9, True)])
def test_many_baseline_nodes_with_history_decide_the_spread_alone(nodes, prior):
    """With DATA_DECIDES_NODES (10) or more baseline nodes with history the node spread is the data's
    (no node_spread prior: its 4 df cost ~4 points of +10% power with 19 nodes); fewer keep the prior."""
    from gpuobs.canary.histstats import DATA_DECIDES_NODES, HistContext
    from gpuobs.canary.stats import bin_log_centres

    assert DATA_DECIDES_NODES == 10
    rng = np.random.default_rng(3)
    b = np.asarray(TTFT_BUCKETS)
    x = bin_log_centres(b)

    def counts(n, k):
        return np.array([binned(sample_ttft(rng, n), b)[1] for _ in range(k)])

    cc, cb = counts(1200, 1), counts(1200, nodes)
    hist_counts = counts(3600, nodes)
    m = (hist_counts * x).sum(1) / hist_counts.sum(1)
    history = (m, np.full(nodes, 0.36 / 3600), 1800.0)
    n_c, n_b = cc.sum(1), cb.sum(1)
    ctx = HistContext(b, x, cc, cb, n_c, n_b, n_c, n_b, math.log1p(0.015), 4.0, history)
    source = ctx.location_stat().tau2_source
    assert source.startswith(f"nodes with history, {nodes - 1} df") and ("prior" in source) == prior
