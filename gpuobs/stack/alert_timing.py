"""Alert-delivery timing of the stack, derived so that no ordinary outage loses or fakes a page.

Facts from the upstream source (read at the tags Debian 12 ships):

* Prometheus v2.42.0 ``rules/alerting.go`` ``AlertingRule.sendAlerts``: a firing alert is (re)sent
  when ``LastSentAt + resend_delay < now`` (``Alert.needsSending``; a resolution is sent at once) and
  each send carries ``ValidUntil = now + 4 * max(resend_delay, evaluation_interval)``;
  ``rules/manager.go`` ``SendAlerts`` turns that into the Alertmanager alert's ``endsAt`` (a resolved
  alert's ``endsAt`` is its ``ResolvedAt``). Sends happen at evaluations only, so two sends of a
  firing alert are at most ``resend_delay + evaluation_interval`` apart. The first send of a new
  alert happens at the evaluation where it starts firing, whatever the resend delay: the resend delay
  does not change fault-to-page latency.
* Alertmanager v0.25.0 ``api/v2/api.go`` ``postAlertsHandler``: ``resolve_timeout`` is applied only
  to alerts posted *without* ``endsAt`` (``alert.EndsAt.IsZero()``), so it never applies to
  Prometheus's alerts; an alert whose ``endsAt`` has passed is resolved (``types/types.go``
  ``Alert.Resolved``) and, with ``send_resolved``, notified as resolved at the next group flush.
  ``provider/mem/mem.go`` ``Put`` merges a re-sent alert that overlaps the stored one
  (``types.Alert.Merge``: the earliest ``startsAt`` wins), so a restarted Prometheus's re-sent
  alert continues the same notification instead of starting a new one.
* Prometheus v2.42.0 ``rules/manager.go`` ``RestoreForState``: after a restart the ``for`` state of
  an alert is restored from ``ALERTS_FOR_STATE`` only for rules whose ``for`` is at least
  ``--rules.alert.for-grace-period`` (default 10m); other rules wait their whole ``for`` again.
* Prometheus v2.42.0 ``notifier/notifier.go`` ``Manager.Run``: a batch sent while no Alertmanager is
  known yet is dropped (``prometheus_notifications_dropped_total``), and Alertmanagers are learned
  through the discovery manager, which pushes updates on a 5 s ticker (``discovery/manager.go``
  ``updatert``). So the first send after a (re)start, which happens at the first evaluations, can be
  dropped (measured: the Watchdog's first send at stack start-up is); the alert then reaches
  Alertmanager one resend delay later.
* Alertmanager v0.25.0 ``cmd/alertmanager/main.go``: ``--data.maintenance-interval`` (default 15m)
  is how often the notification log and silences are snapshotted to disk (``nflog.WithMaintenance``);
  a kill -9 forgets every notification sent since the last snapshot, and Alertmanager keeps no
  alerts on disk at all (Prometheus re-sends them within ``resend_delay + evaluation_interval``).

Derivation (no false resolution for a Prometheus outage of ``max_outage_s``): Prometheus dies at T,
its last send was at T - (r + e) at worst (r = resend delay, e = evaluation interval), so
Alertmanager holds the alert until ``T - r - e + 4 r = T + 3 r - e``. The restarted Prometheus must
re-send before then: after the outage O it needs ``restart_s`` to start, replay its WAL, evaluate
once, restore the ``for`` state and evaluate again, and that first send may be dropped (above), so
the send that counts can come one more ``r`` later. So ``3 r - e >= O + restart_s + r``, i.e.
``r >= (O + e + restart_s) / 2``; rounded up to whole ``RESEND_STEP_S``. With O = 5 min, e = 5 s,
restart_s = 45 s: r >= 175 s -> **3m**, leaving 50 s for the restart (measured: under 20 s).
The ``for`` state must survive the restart too, so the grace period is set to the evaluation
interval (every rule with a ``for`` of 5 s or more is restored; one already firing fires again at
the first evaluation after the restore). ``resolve_timeout`` (for clients that send no ``endsAt``)
is set to the same validity Prometheus gives, ``4 r``.

vmalert (HA topology, fleet-wide rules). vmalert v1.79.5 (the Debian package's version; the same
code at v1.79.0), ``app/vmalert/group.go`` ``getResolveDuration``: every send of a firing alert
carries ``endsAt = now + 4 * max(group interval, -rule.resendDelay)``, capped by
``-rule.maxResolveDuration`` when that is > 0 (default 0: no cap; the flag's help text, "by default
equal to 3 evaluation intervals of the parent group", is older than the code); ``app/vmalert/
alerting.go`` ``alertsToSend``: a firing alert is re-sent at an evaluation when ``LastSent +
resendDelay < now``, a resolution at once. That is Prometheus's rule with the same names, so
``-rule.resendDelay = r`` gives vmalert's alerts the same validity ``4 r`` and the same outage
bound (:meth:`AlertTiming.vmalert_flags`). Without it (resend delay 0) the validity is 4 group
intervals (20 s at the local 5 s), and a longer vmalert outage resolves every fleet-wide alert and
pages it again after the restart. After a restart vmalert restores ``for`` state from
``ALERTS_FOR_STATE`` through ``-remoteRead.url`` and sends a restored firing alert at its first
evaluation straight to the ``-notifier.url`` list (no discovery, so no dropped first send); the
Prometheus bound, which allows for that drop, is therefore conservative for vmalert.

Cost: an alert whose send failed because Alertmanager was down reaches it up to ``r + e`` later
(Alertmanager restarted, or reachable again): the latency of a page raised *during* an Alertmanager
outage, not of a fault while the pipeline is healthy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuobs.core.durations import format_duration

#: The Prometheus outage the settings tolerate without a false resolution (issue 12: 5 minutes).
MAX_OUTAGE_S = 300.0
#: Time from a restarted Prometheus's exec to its re-send of a restored firing alert (start-up,
#: WAL replay, one evaluation, restore, one more evaluation), with room to spare.
RESTART_ALLOWANCE_S = 45.0
#: Resend delays are rounded up to a multiple of this.
RESEND_STEP_S = 30.0
#: Alertmanager's notification-log snapshot interval: a kill -9 loses at most this much of it (the
#: pager's delivery dedupe absorbs what is re-sent from that gap).
NFLOG_MAINTENANCE_S = 5.0
#: Prometheus's evaluation interval in prometheus/prometheus.yml.
EVALUATION_INTERVAL_S = 5.0


@dataclass(frozen=True)
class AlertTiming:
    """The derived settings, seconds; see the module docstring."""

    resend_delay_s: float
    for_grace_period_s: float
    resolve_timeout_s: float
    nflog_maintenance_s: float
    evaluation_interval_s: float

    @property
    def validity_s(self) -> float:
        """How long Alertmanager keeps a firing alert after one send (Prometheus's ``ValidUntil``)."""
        return 4 * max(self.resend_delay_s, self.evaluation_interval_s)

    def tolerated_outage_s(self, restart_s: float = RESTART_ALLOWANCE_S) -> float:
        """Longest Prometheus outage without a false resolution, the first send after the restart
        dropped: ``4 max(r, e) - (r + e) - restart_s - r``."""
        return 4 * max(self.resend_delay_s, self.evaluation_interval_s) - (
            self.resend_delay_s + self.evaluation_interval_s) - restart_s - self.resend_delay_s

    def prometheus_flags(self) -> list[str]:
        return [f"--rules.alert.resend-delay={format_duration(self.resend_delay_s)}",
                f"--rules.alert.for-grace-period={format_duration(self.for_grace_period_s)}"]

    def vmalert_flags(self) -> list[str]:
        """vmalert's flags for the same validity (``4 r``) and resend schedule as Prometheus's (module
        docstring); ``-rule.maxResolveDuration`` stays 0 (no cap below ``4 r``)."""
        return [f"-rule.resendDelay={format_duration(self.resend_delay_s)}", "-rule.maxResolveDuration=0"]

    def alertmanager_flags(self) -> list[str]:
        return [f"--data.maintenance-interval={format_duration(self.nflog_maintenance_s)}"]


def derive(max_outage_s: float = MAX_OUTAGE_S, evaluation_interval_s: float = EVALUATION_INTERVAL_S,
           restart_s: float = RESTART_ALLOWANCE_S) -> AlertTiming:
    """The settings that survive a Prometheus outage of ``max_outage_s`` (see the module docstring).

    Raises ValueError unless every input is finite, ``max_outage_s``/``restart_s`` >= 0 and the
    evaluation interval > 0.
    """
    for name, v in (("max_outage_s", max_outage_s), ("restart_s", restart_s)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    if not (math.isfinite(evaluation_interval_s) and evaluation_interval_s > 0):
        raise ValueError(f"evaluation_interval_s must be a finite number > 0, got {evaluation_interval_s}")
    r = (max_outage_s + evaluation_interval_s + restart_s) / 2
    r = max(RESEND_STEP_S, math.ceil(r / RESEND_STEP_S - 1e-9) * RESEND_STEP_S)
    return AlertTiming(resend_delay_s=r, for_grace_period_s=evaluation_interval_s,
                       resolve_timeout_s=4 * max(r, evaluation_interval_s),
                       nflog_maintenance_s=NFLOG_MAINTENANCE_S, evaluation_interval_s=evaluation_interval_s)


#: The settings of the native and compose stacks.
DEFAULT = derive()
