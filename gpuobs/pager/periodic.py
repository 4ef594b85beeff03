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
    """Every ``every_s`` seconds, re-open the incidents whose held replay (an Alertmanager member's stale
    firing after a resolution, :mod:`gpuobs.pager.incidents`) was not resolved within the hold
    (``store``: a :class:`gpuobs.pager.store.PageStore`)."""

    failure = "releasing held re-openings failed"

    def __init__(self, store, every_s: float = 1.0):
        super().__init__(every_s, "held-releaser")
        self.store = store

    def check(self, now: float) -> list[int]:
        ids = self.store.release_held(now)
        for iid in ids:
            _log.info("held re-opening released: no resolution followed the replayed firing",
                      extra={"fields": {"incident": iid}})
        return ids
