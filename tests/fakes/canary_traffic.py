"""A time-dependent Prometheus responder for controller-semantics tests of ``gpuobs canary serve``.

:class:`Traffic` draws requests second by second (Poisson arrivals, latencies from the simulator's
model :mod:`gpuobs.exporter.sim.latency`) for the ``track="canary"`` and ``track="baseline"`` sides,
and answers the analyzer's instant queries (``sum by (le) (increase(<h>_bucket{...}[Ws]))``,
``sum(increase(<h>_count{...}[Ws]))``, ``sum(increase(vllm:request_success_total{...}[Ws]))`` with an
optional ``finished_reason`` matcher) at the query's ``time`` over exactly the requests of the
window, as Prometheus would (without extrapolation); the analyzer's first-sample query
(``min(min_over_time(timestamp(...)[r:s]))``) with ``first_sample``: by default an hour before ``t0``
(the series exist, without traffic, before the simulated clock starts); ``first_sample=t0`` models
series born at ``t0`` (a fresh canary and baseline). ``query_range`` answers an empty matrix (the
time-series metrics are advisory in the default config and show NoData).

The canary's share of traffic is ``share(t)`` (a controller's traffic weight; Flagger tests change it
as the canary progresses) and starts at ``canary_from`` (late traffic); ``tracks`` maps a label matcher
found in a query to its track; ``fault(t)`` returns None,
"down" (503), "garbage" (200 with a non-JSON body) or "slow" (sleeps ``slow_s`` real seconds first).
"""

from __future__ import annotations

import math
import re
import threading
import time
from typing import Any, Callable

import numpy as np

from gpuobs.exporter.sim.latency import sample_itl, sample_ttft
from gpuobs.reference.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from tests.fakes.prometheus import matrix, ok, vector

TOKENS_PER_REQUEST = 8
_WINDOW = re.compile(r"\[(\d+)s\]")
_METRIC = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")
HISTS = {"vllm:time_to_first_token_seconds": TTFT_BUCKETS, "vllm:inter_token_latency_seconds": ITL_BUCKETS,
         "vllm:e2e_request_latency_seconds": REQUEST_LATENCY_BUCKETS}


