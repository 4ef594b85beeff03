"""A time-dependent Prometheus responder for controller-semantics tests of ``gpuobs canary serve``.

:class:`Traffic` draws requests second by second (Poisson arrivals, latencies from the simulator's
model :mod:`gpuobs.exporter.sim.latency`) for the ``track="canary"`` and ``track="baseline"`` sides,
each served by its own pods (``pods``: one canary pod and nine baseline pods by default, a 10-replica
Deployment at a 10% canary weight, each pod at the simulated engine's 4 req/s), and stores what Prometheus would: every pod is scraped every
``scrape_s`` seconds at its own phase, and each scrape keeps the pod's cumulative ``_bucket`` /
``_count`` counters and ``request_success_total`` (all reasons / ``finished_reason="error"``), with an
``instance`` label per pod (Prometheus attaches it to every scraped series). It answers the analyzer's
instant queries at the query's ``time`` with Prometheus 2.42's ``increase()`` (extrapolation at the
window's edges; :func:`tests.fakes.prom_fleet.increase`, checked against promtool in
tests/canary/test_prom_fleet.py): ``sum by (le[, instance]) (increase(<h>_bucket{...}[Ws]))``,
``sum [by (instance)] (increase(<h>_count{...}[Ws]))``, ``sum(increase(vllm:request_success_total{...}[Ws]))``
with an optional ``finished_reason`` matcher, and ``min(count_over_time(<counter>{...}[Ws]))`` (the
fewest scrapes of any of the track's series in the window). A track without requests in the window
answers an empty vector (no data). ``query_range`` answers an empty matrix (the time-series metrics
are advisory in the default config and show NoData).

Why several baseline pods: the analyzer (issue 18) treats the serving pod as the unit that varies and
estimates the between-pod variation from the pods; with one or two baseline pods it leans on the
assumed spread (``node_spread``, ``node_spread_df``), and a realistic fleet of pods lets the data
decide, as in production.

The analyzer's first-sample query (``min(min_over_time(timestamp(...)[r:s]))``) is answered with
``first_sample``: by default an hour before ``t0`` (the series exist, without traffic, before the
simulated clock starts); ``first_sample=t0`` models series born at ``t0`` (a fresh canary and baseline).

The canary's share of traffic is ``share(t)`` (a controller's traffic weight; Flagger tests change it
as the canary progresses) and starts at ``canary_from`` (late traffic); ``tracks`` maps a label matcher
found in a query to its track; ``fault(t)`` (``t`` the latest time queried so far: the simulated
clock) returns None,
"down" (503), "garbage" (200 with a non-JSON body) or "slow" (sleeps ``slow_s`` real seconds first).
"""

from __future__ import annotations

import math
import re
import threading
import time
from typing import Any, Callable

import numpy as np

from gpuobs.exporter.sim.engine import EngineConfig
from gpuobs.exporter.sim.latency import sample_itl, sample_ttft
from gpuobs.reference.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from tests.fakes.prom_fleet import increase
from tests.fakes.prometheus import matrix, ok, vector

TOKENS_PER_REQUEST = 8
_WINDOW = re.compile(r"\[(\d+)s\]")
_METRIC = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")
_BY = re.compile(r"^\s*sum by \(([^)]*)\)")
HISTS = {"vllm:time_to_first_token_seconds": TTFT_BUCKETS, "vllm:inter_token_latency_seconds": ITL_BUCKETS,
         "vllm:e2e_request_latency_seconds": REQUEST_LATENCY_BUCKETS}


