"""``gpuobs canary serve``: the canary verdict over HTTP, for Argo Rollouts and Flagger.

Routes (configuration examples in docs/canary.md):

* ``GET /api/v1/analysis?canary=SEL&baseline=SEL[&run=ID][&start=TIME|&window=DUR]``: the verdict
  JSON of :meth:`gpuobs.canary.verdict.Verdict.to_dict` with HTTP 200 for every verdict, so an Argo
  Rollouts ``web`` metric maps ``PROMOTE`` to Successful, ``ROLLBACK`` to Failed and ``HOLD`` to
  Inconclusive. Prometheus unreachable -> 503, a backend that rejects or garbles a query -> 502,
  bad parameters -> 400: Argo records those as measurement Errors, never as a verdict.
* ``POST /flagger/rollback``: Flagger ``rollback`` webhook: 200 only on ROLLBACK (Flagger then
  fails the canary), 403 otherwise. ``POST /flagger/confirm-promotion``: 200 only on PROMOTE, 403
  otherwise (Flagger holds the promotion). Selectors and window come from the hook's ``metadata``.
* ``GET /healthz`` (no token needed).

Authentication: with a token (``--token-file``, on by default) the analysis routes need
``Authorization: Bearer <token>``; without it they answer 401 and analyse nothing. Argo Rollouts
sends it from the web provider's ``headers`` list; Flagger webhooks cannot set headers, so
``/flagger/*`` also accept it as ``metadata.token`` in the webhook body (docs/canary.md).

Bounds (every client error is a 4xx, never a 5xx or a hang): ``start``/``window`` must give a window
of at most ``MAX_WINDOW_HORIZONS`` x the configured horizon (400 naming the limit); ``inf``/``NaN``
and unparseable times are 400 at parsing; a Flagger body that is not a JSON object, nests too deeply
or carries non-scalar ``metadata`` values is 400.

Window: ``start`` (unix seconds or RFC 3339) or ``window`` (e.g. ``5m`` back from now) when given;
otherwise the server starts a run the first time it sees a ``run`` key (Argo: the canary's
pod-template hash; Flagger: namespace/name and its checksum) and grows the window from then on,
keeping the run's :class:`~gpuobs.canary.analyzer.AnalysisState` so each look gets the exact
sequential boundary. A run not looked at for ``GAP_INTERVALS`` intervals, or older than twice the
horizon, starts afresh at the next look (the next canary of the same name); at most ``MAX_RUNS``
are kept.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuobs.canary.analyzer import AnalysisState, Analyzer
from gpuobs.canary.config import CanaryConfig, ConfigError, parse_duration, parse_time
from gpuobs.core import httpd, log, tokens
from gpuobs.promapi.prometheus import PromClient, PrometheusError, PrometheusUnavailable

MAX_RUNS = 256
#: Longest stateless window (``start``/``window``), in horizons: the analysis is final at one horizon,
#: and the look plan of a stateless caller grows with the window (one look per interval).
MAX_WINDOW_HORIZONS = 2.0
GAP_INTERVALS = 4  # a run not looked at for this many intervals has ended; the next look starts anew
MAX_BODY_BYTES = 1024 * 1024
_log = log.get("canary-serve")


class RequestError(Exception):
    """A client error: HTTP ``status`` with ``message``."""

    def __init__(self, status: int, message: str):
        self.status, self.message = status, message
        super().__init__(message)


@dataclass
class Run:
    """One tracked analysis: its start, sequential state and a lock serialising its looks."""

    start: float
    last_seen: float
    state: AnalysisState = field(default_factory=AnalysisState)
    lock: threading.Lock = field(default_factory=threading.Lock)


class CanaryServer(httpd.Server):
    """HTTP server holding the Prometheus client, the config and the tracked runs."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], client: PromClient, config: CanaryConfig,
                 canary: str | None = None, baseline: str | None = None, clock=time.time,
                 token: str | None = None):
        super().__init__(addr, CanaryHandler)
        self.client, self.config, self.clock = client, config, clock
        self.token = token
        self.default_canary, self.default_baseline = canary, baseline
        self.runs: OrderedDict[tuple[str, str, str], Run] = OrderedDict()
        self.runs_lock = threading.Lock()

    def run_for(self, key: tuple[str, str, str], now: float) -> Run:
        """The tracked run for ``key``; a new one (start = now) when unknown, older than twice the
        horizon, or silent for more than ``GAP_INTERVALS`` look intervals (a new analysis)."""
        with self.runs_lock:
            run = self.runs.get(key)
            if (run is None or now - run.start > 2 * self.config.horizon_s
                    or now - run.last_seen > GAP_INTERVALS * self.config.interval_s):
                run = self.runs[key] = Run(now, now)
            run.last_seen = now
            self.runs.move_to_end(key)
            while len(self.runs) > MAX_RUNS:
                self.runs.popitem(last=False)
            return run

    def evaluate(self, params: dict[str, str]) -> dict[str, Any]:
        """Analyse per ``params`` (canary, baseline, run, start, window); returns the verdict dict.

        Raises RequestError (400) on bad parameters and PrometheusError from the backend.
        """
        canary = params.get("canary") or self.default_canary
        baseline = params.get("baseline") or self.default_baseline
        if not canary or not baseline:
            raise RequestError(400, "canary and baseline selectors are required (parameters or server defaults)")
        now = self.clock()
        try:
            analyzer = Analyzer(self.client, self.config, canary, baseline)
            if params.get("start") or params.get("window"):
                start = (parse_time(params["start"], "start") if params.get("start")
                         else now - parse_duration(params["window"], "window"))
                if start >= now:
                    raise RequestError(400, "start must be in the past")
                limit = MAX_WINDOW_HORIZONS * self.config.horizon_s
                if now - start > limit:
                    which = "start" if params.get("start") else "window"
                    raise RequestError(400, f"{which}: the window would be {now - start:.0f} s; the limit is "
                                            f"{limit:.0f} s ({MAX_WINDOW_HORIZONS:g} x the {self.config.horizon_s:.0f} s "
                                            "horizon): analyse a recent window or use a run")
                return analyzer.analyze(start, now).to_dict()
            run = self.run_for((params.get("run", ""), analyzer.canary, analyzer.baseline), now)
            with run.lock:
                if now - run.start < 1.0:
                    return _started(run.start, analyzer)
                return analyzer.analyze(run.start, now, run.state).to_dict()
        except ConfigError as exc:
            raise RequestError(400, str(exc)) from None
        except ValueError as exc:
            raise RequestError(400, str(exc)) from None


