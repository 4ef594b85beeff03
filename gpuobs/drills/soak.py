"""Soak: watch a healthy fleet for N minutes and count every alert that fires and every notification
that reaches the pager. A healthy fleet with realistic noise must produce zero pages and zero tickets
(the Watchdog, which always fires and routes nowhere, excepted)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpuobs.core.fleet import FleetConfig, shipped_fleet
from gpuobs.core.meta_alerts import is_meta
from gpuobs.promapi.alertmanager import AlertApiError, PagerClient
from gpuobs.drills.runner import alerts_client
from gpuobs.stack.state import StackState


@dataclass
class SoakResult:
    """Outcome of a soak: duration, alerts seen firing (name -> labels), notifications by channel."""

    minutes: float
    started_at: float
    polls: int = 0
    fired: dict[str, dict] = field(default_factory=dict)
    notifications: dict[str, int] = field(default_factory=lambda: {"page": 0, "ticket": 0})
    errors: int = 0

    @property
    def ok(self) -> bool:
        return not self.fired and not any(self.notifications.values())

    def to_dict(self) -> dict:
        return {"minutes": self.minutes, "started_at": self.started_at, "polls": self.polls, "fired": self.fired,
                "notifications": self.notifications, "errors": self.errors, "ok": self.ok}

    def summary(self) -> str:
        fired = ", ".join(sorted(self.fired)) or "none"
        return (f"soak {self.minutes:g} min, {self.polls} polls: alerts fired: {fired}; pages: "
                f"{self.notifications['page']}, tickets: {self.notifications['ticket']}; poll errors: {self.errors}; "
                f"result: {'PASS' if self.ok else 'FAIL'}")


def run_soak(state: StackState, minutes: float, poll_s: float = 5.0, progress=None,
             fleet: FleetConfig | None = None) -> SoakResult:
    """Poll Prometheus alerts and the pager every ``poll_s`` for ``minutes``; never injects anything.
    Alerts are counted per alert name and the fleet config's identity label (``fleet``: the one the
    stack's rules were rendered from, default the shipped one)."""
    ident = (fleet or shipped_fleet()).identity_label
    alerts_api, pager_api = alerts_client(state), PagerClient(state.urls.pager)
    res = SoakResult(minutes, time.time())
    end = res.started_at + minutes * 60
    next_report = res.started_at + 60
    while time.time() < end:
        try:
            alerts = alerts_api.alerts()
            pages = pager_api.pages(limit=1000)
        except AlertApiError:
            res.errors += 1
            time.sleep(poll_s)
            continue
        res.polls += 1
        for a in alerts:
            name = a["labels"].get("alertname")
            if not is_meta(a["labels"]) and a["state"] == "firing":
                key = f"{name}{{{ident}={a['labels'].get(ident, '')}}}"
                if key not in res.fired and progress:
                    progress(f"ALERT {key} firing")
                res.fired.setdefault(key, a["labels"])
        res.notifications = {"page": 0, "ticket": 0}
        for p in pages:
            if p["received_at"] >= res.started_at and p["status"] == "firing":
                res.notifications[p["channel"]] += 1
        if progress and time.time() >= next_report:
            next_report += 60
            progress(f"{(time.time() - res.started_at) / 60:.0f} min: {len(res.fired)} alert(s), "
                     f"{sum(res.notifications.values())} notification(s)")
        time.sleep(poll_s)
    return res
