"""Rollout notices: a rollout that ends RolledBack, Rejected or Aborted raises an alert in Alertmanager.

Posted through Alertmanager's API v2 (``POST /api/v2/alerts``), so routing, grouping, inhibition and
silences apply as to any alert. Labels: ``alertname`` = ``RolloutRolledBack`` | ``RolloutRejected`` |
``RolloutAborted``, ``severity="warning"`` (the stack routes warnings to the ``ticket`` receiver: the
platform already returned to the known release; a person has to decide what next), ``rollout`` (id),
``version``. Annotations: ``summary``, ``description`` (the verdict and reason), ``report`` (the
commands that write the rollout's HTML report). The alert ends after ``NOTICE_TTL_S`` (then
Alertmanager sends the resolution), so a notice nobody acknowledged does not stay open for ever.
"""

from __future__ import annotations

import time
from typing import Any

from gpuobs.promapi.silences import AlertmanagerClient, SilenceApiError, rfc3339
from gpuobs.rollout.model import ABORTED, REJECTED, ROLLED_BACK

#: Terminal states that raise a notice -> alertname.
NOTICE_STATES = {ROLLED_BACK: "RolloutRolledBack", REJECTED: "RolloutRejected", ABORTED: "RolloutAborted"}
#: Seconds a notice stays firing.
NOTICE_TTL_S = 3600.0


def notice(rec: Any, run_dir: str, now: float | None = None, flag: str | None = None) -> dict[str, Any] | None:
    """The Alertmanager alert for a finished rollout record, or None when its state raises none.

    ``flag``: the record is a feature-flag rollout (``gpuobs flag``) of that flag: the alertname is
    prefixed ``Flag`` (``FlagRolloutRolledBack``...), a ``flag`` label is added and the report
    command reads ``gpuobs flag status``."""
    name = NOTICE_STATES.get(rec.state)
    if name is None:
        return None
    t = time.time() if now is None else now
    hosts = rec.spec.get("hosts") or []
    group = "rollout" if flag is None else "flag"
    report = (f"gpuobs {group} status --run-dir {run_dir} --id {rec.id} --json > {rec.id}.json && "
              f"gpuobs report rollout --run-dir {run_dir} --file {rec.id}.json")
    labels = {"alertname": name if flag is None else "Flag" + name, "severity": "warning", "rollout": rec.id,
              "version": rec.version, **({} if flag is None else {"flag": flag})}
    return {
        "labels": labels,
        "annotations": {
            "summary": f"Rollout of {rec.version} ended {rec.state}",
            "description": f"Rollout {rec.id} of {rec.version} on {len(hosts)} serving node(s) ended {rec.state}: "
                           f"{rec.reason or 'no reason recorded'}",
            "report": report,
        },
        "startsAt": rfc3339(t), "endsAt": rfc3339(t + NOTICE_TTL_S), "generatorURL": "",
    }


def send(alertmanager_url: str, rec: Any, run_dir: str, flag: str | None = None) -> str | None:
    """Post the notice of ``rec`` (if its state raises one); returns a line for the operator, or None
    when there is nothing to send. Never raises: a notice that cannot be sent is reported, not fatal."""
    alert = notice(rec, run_dir, flag=flag)
    if alert is None:
        return None
    try:
        AlertmanagerClient(alertmanager_url).post_alerts([alert])
    except SilenceApiError as exc:
        return f"warning: the {alert['labels']['alertname']} notice could not be sent to Alertmanager: {exc}"
    return f"notice {alert['labels']['alertname']} sent to Alertmanager ({alertmanager_url})"
