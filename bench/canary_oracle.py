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

import sys
from pathlib import Path
from typing import Callable

import numpy as np
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_canary import Q90, TAIL_K  # noqa: E402
from gpuobs.exporter.sim.latency import TTFT_MEDIAN_S, TTFT_SIGMA  # noqa: E402
from gpuobs.reference.buckets import TTFT_BUCKETS  # noqa: E402

BOUNDS = np.asarray(TTFT_BUCKETS, dtype=float)


def healthy_cdf(x: np.ndarray) -> np.ndarray:
    return norm.cdf(np.log(np.asarray(x, float) / TTFT_MEDIAN_S) / TTFT_SIGMA)


def tail_cdf(x: np.ndarray) -> np.ndarray:
    """Above Q90 a healthy latency y becomes Q90 (y/Q90)^TAIL_K; invert for the CDF."""
    x = np.asarray(x, float)
    return healthy_cdf(np.where(x > Q90, Q90 * (x / Q90) ** (1.0 / TAIL_K), x))


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
