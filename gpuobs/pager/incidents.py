"""Incidents: what is open now, built from the stored notifications.

One incident per Alertmanager aggregation group and channel: the key is ``(channel, groupKey)``
(Alertmanager's group key names the route and the group labels, alertmanager v0.25.0
``dispatch/dispatch.go`` ``aggrGroup.GroupKey``), and its alerts are tracked by their
``fingerprint`` (the hash of the alert's label set, ``model.LabelSet.Fingerprint``). Every webhook
notification of a group carries all of the group's alerts, firing and resolved, so each
notification sets the state of the alerts it names:

* ``open``: at least one alert firing and nobody acknowledged it;
* ``acknowledged``: at least one alert firing, acknowledged (by whom and when are on the timeline);
* ``resolved``: every known alert of the group resolved (a resolved notification resolves).

A firing notification for a resolved incident re-opens it (the acknowledgement is cleared: it was for
the earlier firing), except a *replay*: a notification that lists as firing only alerts this incident
holds as resolved with the same ``startsAt``, arriving within ``hold_s`` of the resolution. That is
what an Alertmanager cluster member sends when it took its snapshot of the group just before the
resolution reached it and then waited its turn (``position x --cluster.peer-timeout``) while the first
member sent the resolution: alertmanager v0.25.0 ``dispatch/dispatch.go`` ``aggrGroup.flush`` lists the
group's alerts when the flush timer fires, ``notify/notify.go`` ``WaitStage.Exec`` then sleeps, and
``DedupStage.needsUpdate`` compares that stale list with the notification log the first member has
meanwhile written (``!entry.IsFiringSubset(firing)``: notify); upstream calls it a side effect of how
HA works (prometheus/alertmanager#4008). A new firing of the alert has a new ``startsAt``
(alertmanager v0.25.0 ``provider/mem/mem.go`` ``Put`` merges only overlapping alerts), so it re-opens
at once. The replay is *held*: a notification resolving it within ``hold_s`` drops it (``reopen_dropped``). No
such notification need come: once a member has notified the group with the alert resolved or absent
(a restarted member that never heard of it), the notification log's firing set is empty again and
no member sends another (``needsUpdate``: nothing firing and nothing notified as firing; measured in
the live HA restart test). So at the end of the hold :func:`release_held` asks Alertmanager
(``GET /api/v2/alerts``, which leaves out resolved alerts, alertmanager v0.25.0 ``api/v2/api.go``
``alertFilter``): an alert it still holds as active re-opens the incident at ``held_until`` (late by at
most ``hold_s``, never lost); one it does not hold is dropped as the stale replay it was. Without an
answer (no Alertmanager configured, or it does not answer) the incident re-opens: a page late, never
lost. A notification that lists no firing alert never re-opens an incident. Every change is one row of the incident's timeline (``kind``: ``opened``,
``notified``, ``acknowledged``, ``resolved``, ``reopened``, ``reopen_held``, ``reopen_dropped``,
``silenced``, ``silence_expired``, ``escalated``, ``reconciled``; escalation policy: :mod:`gpuobs.pager.escalation`; reconciliation with
Alertmanager: :mod:`gpuobs.pager.reconcile`).

The functions here take an open sqlite3 connection inside the caller's transaction
(:class:`gpuobs.pager.store.PageStore` holds the lock and commits).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from gpuobs.core.meta_alerts import is_meta

STATES = ("open", "acknowledged", "resolved")
#: Seconds a replayed firing (see the module docstring) is held before it re-opens a resolved incident,
#: and how soon after the resolution a firing counts as a replay: the stack's ``group_interval`` (10 s,
#: alertmanager/alertmanager.yml), within which the replaying member's next flush resolves it again,
#: plus the longest member wait, (3 members - 1) x ``--cluster.peer-timeout`` 3 s
#: (gpuobs.stack.ha.HAConfig), plus 4 s for delivery under load.
REPLAY_HOLD_S = 20.0
#: Severity labels in the order the console lists them (alert rules use critical/warning/info).
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    group_key TEXT NOT NULL,
    state TEXT NOT NULL,
    opened_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    acknowledged_at REAL,
    acknowledged_by TEXT,
    resolved_at REAL,
    group_labels TEXT NOT NULL,
    common_labels TEXT NOT NULL,
    open_since REAL,
    escalated_at REAL,
    held_until REAL,
    UNIQUE (channel, group_key)
);
CREATE TABLE IF NOT EXISTS incident_alerts (
    incident_id INTEGER NOT NULL REFERENCES incidents(id),
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    ends_at TEXT NOT NULL,
    PRIMARY KEY (incident_id, fingerprint)
);
CREATE TABLE IF NOT EXISTS incident_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id INTEGER NOT NULL REFERENCES incidents(id),
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incident_events_by_incident ON incident_events(incident_id);
CREATE TABLE IF NOT EXISTS incident_silences (
    incident_id INTEGER NOT NULL REFERENCES incidents(id),
    silence_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    ends_at TEXT NOT NULL,
    created_by TEXT NOT NULL,
    comment TEXT NOT NULL,
    matchers TEXT NOT NULL,
    expired_at REAL,
    PRIMARY KEY (incident_id, silence_id)
);
CREATE TABLE IF NOT EXISTS incident_impact (
    incident_id INTEGER PRIMARY KEY REFERENCES incidents(id),
    measured_at REAL NOT NULL,
    doc TEXT NOT NULL
);
"""


