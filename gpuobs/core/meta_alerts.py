"""Alerts that are states, not incidents: which firing alerts the firing views leave out.

``Watchdog`` (prometheus/rules/gpu-health.yml, label ``family="meta"``) fires all the time by design:
it is the dead man's switch that proves the Prometheus -> Alertmanager path works, and in production
Alertmanager routes it to a heartbeat receiver that pages when it *stops* arriving (on the stack, to the
``blackhole`` receiver). It must stay an alert (a recording rule never reaches Alertmanager), but it is
never an incident: every gpuobs view of firing alerts (the pager's incidents, and with them the
console and ``gpuobs incident``; the drills' false-alert and soak checks) leaves it out with
:func:`is_meta`. docs/incidents.md says so for the on-call.

There is no other such state alert: the kernel-log watcher's "logwatch reads its source" is
``gpuobs_logwatch_source_up`` used inside the DCGM Xid alerts' expressions (gpuobs.mixin.kernel_log_rules),
not an always-firing ``GpuKernelLogWatching`` alert (removed in 5e3cb81, issue 32).
"""

from __future__ import annotations

from typing import Mapping

#: Alert names that fire by design while everything is healthy.
META_ALERTS = frozenset({"Watchdog"})
#: The ``family`` label value the mixin gives such alerts.
META_FAMILY = "meta"


def is_meta(labels: Mapping[str, str]) -> bool:
    """True for an always-firing state alert (by ``alertname`` or ``family="meta"``), which no firing
    view counts as an incident or a false alert. ``labels``: the alert's label set."""
    return labels.get("alertname") in META_ALERTS or labels.get("family") == META_FAMILY
