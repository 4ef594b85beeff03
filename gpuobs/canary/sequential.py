"""Error control for a canary that is looked at every interval (pure numpy/scipy).

Why not a fixed-sample test at every look: a 98% Mann-Whitney test (Kayenta) or a fixed threshold
repeated at 20 looks rolls back a healthy canary far more often than its nominal 2%, because each
look is another chance for noise to cross the line (Armitage, McPherson & Rowe 1969, "Repeated
significance tests on accumulating data", JRSS A 132; Johari et al. 2017, "Peeking at A/B tests",
KDD). Two families of methods keep the error rate at alpha however many looks are taken:

1. **Group-sequential alpha spending** (Lan & DeMets 1983, "Discrete sequential boundaries for
   clinical trials", Biometrika 70): the test statistic of look k is compared with a boundary c_k
   chosen so that the probability of *ever* crossing, under no difference, is at most alpha(t_k),
   a pre-declared spending function of the time fraction t_k = elapsed / horizon. Boundaries follow
   from the joint normal law of the z statistics (corr(Z_j, Z_k) = sqrt(I_j / I_k), I = information),
   computed by the recursive numerical integration of Armitage et al. / Jennison & Turnbull 2000,
   "Group Sequential Methods with Applications to Clinical Trials", ch. 19. Looks need not be
   planned: unplanned or skipped looks only change which boundary applies (Lan & DeMets).
   ``effect +- c_k * se`` is a *repeated confidence interval* (Jennison & Turnbull 1989, JRSS B 51):
   the intervals of all looks hold simultaneously with probability >= 1 - 2 alpha.
2. **Anytime-valid e-processes** (Ville 1939; Robbins 1970 mixtures; Howard, Ramdas, McAuliffe &
   Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann. Statist. 49):
   a nonnegative supermartingale under the null; P(ever >= 1/alpha) <= alpha with no horizon at all.

Choice: latency (binned histograms, thousands of requests, CLT holds) uses (1). It exploits the
known stage horizon and the discreteness of the looks; a normal-mixture confidence sequence (the
mSPRT of Johari et al.) needs a z of about 3.4 at alpha = 1% for every look, against about 2.6-3.1
for the spending boundary over 20 looks. At 60 canary requests per interval that is the difference
between catching a +10% TTFT regression by the 10th interval in 83% or in 57% of runs (both
measured on the same runs in bench/bench_canary.py). A canary stage always has a deadline, so the
horizon costs nothing. Error counts (rare events: 0-10 errors per window, where the CLT fails) use
(2): an exact conditional-binomial likelihood-ratio mixture that needs no normal approximation and
no horizon.

Spending function (:class:`Spending`): ``main_share`` of alpha is spent over the first ``main_until``
of the horizon as ``(t/main_until)**rho`` (Kim & DeMets 1987 power family; rho >= 2 is
O'Brien-Fleming-like: little alpha on the first, noisiest looks, where only a large regression can be
seen anyway), the rest linearly over the whole horizon as a reserve for a stage that runs long. The
defaults (0.5, 0.85, 3) aim the test at "decide within half the stage": of the shapes compared at the
same alpha (power family rho 0.75-1.5, Hwang-Shih-DeCani gamma -2..4, this two-phase family) they gave
the highest chance of catching a +10% regression by mid-horizon while keeping >= 95% power at the
horizon. After the horizon nothing is left: the analysis is final. Since issue 18 the packaged
config spends the location tests' alpha with main_share 0.9, and the quantile and spread tests'
alpha with ``tail_spending`` = (t)^5 over the whole horizon: each test of a metric has its own
boundary at its share of the metric's alpha (weighted Bonferroni across tests, Jennison & Turnbull
2000 ch. 15), so the metric's family-wise error over all tests and looks stays at its alpha. The
passing end of each test (PROMOTE) has a second boundary on the same looks, ``pass_spending``
(linear) at the stage alpha: PROMOTE needs every test to pass, an intersection-union test whose
error needs no split (docs/canary.md, section 5).
"""

from __future__ import annotations