class Traffic:
    """Per-second request counts of both tracks' pods, generated lazily up to the latest queried second.

    ``rate``: requests/s of the whole service; ``share(t)``: the canary's fraction at sim time t;
    ``ttft_mult``: the canary's TTFT multiplier (1.3 = +30%); ``err``: error probability per request
    (``err_canary`` for the canary; default the simulated engine's base error ratio, 0.02%); ``pods``: pods per track (requests spread evenly, Poisson per
    pod); ``scrape_s``: the scrape interval. Times are the simulated clock's unix seconds from ``t0``.
    """

    def __init__(self, t0: float, seed: int = 7, rate: float = 40.0, share: Callable[[float], float] = lambda t: 0.1,
                 ttft_mult: float = 1.0, err: float = EngineConfig.base_error_ratio, err_canary: float | None = None,
                 canary_from: float | None = None, fault: Callable[[float], str | None] = lambda t: None,
                 slow_s: float = 2.0, tracks: dict[str, str] | None = None, pods: dict[str, int] | None = None,
                 scrape_s: float = 15.0, first_sample: float | None = None):
        self.t0, self.rate, self.share, self.ttft_mult = float(t0), rate, share, ttft_mult
        self.first_sample = self.t0 - 3600.0 if first_sample is None else float(first_sample)
        self.err, self.err_canary = err, err if err_canary is None else err_canary
        self.canary_from = t0 if canary_from is None else canary_from
        self.fault, self.slow_s = fault, slow_s
        self.tracks = tracks or {'track="canary"': "canary", 'track="baseline"': "baseline"}
        self.pods = {"canary": 1, "baseline": 9, **(pods or {})}
        self.scrape_s = float(scrape_s)
        self.rng = np.random.default_rng(seed)
        # every pod is scraped at its own phase within the interval, as Prometheus spreads targets
        self.phase = {track: self.rng.uniform(0.0, self.scrape_s, k) for track, k in self.pods.items()}
        self.lock = threading.Lock()
        # cumulative counts per track and pod: hist name -> (pods, seconds+1, buckets+1);
        # "requests"/"errors" -> (pods, seconds+1)
        self.cum: dict[str, dict[str, np.ndarray]] = {
            track: {**{h: np.zeros((k, 1, len(b) + 1)) for h, b in HISTS.items()},
                    "requests": np.zeros((k, 1)), "errors": np.zeros((k, 1))} for track, k in self.pods.items()}
        self.queries = 0

    # ---- generation ---------------------------------------------------------------------------
    def _extend(self, upto: int) -> None:
        """Generate seconds [generated, upto) (second i covers [t0 + i, t0 + i + 1))."""
        have = self.cum["canary"]["requests"].shape[1] - 1
        if upto <= have:
            return
        secs = np.arange(have, upto)
        t = self.t0 + secs
        share = np.array([min(max(self.share(float(x)), 0.0), 1.0) for x in t])
        on = t >= self.canary_from
        for track, lam, mult, p_err in (("canary", self.rate * share * on, self.ttft_mult, self.err_canary),
                                        ("baseline", self.rate * (1 - share * on), 1.0, self.err)):
            c = self.cum[track]
            k = self.pods[track]
            new: dict[str, list[np.ndarray]] = {name: [] for name in (*HISTS, "requests", "errors")}
            for _pod in range(k):
                n = self.rng.poisson(lam / k)
                idx = np.repeat(np.arange(len(secs)), n)
                total = int(n.sum())
                ttft = sample_ttft(self.rng, total, mult)
                draws = {"vllm:time_to_first_token_seconds": (ttft, idx),
                         "vllm:inter_token_latency_seconds": (sample_itl(self.rng, total * TOKENS_PER_REQUEST),
                                                              np.repeat(idx, TOKENS_PER_REQUEST)),
                         "vllm:e2e_request_latency_seconds": (ttft + self.rng.lognormal(1.0, 0.5, total), idx)}
                for h, (x, where) in draws.items():
                    b = np.asarray(HISTS[h])
                    per = np.zeros((len(secs), b.size + 1))
                    np.add.at(per, (where, np.searchsorted(b, x, side="left")), 1.0)
                    new[h].append(np.cumsum(per, axis=0))
                errs = np.bincount(idx[self.rng.random(total) < p_err], minlength=len(secs)).astype(float)
                new["requests"].append(np.cumsum(n).astype(float))
                new["errors"].append(np.cumsum(errs))
            for name, parts in new.items():
                c[name] = np.concatenate([c[name], c[name][:, -1:] + np.stack(parts)], axis=1)

    def _scrapes(self, track: str, pod: int, at: float, window: float) -> np.ndarray:
        """Scrape times of ``pod`` in [at - window, at] (none before the stage start ``t0``)."""
        ph, s = self.phase[track][pod], self.scrape_s
        first = max(0, math.ceil((at - window - self.t0 - ph) / s))
        last = math.floor((at - self.t0 - ph) / s)
        return self.t0 + ph + s * np.arange(first, last + 1) if last >= first else np.zeros(0)

    def _increase(self, track: str, name: str, at: float, window: float) -> list[np.ndarray | None]:
        """Per pod: Prometheus's ``increase(name[window])`` at ``at`` (None: < 2 scrapes)."""
        out: list[np.ndarray | None] = []
        for pod in range(self.pods[track]):
            ts = self._scrapes(track, pod, at, window)
            if ts.size < 2:
                out.append(None)
                continue
            idx = np.floor(ts - self.t0).astype(int)
            self._extend(int(idx[-1]) + 1)
            out.append(increase(ts, self.cum[track][name][pod, idx], at - window, at))
        return out

    def _had_requests(self, track: str, at: float, window: float) -> bool:
        hi = max(0, int(math.floor(at - self.t0)))
        lo = max(0, int(math.floor(at - window - self.t0)))
        self._extend(hi + 1)
        r = self.cum[track]["requests"]
        return bool((r[:, hi] - r[:, lo]).sum() > 0)

    # ---- responder ----------------------------------------------------------------------------
    def __call__(self, endpoint: str, params: dict[str, list[str]]) -> tuple[int, Any]:
        at = float(params.get("time", params.get("end", ["0"]))[0])
        # the fault follows the simulated clock (the latest time queried), not the query's own time: a
        # query about the past (the analyzer's pre-stage query at the stage start) meets the backend as it is now
        self.latest = max(getattr(self, "latest", at), at)
        kind = self.fault(self.latest)
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
        if not self._had_requests(track, at, window):
            return ok(vector([], at))
        metric = _METRIC.search(q).group(1)
        base = metric.removesuffix("_bucket").removesuffix("_count")
        if "count_over_time(" in q:
            counts = [self._scrapes(track, pod, at, window).size for pod in range(self.pods[track])]
            counts = [c for c in counts if c > 0]
            return ok(vector([({}, float(min(counts)))] if counts else [], at))
        m = _BY.match(q)
        by = [x.strip() for x in m.group(1).split(",")] if m else []
        if base in HISTS:
            per_pod = self._increase(track, base, at, window)
            les = [repr(float(b)) for b in HISTS[base]] + ["+Inf"]
            acc: dict[tuple, float] = {}
            for pod, inc in enumerate(per_pod):
                if inc is None:
                    continue
                pod_labels = {"instance": f"{track}-{pod}:8000"}
                if metric.endswith("_count"):
                    key = tuple((k, pod_labels.get(k, "")) for k in by)
                    acc[key] = acc.get(key, 0.0) + float(inc.sum())
                    continue
                cumulative = np.cumsum(inc)
                for le, val in zip(les, cumulative):
                    key = tuple((k, le if k == "le" else pod_labels.get(k, "")) for k in by)
                    acc[key] = acc.get(key, 0.0) + float(val)
            return ok(vector([(dict(k), v) for k, v in acc.items()], at))
        if metric == "vllm:request_success_total":
            name = "errors" if 'finished_reason="error"' in q else "requests"
            incs = [inc for inc in self._increase(track, name, at, window) if inc is not None]
            return ok(vector([({}, float(sum(incs)))] if incs else [], at))
        return ok(vector([], at))
