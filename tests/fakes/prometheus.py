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
import zlib
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
        if endpoint == "status/buildinfo" and self.server.build_info is None:
            # a backend that does not say which engine it runs (the analyzer then cuts its windows the way
            # that is right on every engine); not recorded: ``requests`` holds the queries
            status, body = 404, {"status": "error", "errorType": "not_found", "error": "fake: no buildinfo"}
        elif endpoint == "status/buildinfo":
            status, body = 200, {"status": "success", "data": self.server.build_info}
        else:
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
        # GET /api/v1/status/buildinfo's data; None: answered 404 (the engine unknown to the client)
        self.build_info: dict[str, str] | None = None
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

    The analyzer's first-sample query (``min(min_over_time(timestamp(...)[r:s]))``) is answered with
    ``first_sample[track]`` (unix seconds) when set, else 0.0 (series far older than any window), or
    empty for a track with no data.
    """

    histograms: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    counters: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    step_start: float = 1000.0
    first_sample: dict[str, float] = field(default_factory=dict)
    units: dict[str, int] = field(default_factory=lambda: {"canary": 1, "baseline": 8})
    scrape_s: float = 15.0

    def _split(self, track: str, metric: str, counts: np.ndarray) -> list[np.ndarray]:
        """The track's requests spread over its ``units`` pods (instance labels), multinomially with a
        fixed seed, so per-node queries see realistic small differences between pods."""
        k = self.units.get(track, 1)
        if k == 1:
            return [np.asarray(counts, float)]
        rng = np.random.default_rng(zlib.crc32(f"{track}/{metric}".encode()))  # hash() is salted per process
        parts = np.array([rng.multinomial(int(round(c)), np.full(k, 1.0 / k)) for c in counts], dtype=float)
        return [parts[:, u] for u in range(k)]

    def __call__(self, endpoint: str, params: dict[str, list[str]]) -> tuple[int, Any]:
        q = params["query"][0]
        track_m = _TRACK.search(q)
        track = track_m.group(1) if track_m else ""
        if endpoint == "query" and q.startswith("min(min_over_time(timestamp("):
            if track not in self.histograms and track not in self.counters:
                return ok(vector([]))
            return ok(vector([({}, self.first_sample.get(track, 0.0))]))
        if endpoint == "query_range":
            for name, values in self.series.get(track, {}).items():
                if name in q:
                    step = float(params["step"][0])
                    return ok(matrix([({}, [(self.step_start + i * step, v) for i, v in enumerate(values)])]))
            return ok(matrix([]))
        metric = _METRIC.search(q).group(1)
        by_unit = "instance)" in q
        if "count_over_time" in q:  # samples per series in the window: one per scrape interval
            known = any(metric.removesuffix(suffix) in self.histograms.get(track, {})
                        for suffix in ("_count", "_bucket")) or metric in self.counters.get(track, {})
            window = float(re.search(r"\[(\d+)s\]", q).group(1))
            return ok(vector([({}, window // self.scrape_s)] if known else []))
        if metric.endswith("_bucket"):
            hist = self.histograms.get(track, {}).get(metric.removesuffix("_bucket"))
            if hist is None:
                return ok(vector([]))
            bounds, counts = hist
            les = [repr(float(b)) for b in bounds] + ["+Inf"]
            parts = self._split(track, metric.removesuffix("_bucket"), counts) if by_unit else [counts]
            out = []
            for u, part in enumerate(parts):
                lab = {"instance": f"{track}-{u}"} if by_unit else {}
                out += [({"le": le, **lab}, float(c)) for le, c in zip(les, np.cumsum(part))]
            return ok(vector(out))
        if metric.endswith("_count"):
            hist = self.histograms.get(track, {}).get(metric.removesuffix("_count"))
            if hist is None:
                return ok(vector([]))
            if by_unit:
                parts = self._split(track, metric.removesuffix("_count"), hist[1])
                return ok(vector([({"instance": f"{track}-{u}"}, float(p.sum())) for u, p in enumerate(parts)]))
            return ok(vector([({}, float(np.sum(hist[1])))]))
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


# ---- a fake TSDB of label sets, for instant queries of the shapes gpuobs doctor sends -------------------
_SEL_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_AGG = re.compile(r"^\s*(count|group)\s+by\s*\(([^)]*)\)\s*\((.*)\)\s*$", re.S)
_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{(.*)\}\s*$", re.S)


class UnsupportedQuery(ValueError):
    """The fake does not understand the query (a test bug, not a Prometheus answer)."""


@dataclass
class SeriesSet:
    """A responder holding the TSDB's current samples as ``(labels, value)`` (labels include ``__name__``).

    It answers only what ``gpuobs doctor`` asks: instant vector selectors with ``=``, ``!=``, ``=~``,
    ``!~`` matchers (regexes fully anchored, as in Prometheus) and ``count by``/``group by`` around them,
    nested. A label with an empty value is the same as no label, as in Prometheus. Anything else answers
    HTTP 400 ``bad_data`` naming the query, so a test cannot pass on a query the fake misread.
    Tests that prove the fake agrees with real Prometheus on these shapes: tests/doctor/test_fake_vs_prometheus.py.
    """

    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)
    at: float = 1000.0

    def add(self, name: str, labels: dict[str, str], value: float = 1.0) -> None:
        self.samples.append(({"__name__": name, **{k: v for k, v in labels.items() if v != ""}}, value))

    def __call__(self, endpoint: str, params: dict[str, list[str]]) -> tuple[int, Any]:
        if endpoint != "query":
            return 400, {"status": "error", "errorType": "bad_data", "error": f"fake: endpoint {endpoint} unsupported"}
        q = params["query"][0]
        try:
            rows = self.evaluate(q)
        except UnsupportedQuery as exc:
            return 400, {"status": "error", "errorType": "bad_data", "error": f"fake: {exc}"}
        return ok(vector(rows, self.at))

    def evaluate(self, q: str) -> list[tuple[dict[str, str], float]]:
        m = _AGG.match(q)
        if m:
            op, by, inner = m.group(1), [x.strip() for x in m.group(2).split(",") if x.strip()], m.group(3)
            groups: dict[tuple, int] = {}
            for labels, _ in self.evaluate(inner):
                key = tuple((k, labels[k]) for k in by if labels.get(k, "") != "")
                groups[key] = groups.get(key, 0) + 1
            return [(dict(k), float(n if op == "count" else 1)) for k, n in groups.items()]
        m = _SELECTOR.match(q)
        if not m:
            raise UnsupportedQuery(f"cannot parse {q!r}")
        matchers = []
        if m.group(1):
            matchers.append(("__name__", "=", m.group(1)))
        body, pos = m.group(2), 0
        while pos < len(body.strip()):
            mm = _SEL_MATCHER.match(body, pos)
            if not mm:
                raise UnsupportedQuery(f"cannot parse matchers {body!r}")
            matchers.append((mm.group(1), mm.group(2), mm.group(3).replace('\\"', '"')))
            pos = mm.end()
        return [(dict(labels), v) for labels, v in self.samples if all(_match(labels, *mt) for mt in matchers)]


def _match(labels: dict[str, str], name: str, op: str, value: str) -> bool:
    have = labels.get(name, "")
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    hit = re.fullmatch(value, have) is not None
    return hit if op == "=~" else not hit