import collections
import functools
import math
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.special import logsumexp
from scipy.stats import norm

# Grid of the recursive integration (z scale). H = 0.02 reproduces single-look quantiles to 1e-4.
Z_LO, Z_HI, H = -8.0, 10.0, 0.02
# Half-width of the propagation kernel's band, in kernel sd (exp(-0.5 x 9^2) ~ 3e-18 of the peak).
KERNEL_HALF_WIDTH_SD = 9.0
# A look whose information grew less than this factor since the last tested look is a repeat of it.
MIN_INFO_GROWTH = 1.02
# Most looks a stateless caller's plan may hold (one per interval over the window); a window with
# more is refused (ValueError) rather than planned: each look costs one propagation on the grid.
MAX_PLANNED_LOOKS = 2000
# Boundary schedules longer than this are computed but not cached, so the cache stays small
# (at most _CACHE_SIZE entries of at most _MAX_CACHED_LOOKS floats each: ~16 MiB at worst). A stateless
# stage of K looks needs one entry per look and per (test, side) spending: the packaged config has
# ~18 of them (ttft 5 tests and itl 4, harm and pass side), so a 40-look stage needs ~720 entries; at
# 256 the cache thrashed and every look recomputed every schedule (35x slower looks at 40 looks).
_MAX_CACHED_LOOKS = 512
_CACHE_SIZE = 4096
# Alternatives of the error-count mixtures: rate ratios canary/baseline (uniform weights).
RATE_RATIOS = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0)


@dataclass(frozen=True)
class Spending:
    """Cumulative alpha spent by time fraction t (see the module docstring).

    Raises ValueError unless 0 < alpha < 0.5, 0 < main_until <= 1, 0 <= main_share <= 1, rho > 0.
    """

    alpha: float
    main_until: float = 0.5
    main_share: float = 0.85
    rho: float = 3.0

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 0.5 and 0 < self.main_until <= 1 and 0 <= self.main_share <= 1 and self.rho > 0):
            raise ValueError(f"bad spending parameters: {self}")

    def cumulative(self, t: float) -> float:
        """alpha(t) for t >= 0 (time fraction of the horizon); alpha(t) = alpha for t >= 1."""
        t = max(0.0, float(t))
        main = min(1.0, t / self.main_until) ** self.rho
        return self.alpha * (self.main_share * main + (1.0 - self.main_share) * min(1.0, t))

    def with_alpha(self, alpha: float) -> "Spending":
        """The same shape with another total alpha (per-metric split of a family-wise alpha)."""
        return Spending(alpha, self.main_until, self.main_share, self.rho)


def group_sequential_boundaries(spending: Spending, times: Sequence[float], infos: Sequence[float]) -> np.ndarray:
    """One-sided upper boundaries (z scale) for tested looks at ``times`` with ``infos``.

    ``times``: non-decreasing time fractions of the horizon; ``infos``: statistical information of
    each look (any positive scale; only ratios matter). Returns ``c`` with ``P(Z_j >= c_j`` for some
    ``j <= k) <= spending.cumulative(times[k])`` under no difference; ``inf`` where no alpha is left.
    A look whose information grew by less than :data:`MIN_INFO_GROWTH` repeats the previous boundary.
    Results are cached on rounded inputs (the analyzer recomputes the same schedule at every look) for
    schedules of up to ``_MAX_CACHED_LOOKS`` looks, at most ``_CACHE_SIZE`` of them.
    Raises ValueError on empty or mismatched inputs, non-finite values or non-positive information.
    """
    if len(times) != len(infos) or not times:
        raise ValueError("times and infos must be non-empty and of equal length")
    if min(infos) <= 0:
        raise ValueError("information must be positive")
    if not (all(math.isfinite(float(t)) for t in times) and all(math.isfinite(float(i)) for i in infos)):
        raise ValueError("times and infos must be finite")
    first = float(infos[0])
    # information relative to the first look's: a look's boundary depends only on the looks up to it,
    # so every look of a stage extends the previous look's key (the prefix cache below reuses its state)
    key_t = tuple(round(float(t), 4) for t in times)
    key_i = tuple(round(float(i) / first, 4) for i in infos)
    if len(key_t) > _MAX_CACHED_LOOKS:
        return np.array(_boundaries.__wrapped__(spending, key_t, key_i))
    return np.array(_boundaries(spending, key_t, key_i))


