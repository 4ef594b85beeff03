"""``gpuobs canary serve``: the canary verdict over HTTP, for Argo Rollouts and Flagger.

Routes (configuration, and the mapping to each controller's outcomes: docs/canary.md):

* ``GET /api/v1/analysis?canary=SEL&baseline=SEL&run=ID[&step=STEP]``: one look of the run
  (``run``, ``step``, selectors) as the verdict JSON of :meth:`gpuobs.canary.verdict.Verdict.to_dict`
  plus ``run``; HTTP 200 for every verdict: ``PROMOTE``, ``ROLLBACK``, ``HOLD`` (keep looking) or
  ``INCONCLUSIVE`` (the horizon passed without a decision). Verdict semantics (sticky decisions,
  no data never promotes, durable runs): :mod:`gpuobs.canary.runs`. ``start``/``window`` instead of
  a run: one stateless look over that window (no run is kept).
  Errors are never verdicts: Prometheus unreachable -> 503, a backend that rejects or garbles a
  query -> 502, the per-look deadline ran out (or a previous look of the run still runs) -> 504,
  bad parameters -> 400.
* ``POST /flagger/{rollback,confirm-promotion,confirm-traffic-increase,rollout}``: Flagger webhooks
  (Flagger proceeds on status <= 202, ``pkg/controller/webhook.go`` v1.44.0). ``rollback``: 200
  only on ROLLBACK. ``confirm-promotion``: 200 only on PROMOTE. ``confirm-traffic-increase``: 200
  for the first step, then only while every critical metric has data, none leans harmful (a
  harm-side z of at least ``runs.LEAN_Z``, an error e-value of at least ``runs.LEAN_E``:
  :func:`~gpuobs.canary.runs.leans_harmful`) and the run is undecided or PROMOTE (Flagger never ramps
  an unjudged canary, nor one on its way to a rollback). ``rollout``: 200 while the analysis may still
  promote (HOLD, PROMOTE, or a backend error before the horizon), 409 on ROLLBACK and INCONCLUSIVE,
  so Flagger's failed-check ``threshold`` bounds WaitingPromotion. Selectors, ``run`` and ``step``
  come from the hook's ``metadata``; the run id is namespace/name/checksum of the payload.
* ``GET /api/v1/query?query=gpuobs_canary_ok{namespace="NS",name="NAME",canary="SEL",baseline="SEL"}``:
  Prometheus-API-shaped one-sample vector for a Flagger MetricTemplate (prometheus provider): 1
  while the analysis may still promote, 0 on ROLLBACK or INCONCLUSIVE; ``thresholdRange: {min: 1}``.
  A constant ``vector(<number>)`` answers that number (one sample, no labels) without analysing:
  Flagger's prometheus provider checks a MetricTemplate's address with ``vector(1)`` and wants 1
  (``IsOnline``, ``pkg/metrics/providers/prometheus.go``); :func:`constant_query`.
* ``GET /healthz`` (no token needed).

Authentication: with a token (``--token-file``, on by default) the analysis routes need
``Authorization: Bearer <token>``; without it they answer 401 and analyse nothing. Argo Rollouts
sends it from the web provider's ``headers`` list; Flagger webhooks cannot set headers, so
``/flagger/*`` also accept it as ``metadata.token`` in the webhook body (docs/canary.md).

Bounds (every client error is a 4xx, never a 5xx or a hang): ``start``/``window`` must give a window
of at most ``MAX_WINDOW_HORIZONS`` x the configured horizon (400 naming the limit); ``inf``/``NaN``
and unparseable times are 400 at parsing; a Flagger body that is not a JSON object, nests too deeply
or carries non-scalar ``metadata`` values is 400.

Timing: a look that does not finish within ``look_deadline_s`` (wall clock, default 15 s, below
the 20 s controller timeouts in the docs) answers 504; its late result is discarded, and while it
still runs, further looks of that run answer 504 at once (bounded threads against a hanging
backend). Looks of one run closer together than ``reuse_s`` reuse the last answer (Flagger calls
several hooks per iteration). Each computed look is an OpenTelemetry span ``canary.look``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuobs.canary import runs as R
from gpuobs.canary.analyzer import AnalysisState, Analyzer
from gpuobs.canary.config import CanaryConfig, ConfigError, parse_duration, parse_time
from gpuobs.core import httpd, log, tokens
from gpuobs.promapi.prometheus import PromClient, PrometheusError, PrometheusUnavailable

MAX_BODY_BYTES = 1024 * 1024
LOOK_DEADLINE_S = 15.0
MAX_WORKERS = 32
OK_METRIC = "gpuobs_canary_ok"
#: Longest stateless window (``start``/``window``), in horizons: the analysis is final at one horizon,
#: and the look plan of a stateless caller grows with the window (one look per interval).
MAX_WINDOW_HORIZONS = 2.0
_log = log.get("canary-serve")


class RequestError(Exception):
    """A client error: HTTP ``status`` with ``message``."""

    def __init__(self, status: int, message: str):
        self.status, self.message = status, message
        super().__init__(message)


class LookTimeout(Exception):
    """The per-look deadline ran out, or an earlier look of the run is still running (HTTP 504)."""


class CanaryServer(httpd.Server):
    """HTTP server holding the Prometheus client, the config, the run store and the tracer.

    ``store``: a :class:`~gpuobs.canary.runs.RunStore` (default: in memory). ``look_deadline_s``:
    wall-clock budget of one look. ``reuse_s``: looks of one run closer than this reuse the last
    answer (default min(10 s, interval / 3)). ``grace_s``: past horizon + grace, a look that cannot
    reach the backend answers INCONCLUSIVE instead of an error (default: one interval).
    ``tracing``: a :class:`gpuobs.core.otel.Tracing` (default: from the OTel environment).
    """

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], client: PromClient, config: CanaryConfig,
                 canary: str | None = None, baseline: str | None = None, clock=time.time,
                 store: R.RunStore | None = None, look_deadline_s: float = LOOK_DEADLINE_S,
                 reuse_s: float | None = None, grace_s: float | None = None, tracing: Any = None,
                 token: str | None = None):
        super().__init__(addr, CanaryHandler)
        from gpuobs.core import otel

        self.client, self.config, self.clock = client, config, clock
        self.token = token
        self.default_canary, self.default_baseline = canary, baseline
        self.store = store if store is not None else R.RunStore(None)
        self.look_deadline_s = float(look_deadline_s)
        self.reuse_s = min(10.0, config.interval_s / 3) if reuse_s is None else float(reuse_s)
        self.grace_s = config.interval_s if grace_s is None else float(grace_s)
        self.tracing = tracing if tracing is not None else otel.setup(service_name="gpuobs-canary",
                                                                      scope="gpuobs.canary.serve")
        self.tracer = self.tracing.tracer
        self.pool = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="canary-look")
        self.in_flight: set[str] = set()
        self.in_flight_lock = threading.Lock()

    def server_close(self) -> None:
        super().server_close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- one look ---------------------------------------------------------------------------------
    def _analyzer(self, params: dict[str, str]) -> Analyzer:
        canary = params.get("canary") or self.default_canary
        baseline = params.get("baseline") or self.default_baseline
        if not canary or not baseline:
            raise RequestError(400, "canary and baseline selectors are required (parameters or server defaults)")
        try:
            return Analyzer(self.client, self.config, canary, baseline)
        except ConfigError as exc:
            raise RequestError(400, str(exc)) from None

    def _timed(self, analyzer: Analyzer, start: float, end: float, state: AnalysisState | None,
               key: str | None, attrs: dict[str, Any]) -> dict[str, Any]:
        """Run one analysis under the look deadline and a span; returns the settled dict.

        Raises LookTimeout, PrometheusError, RequestError (a bad window)."""
        with self.tracer.start_as_current_span("canary.look", attributes=attrs) as span:
            fut = self.pool.submit(analyzer.analyze, start, end, state)
            try:
                verdict = fut.result(timeout=self.look_deadline_s)
            except FutureTimeout:
                if key is not None:
                    with self.in_flight_lock:
                        self.in_flight.add(key)
                    fut.add_done_callback(lambda _f: self._done(key))
                span.set_attribute("canary.error", "deadline")
                raise LookTimeout(f"the look did not finish within the per-look deadline of "
                                  f"{self.look_deadline_s:g} s (slow or hanging Prometheus)") from None
            except PrometheusError as exc:
                span.set_attribute("canary.error", type(exc).__name__)
                raise
            except ValueError as exc:
                raise RequestError(400, str(exc)) from None
            doc = R.settle(verdict.to_dict())
            span.set_attributes(look_attrs(doc))
            return doc

    def _done(self, key: str) -> None:
        with self.in_flight_lock:
            self.in_flight.discard(key)

    def evaluate(self, params: dict[str, str]) -> dict[str, Any]:
        """One look per ``params`` (canary, baseline, run, step, start, window); returns the answer dict.

        Raises RequestError (400) on bad parameters, LookTimeout (504) and PrometheusError from the
        backend (never past horizon + grace of a run: that answers INCONCLUSIVE).
        """
        analyzer = self._analyzer(params)
        now = self.clock()
        attrs = {"canary.canary": analyzer.canary, "canary.baseline": analyzer.baseline}
        if params.get("start") or params.get("window"):
            try:
                start = (parse_time(params["start"], "start") if params.get("start")
                         else now - parse_duration(params["window"], "window"))
            except ConfigError as exc:
                raise RequestError(400, str(exc)) from None
            if start >= now:
                raise RequestError(400, "start must be in the past")
            limit = MAX_WINDOW_HORIZONS * self.config.horizon_s
            if now - start > limit:
                which = "start" if params.get("start") else "window"
                raise RequestError(400, f"{which}: the window would be {now - start:.0f} s; the limit is "
                                        f"{limit:.0f} s ({MAX_WINDOW_HORIZONS:g} x the {self.config.horizon_s:.0f} s "
                                        "horizon): analyse a recent window or use a run")
            return self._timed(analyzer, start, now, None, None, attrs)
        return self.look_run(analyzer, params.get("run", ""), params.get("step", ""), now, attrs)[1]

    def look_run(self, analyzer: Analyzer, run: str, step: str, now: float,
                 attrs: dict[str, Any] | None = None) -> tuple[R.RunRecord, dict[str, Any]]:
        """One look of the run (``run``, ``step``, selectors) at ``now``; returns (record, answer)."""
        key = R.run_key(run, step, analyzer.canary, analyzer.baseline)
        attrs = dict(attrs or {}, **{"canary.run": run, "canary.step": step})
        cfg = self.config
        with self.store.key_lock(key):
            rec = self.store.get(key)
            if rec is None or now - rec.last_seen > cfg.horizon_s:
                if rec is not None:
                    _log.info("run expired; starting a new one", extra={"fields": {"run": run, "step": step}})
                rec = R.RunRecord(key, step, now, now)
            rec.last_seen = now
            if rec.answer is not None:  # decided: sticky
                self.store.put(rec)
                return rec, dict(rec.answer, run=rec.info(True))
            if now - rec.start < 1.0:
                self.store.put(rec)
                return rec, _started(rec, analyzer)
            if rec.last_answer is not None and rec.last_look is not None and now - rec.last_look < self.reuse_s:
                self.store.put(rec)
                return rec, dict(rec.last_answer, run=rec.info(False))
            past = now - rec.start >= cfg.horizon_s + self.grace_s
            with self.in_flight_lock:
                busy = key in self.in_flight
            try:
                if busy:
                    raise LookTimeout("an earlier look of this run is still running past its deadline")
                state = AnalysisState.from_dict(rec.state)
                doc = self._timed(analyzer, rec.start, now, state, key, attrs)
                rec.state = state.to_dict()
            except (LookTimeout, PrometheusError) as exc:
                if not past:
                    self.store.put(rec)
                    raise
                doc = R.inconclusive(rec, now, f"the horizon and its grace passed without a decision and this look "
                                               f"failed ({exc})", analyzer.canary, analyzer.baseline, cfg.alpha,
                                     cfg.horizon_s)
            rec.looks += 1
            rec.last_look, rec.last_answer = now, doc
            if doc["final"]:
                rec.decision, rec.decided_at, rec.answer = doc["verdict"], now, doc
                _log.info("run decided", extra={"fields": {"run": run, "step": step, "verdict": doc["verdict"],
                                                           "looks": rec.looks}})
            self.store.put(rec)
            return rec, dict(doc, run=rec.info(False))

    def grant_step(self, rec: R.RunRecord) -> None:
        """Record one confirmed Flagger traffic increase of ``rec``."""
        with self.store.key_lock(rec.key):
            cur = self.store.get(rec.key) or rec
            cur.steps_granted += 1
            self.store.put(cur)


def look_attrs(doc: dict[str, Any]) -> dict[str, Any]:
    """Span attributes of an answer: verdict, final, time fraction, window, per-metric class/effect/CI."""
    from gpuobs.core.otel import clean_attrs

    attrs: dict[str, Any] = {"canary.verdict": doc["verdict"], "canary.final": bool(doc["final"]),
                             "canary.time_fraction": doc.get("time_fraction"),
                             "canary.window_s": (doc.get("end") or 0) - (doc.get("start") or 0)}
    for m in doc.get("metrics") or []:
        p = f"canary.{m['name']}"
        attrs[f"{p}.class"] = m.get("classification")
        attrs[f"{p}.effect"] = m.get("effect")
        if m.get("interval"):
            attrs[f"{p}.ci_low"], attrs[f"{p}.ci_high"] = m["interval"]
    return clean_attrs(attrs)


def _started(rec: R.RunRecord, analyzer: Analyzer) -> dict[str, Any]:
    """The HOLD answer of a run's first contact (no window yet)."""
    return {"verdict": "HOLD", "reasons": ["analysis run registered; the window starts now"], "warnings": [],
            "metrics": [], "canary": analyzer.canary, "baseline": analyzer.baseline, "start": rec.start,
            "end": rec.start, "time_fraction": 0.0, "final": False, "alpha": analyzer.config.alpha, "score": None,
            "exit_code": 3, "deciding": [], "assumptions": [], "run": rec.info(False)}


