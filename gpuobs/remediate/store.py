"""SQLite persistence of remediation: events, one episode per node fault, write-ahead steps, the
timeline, human holds and the breaker.

One database per run directory (``<run>/remediate.sqlite``, WAL mode so ``status``/``hold`` can read and
write while the controller runs). Every transition and side effect is committed before the next one;
node actions are write-ahead: a ``steps`` row is written ``started`` *before* the adapter call and set
``done``/``failed`` after, so a controller killed with ``kill -9`` finds a started step with no outcome
and resolves it by checking the node, never by calling the action again.

Tables (times are unix seconds):

* ``events``: every alert received: (fingerprint, starts_at) unique (Alertmanager's fingerprint and the
  alert's ``startsAt``: a re-send of the same firing alert has both), node, alertname, status
  (firing|resolved), labels (JSON), received_at, outcome (opened | attached | duplicate | stale | held |
  no-policy | no-action | observed | resolved), episode.
* ``episodes``: id, node, pool, state (see :data:`OPEN_STATES`, :data:`CLOSED_STATES`), fault_class,
  action, gpu, alertname, fingerprint, why (the policy's line), reason (the last state's reason),
  attempts, opened_at, state_since, deadline, verify_since (first passing check), closed_at.
* ``steps``: id, episode, node, ts, step (cordon | drain | act | health | uncordon), status (started |
  done | failed | unknown), detail.
* ``timeline``: ts, node, episode, actor (gpuobs | human:<name> | interlock:<name> | alertmanager),
  kind, detail.
* ``holds``: node, by, reason, ts: a person's hold (the controller never acts on a held node).
* ``breaker``: one row: open (0/1), opened_at, reason, paged (0/1), closed_by, closed_at.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

#: States of an episode that still holds the node (or will): pending waits on an interlock.
OPEN_STATES = ("pending", "quarantined", "draining", "acting", "verifying")
#: Terminal states. ``escalated`` keeps the node cordoned until a person releases it.
CLOSED_STATES = ("returned", "escalated", "overridden", "cancelled", "observed", "dry-run", "released")
#: States in which the node is out of service because of the controller (counts against the pool cap).
OUT_STATES = ("quarantined", "draining", "acting", "verifying", "escalated")

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
  fingerprint TEXT NOT NULL, starts_at TEXT NOT NULL, node TEXT NOT NULL, alertname TEXT NOT NULL,
  status TEXT NOT NULL, labels TEXT NOT NULL, received_at REAL NOT NULL, outcome TEXT NOT NULL,
  episode INTEGER, PRIMARY KEY (fingerprint, starts_at, status));
CREATE TABLE IF NOT EXISTS episodes (
  id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, pool TEXT NOT NULL, state TEXT NOT NULL,
  fault_class TEXT NOT NULL, action TEXT NOT NULL, gpu INTEGER, alertname TEXT NOT NULL,
  fingerprint TEXT NOT NULL, why TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', attempts INTEGER NOT NULL DEFAULT 0,
  opened_at REAL NOT NULL, state_since REAL NOT NULL, deadline REAL, verify_since REAL, closed_at REAL,
  escalation_cleared INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS steps (
  id INTEGER PRIMARY KEY AUTOINCREMENT, episode INTEGER NOT NULL, node TEXT NOT NULL, ts REAL NOT NULL,
  step TEXT NOT NULL, status TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS timeline (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, node TEXT NOT NULL, episode INTEGER,
  actor TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS holds (
  node TEXT PRIMARY KEY, by TEXT NOT NULL, reason TEXT NOT NULL, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS breaker (
  id INTEGER PRIMARY KEY CHECK (id = 1), open INTEGER NOT NULL, opened_at REAL, reason TEXT NOT NULL,
  nodes TEXT NOT NULL DEFAULT '[]', closed_by TEXT NOT NULL DEFAULT '', closed_at REAL);
CREATE INDEX IF NOT EXISTS episodes_node ON episodes (node, id);
CREATE INDEX IF NOT EXISTS steps_node ON steps (node, step, ts);
"""