def _started(start: float, analyzer: Analyzer) -> dict[str, Any]:
    """The HOLD answer of a run's first contact (no window yet)."""
    return {"verdict": "HOLD", "reasons": ["analysis run registered; the window starts now"], "warnings": [],
            "metrics": [], "canary": analyzer.canary, "baseline": analyzer.baseline, "start": start, "end": start,
            "time_fraction": 0.0, "final": False, "alpha": analyzer.config.alpha, "score": None, "exit_code": 3}


class CanaryHandler(httpd.Handler):
    """Routes of :class:`CanaryServer` (see the module docstring; HTTP plumbing: :mod:`gpuobs.core.httpd`)."""

    server: CanaryServer
    server_version = "gpuobs-canary"
    max_body_bytes = MAX_BODY_BYTES
    methods = {"GET": "_get", "POST": "_post"}
    logger = _log

    def _send(self, status: int, doc: Any) -> None:
        self.send_json(status, doc)

    def _authorized(self) -> bool:
        """Answer 401 (body drained) and return False unless the request carries the bearer token."""
        if tokens.bearer_ok(self.headers.get("Authorization"), self.server.token):
            return True
        self.discard_body()
        self.send_json(401, {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                       headers={"WWW-Authenticate": 'Bearer realm="gpuobs-canary"'})
        return False

    def _metadata_token_ok(self, raw: bytes) -> bool:
        """Flagger webhooks cannot set headers (fluxcd/flagger ``pkg/apis/flagger/v1beta1/canary.go``
        ``CanaryWebhook``: type, name, url, muteAlert, timeout, metadata only), so the token may come as
        ``metadata.token`` in the body instead."""
        if self.server.token is None:
            return True
        try:
            token = json.loads(raw)["metadata"]["token"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return False
        return isinstance(token, str) and tokens.bearer_ok(f"Bearer {token}", self.server.token)

    def _answer(self, params: dict[str, str], gate: str | None) -> None:
        try:
            doc = self.server.evaluate(params)
        except RequestError as exc:
            self._send(exc.status, {"error": exc.message})
            return
        except PrometheusUnavailable as exc:
            self._send(503, {"error": str(exc)})
            return
        except PrometheusError as exc:
            self._send(502, {"error": str(exc)})
            return
        status = 200 if gate is None or doc["verdict"] == gate else 403
        _log.info("verdict served", extra={"fields": {"path": self.path.split("?")[0], "verdict": doc["verdict"],
                                                      "status": status, "run": params.get("run", "")}})
        self._send(status, doc)

    def _get(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._send(200, {"status": "ok", "runs": len(self.server.runs)})
        elif url.path == "/api/v1/analysis":
            if not self._authorized():
                return
            self._answer({k: v[-1] for k, v in parse_qs(url.query).items()}, None)
        else:
            self._send(404, {"error": f"no route {url.path}; try /api/v1/analysis"})

    def _post(self) -> None:
        url = urlsplit(self.path)
        gates = {"/flagger/rollback": "ROLLBACK", "/flagger/confirm-promotion": "PROMOTE"}
        if url.path not in gates:
            self.discard_body()
            self._send(404, {"error": f"no route {url.path}; try /flagger/rollback or /flagger/confirm-promotion"})
            return
        header_ok = tokens.bearer_ok(self.headers.get("Authorization"), self.server.token)
        raw = self.read_body()
        if raw is None:  # 411/413 answered
            return
        if not header_ok and not self._metadata_token_ok(raw):
            self.send_json(401, {"error": "missing or wrong bearer token (Authorization: Bearer <token>, "
                                          "or metadata.token in the Flagger webhook)"},
                           headers={"WWW-Authenticate": 'Bearer realm="gpuobs-canary"'})
            return
        if not raw:
            self._send(400, {"error": "expected a JSON body (Flagger payload)"})
            return
        try:
            payload = json.loads(raw)
            if not isinstance(payload, dict):
                raise ValueError("the body is not a JSON object")
            meta = payload.get("metadata") or {}
            if not isinstance(meta, dict):
                raise ValueError("metadata is not an object")
            for k, v in list(meta.items()) + [(k, payload.get(k)) for k in ("namespace", "name", "checksum")]:
                if v is not None and (isinstance(v, (dict, list)) or len(str(v)) > 4096):
                    raise ValueError(f"{k} must be a string of at most 4096 characters")
        except (ValueError, AttributeError, RecursionError) as exc:
            self._send(400, {"error": f"malformed Flagger payload: {str(exc)[:200]}"})
            return
        params = {k: str(v) for k, v in meta.items() if k in ("canary", "baseline", "start", "window", "run")}
        params["run"] = "/".join(str(payload.get(k, "")) for k in ("namespace", "name", "checksum")) + params.get("run", "")
        self._answer(params, gates[url.path])


def serve(host: str, port: int, client: PromClient, config: CanaryConfig, canary: str | None = None,
          baseline: str | None = None, token: str | None = None) -> None:
    """Run the verdict server until interrupted (``token``: bearer token the analysis routes require).
    Raises OSError when the address cannot be bound."""
    srv = CanaryServer((host, port), client, config, canary, baseline, token=token)
    _log.info("canary verdict server listening", extra={"fields": {"host": host, "port": srv.server_address[1],
                                                                   "prometheus": client.url}})
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
