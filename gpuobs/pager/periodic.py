"""The pager's background checks (escalation, reconciliation): one daemon thread that calls
``check(now)`` every ``every_s`` seconds until stopped; a failed check is logged and tried again at
the next tick, never the end of the loop."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

from gpuobs.core import log

_log = log.get("pager")


class Periodic(ABC):
    """Subclasses implement ``check(now: float)`` (epoch seconds); ``failure`` is the log line for a
    check that raised."""

    failure = "background check failed"

    def __init__(self, every_s: float, name: str):
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check(time.time())
            except Exception:  # noqa: BLE001 (a failed check must not end the loop for good)
                _log.warning(self.failure, exc_info=True)

    @abstractmethod
    def check(self, now: float):
        """One check at ``now`` (epoch seconds)."""


class HeldReleaser(Periodic):
    """Every ``every_s`` seconds, end the holds of replayed firings (an Alertmanager member's stale
    snapshot sent after a resolution, :mod:`gpuobs.pager.incidents`) that are due: re-open the incident
    when Alertmanager still holds the alert, drop the replay when it does not. ``store``: a
    :class:`gpuobs.pager.store.PageStore`; ``alerts()``: the fingerprints Alertmanager holds now (e.g.
    :meth:`gpuobs.promapi.silences.AlertmanagerClient.fingerprints`), None when no Alertmanager is
    configured; when it raises, the incidents re-open (late, never lost)."""

    failure = "ending held re-openings failed"

    def __init__(self, store, alerts=None, every_s: float = 1.0):
        super().__init__(every_s, "held-releaser")
        self.store, self.alerts = store, alerts

    def check(self, now: float) -> tuple[list[int], list[int]]:
        if not self.store.holds_due(now):
            return [], []
        present = None
        if self.alerts is not None:
            try:
                present = set(self.alerts())
            except Exception:  # noqa: BLE001 (any failure to ask: re-open rather than lose a page)
                _log.warning("Alertmanager did not answer: held re-openings are released", exc_info=True)
        reopened, dropped = self.store.release_held(now, present)
        for iid in reopened:
            _log.info("held re-opening released: Alertmanager still holds the alert",
                      extra={"fields": {"incident": iid}})
        for iid in dropped:
            _log.info("held re-opening dropped: Alertmanager no longer holds the alert (a stale replay)",
                      extra={"fields": {"incident": iid}})
        return reopened, dropped
