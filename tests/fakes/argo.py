"""Argo Rollouts' evaluation of a ``web`` metric, emulated on a simulated clock, for controller-semantics tests.

Read from argoproj/argo-rollouts v1.9.1 (facts, not code):

* ``metricproviders/webmetric/webmetric.go``: GET the URL with ``timeoutSeconds`` (default 10 s); a
  transport error or a status outside 200-299 is a measurement **Error**; a JSON body is reduced
  with ``jsonPath`` and the result handed to the conditions; a non-JSON 2xx body is Successful.
* ``utils/evaluate/evaluate.go`` ``EvaluateResult``: failureCondition true -> Failed; else
  successCondition true -> Successful; neither -> Inconclusive (with only one condition given, the
  other is its negation).
* ``analysis/analysis.go`` ``runMeasurements``: Successful/Failed/Inconclusive increment ``count``
  and reset ``consecutiveError``; Error increments ``consecutiveError`` but not ``count``;
  ``consecutiveSuccess`` counts Successful in a row and resets on anything else.
  ``assessMetricStatus``/``assessMetricFailureInconclusiveOrError``: Failed when failed >
  failureLimit (default 0; negative = not applicable); Inconclusive when inconclusive >
  inconclusiveLimit (default 0); Error when consecutiveError > consecutiveErrorLimit (default 4,
  ``utils/defaults/defaults.go``); then Successful when consecutiveSuccess >= consecutiveSuccessLimit
  (> 0); then at ``count``: Inconclusive when both failureLimit (>= 0) and consecutiveSuccessLimit
  apply, Failed when only consecutiveSuccessLimit does, else Successful.
* ``generateMetricTasks``/``calculateNextReconcileTime``: the next measurement is due when
  ``now > finishedAt + interval`` (``DefaultErrorRetryInterval`` = 10 s after an Error).
  ``finishedAt`` is a ``metav1.Time``, persisted in whole seconds (RFC 3339), so the controller
  re-enqueues up to 1 s early relative to the true finish.
* ``rollout/analysis.go``: AnalysisRun Inconclusive -> the Rollout pauses
  (``PauseReasonInconclusiveAnalysis``); Failed or Error -> the Rollout aborts.

Conditions are evaluated by :func:`eval_condition`, which understands the ``expr`` subset the
documented templates use (``result.a.b == "X"``, ``!=``, ``&&``, ``||``, ``true``/``false`` fields)
and raises on anything else, so a template change that the harness cannot judge fails the test.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import requests

ERROR_RETRY_S = 10.0
DEFAULT_CONSECUTIVE_ERROR_LIMIT = 4
ROLLOUT_EFFECT = {"Successful": "promoted", "Failed": "aborted", "Error": "aborted", "Inconclusive": "paused"}


def json_path(doc: Any, path: str) -> Any:
    """``{$}`` or ``{$.a.b}`` (the k8s JSONPath forms templates use). Raises KeyError when absent."""
    m = re.fullmatch(r"\{\$((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}", path.strip())
    if not m:
        raise ValueError(f"unsupported jsonPath {path!r}")
    for part in filter(None, m.group(1).split(".")):
        doc = doc[part]
    return doc


_TERM = re.compile(r'^\s*(result(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*(==|!=)\s*("(?:[^"\\]|\\.)*"|true|false|nil)\s*$')


def eval_condition(expr: str, result: Any) -> bool:
    """Evaluate an Argo condition over ``result`` (subset of antonmedv/expr; see module doc)."""
    def term(t: str) -> bool:
        t = t.strip()
        while t.startswith("(") and t.endswith(")"):
            t = t[1:-1].strip()
        if "||" in t or "&&" in t:
            return evaluate(t)
        m = _TERM.match(t)
        if not m:
            raise ValueError(f"unsupported condition term {t!r}")
        val: Any = result
        for part in m.group(1).split(".")[1:]:
            val = val.get(part) if isinstance(val, dict) else None
        lit = m.group(3)
        want: Any = {"true": True, "false": False, "nil": None}.get(lit, lit[1:-1] if lit.startswith('"') else None)
        return (val == want) if m.group(2) == "==" else (val != want)

    def evaluate(e: str) -> bool:
        return any(all(term(a) for a in _split(o, "&&")) for o in _split(e, "||"))

    return evaluate(expr)


def _split(e: str, op: str) -> list[str]:
    out, depth, cur, i = [], 0, "", 0
    while i < len(e):
        if e[i] == "(":
            depth += 1
        elif e[i] == ")":
            depth -= 1
        if depth == 0 and e.startswith(op, i):
            out.append(cur)
            cur, i = "", i + len(op)
            continue
        cur += e[i]
        i += 1
    return out + [cur]


def _int(metric: dict, name: str, default: int | None) -> int | None:
    v = metric.get(name)
    return default if v is None else int(v)


def _duration_s(text: str) -> float:
    m = re.fullmatch(r"(\d+)(s|m|h)", str(text))
    if not m:
        raise ValueError(f"unsupported duration {text!r}")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def validate_metric(metric: dict) -> None:
    """``ValidateMetric`` (utils/analysis/factory.go v1.9.1), the checks on limits and count. Raises
    ValueError with Argo's message."""
    count = _int(metric, "count", 0)
    failure = _int(metric, "failureLimit", 0)
    csl = _int(metric, "consecutiveSuccessLimit", 0)
    inconclusive = _int(metric, "inconclusiveLimit", 0)
    if csl < 0:
        raise ValueError("consecutiveSuccessLimit must be >= 0")
    if failure < -1:
        raise ValueError("failureLimit must be >= 0, or -1 to be disabled")
    if csl == 0 and failure == -1:
        raise ValueError("failureLimit and consecutiveSuccessLimit cannot both be disabled")
    if inconclusive < 0 or _int(metric, "consecutiveErrorLimit", 0) < 0:
        raise ValueError("limits must be >= 0")
    if count > 0:
        if failure >= 0 and count < failure + csl:
            raise ValueError("count must be >= failureLimit + consecutiveSuccessLimit")
        if failure < 0 and count < csl:
            raise ValueError("count must be >= consecutiveSuccessLimit")
        if count < inconclusive:
            raise ValueError("count must be >= inconclusiveLimit")
    if count > 1 and not metric.get("interval"):
        raise ValueError("interval must be specified when count > 1")


