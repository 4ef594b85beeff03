"""An in-process fake of the Prometheus HTTP API for unit tests (127.0.0.1, ephemeral port).

:class:`FakePrometheus` serves ``/api/v1/query``, ``/api/v1/query_range`` and ``/api/v1/series``
(GET and form POST) from a ``responder(endpoint, params) -> (status, body)`` and records every
request. :class:`FleetData` is a responder that answers the analyzer's queries from bucket counts,
counters and time series keyed by the ``track`` matcher, the way Prometheus would; :func:`fleet`
fills one with a window of requests drawn from the simulator's latency model.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import numpy as np

from gpuobs.exporter.sim.latency import sample_itl, sample_ttft
from gpuobs.reference.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS

Responder = Callable[[str, dict[str, list[str]]], tuple[int, Any]]


def ok(data: Any, warnings: list[str] | None = None) -> tuple[int, dict]:
    """A 200 ``status: success`` answer."""
    body = {"status": "success", "data": data}
    if warnings:
        body["warnings"] = warnings
    return 200, body


def vector(samples: list[tuple[dict[str, str], float]], at: float = 1000.0) -> dict:
    """``data`` of an instant vector; values rendered as Prometheus does (strings, NaN, +Inf)."""
    return {"resultType": "vector", "result": [{"metric": m, "value": [at, _fmt(v)]} for m, v in samples]}


def matrix(series: list[tuple[dict[str, str], list[tuple[float, float]]]]) -> dict:
    """``data`` of a range vector."""
    return {"resultType": "matrix",
            "result": [{"metric": m, "values": [[t, _fmt(v)] for t, v in pts]} for m, pts in series]}


def _fmt(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Handler(BaseHTTPRequestHandler):
    server: "FakePrometheus"

    def log_message(self, *args: Any) -> None:
        pass

    def _handle(self, params: dict[str, list[str]]) -> None:
        url = urlsplit(self.path)
        endpoint = url.path.removeprefix("/api/v1/")
        self.server.requests.append({"method": self.command, "endpoint": endpoint, "params": params,
                                     "headers": dict(self.headers)})
        status, body = self.server.responder(endpoint, params)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        self._handle(parse_qs(urlsplit(self.path).query))

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self._handle(parse_qs(self.rfile.read(length).decode()))


class FakePrometheus(ThreadingHTTPServer):
    """The fake server; use as a context manager. ``url`` is its base URL."""

    daemon_threads = True

    def __init__(self, responder: Responder):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> "FakePrometheus":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()


_TRACK = re.compile(r'track="([^"]+)"')
_METRIC = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")


@dataclass
class FleetData:
    """Per-track data: ``histograms[track][metric] = (bounds, per-bucket counts)``,
    ``counters[track][metric] = {finished_reason: count}``, ``series[track][query-name] = values``.

    Answers ``increase(..._bucket)`` with cumulative ``le`` buckets, ``increase(..._count)`` and
    counter sums, and ``query_range`` with one series per known name found in the query text.
    Unknown metrics give an empty result, like Prometheus.
    """

    histograms: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    counters: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    step_start: float = 1000.0

    def __call__(self, endpoint: str, params: dict[str, list[str]]) -> tuple[int, Any]:
        q = params["query"][0]
        track_m = _TRACK.search(q)
        track = track_m.group(1) if track_m else ""
        if endpoint == "query_range":
            for name, values in self.series.get(track, {}).items():
                if name in q:
                    step = float(params["step"][0])
                    return ok(matrix([({}, [(self.step_start + i * step, v) for i, v in enumerate(values)])]))
            return ok(matrix([]))
        metric = _METRIC.search(q).group(1)
        if metric.endswith("_bucket"):
            hist = self.histograms.get(track, {}).get(metric.removesuffix("_bucket"))
            if hist is None:
                return ok(vector([]))
            bounds, counts = hist
            cum = np.cumsum(counts)
            les = [repr(float(b)) for b in bounds] + ["+Inf"]
            return ok(vector([({"le": le}, float(c)) for le, c in zip(les, cum)]))
        if metric.endswith("_count"):
            hist = self.histograms.get(track, {}).get(metric.removesuffix("_count"))
            return ok(vector([] if hist is None else [({}, float(np.sum(hist[1])))]))
        reasons = self.counters.get(track, {}).get(metric)
        if reasons is None:
            return ok(vector([]))
        m = re.search(r'finished_reason="([^"]+)"', q)
        wanted = [m.group(1)] if m else list(reasons)
        present = [r for r in wanted if r in reasons]
        return ok(vector([({}, float(sum(reasons[r] for r in present)))] if present else []))


def _binned(x: np.ndarray, bounds: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(bounds)
    return b, np.bincount(np.searchsorted(b, x, side="left"), minlength=b.size + 1).astype(float)


def fleet(seed: int = 1, n_c: int = 600, n_b: int = 11_400, ttft_mult: float = 1.0, err_c: int = 0,
          err_b: int = 6, series: bool = True) -> FleetData:
    """Requests of one window for both tracks, drawn from gpuobs.exporter.sim.latency."""
    rng = np.random.default_rng(seed)
    data = FleetData()
    for track, n, mult, err in (("canary", n_c, ttft_mult, err_c), ("baseline", n_b, 1.0, err_b)):
        ttft = sample_ttft(rng, n, mult)
        data.histograms[track] = {
            "vllm:time_to_first_token_seconds": _binned(ttft, TTFT_BUCKETS),
            "vllm:inter_token_latency_seconds": _binned(sample_itl(rng, 40 * n), ITL_BUCKETS),
            "vllm:e2e_request_latency_seconds": _binned(ttft + rng.lognormal(1.0, 0.5, n), REQUEST_LATENCY_BUCKETS)}
        data.counters[track] = {"vllm:request_success_total": {"stop": n - err, "length": 0, "error": err}}
        if series:
            data.series[track] = {name: list(level + 0.01 * rng.standard_normal(20)) for name, level in
                                  (("kv_cache_usage_perc", 0.5), ("DCGM_FI_DEV_POWER_USAGE", 2.0), ("SM_ACTIVE", 0.7))}
    return data
