"""Upper bound on the power of any canary test on vLLM's TTFT buckets (issue 18's goals).

The most powerful test there can be of "healthy" against one fully known alternative (Neyman-Pearson
lemma) is the likelihood-ratio test. This oracle gives it everything a real judge lacks: the healthy
bucket probabilities exactly (an infinitely large baseline, no node spread), the alternative's exact
shape, a single look at the end (no alpha spent on earlier looks) and a chosen alpha. Counts are
multinomial over vLLM's TTFT buckets (``gpuobs.reference.buckets.TTFT_BUCKETS``) for ``n`` canary
requests; TTFT is the simulator's lognormal (median ``TTFT_MEDIAN_S``, sigma ``TTFT_SIGMA``) and the
shapes are the canary benchmark's (``bench/bench_canary.py``: the tail shape stretches latencies above
the healthy p90 so that p99 is +30%; uniform multiplies every latency).

A real judge's power on the same data is at most this. Run: ``python bench/canary_oracle.py``
(about a minute). Output: one line per shape, canary requests and alpha, with the oracle's power
estimated from 200,000 draws under the alternative (the critical value from 400,000 under healthy).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_canary import Q90, TAIL_K, Z90, Z99  # noqa: E402
from gpuobs.exporter.sim.latency import TTFT_MEDIAN_S, TTFT_SIGMA  # noqa: E402
from gpuobs.reference.buckets import TTFT_BUCKETS  # noqa: E402

BOUNDS = np.asarray(TTFT_BUCKETS, dtype=float)


def healthy_cdf(x: np.ndarray) -> np.ndarray:
    return norm.cdf(np.log(np.asarray(x, float) / TTFT_MEDIAN_S) / TTFT_SIGMA)


def tail_cdf(x: np.ndarray) -> np.ndarray:
    """Above Q90 a healthy latency y becomes Q90 (y/Q90)^TAIL_K; invert for the CDF."""
    return tail_stretch_cdf(TAIL_K)(x)


def tail_stretch_cdf(k: float) -> Callable[[np.ndarray], np.ndarray]:
    """The bench's tail shape with exponent ``k``: above Q90 a healthy latency y becomes
    Q90 (y/Q90)^k (median and p90 unchanged; in log latency the tail above p90 stays normal with its
    sd times ``k``, so the shape is inside the judge's binormal tail model)."""
    def cdf(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, float)
        return healthy_cdf(np.where(x > Q90, Q90 * (x / Q90) ** (1.0 / k), x))
    return cdf


def tail_k_for_p99(ratio: float) -> float:
    """Exponent of :func:`tail_stretch_cdf` that moves the healthy p99 by ``ratio`` (1.25 = +25%)."""
    return 1 + math.log(ratio) / (TTFT_SIGMA * (Z99 - Z90))


def uniform_cdf(factor: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: healthy_cdf(np.asarray(x, float) / factor)


def bucket_probs(cdf: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    return np.diff(np.concatenate(([0.0], cdf(BOUNDS), [1.0])))


def oracle_power(p: np.ndarray, q: np.ndarray, n: int, alpha: float, rng: np.random.Generator) -> float:
    """Power of the likelihood-ratio test of bucket probabilities ``p`` (healthy) against ``q`` at
    level ``alpha`` with ``n`` multinomial requests (Monte Carlo)."""
    ok = (p > 0) & (q > 0)
    w = np.zeros_like(p)
    w[ok] = np.log(q[ok] / p[ok])
    h0 = rng.multinomial(n, p, size=400_000) @ w
    h1 = rng.multinomial(n, q, size=200_000) @ w
    return float(np.mean(h1 > np.quantile(h0, 1.0 - alpha)))


def main() -> int:
    rng = np.random.default_rng(1)
    p = bucket_probs(healthy_cdf)
    shapes = {"tail: p99 +30%, median unchanged": tail_cdf, "+10% uniform": uniform_cdf(1.10)}
    print("Neyman-Pearson oracle on vLLM's TTFT buckets (known healthy and alternative, one look)")
    for name, cdf in shapes.items():
        q = bucket_probs(cdf)
        print(f"{name}: share above 1.0 s healthy {1 - healthy_cdf(np.array(1.0)):.4f}, "
              f"alternative {1 - cdf(np.array(1.0)):.4f}")
        for n in (600, 1140):
            for alpha in (0.01, 0.0089, 0.0045, 0.0027):
                print(f"  n={n:5d} canary requests, alpha={alpha:.4f}: power {oracle_power(p, q, n, alpha, rng):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _draw_counts(q: np.ndarray, p: np.ndarray, runs: int, looks: int, canary_per_look: float, baseline_ratio: float,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cumulative bucket counts by look of a canary drawn from bucket probabilities ``q`` (Poisson
    ``canary_per_look`` requests per look) and of a baseline drawn from ``p`` (``baseline_ratio`` x
    as many): ``(c, b, nc, nb)``, counts (runs, looks, buckets) and totals (runs, looks), ``nb`` >= 1."""
    n_c = rng.poisson(canary_per_look, size=(runs, looks))
    c = np.cumsum(np.stack([rng.multinomial(n, q) for n in n_c.ravel()]).reshape(runs, looks, -1), 1)
    n_b = rng.poisson(canary_per_look * baseline_ratio, size=(runs, looks))
    b = np.cumsum(np.stack([rng.multinomial(n, p) for n in n_b.ravel()]).reshape(runs, looks, -1), 1)
    return c, b, c.sum(-1), np.maximum(b.sum(-1), 1)


def _oracle_stats(cdf: Callable[[np.ndarray], np.ndarray], runs: int, looks: int, canary_per_look: float,
                  baseline_ratio: float, rng: np.random.Generator) -> list[np.ndarray]:
    """The two likelihood-ratio statistics (+10% uniform, tail stretch) per run and look, (runs, looks)
    each, under the canary distribution ``cdf`` (see :func:`joint_oracle`)."""
    p = bucket_probs(healthy_cdf)
    c, b, nc, nb = _draw_counts(bucket_probs(cdf), p, runs, looks, canary_per_look, baseline_ratio, rng)
    p_hat = b / nb[..., None]
    out = []
    for alt in (uniform_cdf(1.10), tail_cdf):
        qa = bucket_probs(alt)
        ok = (p > 0) & (qa > 0)
        w = np.zeros_like(p)
        w[ok] = np.log(qa[ok] / p[ok])
        mean_w = (p_hat * w).sum(-1)
        var_w = np.maximum((p_hat * w * w).sum(-1) - mean_w ** 2, 1e-12)
        out.append(((c * w).sum(-1) - nc * mean_w) / np.sqrt(np.maximum(nc, 1) * (1 + nc / nb) * var_w))
    return out


def _oracle_reject(stats: list[np.ndarray], alpha: float, looks: int, canary_per_look: float) -> np.ndarray:
    """Cumulative rejection share by look when each statistic gets ``alpha / 2`` with the judge's
    spending (location: ``spending``, tail: ``tail_spending``)."""
    from gpuobs.canary.config import load_config
    from gpuobs.canary.sequential import group_sequential_boundaries

    cfg = load_config()
    times = [(k + 1) / looks for k in range(looks)]
    infos = [canary_per_look * (k + 1) for k in range(looks)]
    rejected = np.zeros(stats[0].shape, dtype=bool)
    for t, spending in zip(stats, (cfg.spending, cfg.tail_spending or cfg.spending)):
        bound = group_sequential_boundaries(spending.with_alpha(alpha / 2), times, infos)
        rejected |= t >= bound[None, :]
    return np.cumsum(rejected, 1).astype(bool).mean(0)


def joint_oracle(cdfs: dict[str, Callable[[np.ndarray], np.ndarray]], runs: int = 4000, looks: int = 20,
                 canary_per_look: float = 60.0, baseline_ratio: float = 19.0, seed: int = 1,
                 alpha: float | None = None, null_runs: int = 20_000) -> dict[str, np.ndarray]:
    """Power by look of the joint oracle under each alternative of ``cdfs``: ``{name: (looks,) shares
    of runs rejected at or before each look}``, plus ``"null"`` (the healthy canary's rate, which the
    calibration sets to ``alpha`` by the last look).

    The oracle the issue-26 goals are measured against: the Neyman-Pearson likelihood-ratio statistics
    for the two shapes the bench regresses to (+10% uniform and the tail stretch, p99 +30%) computed
    on the canary's raw counts (every request from the stage's start: no first-scrape loss), each
    standardised against a finite baseline (``baseline_ratio`` x the canary's requests, its bucket
    shares estimated from its own draws: ``T = w.(c - n p_hat) / sqrt(n (1 + n/N) Var_p(w))``), each
    with its half of the stage's family-wise alpha less the error ratio's share (``alpha``; default
    from the packaged config) and its own group-sequential boundary with the judge's spending
    (location: ``spending``, tail: ``tail_spending``), looked at ``looks`` times at equal steps of
    ``canary_per_look`` Poisson canary requests; no node spread. It rejects when either statistic
    crosses. The tail statistic is skewed, so the normal boundaries let a healthy canary through at
    1.4% instead of 0.94%: the alpha given to the boundaries is calibrated by bisection on
    ``null_runs`` healthy runs so that the oracle's own false-rollback rate by the last look is
    ``alpha`` (an oracle above its level would inflate the bar). Same looks, alpha, data
    availability (minus the clamp), baseline size and bucket layout as the bench; what it knows and
    a judge cannot: the two alternatives' exact shapes."""
    from gpuobs.canary.config import load_config

    if alpha is None:
        cfg = load_config().select(["ttft", "error_ratio"])
        err = next(m for m in cfg.metrics if m.name == "error_ratio")
        alpha = cfg.alpha - cfg.metric_alpha(err)
    rng = np.random.default_rng(seed)
    null = _oracle_stats(healthy_cdf, null_runs, looks, canary_per_look, baseline_ratio, rng)
    lo, hi = alpha / 8, alpha
    for _ in range(14):
        mid = (lo * hi) ** 0.5
        if _oracle_reject(null, mid, looks, canary_per_look)[-1] > alpha:
            hi = mid
        else:
            lo = mid
    out = {"null": _oracle_reject(null, lo, looks, canary_per_look)}
    for name, cdf in cdfs.items():
        stats = _oracle_stats(cdf, runs, looks, canary_per_look, baseline_ratio, rng)
        out[name] = _oracle_reject(stats, lo, looks, canary_per_look)
    return out


def pass_oracle(runs: int = 20_000, looks: int = 20, canary_per_look: float = 60.0, baseline_ratio: float = 19.0,
                seed: int = 1, calibration_runs: int = 20_000) -> dict[str, np.ndarray]:
    """The pass side's limit (issue 26): the share of healthy canaries any judge with the packaged
    config's PROMOTE rule could promote by each look, ``{"promote": (looks,), "location": (looks,),
    "p99": (looks,)}`` (cumulative shares of healthy runs; the last two each test alone).

    PROMOTE needs every test's passing end within its allowed effect (docs/canary.md, section 5; an
    intersection-union test, each test at the stage's alpha with ``pass_spending``). Two of those
    margins bind: the location test's (the canary at ``allowed_effect`` = +10%, every latency x1.1)
    and the p99 test's (``quantile_allowed_effect`` = +25% on p99 with the median and p90 unchanged:
    :func:`tail_stretch_cdf`, a member of the judge's binormal tail model). For each margin the
    oracle knows the margin distribution exactly and runs the Neyman-Pearson test of it against the
    healthy one (the likelihood ratio on the canary's raw bucket counts from the stage's start,
    standardised under the margin distribution against a finite baseline of ``baseline_ratio`` x the
    canary's requests, as :func:`joint_oracle`), rejecting the margin (passing) when
    ``T <= -c_k`` with the pass spending's boundary on the judge's looks; each test's alpha is
    calibrated by bisection on ``calibration_runs`` canaries drawn at its margin so that its own
    chance of ever passing there is the stage alpha (its statistic is skewed, as the harm side's
    tail statistic is). A healthy run passes at the first look where both tests pass at that look.
    Testing one fully known margin shape is easier than testing every distribution at the margin,
    so no judge with these margins and this alpha promotes more often: the bar for "healthy
    promoted". What it does not require (p50, p90, spread and error ratio margins) only lowers a
    judge's rate further."""
    from gpuobs.canary.config import load_config
    from gpuobs.canary.sequential import group_sequential_boundaries

    cfg = load_config().select(["ttft", "error_ratio"])
    ttft = next(m for m in cfg.metrics if m.name == "ttft")
    margins = {"location": uniform_cdf(1 + ttft.allowed_effect),
               "p99": tail_stretch_cdf(tail_k_for_p99(1 + ttft.quantile_allowed_effect))}
    rng = np.random.default_rng(seed)
    p = bucket_probs(healthy_cdf)
    times = [(k + 1) / looks for k in range(looks)]
    infos = [canary_per_look * (k + 1) for k in range(looks)]

    def stats(canary_cdf, q: np.ndarray, n_runs: int) -> np.ndarray:
        c, b, nc, nb = _draw_counts(bucket_probs(canary_cdf), p, n_runs, looks, canary_per_look, baseline_ratio, rng)
        ok = (p > 0) & (q > 0)
        w = np.zeros_like(p)
        w[ok] = np.log(q[ok] / p[ok])
        shift = (q * w).sum() - (p * w).sum()  # E_q[w] - E_p[w]: known to the oracle
        mean_b = ((b / nb[..., None]) * w).sum(-1)
        var_q = (q * w * w).sum() - (q * w).sum() ** 2
        var_p = (p * w * w).sum() - (p * w).sum() ** 2
        sd = np.sqrt(np.maximum(nc, 1) * var_q + nc ** 2 / nb * var_p)
        return ((c * w).sum(-1) - nc * (mean_b + shift)) / sd

    def passed(t: np.ndarray, alpha: float) -> np.ndarray:
        bound = group_sequential_boundaries(cfg.pass_spending.with_alpha(alpha), times, infos)
        return t <= -bound[None, :]

    out: dict[str, np.ndarray] = {}
    each = []
    for name, margin in margins.items():
        q = bucket_probs(margin)
        at_margin = stats(margin, q, calibration_runs)
        lo, hi = cfg.alpha / 8, min(2 * cfg.alpha, 0.49)
        for _ in range(14):
            mid = (lo * hi) ** 0.5
            if np.cumsum(passed(at_margin, mid), 1).astype(bool).mean(0)[-1] > cfg.alpha:
                hi = mid
            else:
                lo = mid
        ok = passed(stats(healthy_cdf, q, runs), lo)
        out[name] = np.cumsum(ok, 1).astype(bool).mean(0)
        each.append(ok)
    out["promote"] = np.cumsum(np.logical_and(*each), 1).astype(bool).mean(0)
    return out