# The recursion's state after each look of a schedule, keyed on the schedule up to that look: the next
# look of the same stage (the analyzer recomputes the whole schedule at every look) starts from it and
# propagates once instead of once per earlier look (look 20 of a run in serve: ~1.5 s of CPU -> ~0.1 s).
# At most _STATE_CACHE_SIZE states of ~7 KiB (the grid's density): ~14 MiB.
_STATE_CACHE_SIZE = 2048
_states: collections.OrderedDict = collections.OrderedDict()
_states_lock = threading.Lock()


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _boundaries(spending: Spending, times: tuple[float, ...], infos: tuple[float, ...]) -> tuple[float, ...]:
    z = np.arange(Z_LO, Z_HI + H / 2, H)
    out: list[float] = []
    g: np.ndarray | None = None  # density of Z at the last tested look, on paths not yet stopped
    spent, prev_c, prev_i = 0.0, math.inf, 0.0
    done = 0
    with _states_lock:
        for k in range(len(times), 0, -1):
            state = _states.get((spending, times[:k], infos[:k]))
            if state is not None:
                _states.move_to_end((spending, times[:k], infos[:k]))
                g, spent, prev_c, prev_i, prefix = state
                out, done = list(prefix), k
                break
    for k in range(done, len(times)):
        t, info = times[k], infos[k]
        if g is None:
            g = norm.pdf(z)
        elif info < prev_i * MIN_INFO_GROWTH:
            out.append(prev_c)
            continue
        else:
            g = _propagate(z, g, prev_c, prev_i, info)
        target = spending.cumulative(t) - spent
        c, mass = _upper_quantile(z, g, target)
        spent += mass
        out.append(c)
        prev_c, prev_i = c, info
        with _states_lock:
            _states[(spending, times[:k + 1], infos[:k + 1])] = (g, spent, prev_c, prev_i, tuple(out))
            while len(_states) > _STATE_CACHE_SIZE:
                _states.popitem(last=False)
    return tuple(out)


def _propagate(z: np.ndarray, g: np.ndarray, c: float, i_prev: float, i_new: float) -> np.ndarray:
    """Density of Z_new on ``z`` from the sub-density ``g`` of Z_prev restricted to Z_prev < c.

    ``Z_new = r Z_prev + sd E`` with ``r = sqrt(i_prev / i_new)``, ``sd = sqrt(1 - r^2)``. The kernel is
    banded: each node reaches only the grid points within :data:`KERNEL_HALF_WIDTH_SD` sd of
    ``r u`` (the normal density beyond is below 1e-17 of its peak). Between consecutive looks of a
    20-look stage sd is about 0.22, so a node touches ~200 of the 901 grid points instead of all:
    the recursion, most of a look's time, runs about 7x faster (1.5 ms against 11 ms per
    propagation here; the unit test holds it equal to the dense kernel within 1e-12).
    """
    keep = z < c
    u, gu = z[keep], g[keep]
    if math.isfinite(c) and u.size and c > u[-1]:
        u = np.append(u, c)
        gu = np.append(gu, np.interp(c, z, g))
    if u.size < 2:
        return np.zeros_like(z)
    w = np.zeros(u.size)  # trapezoid weights on the (possibly non-uniform) nodes
    w[:-1] += np.diff(u) / 2
    w[1:] += np.diff(u) / 2
    sd = math.sqrt((i_new - i_prev) / i_new)
    r = math.sqrt(i_prev / i_new)
    wg = w * gu
    n, z0, h = z.size, float(z[0]), float(z[1] - z[0])
    centre = r * u
    half = KERNEL_HALF_WIDTH_SD * sd
    first = np.clip(np.floor((centre - half - z0) / h).astype(np.int64), 0, n - 1)
    last = np.clip(np.ceil((centre + half - z0) / h).astype(np.int64), 0, n - 1)
    width = int((last - first).max()) + 1
    norm_c = 1.0 / (sd * math.sqrt(2.0 * math.pi))
    if width * 2 > n:  # a wide kernel (early looks): the dense product is as fast
        # the normal density written out: scipy's norm.pdf costs 3x more on this (nodes x grid) array
        x = (z[None, :] - centre[:, None]) / sd
        return wg @ (np.exp(-0.5 * x * x) * norm_c)
    idx = first[:, None] + np.arange(width)[None, :]
    inside = idx <= last[:, None]
    idx = np.minimum(idx, n - 1)
    x = (z[idx] - centre[:, None]) / sd
    vals = np.exp(-0.5 * x * x) * (wg[:, None] * norm_c)
    return np.bincount(idx[inside], weights=vals[inside], minlength=n)


