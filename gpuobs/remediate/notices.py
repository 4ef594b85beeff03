"""Remediation notices: the breaker's page and the escalations' tickets, raised in Alertmanager.

Posted through Alertmanager's API v2 (``POST /api/v2/alerts``) like the rollout's notices
(:mod:`gpuobs.rollout.notices`), so routing, grouping, inhibition and silences apply:

* ``RemediationHalted`` (``severity="critical"``: the ``page`` receiver), while the fleet breaker is
  open: one alert for the fleet (no node label), ``startsAt`` = when it tripped, so re-posts are the
  same alert and Alertmanager pages once. The description says why (how many nodes, within what
  window, the likely cause) and how to close it.
* ``RemediationEscalated`` (``severity="warning"``: ``ticket``), one per escalated node (labels: the
  identity label, ``fault`` = the alert that started it), until a person releases the node.

Every alert is re-posted every ``resend_s`` with ``endsAt`` = now + ``ttl_s``; one that no longer
holds is posted once with ``endsAt`` = now, which resolves it (Alertmanager API v2 ``postableAlert``:
an alert whose ``endsAt`` has passed is resolved). A post that fails is retried at the next tick;
after a controller restart the first sync re-posts whatever still holds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gpuobs.mixin.runbooks import runbook_url
from gpuobs.promapi.silences import AlertmanagerClient, SilenceApiError, rfc3339

_log = logging.getLogger("gpuobs.remediate.notices")
RUNBOOK_FILE = "remediation"
#: The label the Kubernetes Alertmanager fragment routes gpuobs's alerts on (gpuobs/mixin/kubernetes.py adds
#: it to every alerting rule); without it the notices would go to the cluster's default receiver.
ROUTING_LABEL = {"gpuobs": "true"}


def desired(store: Any, identity_label: str, runbook_base: str) -> dict[tuple, dict[str, Any]]:
    """``{key: alert without times}`` for what holds now (see the module docstring)."""
    out: dict[tuple, dict[str, Any]] = {}
    b = store.breaker()
    if b["open"]:
        out[("RemediationHalted",)] = {
            "labels": {"alertname": "RemediationHalted", "severity": "critical", "family": "remediation",
                       **ROUTING_LABEL},
            "annotations": {
                "summary": "Fleet-wide event: automatic remediation halted",
                "description": b["reason"] + ". No node is quarantined, reset or rebooted until a person closes "
                               "the breaker: gpuobs remediate breaker close --reason '...'",
                "runbook_url": runbook_url(runbook_base, RUNBOOK_FILE, "RemediationHalted")},
            "_starts": b["opened_at"]}
    for ep in store.out_of_service():
        if ep.state != "escalated":
            continue
        out[("RemediationEscalated", ep.node)] = {
            "labels": {"alertname": "RemediationEscalated", "severity": "warning", "family": "remediation",
                       identity_label: ep.node, "fault": ep.alertname, **ROUTING_LABEL},
            "annotations": {
                "summary": f"Remediation of {ep.node} escalated: the node stays out of service",
                "description": f"{ep.node}: {ep.reason}. Repair or RMA it, then: gpuobs remediate release {ep.node}",
                "runbook_url": runbook_url(runbook_base, RUNBOOK_FILE, "RemediationEscalated")},
            "_starts": ep.closed_at or ep.state_since}
    return out


class Notifier:
    """Keeps the notices in the Alertmanagers at ``alertmanager_urls`` in step with the store."""

    def __init__(self, alertmanager_urls: list[str], runbook_base: str, resend_s: float = 60.0, ttl_s: float = 300.0,
                 clock: Any = time.time):
        self.clients = [AlertmanagerClient(u) for u in alertmanager_urls]
        self.runbook_base, self.resend_s, self.ttl_s, self.clock = runbook_base, resend_s, ttl_s, clock
        self._sent: dict[tuple, dict[str, Any]] = {}
        self._last = -float("inf")

    def sync(self, store: Any, identity_label: str) -> None:
        now = self.clock()
        want = desired(store, identity_label, self.runbook_base)
        gone = {k: v for k, v in self._sent.items() if k not in want}
        if set(want) == set(self._sent) and now - self._last < self.resend_s:
            return
        alerts = []
        for a in want.values():
            alerts.append({"labels": a["labels"], "annotations": a["annotations"], "startsAt": rfc3339(a["_starts"]),
                           "endsAt": rfc3339(now + self.ttl_s), "generatorURL": ""})
        for a in gone.values():
            alerts.append({"labels": a["labels"], "annotations": a["annotations"], "startsAt": rfc3339(a["_starts"]),
                           "endsAt": rfc3339(now), "generatorURL": ""})
        if alerts:
            ok = False
            for c in self.clients:
                try:
                    c.post_alerts(alerts)
                    ok = True
                except SilenceApiError as exc:
                    _log.warning("posting remediation notices failed", extra={"fields": {"error": str(exc)}})
            if not ok:
                return
        self._sent, self._last = want, now
