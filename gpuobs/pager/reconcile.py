"""Reconcile open incidents with Alertmanager: resolve those whose alerts it no longer has.

An incident opened from Alertmanager's notifications stays open until a notification resolves it. When
Alertmanager loses the alert instead (it restarted while the alert ended, or the stack went down
mid-incident: docs/alert-delivery.md), no resolution ever comes and the console shows the incident
open for good. The reconciler asks Alertmanager for every alert it holds (``GET /api/v2/alerts``,
active, silenced, inhibited and unprocessed alike) and resolves an open or acknowledged incident none
of whose firing alerts' fingerprints has been among them for ``grace_s`` (timed from the first check
that found them missing, not from the last notification: Alertmanager repeats a notification only
every 4h). The grace must exceed the time a still-firing alert can be missing from a restarted
Alertmanager: Prometheus re-sends a firing alert every resend delay (3 min on the stack; a first send
after a joint restart can be dropped, so up to twice that), so the default is the alert validity
Prometheus gives each send, 4 x the resend delay (:mod:`gpuobs.stack.alert_timing`). Alertmanager
unreachable or answering nonsense: nothing is resolved.
"""

from __future__ import annotations

from typing import Any

from gpuobs.core import log
from gpuobs.pager.periodic import Periodic

_log = log.get("pager.reconcile")


class Reconciler(Periodic):
    """Background reconciliation every ``every_s`` seconds (daemon thread). ``alerts()`` returns the
    fingerprints Alertmanager holds now and raises when it cannot say (e.g.
    :meth:`gpuobs.promapi.silences.AlertmanagerClient.fingerprints`); ``store`` is a
    :class:`gpuobs.pager.store.PageStore`."""

    failure = "reconciliation skipped: Alertmanager did not answer"

    def __init__(self, store: Any, alerts, grace_s: float, every_s: float = 30.0):
        if grace_s <= 0 or every_s <= 0:
            raise ValueError(f"grace_s and every_s must be > 0 seconds, got {grace_s} and {every_s}")
        super().__init__(every_s, "reconciler")
        self.store, self.alerts, self.grace_s = store, alerts, grace_s
        self._since: dict[int, float] = {}  # incident id -> when Alertmanager was first seen without its alerts

    def check(self, now: float) -> list[int]:
        """Resolve what Alertmanager has not held for ``grace_s`` at ``now``; returns the incident ids.
        The absence is timed from the first check that found it (a pager restart starts it over)."""
        present = set(self.alerts())
        missing = set(self.store.unheld(present))
        self._since = {iid: self._since.get(iid, now) for iid in missing}
        due = [iid for iid, since in self._since.items() if now - since >= self.grace_s]
        ids = self.store.resolve_unheld(due, present, now, {iid: now - self._since[iid] for iid in due})
        for iid in ids:
            self._since.pop(iid, None)
            _log.warning("incident resolved by reconciliation", extra={"fields": {"incident": iid}})
        return ids
