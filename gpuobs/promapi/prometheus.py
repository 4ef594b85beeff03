"""A small client for the Prometheus HTTP API (``/api/v1/query``, ``query_range``, ``series``).

It speaks the API that Prometheus, Thanos Query, Grafana Mimir (under its ``/prometheus`` prefix) and
VictoriaMetrics all serve (source: https://prometheus.io/docs/prometheus/latest/querying/api/):
responses are ``{"status": "success"|"error", "data": ..., "errorType": ..., "error": ...,
"warnings": [...]}``; a bad expression is HTTP 400 (``bad_data``), a query that cannot run is 422
(``execution``), a timeout or overload is 503, and sample values are strings (``"NaN"``, ``"+Inf"``).

What the canary analyzer needs from it, and why each case is its own exception:

* :class:`PrometheusUnavailable`: connection refused, timeout, or HTTP 5xx after the retries. Retried
  with exponential backoff; never turned into a verdict (the analyzer re-raises it).
* :class:`PrometheusQueryError`: the server understood the request and rejected the query (``status:
  error``, HTTP 400/422). Not retried: asking again gives the same answer.
* :class:`PrometheusResponseError`: anything else that is not a usable answer (401/403, 404 from a
  wrong path prefix, non-JSON body, unexpected result type). Not retried.
* Empty results and NaN values are *not* errors: :class:`QueryResult` says ``empty`` / ``has_nan``
  and the caller decides (the analyzer classifies such a metric as NoData).

Authentication: ``bearer_token`` or ``basic_auth`` plus any ``headers`` (e.g. ``X-Scope-OrgID`` for
Mimir/Cortex tenants). Queries are sent as form-encoded POST by default (no URL length limit; all four
backends accept it); ``method="GET"`` is available for proxies that only allow GET.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import requests

from gpuobs.core.errors import Failure
from gpuobs.core.reach import unreachable

RETRY_STATUS = frozenset(range(500, 600))
QUERY_ERROR_STATUS = frozenset({400, 422})
#: Extra parameters of an instant query that must be answered at exactly the ``time`` asked.
#: VictoriaMetrics moves an instant query whose time lies within ``-search.latencyOffset`` of now back
#: to now minus the offset (and stamps the answer with the time asked) unless ``nocache`` is set
#: (v1.79.5 ``app/vmselect/prometheus/prometheus.go`` ``QueryHandler``: "Adjust start time only if
#: `nocache` arg isn't set"); ``nocache`` also turns off its rollup-result cache, which an instant query
#: uses only at a time that is a multiple of its 5 m step (``promql/eval.go`` ``EvalConfig.mayCache``),
#: so it costs nothing here. Prometheus reads only the form values it knows and ignores it.
#: Owner of the parameter for every gpuobs reader that needs it (the canary analyzer; vmalert's rule
#: groups: :data:`gpuobs.mixin.placement.VMALERT_QUERY_PARAMS`).
AT_TIME_PARAMS: Mapping[str, str] = {"nocache": "1"}


def prometheus_engine(build_info: Mapping[str, str] | None) -> bool:
    """Whether a backend's build info (:meth:`PromClient.build_info`) is Prometheus's own, i.e. its
    PromQL engine evaluates the queries (Prometheus, Thanos, Mimir: ``revision`` and ``goVersion``
    present). False for VictoriaMetrics (no ``revision``) and for a backend that answered nothing:
    callers whose query depends on the engine take the choice that is right on every engine then."""
    return bool(build_info) and "revision" in build_info and "goVersion" in build_info


class PrometheusError(Failure):
    """Base class of every error raised by :class:`PromClient`."""


class PrometheusUnavailable(PrometheusError):
    """The server could not be reached or kept answering 5xx after ``attempts`` tries."""

    def __init__(self, url: str, attempts: int, detail: str):
        self.url, self.attempts, self.detail = url, attempts, detail
        if detail.startswith("cannot reach "):  # never answered: the one wording of gpuobs.core.reach
            super().__init__(f"{detail}" + (f" after {attempts} attempts" if attempts > 1 else ""))
        else:
            super().__init__(f"Prometheus at {url} unavailable after {attempts} attempt(s): {detail}")


class PrometheusQueryError(PrometheusError):
    """The server rejected the query (``status: error``): ``error_type`` is Prometheus' errorType.

    The query comes from the user's configuration, so this is an input error (exit code 2)."""

    exit_code = 2

    def __init__(self, query: str, status: int, error_type: str, message: str):
        self.query, self.status, self.error_type, self.message = query, status, error_type, message
        super().__init__(f"query rejected (HTTP {status}, {error_type}): {message}; query: {query}")