class Traffic:
    """Per-second request counts of both tracks, generated lazily up to the latest queried second.

    ``rate``: requests/s of the whole service; ``share(t)``: the canary's fraction at sim time t;
    ``ttft_mult``: the canary's TTFT multiplier (1.3 = +30%); ``err``: error probability per request
    (``err_canary`` for the canary). Times are the simulated clock's unix seconds from ``t0``.
    """

    def __init__(self, t0: float, seed: int = 7, rate: float = 40.0, share: Callable[[float], float] = lambda t: 0.1,
                 ttft_mult: float = 1.0, err: float = 0.001, err_canary: float | None = None,
                 canary_from: float | None = None, fault: Callable[[float], str | None] = lambda t: None,
                 slow_s: float = 2.0, tracks: dict[str, str] | None = None, first_sample: float | None = None):
        self.t0, self.rate, self.share, self.ttft_mult = float(t0), rate, share, ttft_mult
        self.first_sample = self.t0 - 3600.0 if first_sample is None else float(first_sample)
        self.err, self.err_canary = err, err if err_canary is None else err_canary
        self.canary_from = t0 if canary_from is None else canary_from
        self.fault, self.slow_s = fault, slow_s
        self.tracks = tracks or {'track="canary"': "canary", 'track="baseline"': "baseline"}
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        # cumulative counts per track: hist name -> (seconds+1, buckets+1); "requests"/"errors" -> (seconds+1,)
        self.cum: dict[str, dict[str, np.ndarray]] = {
            track: {**{h: np.zeros((1, len(b) + 1)) for h, b in HISTS.items()},
                    "requests": np.zeros(1), "errors": np.zeros(1)} for track in ("canary", "baseline")}
        self.queries = 0

    # ---- generation ---------------------------------------------------------------------------
    def _extend(self, upto: int) -> None:
        """Generate seconds [generated, upto) (second i covers [t0 + i, t0 + i + 1))."""
        have = len(self.cum["canary"]["requests"]) - 1
        if upto <= have:
            return
        secs = np.arange(have, upto)
        t = self.t0 + secs
        share = np.array([min(max(self.share(float(x)), 0.0), 1.0) for x in t])
        on = t >= self.canary_from
        for track, lam, mult, p_err in (("canary", self.rate * share * on, self.ttft_mult, self.err_canary),
                                        ("baseline", self.rate * (1 - share * on), 1.0, self.err)):
            n = self.rng.poisson(lam)
            idx = np.repeat(np.arange(len(secs)), n)
            total = int(n.sum())
            ttft = sample_ttft(self.rng, total, mult)
            draws = {"vllm:time_to_first_token_seconds": (ttft, idx),
                     "vllm:inter_token_latency_seconds": (sample_itl(self.rng, total * TOKENS_PER_REQUEST),
                                                          np.repeat(idx, TOKENS_PER_REQUEST)),
                     "vllm:e2e_request_latency_seconds": (ttft + self.rng.lognormal(1.0, 0.5, total), idx)}
            c = self.cum[track]
            for h, (x, where) in draws.items():
                b = np.asarray(HISTS[h])
                bucket = np.searchsorted(b, x, side="left")
                per = np.zeros((len(secs), b.size + 1))
                np.add.at(per, (where, bucket), 1.0)
                c[h] = np.vstack([c[h], c[h][-1] + np.cumsum(per, axis=0)])
            errs = np.bincount(idx[self.rng.random(total) < p_err], minlength=len(secs)).astype(float)
            c["requests"] = np.concatenate([c["requests"], c["requests"][-1] + np.cumsum(n)])
            c["errors"] = np.concatenate([c["errors"], c["errors"][-1] + np.cumsum(errs)])

    def _delta(self, track: str, name: str, at: float, window: float) -> np.ndarray:
        hi = max(0, int(math.floor(at - self.t0)))
        lo = max(0, int(math.floor(at - window - self.t0)))
        self._extend(hi)
        arr = self.cum[track][name]
        return arr[hi] - arr[lo]

    # ---- responder ----------------------------------------------------------------------------
    def __call__(self, endpoint: str, params: dict[str, list[str]]) -> tuple[int, Any]:
        at = float(params.get("time", params.get("end", ["0"]))[0])
        kind = self.fault(at)
        if kind == "down":
            return 503, {"status": "error", "errorType": "unavailable", "error": "fake: down"}
        if kind == "garbage":
            return 200, b"<html>proxy error</html>"
        if kind == "slow":
            time.sleep(self.slow_s)
        with self.lock:
            self.queries += 1
            return self._answer(endpoint, params, at)

    def _answer(self, endpoint: str, params: dict[str, list[str]], at: float) -> tuple[int, Any]:
        if endpoint == "query_range":
            return ok(matrix([]))
        q = params["query"][0]
        track = next((t for matcher, t in self.tracks.items() if matcher in q), None)
        if q.startswith("min(min_over_time(timestamp(") and track is not None:
            return ok(vector([({}, self.first_sample)], at))
        window_m = _WINDOW.search(q)
        if track is None or not window_m:
            return ok(vector([]))
        window = float(window_m.group(1))
        metric = _METRIC.search(q).group(1)
        base = metric.removesuffix("_bucket").removesuffix("_count")
        if base in HISTS:
            counts = self._delta(track, base, at, window)
            if counts.sum() <= 0:
                return ok(vector([], at))
            if metric.endswith("_count"):
                return ok(vector([({}, float(counts.sum()))], at))
            les = [repr(float(b)) for b in HISTS[base]] + ["+Inf"]
            return ok(vector([({"le": le}, float(c)) for le, c in zip(les, np.cumsum(counts))], at))
        if metric == "vllm:request_success_total":
            name = "errors" if 'finished_reason="error"' in q else "requests"
            total = float(self._delta(track, "requests", at, window))
            if total <= 0:
                return ok(vector([], at))
            return ok(vector([({}, float(self._delta(track, name, at, window)))], at))
        return ok(vector([], at))