_CONSTANT = re.compile(r"^\s*vector\s*\(\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*\)\s*$")
_QUERY = re.compile(r"^\s*" + OK_METRIC + r"\s*\{(.*)\}\s*$", re.S)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def constant_query(query: str) -> str | None:
    """The sample value of a constant ``vector(<number>)`` query as Prometheus writes it (``"1"``,
    ``"0.5"``), or None for any other query (then :func:`parse_ok_query` reads it)."""
    m = _CONSTANT.match(query or "")
    if not m:
        return None
    v = float(m.group(1))
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def parse_ok_query(query: str) -> dict[str, str]:
    """Labels of ``gpuobs_canary_ok{name="value",...}`` (PromQL string escapes). Raises ValueError."""
    m = _QUERY.match(query or "")
    if not m:
        raise ValueError(f'query must be {OK_METRIC}{{namespace="...",name="...",canary="...",baseline="..."}}')
    body, labels, pos = m.group(1).strip(), {}, 0
    while pos < len(body):
        lm = _LABEL.match(body, pos)
        if not lm:
            raise ValueError(f"cannot parse the label matchers at: {body[pos:pos + 40]!r}")
        labels[lm.group(1)] = json.loads('"' + lm.group(2) + '"')
        pos = lm.end()
    missing = [k for k in ("namespace", "name") if not labels.get(k)]
    if missing:
        raise ValueError(f"query needs the labels {', '.join(missing)}")
    return labels


