"""Request-level latency model of the simulated serving engine (vLLM-like), shared by the simulator
and by the canary benchmark so both draw from the same distributions.

Healthy latencies are heavy-tailed (lognormal), as measured serving latencies are:

* TTFT (prefill + scheduling): lognormal, median 0.25 s, sigma 0.6 at full SM clock and an empty
  queue. Prefill is compute-bound, so TTFT scales with ``max_clock / sm_clock``.
* ITL (one decode step): lognormal, median 20 ms, sigma 0.3; decode is memory-bound, so it scales
  with the clock only by half as much.

``multiplier`` carries everything else that stretches a request: the deployed release's behaviour
profile (e.g. ``ttft_multiplier: 1.2``), KV-cache pressure, or a regression injected by a benchmark.
"""

from __future__ import annotations

import numpy as np

TTFT_MEDIAN_S = 0.25
TTFT_SIGMA = 0.6
ITL_MEDIAN_S = 0.020
ITL_SIGMA = 0.3


def sample_ttft(rng: np.random.Generator, n: int, multiplier: float = 1.0, clock_ratio: float = 1.0) -> np.ndarray:
    """``n`` TTFT samples in seconds. ``clock_ratio`` = current SM clock / max clock (0 < r <= 1)."""
    scale = TTFT_MEDIAN_S * multiplier / max(clock_ratio, 1e-3)
    return scale * rng.lognormal(0.0, TTFT_SIGMA, n)


def sample_itl(rng: np.random.Generator, n: int, multiplier: float = 1.0, clock_ratio: float = 1.0) -> np.ndarray:
    """``n`` inter-token latencies in seconds (memory-bound decode: half the clock sensitivity)."""
    slow = 1.0 + 0.5 * (1.0 / max(clock_ratio, 1e-3) - 1.0)
    return ITL_MEDIAN_S * multiplier * slow * rng.lognormal(0.0, ITL_SIGMA, n)
