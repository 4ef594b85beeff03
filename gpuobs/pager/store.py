"""Validation of Alertmanager webhook payloads (version 4) and their SQLite store.

Payload shape (Alertmanager docs, "webhook_config"): ``version`` "4", ``groupKey``,
``truncatedAlerts`` (int), ``status`` firing|resolved, ``receiver``, ``groupLabels``,
``commonLabels``, ``commonAnnotations`` (string maps), ``externalURL``, and ``alerts[]`` each with
``status``, ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``generatorURL``, ``fingerprint``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from gpuobs.core.errors import InputError

STATUSES = ("firing", "resolved")
CHANNELS = ("page", "ticket")


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


class PageStore:
    """SQLite store of notifications (one row per webhook call) and their alerts.

    Thread-safe: one connection guarded by a lock; each ``add`` is one committed transaction, so a
    notification is on disk before the webhook is answered.
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
    """

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(self.SCHEMA)
        self._db.commit()

    def add(self, channel: str, payload: dict, received_at: float | None = None) -> int:
        """Store a validated payload received on ``channel`` (page|ticket); returns its id."""
        if channel not in CHANNELS:
            raise PayloadError("channel", f"must be one of {', '.join(CHANNELS)}")
        ts = time.time() if received_at is None else received_at
        with self._lock, self._db:
            cur = self._db.execute(
                "INSERT INTO notifications(received_at, channel, receiver, status, group_key, payload)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (ts, channel, payload["receiver"], payload["status"], payload["groupKey"], json.dumps(payload)))
            nid = cur.lastrowid
            self._db.executemany(
                "INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(nid, a["status"], a["labels"]["alertname"], a["fingerprint"], json.dumps(a["labels"]),
                  json.dumps(a["annotations"]), a["startsAt"], a["endsAt"]) for a in payload["alerts"]])
        return nid

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

    def count(self) -> int:
        """Number of stored notifications."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM notifications").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