def _upper_quantile(z: np.ndarray, g: np.ndarray, target: float) -> tuple[float, float]:
    """Smallest c with mass of g above c <= target; returns (c, mass above c). inf if target <= 0."""
    if target <= 1e-12:
        return math.inf, 0.0
    seg = (g[1:] + g[:-1]) / 2 * H
    tail = np.concatenate((np.cumsum(seg[::-1])[::-1], [0.0]))  # tail[i] = mass above z[i]
    if tail[0] <= target:
        return float(z[0]), float(tail[0])
    i = int(np.searchsorted(-tail, -target))  # first index with tail <= target
    t0, t1 = tail[i - 1], tail[i]
    frac = (t0 - target) / (t0 - t1) if t0 > t1 else 0.0
    return float(z[i - 1] + frac * H), float(target)


def planned_looks(elapsed: float, interval: float, horizon: float, n_now: float, min_n: float,
                  info_now: float) -> tuple[list[float], list[float]]:
    """Reconstruct the looks of a caller that keeps no state: one every ``interval`` seconds.

    Assumes steady traffic, so a past look at time s had ``n_now * s / elapsed`` samples and
    information ``info_now * s / elapsed``; past looks below ``min_n`` samples were not tested.
    Returns (time fractions, informations), the current look last: O(looks) time and memory. Raises
    ValueError unless elapsed, interval and horizon are positive and finite, or when the window holds
    more than :data:`MAX_PLANNED_LOOKS` looks (a window far longer than the horizon).
    """
    if not all(math.isfinite(v) and v > 0 for v in (elapsed, interval, horizon)):
        raise ValueError("elapsed, interval and horizon must be positive and finite")
    if elapsed / interval > MAX_PLANNED_LOOKS:
        raise ValueError(f"the window ({elapsed:.0f} s) holds {elapsed / interval:.0f} looks of {interval:g} s; "
                         f"at most {MAX_PLANNED_LOOKS} can be planned: analyse a shorter window")
    times, infos = [], []
    j = 1
    while j * interval < elapsed * (1 - 1e-9):
        share = j * interval / elapsed
        if n_now * share >= min_n:
            times.append(j * interval / horizon)
            infos.append(info_now * share)
        j += 1
    times.append(elapsed / horizon)
    infos.append(info_now)
    return times, infos


# ---- error counts: exact likelihood-ratio mixtures ----------------------------------------------
def _log_binomial_mixture(x: np.ndarray, n: np.ndarray, p0: np.ndarray, p_alt: np.ndarray) -> np.ndarray:
    """log of the mean over alternatives ``p_alt (..., J)`` of the binomial likelihood ratio vs ``p0``."""
    x, n, p0 = (np.asarray(a, dtype=float)[..., None] for a in (x, n, p0))
    with np.errstate(divide="ignore", invalid="ignore"):
        llr = x * (np.log(p_alt) - np.log(p0)) + (n - x) * (np.log1p(-p_alt) - np.log1p(-p0))
    llr = np.where(np.isnan(llr), 0.0, llr)
    return logsumexp(llr, axis=-1) - math.log(p_alt.shape[-1])