class CanaryHandler(httpd.Handler):
    """Routes of :class:`CanaryServer` (see the module docstring; HTTP plumbing: :mod:`gpuobs.core.httpd`)."""

    server: CanaryServer
    server_version = "gpuobs-canary"
    max_body_bytes = MAX_BODY_BYTES
    methods = {"GET": "_get", "POST": "_post"}
    logger = _log

    def _send(self, status: int, doc: Any) -> None:
        self.send_json(status, doc)

    def _served(self, route: str, status: int, doc: dict[str, Any], run: str) -> None:
        _log.info("verdict served", extra={"fields": {"path": route, "verdict": doc.get("verdict"),
                                                      "status": status, "run": run}})
        self._send(status, doc)

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

    @staticmethod
    def _error_status(exc: Exception) -> int:
        if isinstance(exc, RequestError):
            return exc.status
        if isinstance(exc, LookTimeout):
            return 504
        return 503 if isinstance(exc, PrometheusUnavailable) else 502

    def _get(self) -> None:
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/healthz":
            self._send(200, {"status": "ok", "runs": self.server.store.count()})
        elif url.path == "/api/v1/analysis":
            if not self._authorized():
                return
            try:
                doc = self.server.evaluate(params)
            except (RequestError, LookTimeout, PrometheusError) as exc:
                self._send(self._error_status(exc), {"error": getattr(exc, "message", str(exc))})
                return
            self._served(url.path, 200, doc, params.get("run", ""))
        elif url.path == "/api/v1/query":
            if not self._authorized():
                return
            self._query(params)
        else:
            self._send(404, {"error": f"no route {url.path}; try /api/v1/analysis"})

    def _query(self, params: dict[str, str]) -> None:
        """Flagger MetricTemplate (prometheus provider): a one-sample vector of ``gpuobs_canary_ok``, or
        of a constant (``vector(1)``: Flagger's check of the template's address)."""
        const = constant_query(params.get("query", ""))
        if const is not None:
            sample = {"metric": {}, "value": [self.server.clock(), const]}
            self._send(200, {"status": "success", "data": {"resultType": "vector", "result": [sample]}})
            return
        try:
            labels = parse_ok_query(params.get("query", ""))
            analyzer = self.server._analyzer(labels)
        except ValueError as exc:
            self._send(400, {"status": "error", "errorType": "bad_data", "error": str(exc)})
            return
        except RequestError as exc:
            self._send(400, {"status": "error", "errorType": "bad_data", "error": exc.message})
            return
        prefix = "/".join((labels["namespace"], labels["name"], ""))
        run = prefix + labels.get("checksum", "")
        if "checksum" not in labels:  # a MetricTemplate cannot see the checksum: use the hooks' latest run
            latest = self.server.store.latest(json.dumps([prefix])[:-2])
            if latest is not None:
                run = json.loads(latest.key)[0]
        now = self.server.clock()
        warnings: list[str] = []
        try:
            _, doc = self.server.look_run(analyzer, run, labels.get("step", ""), now)
            ok, verdict = doc["verdict"] in (R.HOLD, R.PROMOTE), doc["verdict"]
        except (LookTimeout, PrometheusError) as exc:
            ok, verdict = True, "error"
            warnings.append(f"look failed before the horizon (not a failure yet): {exc}")
        sample = {"metric": {"__name__": OK_METRIC, "namespace": labels["namespace"], "name": labels["name"],
                             "verdict": verdict},
                  "value": [now, "1" if ok else "0"]}
        body: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": [sample]}}
        if warnings:
            body["warnings"] = warnings
        self._served("/api/v1/query", 200, body, run)

    def _post(self) -> None:
        url = urlsplit(self.path)
        hooks = ("rollback", "confirm-promotion", "confirm-traffic-increase", "rollout")
        hook = url.path.removeprefix("/flagger/") if url.path.startswith("/flagger/") else ""
        if hook not in hooks:
            self.discard_body()
            self._send(404, {"error": f"no route {url.path}; try /flagger/{{{','.join(hooks)}}}"})
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
        params = {k: str(v) for k, v in meta.items() if k in ("canary", "baseline", "start", "window", "run", "step")}
        params["run"] = "/".join(str(payload.get(k, "")) for k in ("namespace", "name", "checksum")) + params.get("run", "")
        self._hook(url.path, hook, params, str(payload.get("phase", "")))

    def _hook(self, route: str, hook: str, params: dict[str, str], phase: str) -> None:
        srv = self.server
        if phase in ("Waiting", "Initializing", "Initialized"):  # the analysis has not started
            yes = hook == "rollout"
            self._served(route, 200 if yes else 403, {"verdict": None, "phase": phase,
                                                      "reason": "the canary analysis has not started"}, params["run"])
            return
        rec = None
        try:
            if params.get("start") or params.get("window"):
                doc = srv.evaluate(params)
            else:
                rec, doc = srv.look_run(srv._analyzer(params), params["run"], params.get("step", ""), srv.clock())
        except RequestError as exc:
            self._send(exc.status, {"error": exc.message})
            return
        except (LookTimeout, PrometheusError) as exc:
            status = self._error_status(exc)
            if hook == "rollout":  # an outage before the horizon is not a failed check; the horizon bounds it
                self._served(route, 200, {"verdict": None, "error": str(exc)}, params["run"])
            else:
                self._send(status, {"error": str(exc)})
            return
        v = doc["verdict"]
        if hook == "rollback":
            ok = v == R.ROLLBACK
        elif hook == "confirm-promotion":
            ok = v == R.PROMOTE
        elif hook == "rollout":
            ok = v in (R.HOLD, R.PROMOTE)
        else:  # confirm-traffic-increase
            first = rec is not None and rec.steps_granted == 0
            lean = R.leans_harmful(doc) if v == R.HOLD else []
            ok = v in (R.HOLD, R.PROMOTE) and (first or R.has_evidence(doc)) and not lean
            if ok and rec is not None:
                srv.grant_step(rec)
            if not ok and lean:
                doc = dict(doc, reasons=list(doc.get("reasons") or []) + [
                    "traffic increase held: the canary leans harmful (" + "; ".join(lean) + ")"])
            elif not ok and v in (R.HOLD, R.PROMOTE):
                doc = dict(doc, reasons=list(doc.get("reasons") or []) + [
                    "traffic increase held: a critical metric has no data at the current weight"])
        status = 200 if ok else (409 if hook == "rollout" else 403)
        self._served(route, status, doc, params["run"])


def serve(host: str, port: int, client: PromClient, config: CanaryConfig, canary: str | None = None,
          baseline: str | None = None, state_dir: str | None = None,
          look_deadline_s: float = LOOK_DEADLINE_S, token: str | None = None) -> None:
    """Run the verdict server until interrupted (``token``: bearer token the analysis routes require).
    Raises OSError when the address cannot be bound or the state directory cannot be created,
    sqlite3.Error when its database cannot be opened."""
    store = R.RunStore(state_dir)
    srv = CanaryServer((host, port), client, config, canary, baseline, store=store, look_deadline_s=look_deadline_s,
                       token=token)
    _log.info("canary verdict server listening", extra={"fields": {
        "host": host, "port": srv.server_address[1], "prometheus": client.url,
        "state": str(store.path) if store.path else "memory (runs do not survive a restart)",
        "look_deadline_s": look_deadline_s}})
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        srv.tracing.shutdown()
        store.close()
