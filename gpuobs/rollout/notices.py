"""Rollout notices: a rollout that ends RolledBack, Rejected or Aborted raises an alert in Alertmanager.

Posted through Alertmanager's API v2 (``POST /api/v2/alerts``), so routing, grouping, inhibition and
silences apply as to any alert. Labels: ``alertname`` = ``RolloutRolledBack`` | ``RolloutRejected`` |
``RolloutAborted`` (``Flag``-prefixed for a feature-flag rollout; ``DriverUpgradeRolledBack`` ... for a
driver upgrade, ``gpuobs upgrade``), ``severity="warning"`` (the stack
routes warnings to the ``ticket`` receiver: the platform already returned to the known release; a
person has to decide what next), ``rollout`` (id), ``version``. Annotations: ``summary``,
``description`` (at most :data:`MAX_DESCRIPTION_LINES` short lines, :func:`description`: where it
ended, the deciding test with its effect and interval or else why, and where the report is),
``report`` (the commands that write the rollout's HTML report), ``affected_nodes`` /
``affected_since`` / ``affected_until`` (the stage's nodes and span, RFC 3339, when a stage ran: the
pager measures the incident's impact there, :mod:`gpuobs.pager.impact`) and ``runbook_url``
(``<runbook_base>/runbooks/rollout.md#<alertname-lowercase>``, :func:`gpuobs.mixin.runbooks.runbook_url`;
the base is the fleet config's, :attr:`gpuobs.core.fleet.FleetConfig.runbook_base`). The
assumptions the verdicts rest on are in the report, not in the ticket. The alert ends after
``NOTICE_TTL_S`` (then Alertmanager sends the resolution), so a notice nobody acknowledged does not
stay open for ever.
"""

from __future__ import annotations

import time
from typing import Any

from gpuobs.canary.verdict import deciding_line
from gpuobs.mixin.runbooks import runbook_url
from gpuobs.promapi.silences import AlertmanagerClient, SilenceApiError, rfc3339
from gpuobs.rollout.model import ABORTED, CANARY_ROLLBACK, REJECTED, ROLLED_BACK

#: Terminal states that raise a notice -> alertname (a flag rollout's is prefixed ``Flag``).
NOTICE_STATES = {ROLLED_BACK: "RolloutRolledBack", REJECTED: "RolloutRejected", ABORTED: "RolloutAborted"}
#: Seconds a notice stays firing.
NOTICE_TTL_S = 3600.0
#: The runbook (``runbooks/<file>.md``) with a section per notice alertname.
RUNBOOK_FILE = "rollout"
#: A ticket's description is at most this many lines, each at most MAX_LINE_CHARS characters.
MAX_DESCRIPTION_LINES = 5
MAX_LINE_CHARS = 200


#: The command group of driver upgrades (``gpuobs upgrade``), whose notices are ``DriverUpgrade<State>``.
UPGRADE_GROUP = "upgrade"


def alertnames(flag: bool = False, group: str = "rollout") -> list[str]:
    """Every notice alertname, of release rollouts, (``flag``) of feature-flag rollouts, or (``group``
    ``upgrade``) of driver upgrades."""
    return [_alertname(state, flag, group) for state in NOTICE_STATES]


def _alertname(state: str, flag: bool, group: str) -> str:
    if group == UPGRADE_GROUP:
        return "DriverUpgrade" + state
    return ("Flag" if flag else "") + NOTICE_STATES[state]


def _noun(group: str) -> str:
    return "Driver upgrade" if group == UPGRADE_GROUP else "Rollout"


def _cut(text: str) -> str:
    """``text`` on one line of at most MAX_LINE_CHARS characters (cut with ``...``)."""
    one = " ".join(str(text).split())
    return one if len(one) <= MAX_LINE_CHARS else one[:MAX_LINE_CHARS - 3].rstrip() + "..."


def description(rec: Any, run_dir: str, stage: Any = None, flag: str | None = None, group: str = "rollout") -> str:
    """The ticket's description, at most :data:`MAX_DESCRIPTION_LINES` lines: the rollout, its end
    state and the stage it ended in (``stage``: that stage's
    :class:`~gpuobs.rollout.store.StageRecord`, None when none ran); the deciding test's metric,
    effect and interval (:func:`gpuobs.canary.verdict.deciding_line`) when the canary analysis
    decided, else the recorded reason, cut to one line; and the status command that shows the report."""
    hosts = rec.spec.get("hosts") or []
    total = len(rec.spec.get("stages") or [])
    where = (f"in stage {stage.idx + 1}/{total} ({len(stage.hosts)} of {len(hosts)} serving node(s))"
             if stage is not None else f"before any stage (nothing deployed on its {len(hosts)} serving node(s))")
    what = "batch" if group == UPGRADE_GROUP else "stage"
    where = where.replace("stage", what) if stage is not None else where
    lines = [f"{_noun(group)} {rec.id} {'to' if group == UPGRADE_GROUP else 'of'} {rec.version} ended {rec.state} "
             f"{where}."]
    doc = (stage.verdict_doc or {}) if stage is not None else {}
    deciding = doc.get("deciding") or []
    if rec.state == ROLLED_BACK and str(rec.reason).startswith(CANARY_ROLLBACK) and deciding:
        more = f" (+{len(deciding) - 1} more test(s), see the report)" if len(deciding) > 1 else ""
        lines.append(_cut(f"Deciding: {deciding_line(deciding[0])}{more}"))
    else:
        lines.append(_cut(f"Why: {rec.reason or 'no reason recorded'}"))
    group = "flag" if flag is not None else group
    lines.append(f"Report: gpuobs {group} status --run-dir {run_dir} --id {rec.id} (the HTML report: the commands in the report annotation)")
    return "\n".join(lines[:MAX_DESCRIPTION_LINES])