def _share(ratio: np.ndarray, n_c: np.ndarray, n_b: np.ndarray) -> np.ndarray:
    """Probability that an error is the canary's when its rate is ``ratio`` times the baseline's."""
    return ratio * n_c / (ratio * n_c + n_b)


def rate_ratio_log_evalue(e_c: np.ndarray, n_c: np.ndarray, e_b: np.ndarray, n_b: np.ndarray,
                          r0: float | np.ndarray = 1.0, upper: bool = True) -> np.ndarray:
    """log e-value against "canary error rate <= r0 x baseline's" (``upper=False``: ">= r0 x").

    Conditional on the total number of errors, each error is the canary's with probability
    ``r n_c / (r n_c + n_b)`` (the exact conditional test of two Poisson rates, Przyborowski &
    Wilenski 1940). The mixture of likelihood ratios over :data:`RATE_RATIOS` alternatives is a
    nonnegative supermartingale under the null, so P(ever >= 1/alpha) <= alpha (Ville's inequality)
    at any number of looks. ``n_c``, ``n_b`` are cumulative request counts; their ratio is assumed
    steady over the window (a constant canary traffic share).
    """
    r0 = np.asarray(r0, dtype=float)
    p0 = _share(r0, np.asarray(n_c, float), np.asarray(n_b, float))
    grid = np.asarray(RATE_RATIOS)
    alt_r = r0[..., None] * (grid if upper else 1.0 / grid)
    p_alt = _share(alt_r, np.asarray(n_c, float)[..., None], np.asarray(n_b, float)[..., None])
    return _log_binomial_mixture(e_c, np.asarray(e_c, float) + np.asarray(e_b, float), p0, p_alt)


def rate_ratio_interval(e_c: float, n_c: float, e_b: float, n_b: float, alpha: float) -> tuple[float, float]:
    """Anytime-valid interval for the error-rate ratio canary/baseline (each side at ``alpha``).

    Inverts :func:`rate_ratio_log_evalue` on a log grid from 1e-3 to 1e4; returns (0, inf) for an
    end the data cannot bound (e.g. no errors at all).
    """
    grid = np.logspace(-3, 4, 561)
    thr = math.log(1 / alpha)
    up = rate_ratio_log_evalue(e_c, n_c, e_b, n_b, grid, upper=True) < thr
    down = rate_ratio_log_evalue(e_c, n_c, e_b, n_b, grid, upper=False) < thr
    inside = up & down
    if not inside.any():
        return (math.nan, math.nan)
    lo = grid[np.argmax(inside)]
    hi = grid[len(grid) - 1 - np.argmax(inside[::-1])]
    return (0.0 if lo == grid[0] else float(lo), math.inf if hi == grid[-1] else float(hi))


def binomial_upper_bound(x: np.ndarray, n: np.ndarray, alpha: float) -> np.ndarray:
    """Anytime-valid upper confidence bound for a proportion from ``x`` events in ``n`` trials.

    The largest p0 not rejected by the e-process of "p >= p0" against alternatives p0/r, r in
    :data:`RATE_RATIOS` (vectorised bisection on log p0). With x = 0 it is about
    (log(1/alpha) + log(len(RATE_RATIOS))) / n. NaN where n = 0.
    """
    x = np.asarray(x, dtype=float)
    n = np.asarray(n, dtype=float)
    thr = math.log(1 / alpha)
    grid = 1.0 / np.asarray(RATE_RATIOS)
    with np.errstate(divide="ignore", invalid="ignore"):
        phat = np.where(n > 0, x / n, np.nan)
    lo = np.log(np.clip(phat, 1e-12, 1 - 1e-9))
    hi = np.full(np.shape(lo), math.log(1 - 1e-9))
    for _ in range(48):
        mid = (lo + hi) / 2
        p0 = np.exp(mid)
        rejected = _log_binomial_mixture(x, n, p0, p0[..., None] * grid) >= thr
        hi = np.where(rejected, mid, hi)
        lo = np.where(rejected, lo, mid)
    return np.where(n > 0, np.exp(hi), np.nan)