@dataclass
class Episode:
    """An ``episodes`` row (see the module docstring)."""

    id: int
    node: str
    pool: str
    state: str
    fault_class: str
    action: str
    gpu: int | None
    alertname: str
    fingerprint: str
    why: str
    reason: str
    attempts: int
    opened_at: float
    state_since: float
    deadline: float | None
    verify_since: float | None
    closed_at: float | None
    escalation_cleared: int = 0

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class RemediationStore:
    """The database at ``path`` (created with its schema). ``clock``: unix seconds (tests pass a fake)."""

    def __init__(self, path: Path | str, clock: Any = time.time):
        self.path = Path(path)
        self.clock = clock
        self.db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ---- events -------------------------------------------------------------------------------
    def seen(self, fingerprint: str, starts_at: str, status: str) -> bool:
        """True when this alert (fingerprint, startsAt, status) was already received."""
        return self.db.execute("SELECT 1 FROM events WHERE fingerprint=? AND starts_at=? AND status=?",
                               (fingerprint, starts_at, status)).fetchone() is not None

    def record_event(self, fingerprint: str, starts_at: str, node: str, alertname: str, status: str,
                     labels: dict[str, str], outcome: str, episode: int | None) -> bool:
        """Insert one event; False (nothing written) when it was already there (a re-send)."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO events VALUES (?,?,?,?,?,?,?,?,?)",
            (fingerprint, starts_at, node, alertname, status, json.dumps(labels, sort_keys=True), self.clock(),
             outcome, episode))
        return cur.rowcount == 1

    def events(self, node: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        q = "SELECT * FROM events" + (" WHERE node=?" if node else "") + " ORDER BY received_at DESC LIMIT ?"
        rows = self.db.execute(q, ((node,) if node else ()) + (limit,)).fetchall()
        return [dict(r) | {"labels": json.loads(r["labels"])} for r in rows]

    def event_nodes_since(self, since: float) -> list[str]:
        """Distinct nodes with a firing event that a policy covers, received at or after ``since``."""
        rows = self.db.execute(
            "SELECT DISTINCT node FROM events WHERE status='firing' AND received_at>=? AND node!='' "
            "AND outcome NOT IN ('no-policy','duplicate','no-action') ORDER BY node", (since,)).fetchall()
        return [r[0] for r in rows]

    # ---- episodes -----------------------------------------------------------------------------
    def open_episode(self, node: str, pool: str, fault_class: str, action: str, gpu: int | None,
                     alertname: str, fingerprint: str, why: str, state: str = "pending") -> Episode:
        now = self.clock()
        closed = now if state in CLOSED_STATES else None
        cur = self.db.execute(
            "INSERT INTO episodes (node, pool, state, fault_class, action, gpu, alertname, fingerprint, why, "
            "opened_at, state_since, closed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (node, pool, state, fault_class, action, gpu, alertname, fingerprint, why, now, now, closed))
        return self.episode(int(cur.lastrowid))

    def episode(self, episode_id: int) -> Episode:
        row = self.db.execute("SELECT * FROM episodes WHERE id=?", (episode_id,)).fetchone()
        if row is None:
            raise KeyError(episode_id)
        return Episode(**dict(row))

    def active(self, node: str) -> Episode | None:
        """The node's open episode, if any (at most one per node)."""
        row = self.db.execute(
            f"SELECT * FROM episodes WHERE node=? AND state IN ({','.join('?' * len(OPEN_STATES))}) "
            "ORDER BY id DESC LIMIT 1", (node, *OPEN_STATES)).fetchone()
        return Episode(**dict(row)) if row else None

    def latest(self, node: str) -> Episode | None:
        row = self.db.execute("SELECT * FROM episodes WHERE node=? ORDER BY id DESC LIMIT 1", (node,)).fetchone()
        return Episode(**dict(row)) if row else None

    def episodes(self, states: tuple[str, ...] | None = None, limit: int = 500) -> list[Episode]:
        """Episodes in ``states`` oldest first (all: newest first); ``limit`` -1: every one."""
        if states:
            rows = self.db.execute(
                f"SELECT * FROM episodes WHERE state IN ({','.join('?' * len(states))}) ORDER BY id LIMIT ?",
                (*states, limit)).fetchall()
        else:
            rows = self.db.execute("SELECT * FROM episodes ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [Episode(**dict(r)) for r in rows]

    def out_of_service(self) -> list[Episode]:
        """Episodes that keep their node out: quarantined to verifying, and escalated until released."""
        return [e for e in self.episodes(OUT_STATES) if not (e.state == "escalated" and e.escalation_cleared)]

    def set_state(self, ep: Episode, state: str, reason: str, actor: str = "gpuobs",
                  step: tuple[int, str, str] | None = None, **values: Any) -> Episode:
        """Move ``ep`` to ``state`` (timeline entry included) in one transaction; ``step``: ``(step id,
        status, detail)`` of the write-ahead step whose outcome led here, recorded in the same transaction.

        Compare-and-swap: the move happens only if the episode is still in ``ep.state`` (another writer, a
        person's ``hold`` or ``breaker close`` from the CLI, may have moved it since it was read); else
        nothing but the step's outcome is written and the episode is returned as it is now."""
        now = self.clock()
        values = {"state": state, "reason": reason, "state_since": now, **values}
        if state in CLOSED_STATES:
            values.setdefault("closed_at", now)
        cols = ", ".join(f"{k}=?" for k in values)
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            moved = self.db.execute(f"UPDATE episodes SET {cols} WHERE id=? AND state=?",
                                    (*values.values(), ep.id, ep.state)).rowcount
            if step is not None:
                self.db.execute("UPDATE steps SET status=?, detail=? WHERE id=?", (step[1], step[2], step[0]))
            if moved:
                self.db.execute("INSERT INTO timeline (ts, node, episode, actor, kind, detail) VALUES (?,?,?,?,?,?)",
                                (now, ep.node, ep.id, actor, state, reason))
        return self.episode(ep.id)

    def update(self, ep: Episode, **values: Any) -> Episode:
        cols = ", ".join(f"{k}=?" for k in values)
        self.db.execute(f"UPDATE episodes SET {cols} WHERE id=?", (*values.values(), ep.id))
        return self.episode(ep.id)

    def last_change(self, node: str) -> float | None:
        """When the node's latest episode last changed state (its close, when closed)."""
        row = self.db.execute("SELECT max(coalesce(closed_at, state_since)) FROM episodes WHERE node=?",
                              (node,)).fetchone()
        return row[0]

    # ---- steps (write-ahead) ------------------------------------------------------------------
    def step_start(self, ep: Episode, step: str, detail: str = "") -> int:
        cur = self.db.execute("INSERT INTO steps (episode, node, ts, step, status, detail) VALUES (?,?,?,?,?,?)",
                              (ep.id, ep.node, self.clock(), step, "started", detail))
        return int(cur.lastrowid)

    def step_end(self, step_id: int, status: str, detail: str) -> None:
        self.db.execute("UPDATE steps SET status=?, detail=? WHERE id=?", (status, detail, step_id))

    def open_step(self, ep: Episode, step: str) -> dict[str, Any] | None:
        """The episode's ``step`` row still ``started`` (a crash between the call and its outcome)."""
        row = self.db.execute("SELECT * FROM steps WHERE episode=? AND step=? AND status='started' "
                              "ORDER BY id DESC LIMIT 1", (ep.id, step)).fetchone()
        return dict(row) if row else None

    def steps(self, node: str | None = None, episode: int | None = None) -> list[dict[str, Any]]:
        if episode is not None:
            rows = self.db.execute("SELECT * FROM steps WHERE episode=? ORDER BY id", (episode,)).fetchall()
        elif node:
            rows = self.db.execute("SELECT * FROM steps WHERE node=? ORDER BY id", (node,)).fetchall()
        else:
            rows = self.db.execute("SELECT * FROM steps ORDER BY id").fetchall()
        return [dict(r) for r in rows]

    def count_steps(self, step: str, since: float, nodes: list[str] | None = None, failed: bool = True) -> int:
        """Steps of kind ``step`` started at or after ``since`` (on ``nodes`` when given), any outcome
        (``failed=False``: but failed)."""
        q = "SELECT count(*) FROM steps WHERE step=? AND ts>=?" + ("" if failed else " AND status!='failed'")
        args: list[Any] = [step, since]
        if nodes is not None:
            q += f" AND node IN ({','.join('?' * len(nodes))})"
            args += nodes
        return int(self.db.execute(q, args).fetchone()[0])

    # ---- timeline -----------------------------------------------------------------------------
    def log(self, node: str, kind: str, detail: str, actor: str = "gpuobs", episode: int | None = None) -> None:
        self.db.execute("INSERT INTO timeline (ts, node, episode, actor, kind, detail) VALUES (?,?,?,?,?,?)",
                        (self.clock(), node, episode, actor, kind, detail))

    def timeline(self, node: str | None = None, episode: int | None = None, limit: int = 500) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM timeline", []
        if episode is not None:
            q, args = q + " WHERE episode=?", [episode]
        elif node:
            q, args = q + " WHERE node=?", [node]
        rows = self.db.execute(q + " ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [dict(r) for r in reversed(rows)]

    def last_log(self, node: str, kind: str, episode: int | None) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM timeline WHERE node=? AND kind=? AND episode IS ? ORDER BY seq DESC "
                              "LIMIT 1", (node, kind, episode)).fetchone()
        return dict(row) if row else None

    # ---- holds --------------------------------------------------------------------------------
    def hold(self, node: str, by: str, reason: str) -> None:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("INSERT OR REPLACE INTO holds VALUES (?,?,?,?)", (node, by, reason, self.clock()))
            self.db.execute("INSERT INTO timeline (ts, node, episode, actor, kind, detail) VALUES (?,?,?,?,?,?)",
                            (self.clock(), node, None, f"human:{by}", "hold", reason))

    def release(self, node: str, by: str, reason: str) -> bool:
        """Remove the node's hold and close an escalated episode; False when there was neither."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            n = self.db.execute("DELETE FROM holds WHERE node=?", (node,)).rowcount
            m = self.db.execute("UPDATE episodes SET escalation_cleared=1 WHERE node=? AND state='escalated' "
                                "AND escalation_cleared=0", (node,)).rowcount
            if n or m:
                self.db.execute("INSERT INTO timeline (ts, node, episode, actor, kind, detail) VALUES (?,?,?,?,?,?)",
                                (self.clock(), node, None, f"human:{by}", "release", reason))
        return bool(n or m)

    def holds(self) -> dict[str, dict[str, Any]]:
        return {r["node"]: dict(r) for r in self.db.execute("SELECT * FROM holds").fetchall()}

    # ---- breaker ------------------------------------------------------------------------------
    def breaker(self) -> dict[str, Any]:
        row = self.db.execute("SELECT * FROM breaker WHERE id=1").fetchone()
        if row is None:
            return {"open": False, "opened_at": None, "reason": "", "nodes": [], "closed_by": "", "closed_at": None}
        return dict(row) | {"open": bool(row["open"]), "nodes": json.loads(row["nodes"])}

    def open_breaker(self, reason: str, nodes: list[str]) -> bool:
        """Trip the breaker; False when it was already open (so it pages once)."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            if self.breaker()["open"]:
                return False
            self.db.execute("INSERT OR REPLACE INTO breaker (id, open, opened_at, reason, nodes) VALUES (1,1,?,?,?)",
                            (self.clock(), reason, json.dumps(nodes)))
            self.db.execute("INSERT INTO timeline (ts, node, episode, actor, kind, detail) VALUES (?,?,?,?,?,?)",
                            (self.clock(), "*", None, "interlock:breaker", "breaker-open", reason))
        return True

    def close_breaker(self, by: str, reason: str) -> bool:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            if not self.breaker()["open"]:
                return False
            self.db.execute("UPDATE breaker SET open=0, closed_by=?, closed_at=? WHERE id=1", (by, self.clock()))
            self.db.execute("INSERT INTO timeline (ts, node, episode, actor, kind, detail) VALUES (?,?,?,?,?,?)",
                            (self.clock(), "*", None, f"human:{by}", "breaker-close", reason))
        return True