def notice(rec: Any, run_dir: str, runbook_base: str, now: float | None = None, flag: str | None = None,
           stage: Any = None, group: str = "rollout") -> dict[str, Any] | None:
    """The Alertmanager alert for a finished rollout record, or None when its state raises none.

    ``runbook_base``: the fleet config's runbook base (``runbook_url`` is
    ``<base>/runbooks/rollout.md#<alertname-lowercase>``). ``stage``: the
    :class:`~gpuobs.rollout.store.StageRecord` the rollout ended in (for :func:`description`).
    ``flag``: the record is a feature-flag rollout (``gpuobs flag``) of that flag: the alertname is
    prefixed ``Flag`` (``FlagRolloutRolledBack``...), a ``flag`` label is added and the report
    command reads ``gpuobs flag status``. ``group``: the command group (``upgrade``: a driver upgrade,
    ``DriverUpgrade<State>``, ``gpuobs upgrade status``)."""
    if rec.state not in NOTICE_STATES:
        return None
    t = time.time() if now is None else now
    alertname = _alertname(rec.state, flag is not None, group)
    group = "flag" if flag is not None else group
    report = (f"gpuobs {group} status --run-dir {run_dir} --id {rec.id} --json > {rec.id}.json && "
              f"gpuobs report rollout --run-dir {run_dir} --file {rec.id}.json")
    labels = {"alertname": alertname, "severity": "warning", "rollout": rec.id,
              "version": rec.version, **({} if flag is None else {"flag": flag})}
    annotations = {
        "summary": f"{_noun(group)} {'to' if group == UPGRADE_GROUP else 'of'} {rec.version} ended {rec.state}",
        "description": description(rec, run_dir, stage, flag, group),
        "report": report,
        "runbook_url": runbook_url(runbook_base, RUNBOOK_FILE, alertname),
    }
    if stage is not None and stage.hosts:  # what the release touched, for the incident's impact
        annotations.update(affected_nodes=",".join(stage.hosts), affected_since=rfc3339(stage.started_at),
                           affected_until=rfc3339(stage.ended_at or t))
    return {
        "labels": labels,
        "annotations": annotations,
        "startsAt": rfc3339(t), "endsAt": rfc3339(t + NOTICE_TTL_S), "generatorURL": "",
    }


#: The alert a driver upgrade keeps firing while it runs: Alertmanager inhibits GpuDriverSkew with it
#: (two drivers in a pool is the upgrade's expected state, not a ticket; gpuobs/mixin/alertmanager.py).
IN_PROGRESS = "DriverUpgradeInProgress"


def in_progress(rec: Any, run_dir: str, runbook_base: str, until: float, now: float | None = None) -> list[dict[str, Any]]:
    """The ``DriverUpgradeInProgress`` alerts of driver upgrade ``rec``, one per GPU model it upgrades
    (``modelName`` label, as GpuDriverSkew's; ``severity="info"``: routed to no receiver), firing from
    ``now`` until ``until`` (unix seconds; pass ``now`` itself to resolve them). A controller that dies
    leaves them to expire at ``until``, after which a half-upgraded pool tickets again."""
    t = time.time() if now is None else now
    models = sorted(set((rec.spec.get("gpu_models") or {}).values())) or [""]
    return [{"labels": {"alertname": IN_PROGRESS, "severity": "info", "rollout": rec.id, "version": rec.version,
                        **({"modelName": m} if m else {})},
             "annotations": {"summary": f"Driver upgrade to {rec.version} in progress",
                             "description": f"Driver upgrade {rec.id}: GpuDriverSkew is inhibited for this GPU model "
                                            f"while it runs. Report: gpuobs upgrade status --run-dir {run_dir} --id {rec.id}",
                             "runbook_url": runbook_url(runbook_base, RUNBOOK_FILE, IN_PROGRESS)},
             "startsAt": rfc3339(min(t, rec.created_at) if getattr(rec, "created_at", None) else t),
             "endsAt": rfc3339(max(until, t)), "generatorURL": ""} for m in models]


def send_in_progress(alertmanager_url: str, rec: Any, run_dir: str, runbook_base: str, until: float) -> str | None:
    """Post :func:`in_progress`; returns a warning line when Alertmanager refused it, else None (never raises)."""
    try:
        AlertmanagerClient(alertmanager_url).post_alerts(in_progress(rec, run_dir, runbook_base, until))
    except SilenceApiError as exc:
        return f"warning: the {IN_PROGRESS} alert could not be sent to Alertmanager: {exc}"
    return None


def send(alertmanager_url: str, rec: Any, run_dir: str, runbook_base: str, flag: str | None = None,
         stage: Any = None, group: str = "rollout") -> str | None:
    """Post the notice of ``rec`` (if its state raises one; arguments as :func:`notice`); returns a
    line for the operator, or None when there is nothing to send. Never raises: a notice that cannot
    be sent is reported, not fatal."""
    alert = notice(rec, run_dir, runbook_base, flag=flag, stage=stage, group=group)
    if alert is None:
        return None
    try:
        AlertmanagerClient(alertmanager_url).post_alerts([alert])
    except SilenceApiError as exc:
        return f"warning: the {alert['labels']['alertname']} notice could not be sent to Alertmanager: {exc}"
    return f"notice {alert['labels']['alertname']} sent to Alertmanager ({alertmanager_url})"
