"""Flagger's canary analysis loop, emulated on a simulated clock, for controller-semantics tests.

Read from fluxcd/flagger v1.44.0 (facts, not code):

* ``pkg/controller/webhook.go`` ``callWebhook``: POST the JSON payload ``{name, namespace, phase,
  checksum, metadata}`` with the hook's ``timeout`` (default 10 s); a status above 202 or a transport
  error is a failure.
* ``pkg/controller/scheduler.go`` ``advanceCanary``, once per ``analysis.interval``: in Progressing,
  Waiting or WaitingPromotion the ``rollback`` hooks run first and a success rolls back; then
  ``failedChecks >= threshold`` rolls back; then, unless at weight 0 before the first iteration
  (pre-rollout hooks), ``runAnalysis`` calls every ``rollout`` hook and every metric check, and the
  first failure increments ``failedChecks`` and ends the iteration; then, if the next step weight is
  positive and the phase is not WaitingPromotion/Promoting/Finalising, the
  ``confirm-traffic-increase`` hooks gate (``scheduler_hooks.go``); ``runCanary`` then raises the
  weight by ``stepWeight`` up to ``maxWeight`` or, at ``maxWeight``, asks the ``confirm-promotion``
  hooks: failure sets WaitingPromotion, success promotes (Promoting -> Finalising -> Succeeded).
* ``pkg/metrics/providers/prometheus.go`` ``RunQuery``: GET ``<address>/api/v1/query?query=...``;
  status >= 400 is an error; the value is ``data.result[*].value[1]`` parsed as a float; no value or
  NaN is ``ErrNoValuesFound``; a metric check fails when the value is outside ``thresholdRange`` or the
  query errs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import requests


@dataclass
class FlaggerRun:
    """State of one canary analysis: phase, weight, failed checks and a log of (time, event)."""

    phase: str = "Progressing"
    weight: int = 0
    iterations: int = 0
    failed_checks: int = 0
    log: list[tuple[float, str]] = field(default_factory=list)
    max_weight_seen: int = 0


def call_hook(hook: dict, canary: dict, checksum: str, phase: str, base_url: str) -> tuple[bool, Any]:
    """One webhook call; returns (ok, body)."""
    url = re.sub(r"^https?://[^/]+", base_url, hook["url"])
    payload = {"name": canary["metadata"]["name"], "namespace": canary["metadata"]["namespace"],
               "phase": phase, "checksum": checksum, "metadata": hook.get("metadata") or {}}
    timeout = float(str(hook.get("timeout", "10s")).rstrip("s"))
    try:
        r = requests.post(url, json=payload, timeout=timeout)
    except requests.RequestException as exc:
        return False, str(exc)
    try:
        body = r.json()
    except ValueError:
        body = r.text
    return r.status_code <= 202, body


def query_metric(template: dict, canary: dict, base_url: str) -> float:
    """A MetricTemplate (prometheus provider) query with Flagger's variables filled; raises on errors."""
    q = template["spec"]["query"]
    q = q.replace("{{ namespace }}", canary["metadata"]["namespace"]).replace(
        "{{ target }}", canary["spec"]["targetRef"]["name"])
    r = requests.get(f"{base_url}/api/v1/query", params={"query": q}, timeout=10)
    if r.status_code >= 400:
        raise RuntimeError(f"error response: Status {r.status_code}: {r.text}")
    value = None
    for res in r.json()["data"]["result"]:
        if "values" in res:
            raise RuntimeError("multiple values")
        value = float(res["value"][1])
    if value is None or value != value:
        raise RuntimeError("no values found")
    return value


def run_canary(canary: dict, templates: dict[str, dict], base_url: Callable[[], str],
               set_clock: Callable[[float], None], start: float, set_weight: Callable[[float, int], None],
               checksum: str = "7c9d4f", max_iterations: int = 400,
               on_iteration: Callable[[int, float], None] = lambda i, t: None) -> FlaggerRun:
    """Run ``advanceCanary`` every interval from ``start`` until Succeeded or Failed (or raise)."""
    an = canary["spec"]["analysis"]
    interval = float(re.fullmatch(r"(\d+)s", an["interval"]).group(1)) if an["interval"].endswith("s") else \
        60.0 * float(an["interval"].rstrip("m"))
    threshold, step, max_w = int(an["threshold"]), int(an.get("stepWeight", 0)), int(an.get("maxWeight", 100))
    hooks = an.get("webhooks") or []
    st = FlaggerRun()

    def hooks_of(kind: str) -> list[dict]:
        return [h for h in hooks if h.get("type", "rollout") == kind]

    for i in range(max_iterations):
        t = start + i * interval
        on_iteration(i, t)
        set_clock(t)
        url = base_url()
        # rollback hooks
        if st.phase in ("Progressing", "Waiting", "WaitingPromotion"):
            if any(call_hook(h, canary, checksum, st.phase, url)[0] for h in hooks_of("rollback")):
                st.log.append((t, "rollback hook"))
                st.phase = "Failed"
                set_weight(t, 0)
                return st
        if st.failed_checks >= threshold:
            st.log.append((t, "threshold reached"))
            st.phase = "Failed"
            set_weight(t, 0)
            return st
        if not (st.weight == 0 and st.iterations == 0):
            failed = False
            for h in hooks_of("rollout"):
                ok, body = call_hook(h, canary, checksum, "Progressing", url)
                if not ok:
                    st.log.append((t, f"rollout hook failed: {body}"))
                    failed = True
                    break
            if not failed:
                for m in an.get("metrics") or []:
                    tmpl = templates[m["templateRef"]["name"]]
                    try:
                        v = query_metric(tmpl, canary, url)
                    except (RuntimeError, requests.RequestException, KeyError, ValueError) as exc:
                        st.log.append((t, f"metric {m['name']} error: {exc}"))
                        failed = True
                        break
                    rng = m.get("thresholdRange") or {}
                    if ("min" in rng and v < rng["min"]) or ("max" in rng and v > rng["max"]):
                        st.log.append((t, f"metric {m['name']} out of range: {v}"))
                        failed = True
                        break
            if failed:
                st.failed_checks += 1
                continue
        if step > 0:
            if st.phase not in ("WaitingPromotion", "Promoting", "Finalising"):
                if not all(call_hook(h, canary, checksum, "Progressing", url)[0]
                           for h in hooks_of("confirm-traffic-increase")):
                    st.log.append((t, "traffic increase held"))
                    continue
            if st.weight < max_w:
                st.weight = min(st.weight + step, 100)
                st.iterations += 1
                st.max_weight_seen = max(st.max_weight_seen, st.weight)
                set_weight(t, st.weight)
                st.log.append((t, f"weight {st.weight}"))
                continue
            if not all(call_hook(h, canary, checksum, "Progressing", url)[0]
                       for h in hooks_of("confirm-promotion")):
                if st.phase != "WaitingPromotion":
                    st.phase = "WaitingPromotion"
                    st.log.append((t, "waiting promotion"))
                continue
            st.phase = "Succeeded"
            st.log.append((t, "promoted"))
            set_weight(t, 0)
            return st
    raise AssertionError(f"canary still {st.phase} after {max_iterations} iterations: {st.log[-5:]}")