class PrometheusResponseError(PrometheusError):
    """The answer is not a usable API response (auth failure, wrong path, malformed body)."""


def parse_value(text: Any) -> float:
    """A Prometheus sample value (a JSON string such as ``"1.5"``, ``"NaN"``, ``"+Inf"``) as a float.

    Raises :class:`PrometheusResponseError` when the text is not a number.
    """
    try:
        return float(text)
    except (TypeError, ValueError):
        raise PrometheusResponseError(f"sample value {text!r} is not a number") from None


@dataclass(frozen=True)
class Sample:
    """One instant-vector element: label set, value, and evaluation timestamp (unix seconds)."""

    labels: Mapping[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True)
class Series:
    """One range-vector element: label set and parallel tuples of timestamps (s) and values."""

    labels: Mapping[str, str]
    timestamps: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class QueryResult:
    """The ``data`` of a successful query: ``samples`` for vector/scalar, ``series`` for matrix."""

    result_type: str
    samples: tuple[Sample, ...] = ()
    series: tuple[Series, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """True when the query matched nothing (no samples, no series, or series without points)."""
        return not self.samples and not any(s.values for s in self.series)

    @property
    def has_nan(self) -> bool:
        """True when any returned value is NaN (e.g. 0/0 in a ratio, histogram_quantile on no data)."""
        return any(math.isnan(s.value) for s in self.samples) or any(
            math.isnan(v) for s in self.series for v in s.values)

    def scalar(self) -> float | None:
        """The single value of a one-element vector or a scalar; None when empty.

        Raises :class:`PrometheusResponseError` when the vector holds more than one series.
        """
        if not self.samples:
            return None
        if len(self.samples) > 1:
            raise PrometheusResponseError(f"expected one series, got {len(self.samples)}")
        return self.samples[0].value


@dataclass
class PromClient:
    """Client for one Prometheus-API endpoint.

    ``url`` is the base under which ``/api/v1/...`` lives (``http://127.0.0.1:9090``, or
    ``http://mimir/prometheus``). ``timeout`` (s) bounds each HTTP attempt and is also sent as the
    query's ``timeout`` parameter. ``retries`` extra attempts follow a connection error or 5xx, the
    n-th after ``backoff * 2**(n-1)`` seconds (capped at ``max_backoff``). ``sleep`` is injectable
    for tests.
    """

    url: str
    timeout: float = 10.0
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    method: str = "POST"
    sleep: Callable[[float], None] = time.sleep
    session: requests.Session = field(default_factory=requests.Session)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must start with http:// or https://, got {self.url!r}")
        if self.method not in ("GET", "POST"):
            raise ValueError(f"method must be GET or POST, got {self.method!r}")
        if self.bearer_token and self.basic_auth:
            raise ValueError("use either a bearer token or basic auth, not both")

    # ---- public API ---------------------------------------------------------------------------
    def query(self, expr: str, at: float | None = None, params: Mapping[str, str] | None = None) -> QueryResult:
        """Evaluate ``expr`` at unix time ``at`` (default: now). Returns a vector/scalar result.
        ``params``: extra request parameters (e.g. :data:`AT_TIME_PARAMS`); they cannot replace
        ``query``, ``time`` or ``timeout``."""
        params = {**(params or {}), "query": expr, "timeout": f"{self.timeout:g}s"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._parse_result(*self._call("query", params, expr), expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        """Evaluate ``expr`` every ``step`` seconds over [start, end] (unix s). Returns a matrix.

        Raises ValueError on an empty range or a non-positive step (checked before any request).
        """
        if step <= 0 or end < start:
            raise ValueError(f"bad range: start={start} end={end} step={step}")
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}",
                  "timeout": f"{self.timeout:g}s"}
        return self._parse_result(*self._call("query_range", params, expr), expr)

    def series(self, matchers: Sequence[str], start: float | None = None,
               end: float | None = None) -> list[dict[str, str]]:
        """Label sets of the series matching any of ``matchers`` (e.g. ``['up{job="vllm"}']``)."""
        if not matchers:
            raise ValueError("series() needs at least one matcher")
        params: dict[str, Any] = {"match[]": list(matchers)}
        if start is not None:
            params["start"] = f"{start:.3f}"
        if end is not None:
            params["end"] = f"{end:.3f}"
        data, _ = self._call("series", params, " or ".join(matchers))
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise PrometheusResponseError("series: expected a list of label sets")
        return [dict(d) for d in data]

    def build_info(self) -> dict[str, str] | None:
        """The backend's ``GET /api/v1/status/buildinfo`` data (``{"version": ..., "revision": ...}``),
        or None when it does not answer one (any HTTP or transport error, a 404, an answer without a
        ``data`` object): never raises. Prometheus (v2.42.0 ``web/api/v1/api.go`` ``serveBuildInfo``,
        GET only) answers version, revision, branch, buildUser, buildDate, goVersion, and so do the
        services built on its engine (Thanos, Mimir); VictoriaMetrics answers ``{}`` (v1.79.5
        ``app/vmselect/main.go``) or, later, only ``{"version": "2.24.0"}`` for Grafana's sake."""
        try:
            resp = self.session.get(f"{self.url}/api/v1/status/buildinfo", headers=self._request_headers(),
                                    timeout=self.timeout, auth=self.basic_auth)
            data, _ = self._decode(resp, "buildinfo")
        except (requests.RequestException, PrometheusError, ValueError):
            return None
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None

    # ---- transport ----------------------------------------------------------------------------
    def _request_headers(self) -> dict[str, str]:
        out = {"Accept": "application/json", "User-Agent": "gpuobs-canary"}
        out.update(self.headers)
        if self.bearer_token:
            out["Authorization"] = f"Bearer {self.bearer_token}"
        return out

    def _send(self, endpoint: str, params: Mapping[str, Any]) -> requests.Response:
        url = f"{self.url}/api/v1/{endpoint}"
        kwargs: dict[str, Any] = {"headers": self._request_headers(), "timeout": self.timeout,
                                  "auth": self.basic_auth}
        if self.method == "POST":
            return self.session.post(url, data=params, **kwargs)
        return self.session.get(url, params=params, **kwargs)

    def _call(self, endpoint: str, params: Mapping[str, Any], expr: str) -> tuple[Any, tuple[str, ...]]:
        attempts = self.retries + 1
        detail = ""
        for attempt in range(1, attempts + 1):
            try:
                resp = self._send(endpoint, params)
            except (requests.ConnectionError, requests.Timeout) as exc:
                detail = unreachable("Prometheus", self.url, exc)
            else:
                if resp.status_code not in RETRY_STATUS:
                    return self._decode(resp, expr)
                detail = f"HTTP {resp.status_code}: {_error_text(resp)}"
            if attempt < attempts:
                self.sleep(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
        raise PrometheusUnavailable(self.url, attempts, detail)

    def _decode(self, resp: requests.Response, expr: str) -> tuple[Any, tuple[str, ...]]:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code in QUERY_ERROR_STATUS or (isinstance(body, dict) and body.get("status") == "error"):
            if isinstance(body, dict):
                raise PrometheusQueryError(expr, resp.status_code, str(body.get("errorType", "unknown")),
                                           str(body.get("error", "")))
            raise PrometheusQueryError(expr, resp.status_code, "unknown", resp.text[:200])
        if resp.status_code in (401, 403):
            raise PrometheusResponseError(f"HTTP {resp.status_code} from {resp.url}: check the bearer token, "
                                          "basic auth or tenant header")
        if resp.status_code == 404:
            raise PrometheusResponseError(f"HTTP 404 from {resp.url}: is the base URL right? (Mimir serves "
                                          "the API under /prometheus)")
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusResponseError(f"unexpected answer from {resp.url}: HTTP {resp.status_code}, "
                                          f"{resp.text[:200]!r}")
        return body.get("data"), tuple(str(w) for w in body.get("warnings") or ())

    @staticmethod
    def _parse_result(data: Any, warnings: tuple[str, ...], expr: str) -> QueryResult:
        if not isinstance(data, dict) or "resultType" not in data:
            raise PrometheusResponseError(f"no resultType in the answer to {expr!r}")
        rtype, result = data["resultType"], data.get("result")
        try:
            if rtype == "vector":
                samples = tuple(Sample(dict(r.get("metric", {})), parse_value(r["value"][1]), float(r["value"][0]))
                                for r in result)
                return QueryResult(rtype, samples=samples, warnings=warnings)
            if rtype == "scalar":
                return QueryResult(rtype, samples=(Sample({}, parse_value(result[1]), float(result[0])),),
                                   warnings=warnings)
            if rtype == "matrix":
                series = tuple(Series(dict(r.get("metric", {})), tuple(float(p[0]) for p in r["values"]),
                                      tuple(parse_value(p[1]) for p in r["values"])) for r in result)
                return QueryResult(rtype, series=series, warnings=warnings)
        except (KeyError, IndexError, TypeError) as exc:
            raise PrometheusResponseError(f"malformed {rtype} result for {expr!r}: {exc}") from None
        raise PrometheusResponseError(f"unsupported resultType {rtype!r} for {expr!r}")


def _error_text(resp: requests.Response) -> str:
    try:
        body = resp.json()
        return f"{body.get('errorType', '')} {body.get('error', '')}".strip() or resp.text[:200]
    except ValueError:
        return resp.text[:200]