@dataclass
class Measurement:
    phase: str
    started: float
    finished: float
    value: Any = None
    message: str = ""


@dataclass
class MetricRun:
    """One metric of one AnalysisRun: counters as in ``v1alpha1.MetricResult`` and the measurements."""

    metric: dict
    count: int = 0
    failed: int = 0
    inconclusive: int = 0
    successful: int = 0
    error: int = 0
    consecutive_error: int = 0
    consecutive_success: int = 0
    measurements: list[Measurement] = field(default_factory=list)

    def record(self, m: Measurement) -> None:
        self.measurements.append(m)
        if m.phase == "Error":
            self.error += 1
            self.consecutive_error += 1
            self.consecutive_success = 0
            return
        self.count += 1
        self.consecutive_error = 0
        if m.phase == "Successful":
            self.successful += 1
            self.consecutive_success += 1
        else:
            self.consecutive_success = 0
            if m.phase == "Failed":
                self.failed += 1
            else:
                self.inconclusive += 1

    def assess(self) -> str:
        """``assessMetricStatus`` for a metric whose last measurement completed."""
        mt = self.metric
        failure_limit = _int(mt, "failureLimit", 0)
        phase = None
        if failure_limit >= 0 and self.failed > failure_limit:
            phase = "Failed"
        if self.inconclusive > _int(mt, "inconclusiveLimit", 0):
            phase = "Inconclusive"
        if self.consecutive_error > _int(mt, "consecutiveErrorLimit", DEFAULT_CONSECUTIVE_ERROR_LIMIT):
            phase = "Error"
        if phase:
            return phase
        csl = _int(mt, "consecutiveSuccessLimit", 0)
        if csl > 0 and self.consecutive_success >= csl:
            return "Successful"
        count = _int(mt, "count", None)
        if count is not None and self.count >= count:
            failure_applicable = "failureLimit" not in mt or failure_limit >= 0
            if failure_applicable and csl > 0:
                return "Inconclusive"
            if csl > 0:
                return "Failed"
            return "Successful"
        return "Running"