class IncidentNotFound(LookupError):
    """No incident with that id."""


def event(db: sqlite3.Connection, incident_id: int, at: float, kind: str, **detail: Any) -> None:
    """Append one timeline row."""
    db.execute("INSERT INTO incident_events(incident_id, at, kind, detail) VALUES (?, ?, ?, ?)",
               (incident_id, at, kind, json.dumps(detail, sort_keys=True)))


def migrate(db: sqlite3.Connection) -> None:
    """Add the columns a database from an older pager lacks (``incidents.held_until``)."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(incidents)")}
    if "held_until" not in cols:
        db.execute("ALTER TABLE incidents ADD COLUMN held_until REAL")


def _is_replay(db: sqlite3.Connection, iid: int, payload: dict, at: float, hold_s: float) -> bool:
    """Whether ``payload`` (a firing notification of resolved incident ``iid``) only replays alerts the
    incident holds as resolved, same ``startsAt``, within ``hold_s`` seconds of the resolution."""
    resolved_at = db.execute("SELECT resolved_at FROM incidents WHERE id = ?", (iid,)).fetchone()[0]
    if resolved_at is None or at - resolved_at > hold_s:
        return False
    stored = {fp: (st, sa) for fp, st, sa in db.execute(
        "SELECT fingerprint, status, starts_at FROM incident_alerts WHERE incident_id = ?", (iid,))}
    firing = [a for a in payload["alerts"] if a["status"] == "firing"]
    return bool(firing) and all(stored.get(a["fingerprint"]) == ("resolved", a["startsAt"]) for a in firing)


def _reopen(db: sqlite3.Connection, iid: int, at: float, **detail: Any) -> None:
    db.execute("UPDATE incidents SET state = 'open', resolved_at = NULL, acknowledged_at = NULL,"
               " acknowledged_by = NULL, open_since = ?, escalated_at = NULL, held_until = NULL WHERE id = ?",
               (at, iid))
    event(db, iid, at, "reopened", **detail)


def release_held(db: sqlite3.Connection, now: float, present: set[str] | None = None) -> tuple[list[int], list[int]]:
    """End every hold due by ``now``: an incident with a firing alert whose fingerprint Alertmanager still
    holds (``present``: the fingerprints it holds now; None: unknown) re-opens at its ``held_until``; one
    whose firing alerts Alertmanager no longer holds stays resolved and those alerts are marked resolved
    (``reopen_dropped``). Returns ``(re-opened ids, dropped ids)``."""
    reopened, dropped = [], []
    for iid, until in db.execute("SELECT id, held_until FROM incidents WHERE held_until IS NOT NULL"
                                 " AND held_until <= ? AND state = 'resolved'", (now,)).fetchall():
        firing = {fp for (fp,) in db.execute(
            "SELECT fingerprint FROM incident_alerts WHERE incident_id = ? AND status = 'firing'", (iid,))}
        if firing and (present is None or firing & present):
            _reopen(db, iid, until, held=True)
            reopened.append(int(iid))
            continue
        db.execute("UPDATE incident_alerts SET status = 'resolved' WHERE incident_id = ? AND status = 'firing'",
                   (iid,))
        db.execute("UPDATE incidents SET held_until = NULL WHERE id = ?", (iid,))
        if firing:
            event(db, iid, now, "reopen_dropped", reason="Alertmanager no longer holds the replayed alerts")
            dropped.append(int(iid))
    return reopened, dropped


def apply(db: sqlite3.Connection, notification_id: int, channel: str, payload: dict, at: float,
          hold_s: float = REPLAY_HOLD_S) -> int | None:
    """Fold one stored, validated notification into its incident; returns the incident id. ``hold_s``:
    seconds a replayed firing is held before it re-opens a resolved incident (module docstring).

    Always-firing state alerts (the Watchdog, :func:`gpuobs.core.meta_alerts.is_meta`) are no incident:
    they are left out, and a notification of nothing else opens none (returns None). Alertmanager
    routes the Watchdog away from the pager; this keeps the console and ``gpuobs incident`` clean when a
    route sends it here anyway (e.g. a catch-all receiver)."""
    alerts = [a for a in payload["alerts"] if not is_meta(a["labels"])]
    if not alerts:
        return None
    payload = {**payload, "alerts": alerts}
    gk = payload["groupKey"]
    row = db.execute("SELECT id, state FROM incidents WHERE channel = ? AND group_key = ?", (channel, gk)).fetchone()
    group_labels = json.dumps(payload["groupLabels"], sort_keys=True)
    common_labels = json.dumps(payload["commonLabels"], sort_keys=True)
    if row is None:
        iid = db.execute(
            "INSERT INTO incidents(channel, group_key, state, opened_at, updated_at, group_labels, common_labels,"
            " open_since) VALUES (?, ?, 'open', ?, ?, ?, ?, ?)",
            (channel, gk, at, at, group_labels, common_labels, at)).lastrowid
        prev = None
    else:
        iid, prev = int(row[0]), row[1]
        db.execute("UPDATE incidents SET updated_at = ?, group_labels = ?, common_labels = ? WHERE id = ?",
                   (at, group_labels, common_labels, iid))
    replay = prev == "resolved" and _is_replay(db, iid, payload, at, hold_s)
    # Only a notification that itself lists a firing alert may re-open (a resolved incident whose held
    # replay left an alert firing in incident_alerts is not re-opened by a later resolved notification).
    fires_now = any(a["status"] == "firing" for a in payload["alerts"])
    for a in payload["alerts"]:
        db.execute(
            "INSERT INTO incident_alerts VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(incident_id, fingerprint) DO UPDATE"
            " SET status = excluded.status, labels = excluded.labels, annotations = excluded.annotations,"
            " starts_at = excluded.starts_at, ends_at = excluded.ends_at",
            (iid, a["fingerprint"], a["status"], json.dumps(a["labels"], sort_keys=True),
             json.dumps(a["annotations"], sort_keys=True), a["startsAt"], a["endsAt"]))
    firing = db.execute("SELECT COUNT(*) FROM incident_alerts WHERE incident_id = ? AND status = 'firing'",
                        (iid,)).fetchone()[0]
    names = sorted({a["labels"]["alertname"] for a in payload["alerts"]})
    event(db, iid, at, "notified", notification=notification_id, status=payload["status"], alerts=names,
          firing=firing, receiver=payload["receiver"])
    if prev is None:
        if firing:
            event(db, iid, at, "opened")
        else:  # first heard of it resolved (the pager was down while it fired)
            db.execute("UPDATE incidents SET state = 'resolved', resolved_at = ? WHERE id = ?", (at, iid))
            event(db, iid, at, "resolved")
    elif firing and prev == "resolved" and replay:
        held = db.execute("SELECT held_until FROM incidents WHERE id = ?", (iid,)).fetchone()[0]
        if held is None:
            db.execute("UPDATE incidents SET held_until = ? WHERE id = ?", (at + hold_s, iid))
            event(db, iid, at, "reopen_held", notification=notification_id, until=at + hold_s)
    elif firing and prev == "resolved" and fires_now:
        _reopen(db, iid, at)
    elif not firing and prev != "resolved":
        db.execute("UPDATE incidents SET state = 'resolved', resolved_at = ? WHERE id = ?", (at, iid))
        event(db, iid, at, "resolved")
    elif not firing and db.execute("SELECT held_until FROM incidents WHERE id = ?", (iid,)).fetchone()[0]:
        db.execute("UPDATE incidents SET held_until = NULL WHERE id = ?", (iid,))
        event(db, iid, at, "reopen_dropped", notification=notification_id)
    return iid


def unheld(db: sqlite3.Connection, present: set[str]) -> list[int]:
    """Open or acknowledged incidents none of whose firing alerts' fingerprints is in ``present`` (the
    alerts Alertmanager holds)."""
    out = []
    for (iid,) in db.execute("SELECT id FROM incidents WHERE state != 'resolved'").fetchall():
        fps = [r[0] for r in db.execute(
            "SELECT fingerprint FROM incident_alerts WHERE incident_id = ? AND status = 'firing'", (iid,))]
        if fps and not any(fp in present for fp in fps):
            out.append(iid)
    return out


def resolve_unheld(db: sqlite3.Connection, ids: list[int], present: set[str], at: float, missing_s: dict[int, float]
                   ) -> list[int]:
    """Resolve (timeline ``reconciled``) those of ``ids`` that are still :func:`unheld` given ``present``:
    their firing alerts are marked resolved, and the group's delivery keys are forgotten so that the
    same alert notified again re-opens the incident instead of counting as a duplicate.
    ``missing_s[id]``: how long Alertmanager has not held the incident's alerts (for the timeline).
    Returns the incident ids resolved."""
    still = set(unheld(db, present))
    out = []
    for iid in ids:
        if iid not in still:
            continue
        channel, gk = db.execute("SELECT channel, group_key FROM incidents WHERE id = ?", (iid,)).fetchone()
        names = sorted({json.loads(lab)["alertname"] for (lab,) in db.execute(
            "SELECT labels FROM incident_alerts WHERE incident_id = ? AND status = 'firing'", (iid,))})
        db.execute("UPDATE incident_alerts SET status = 'resolved' WHERE incident_id = ? AND status = 'firing'", (iid,))
        db.execute("UPDATE incidents SET state = 'resolved', resolved_at = ?, updated_at = ? WHERE id = ?",
                   (at, at, iid))
        db.execute("DELETE FROM deliveries WHERE notification_id IN "
                   "(SELECT id FROM notifications WHERE channel = ? AND group_key = ?)", (channel, gk))
        event(db, iid, at, "reconciled", alerts=names,
              reason=f"Alertmanager has not held any of its alerts for {missing_s.get(iid, 0):.0f}s (it lost "
                     "them: a restart, or the stack went down mid-incident)")
        out.append(iid)
    return out


def acknowledge(db: sqlite3.Connection, incident_id: int, by: str, at: float, note: str = "") -> tuple[str, bool]:
    """Acknowledge an open incident (``note``: what the person is doing about it, on the timeline);
    returns ``(state after, changed)``. Acknowledging an acknowledged or resolved incident changes
    nothing (``changed`` False). Raises IncidentNotFound."""
    row = db.execute("SELECT state FROM incidents WHERE id = ?", (incident_id,)).fetchone()
    if row is None:
        raise IncidentNotFound(incident_id)
    if row[0] != "open":
        return row[0], False
    db.execute("UPDATE incidents SET state = 'acknowledged', acknowledged_at = ?, acknowledged_by = ?,"
               " updated_at = ? WHERE id = ?", (at, by, at, incident_id))
    event(db, incident_id, at, "acknowledged", by=by, **({"note": note} if note else {}))
    return "acknowledged", True


def _identity(alerts: list[dict], common: dict[str, str], identity_label: str) -> dict[str, Any]:
    """Node, GPUs, Xid codes, severity, alert names and descriptions of an incident's alerts.

    Node: the fleet config's ``identity_label`` (e.g. ``node``: the Kubernetes node of the scrape, set
    by the scrape config's relabelling) or else ``Hostname`` (stock dcgm-exporter's host label).
    """
    firing = [a for a in alerts if a["status"] == "firing"] or alerts

    def values(*keys: str) -> list[str]:
        out: list[str] = []
        for a in firing:
            for k in keys:
                v = a["labels"].get(k)
                if v:
                    if v not in out:
                        out.append(v)
                    break
        return out

    sev = values("severity") or [common.get("severity", "")]
    severity = min(sev, key=lambda s: SEVERITY_ORDER.get(s, 9)) if sev else ""
    descs = [a["annotations"].get("description") or a["annotations"].get("summary", "") for a in firing]
    return {
        "severity": severity, "alertnames": values("alertname"), "nodes": values(identity_label, "Hostname"),
        "gpus": values("gpu"), "xids": values("xid"),
        "descriptions": [d for i, d in enumerate(descs) if d and d not in descs[:i]],
        "summary": next((a["annotations"].get("summary", "") for a in firing if a["annotations"].get("summary")), ""),
        "runbook_url": next((a["annotations"]["runbook_url"] for a in firing
                             if a["annotations"].get("runbook_url")), ""),
    }


_COLS = ("id, channel, group_key, state, opened_at, updated_at, acknowledged_at, acknowledged_by, resolved_at,"
         " group_labels, common_labels, escalated_at, held_until")


def escalate_due(db: sqlite3.Connection, now: float, after_s: float, channels: tuple[str, ...]) -> list[int]:
    """Ids of open, unacknowledged incidents on ``channels`` open since ``now - after_s`` or earlier and
    not yet escalated in this opening; marks them escalated (``escalated_at = now``)."""
    marks = ",".join("?" * len(channels))
    ids = [r[0] for r in db.execute(
        f"SELECT id FROM incidents WHERE state = 'open' AND escalated_at IS NULL AND channel IN ({marks})"
        " AND open_since IS NOT NULL AND open_since <= ? ORDER BY id", (*channels, now - after_s))]
    for iid in ids:
        db.execute("UPDATE incidents SET escalated_at = ? WHERE id = ?", (now, iid))
    return ids


def _row(db: sqlite3.Connection, r: tuple, identity_label: str) -> dict[str, Any]:
    (iid, channel, gk, state, opened, updated, ack_at, ack_by, res_at, gl, cl, esc_at, held) = r
    alerts = [{"fingerprint": fp, "status": st, "labels": json.loads(lab), "annotations": json.loads(ann),
               "startsAt": sa, "endsAt": ea}
              for fp, st, lab, ann, sa, ea in db.execute(
                  "SELECT fingerprint, status, labels, annotations, starts_at, ends_at FROM incident_alerts"
                  " WHERE incident_id = ? ORDER BY status, fingerprint", (iid,))]
    common = json.loads(cl)
    return {"id": iid, "channel": channel, "groupKey": gk, "state": state, "opened_at": opened,
            "updated_at": updated, "acknowledged_at": ack_at, "acknowledged_by": ack_by, "resolved_at": res_at,
            "escalated_at": esc_at, "held_until": held,
            "groupLabels": json.loads(gl), "commonLabels": common,
            "firing": sum(a["status"] == "firing" for a in alerts), **_identity(alerts, common, identity_label), "alerts": alerts,
            "impact": impact(db, iid)}


def impact(db: sqlite3.Connection, incident_id: int) -> dict | None:
    """The incident's last impact measurement (:func:`gpuobs.pager.impact.measure`'s dict), or None."""
    row = db.execute("SELECT doc FROM incident_impact WHERE incident_id = ?", (incident_id,)).fetchone()
    return json.loads(row[0]) if row else None


def record_impact(db: sqlite3.Connection, incident_id: int, doc: dict) -> None:
    """Store ``doc`` as the incident's impact (replacing the last one); the row's ``measured_at`` is the
    last attempt (a failed one's ``error_at``), which paces the next."""
    db.execute("INSERT OR REPLACE INTO incident_impact VALUES (?, ?, ?)",
               (incident_id, max(doc.get("measured_at", 0.0), doc.get("error_at") or 0.0), json.dumps(doc, sort_keys=True)))


def impact_due(db: sqlite3.Connection, now: float, every_s: float, since: float) -> list[int]:
    """Incidents whose impact should be measured now: open or acknowledged ones not tried in the last
    ``every_s`` seconds (a failed try counts: an outage is retried at that pace, not every tick), and
    resolved ones (resolved after ``since``) without numbers measured after their resolution (one final
    measurement over the whole window: at once, then, while it fails, every ``every_s``)."""
    return [r[0] for r in db.execute(
        "SELECT i.id FROM incidents i LEFT JOIN incident_impact m ON m.incident_id = i.id"
        " WHERE (i.state != 'resolved' AND (m.measured_at IS NULL OR m.measured_at <= ?))"
        " OR (i.state = 'resolved' AND i.resolved_at >= ? AND (m.measured_at IS NULL OR ("
        "(json_extract(m.doc, '$.line') IS NULL OR json_extract(m.doc, '$.measured_at') < i.resolved_at)"
        " AND (m.measured_at < i.resolved_at OR m.measured_at <= ?))))"
        " ORDER BY i.id", (now - every_s, since, now - every_s))]


def list_incidents(db: sqlite3.Connection, identity_label: str, state: str | None = None,
                   channel: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Incidents, unresolved first, then by severity and newest update; ``identity_label``: the fleet
    config's, which names an incident's nodes."""
    cond, args = [], []
    if state:
        cond.append("state = ?")
        args.append(state)
    if channel:
        cond.append("channel = ?")
        args.append(channel)
    q = f"SELECT {_COLS} FROM incidents" + (" WHERE " + " AND ".join(cond) if cond else "")
    q += " ORDER BY state = 'resolved', updated_at DESC LIMIT ?"
    rows = [_row(db, r, identity_label) for r in db.execute(q, (*args, limit)).fetchall()]
    rows.sort(key=lambda i: (STATES.index(i["state"]),
                             SEVERITY_ORDER.get(i["severity"], 9) if i["state"] != "resolved" else 0,
                             -i["updated_at"]))
    return rows


def get(db: sqlite3.Connection, incident_id: int, identity_label: str) -> dict[str, Any]:
    """One incident with its alerts, timeline (oldest first) and silences; ``identity_label``: the fleet
    config's, which names its nodes. Raises IncidentNotFound."""
    r = db.execute(f"SELECT {_COLS} FROM incidents WHERE id = ?", (incident_id,)).fetchone()
    if r is None:
        raise IncidentNotFound(incident_id)
    inc = _row(db, r, identity_label)
    inc["timeline"] = [{"at": at, "kind": kind, **json.loads(detail)} for at, kind, detail in db.execute(
        "SELECT at, kind, detail FROM incident_events WHERE incident_id = ? ORDER BY id", (incident_id,))]
    inc["silences"] = [
        {"id": sid, "created_at": ca, "endsAt": ea, "createdBy": by, "comment": c, "matchers": json.loads(m),
         "expired_at": xa}
        for sid, ca, ea, by, c, m, xa in db.execute(
            "SELECT silence_id, created_at, ends_at, created_by, comment, matchers, expired_at FROM incident_silences"
            " WHERE incident_id = ? ORDER BY created_at", (incident_id,))]
    return inc


def counts(db: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """``{channel: {state: n}}`` for every channel and state (zeros included)."""
    out = {ch: {s: 0 for s in STATES} for ch in ("page", "ticket")}
    for ch, st, n in db.execute("SELECT channel, state, COUNT(*) FROM incidents GROUP BY channel, state"):
        out.setdefault(ch, {s: 0 for s in STATES})[st] = n
    return out


def record_silence(db: sqlite3.Connection, incident_id: int, silence_id: str, at: float, ends_at: str, by: str,
                   comment: str, matchers: list[dict]) -> None:
    """Remember a silence created for the incident and put it on the timeline."""
    db.execute("INSERT OR REPLACE INTO incident_silences VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
               (incident_id, silence_id, at, ends_at, by, comment, json.dumps(matchers)))
    event(db, incident_id, at, "silenced", silence=silence_id, by=by, comment=comment, endsAt=ends_at)


def record_silence_expired(db: sqlite3.Connection, incident_id: int, silence_id: str, at: float, by: str) -> bool:
    """Mark the incident's silence expired (timeline row); False when the incident has no such silence."""
    cur = db.execute("UPDATE incident_silences SET expired_at = ? WHERE incident_id = ? AND silence_id = ?",
                     (at, incident_id, silence_id))
    if cur.rowcount == 0:
        return False
    event(db, incident_id, at, "silence_expired", silence=silence_id, by=by)
    return True


def backfill(db: sqlite3.Connection) -> int:
    """Build incidents from notifications stored before incidents existed (a database from an older
    pager); returns how many notifications were folded in. Runs only while no incident exists."""
    if db.execute("SELECT COUNT(*) FROM incidents").fetchone()[0]:
        return 0
    n = 0
    for nid, ts, channel, payload in db.execute(
            "SELECT id, received_at, channel, payload FROM notifications ORDER BY id").fetchall():
        apply(db, nid, channel, json.loads(payload), ts)
        n += 1
    return n
