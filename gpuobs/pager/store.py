"""Validation of Alertmanager webhook payloads (version 4) and their SQLite store.

Payload shape (Alertmanager docs, "webhook_config"): ``version`` "4", ``groupKey``,
``truncatedAlerts`` (int), ``status`` firing|resolved, ``receiver``, ``groupLabels``,
``commonLabels``, ``commonAnnotations`` (string maps), ``externalURL``, and ``alerts[]`` each with
``status``, ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``generatorURL``, ``fingerprint``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from gpuobs.core.errors import InputError
from gpuobs.core.fleet import shipped_fleet
from gpuobs.pager import incidents

STATUSES = ("firing", "resolved")
CHANNELS = ("page", "ticket")
#: Seconds a delivery key is remembered. Shorter than Alertmanager's repeat_interval (4h in
#: alertmanager/alertmanager.yml), so a deliberate reminder is stored again; longer than any retry
#: or re-send after a restart (minutes), so those are answered without being stored.
DEDUPE_WINDOW_S = 3600.0
#: Most delivery keys kept (oldest dropped first), so the window stays bounded under any rate.
DEDUPE_MAX_KEYS = 100_000


class PayloadError(InputError):
    """A malformed webhook payload; ``field`` is the JSON path of the first problem."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _encodable(text: str) -> bool:
    """False for strings UTF-8 cannot encode (lone surrogates from JSON \\ud800 escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _str_map(value: Any, field: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PayloadError(field, "must be an object mapping strings to strings")
    for k, v in value.items():
        if not (_encodable(k) and _encodable(v)):
            raise PayloadError(f"{field}.{k.encode('utf-8', 'backslashreplace').decode()}",
                               "must be valid Unicode text (lone surrogate escapes are not)")
    return value


def _str(value: Any, field: str, allowed: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str):
        raise PayloadError(field, "must be a string")
    if not _encodable(value):
        raise PayloadError(field, "must be valid Unicode text (lone surrogate escapes are not)")
    if allowed and value not in allowed:
        raise PayloadError(field, f"must be one of {', '.join(allowed)}; got {value!r}")
    return value


def validate(payload: Any) -> dict:
    """Check an Alertmanager v4 webhook payload; returns it unchanged or raises PayloadError."""
    if not isinstance(payload, dict):
        raise PayloadError("body", "must be a JSON object")
    if payload.get("version") != "4":
        raise PayloadError("version", f"must be \"4\"; got {payload.get('version')!r}")
    for key in ("receiver", "groupKey", "externalURL"):
        _str(payload.get(key), key)
    _str(payload.get("status"), "status", STATUSES)
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        _str_map(payload.get(key), key)
    trunc = payload.get("truncatedAlerts", 0)
    if isinstance(trunc, bool) or not isinstance(trunc, int) or trunc < 0:
        raise PayloadError("truncatedAlerts", "must be a non-negative integer")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        raise PayloadError("alerts", "must be a non-empty array")
    for i, a in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise PayloadError(where, "must be an object")
        _str(a.get("status"), f"{where}.status", STATUSES)
        labels = _str_map(a.get("labels"), f"{where}.labels")
        if "alertname" not in labels:
            raise PayloadError(f"{where}.labels", "must contain 'alertname'")
        _str_map(a.get("annotations"), f"{where}.annotations")
        for key in ("startsAt", "endsAt", "generatorURL", "fingerprint"):
            _str(a.get(key), f"{where}.{key}")
    return payload


def delivery_key(channel: str, payload: dict) -> str:
    """The identity of one notification, hex SHA-256: the same for every delivery of it.

    Built from the channel, receiver, ``groupKey``, the notification ``status`` and, per alert (sorted),
    its ``fingerprint``, ``status``, ``startsAt`` and ``endsAt``: exactly what Alertmanager's
    notification log dedupes on (the firing and resolved sets of a group; alertmanager v0.25.0
    ``notify/notify.go`` ``DedupStage.needsUpdate``) plus the times, so a webhook retry, a second
    aggregation-group flush while the pager was unreachable, or a re-send after Alertmanager lost its
    notification log all map to the stored notification, while a new firing (new ``startsAt``) or the
    resolution (``status``, ``endsAt``) is a new one. Firing alerts carry ``endsAt``
    ``0001-01-01T00:00:00Z`` (alertmanager v0.25.0 ``types/types.go`` ``Alerts``: an end not yet
    reached is not exposed), so the key of a firing notification does not drift between re-sends.
    """
    alerts = sorted((a["fingerprint"], a["status"], a["startsAt"], a["endsAt"]) for a in payload["alerts"])
    doc = [channel, payload["receiver"], payload["groupKey"], payload["status"], alerts]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode("utf-8")).hexdigest()


class PageStore:
    """SQLite store of notifications (one row per distinct delivery) and their alerts.

    Thread-safe: one connection guarded by a lock; each ``add`` is one committed transaction, so a
    notification is on disk before the webhook is answered. Deliveries are deduplicated by
    :func:`delivery_key` within ``dedupe_window_s`` seconds (at most ``DEDUPE_MAX_KEYS`` keys).
    ``identity_label``: the fleet config's, which names an incident's nodes (default: the shipped fleet
    config's).
    """

    SCHEMA = """
    CREATE TABLE IF NOT EXISTS notifications (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        received_at REAL NOT NULL,
        channel TEXT NOT NULL,
        receiver TEXT NOT NULL,
        status TEXT NOT NULL,
        group_key TEXT NOT NULL,
        payload TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS alerts (
        notification_id INTEGER NOT NULL REFERENCES notifications(id),
        status TEXT NOT NULL,
        alertname TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        labels TEXT NOT NULL,
        annotations TEXT NOT NULL,
        starts_at TEXT NOT NULL,
        ends_at TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS alerts_by_notification ON alerts(notification_id);
    CREATE TABLE IF NOT EXISTS deliveries (
        key TEXT PRIMARY KEY,
        received_at REAL NOT NULL,
        notification_id INTEGER NOT NULL,
        duplicates INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS deliveries_by_time ON deliveries(received_at);
    """

    def __init__(self, path: Path, dedupe_window_s: float = DEDUPE_WINDOW_S, identity_label: str | None = None,
                 replay_hold_s: float = incidents.REPLAY_HOLD_S):
        if not dedupe_window_s > 0:
            raise ValueError(f"dedupe_window_s must be > 0, got {dedupe_window_s}")
        if not replay_hold_s >= 0:
            raise ValueError(f"replay_hold_s must be >= 0, got {replay_hold_s}")
        #: Seconds a replayed firing is held before it re-opens a resolved incident (gpuobs.pager.incidents).
        self.replay_hold_s = float(replay_hold_s)
        self.path = path
        self.identity_label = identity_label or shipped_fleet().identity_label
        self.dedupe_window_s = float(dedupe_window_s)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # the database holds alert payloads: owner-only from its creation
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(self.SCHEMA + incidents.SCHEMA)
        with self._db:
            incidents.migrate(self._db)
            incidents.backfill(self._db)

    def add(self, channel: str, payload: dict, received_at: float | None = None) -> int:
        """Store a validated payload received on ``channel`` (page|ticket); returns its id."""
        return self.deliver(channel, payload, received_at)[0]

    def deliver(self, channel: str, payload: dict, received_at: float | None = None) -> tuple[int, bool]:
        """Store a validated payload unless it is a duplicate; returns ``(notification id, duplicate)``.

        A duplicate (same :func:`delivery_key` within the window) stores nothing and returns the id
        of the stored notification. The key check, the insert and the pruning of keys older than the
        window are one transaction. Raises PayloadError on an unknown channel, sqlite3.Error from disk.
        """
        if channel not in CHANNELS:
            raise PayloadError("channel", f"must be one of {', '.join(CHANNELS)}")
        ts = time.time() if received_at is None else received_at
        key = delivery_key(channel, payload)
        with self._lock, self._db:
            self._db.execute("DELETE FROM deliveries WHERE received_at < ?", (ts - self.dedupe_window_s,))
            row = self._db.execute("SELECT notification_id FROM deliveries WHERE key = ?", (key,)).fetchone()
            if row is not None:
                self._db.execute("UPDATE deliveries SET duplicates = duplicates + 1 WHERE key = ?", (key,))
                return int(row[0]), True
            cur = self._db.execute(
                "INSERT INTO notifications(received_at, channel, receiver, status, group_key, payload)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (ts, channel, payload["receiver"], payload["status"], payload["groupKey"], json.dumps(payload)))
            nid = cur.lastrowid
            self._db.executemany(
                "INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(nid, a["status"], a["labels"]["alertname"], a["fingerprint"], json.dumps(a["labels"]),
                  json.dumps(a["annotations"]), a["startsAt"], a["endsAt"]) for a in payload["alerts"]])
            self._db.execute("INSERT INTO deliveries(key, received_at, notification_id) VALUES (?, ?, ?)",
                             (key, ts, nid))
            incidents.apply(self._db, nid, channel, payload, ts, self.replay_hold_s)
            self._db.execute("DELETE FROM deliveries WHERE key IN (SELECT key FROM deliveries ORDER BY received_at"
                             " DESC LIMIT -1 OFFSET ?)", (DEDUPE_MAX_KEYS,))
        return nid, False

    def release_held(self, now: float | None = None, present: set[str] | None = None) -> tuple[list[int], list[int]]:
        """End the holds due by ``now`` (default: the clock): re-open the incidents whose held alert
        Alertmanager still holds (``present``: its fingerprints; None: unknown, re-open), drop the rest
        (:func:`gpuobs.pager.incidents.release_held`); returns ``(re-opened ids, dropped ids)``."""
        with self._lock, self._db:
            return incidents.release_held(self._db, time.time() if now is None else now, present)

    def holds_due(self, now: float) -> bool:
        """Whether a held replay's hold has ended by ``now`` (then Alertmanager is worth asking)."""
        with self._lock:
            return self._db.execute("SELECT 1 FROM incidents WHERE held_until IS NOT NULL AND held_until <= ?"
                                    " LIMIT 1", (now,)).fetchone() is not None

    def duplicates(self) -> int:
        """Deliveries answered as duplicates of a notification still in the window."""
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(SUM(duplicates), 0) FROM deliveries").fetchone()[0])

    def list(self, limit: int = 100, alertname: str | None = None, status: str | None = None) -> list[dict]:
        """Notifications newest first, each with its alerts; optional filters on any alert's fields."""
        q = "SELECT id, received_at, channel, receiver, status, group_key FROM notifications n"
        cond, args = [], []
        if alertname:
            cond.append("EXISTS (SELECT 1 FROM alerts a WHERE a.notification_id = n.id AND a.alertname = ?)")
            args.append(alertname)
        if status:
            cond.append("n.status = ?")
            args.append(status)
        if cond:
            q += " WHERE " + " AND ".join(cond)
        q += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._db.execute(q, args).fetchall()
            out = []
            for nid, ts, channel, receiver, st, gk in rows:
                alerts = [
                    {"status": s, "labels": json.loads(lab), "annotations": json.loads(ann),
                     "startsAt": sa, "endsAt": ea, "fingerprint": fp}
                    for s, fp, lab, ann, sa, ea in self._db.execute(
                        "SELECT status, fingerprint, labels, annotations, starts_at, ends_at FROM alerts"
                        " WHERE notification_id = ? ORDER BY rowid", (nid,))
                ]
                out.append({"id": nid, "received_at": ts, "channel": channel, "receiver": receiver,
                            "status": st, "groupKey": gk, "alerts": alerts})
        return out

    # ---- incidents (gpuobs.pager.incidents) ---------------------------------------------------
    def incidents(self, state: str | None = None, channel: str | None = None, limit: int = 200) -> list[dict]:
        """Incidents, open first (see :func:`gpuobs.pager.incidents.list_incidents`)."""
        with self._lock:
            return incidents.list_incidents(self._db, self.identity_label, state, channel, limit)

    def incident(self, incident_id: int) -> dict:
        """One incident with timeline and silences; raises IncidentNotFound."""
        with self._lock:
            return incidents.get(self._db, incident_id, self.identity_label)

    def incident_counts(self) -> dict[str, dict[str, int]]:
        """``{channel: {state: n}}``."""
        with self._lock:
            return incidents.counts(self._db)

    def acknowledge(self, incident_id: int, by: str, at: float | None = None, note: str = "") -> tuple[str, bool]:
        """Acknowledge (one committed transaction; ``note`` goes on the timeline); returns ``(state,
        changed)``; raises IncidentNotFound."""
        with self._lock, self._db:
            return incidents.acknowledge(self._db, incident_id, by, time.time() if at is None else at, note)

    def record_silence(self, incident_id: int, silence_id: str, ends_at: str, by: str, comment: str,
                       matchers: list[dict]) -> None:
        """Remember a silence created in Alertmanager for the incident (timeline row)."""
        with self._lock, self._db:
            incidents.get(self._db, incident_id, self.identity_label)
            incidents.record_silence(self._db, incident_id, silence_id, time.time(), ends_at, by, comment, matchers)

    def record_silence_expired(self, incident_id: int, silence_id: str, by: str) -> bool:
        """Mark a silence of the incident expired; False when it is not one of the incident's."""
        with self._lock, self._db:
            return incidents.record_silence_expired(self._db, incident_id, silence_id, time.time(), by)

    def unheld(self, present: set[str]) -> list[int]:
        """Open or acknowledged incidents none of whose firing alerts Alertmanager holds (``present``:
        its alerts' fingerprints); :mod:`gpuobs.pager.reconcile`."""
        with self._lock:
            return incidents.unheld(self._db, present)

    def resolve_unheld(self, ids: list[int], present: set[str], now: float, missing_s: dict[int, float]) -> list[int]:
        """Resolve those of ``ids`` still unheld (one transaction); returns their ids."""
        with self._lock, self._db:
            return incidents.resolve_unheld(self._db, ids, present, now, missing_s)

    def escalate_due(self, now: float, policy) -> list[dict]:
        """Open, unacknowledged incidents due for escalation under ``policy`` at ``now``, marked escalated
        in the same transaction (so no incident escalates twice in one opening)."""
        with self._lock, self._db:
            ids = incidents.escalate_due(self._db, now, policy.after_s, policy.channels)
            return [incidents.get(self._db, i, self.identity_label) for i in ids]

    def record_escalation(self, incident_id: int, at: float, policy, delivered: bool | None,
                          error: str | None) -> None:
        """Put the escalation on the incident's timeline."""
        detail = {"receiver": policy.receiver, "after_s": policy.after_s}
        if delivered is not None:
            detail["delivered"] = delivered
        if error:
            detail["error"] = error
        with self._lock, self._db:
            incidents.event(self._db, incident_id, at, "escalated", **detail)

    def record_impact(self, incident_id: int, doc: dict) -> None:
        """Store the incident's impact measurement (:mod:`gpuobs.pager.impact`), replacing the last."""
        with self._lock, self._db:
            incidents.record_impact(self._db, incident_id, doc)

    def impact_due(self, now: float, every_s: float, since: float) -> list[int]:
        """Incidents to measure now (:func:`gpuobs.pager.incidents.impact_due`)."""
        with self._lock:
            return incidents.impact_due(self._db, now, every_s, since)

    def count(self) -> int:
        """Number of stored notifications."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM notifications").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