def measure(metric: dict, url: str, look: Callable[[], None], started: float, latency_s: float) -> Measurement:
    """One ``web`` measurement: ``look()`` sets the server's clock to the look time; the HTTP call is
    real (127.0.0.1); the measurement finishes ``latency_s`` simulated seconds after it started."""
    web = metric["provider"]["web"]
    timeout = float(web.get("timeoutSeconds") or 10)
    finished = started + latency_s
    look()
    if latency_s > timeout:
        return Measurement("Error", started, started + timeout, message="timeout")
    try:
        resp = requests.get(url, timeout=timeout)
    except requests.RequestException as exc:
        return Measurement("Error", started, finished, message=str(exc))
    if not 200 <= resp.status_code < 300:
        return Measurement("Error", started, finished, message=f"received non 2xx response code: {resp.status_code}")
    try:
        body = resp.json()
    except ValueError:
        return Measurement("Successful", started, finished, value=resp.text)
    try:
        value = json_path(body, web.get("jsonPath", "{$}"))
    except (KeyError, TypeError) as exc:
        return Measurement("Error", started, finished, message=f"Could not find JSONPath in body: {exc}")
    succ, fail = metric.get("successCondition", ""), metric.get("failureCondition", "")
    s = eval_condition(succ, value) if succ else None
    f = eval_condition(fail, value) if fail else None
    if s is None and f is None:
        phase = "Successful"
    else:
        if s is None:
            s = not f
        if f is None:
            f = not s
        phase = "Failed" if f else ("Successful" if s else "Inconclusive")
    return Measurement(phase, started, finished, value=value)


def run_metric(metric: dict, args: dict[str, str], base_url: str, set_clock: Callable[[float], None],
               start: float, latency: Callable[[int], float] = lambda i: 0.2,
               on_measure: Callable[[int, float], None] = lambda i, t: None, max_measurements: int = 500
               ) -> tuple[str, MetricRun]:
    """Run one metric of an AnalysisRun from ``start`` until it completes; returns (phase, run).

    ``args`` fill ``{{args.NAME}}``; the URL's scheme://host:port is replaced with ``base_url`` (the
    test server). ``latency(i)``: simulated seconds measurement i takes (the server looks halfway);
    ``on_measure(i, t)`` runs before measurement i starts at simulated time t (restarts, faults).
    """
    url = re.sub(r"\{\{\s*args\.([A-Za-z0-9_-]+)\s*\}\}", lambda m: args[m.group(1)], metric["provider"]["web"]["url"])
    url = re.sub(r"^https?://[^/]+", lambda m: base_url() if callable(base_url) else base_url, url)
    interval = _duration_s(metric["interval"]) if metric.get("interval") else None
    mr = MetricRun(metric)
    t = start
    for i in range(max_measurements):
        on_measure(i, t)
        lat = latency(i)
        target = re.sub(r"^https?://[^/]+", lambda m: base_url() if callable(base_url) else base_url, url)
        m = measure(metric, target, lambda: set_clock(t + lat / 2), t, lat)
        mr.record(m)
        phase = mr.assess()
        if phase != "Running":
            return phase, mr
        finished = math.floor(m.finished)  # metav1.Time: whole seconds once persisted
        wait = ERROR_RETRY_S if m.phase == "Error" else interval
        if wait is None:
            return "Successful", mr
        t = finished + wait + 0.05  # due when now > finishedAt + interval; the requeue fires just after
    raise AssertionError(f"metric still running after {max_measurements} measurements")
