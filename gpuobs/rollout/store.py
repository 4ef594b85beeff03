"""SQLite persistence of rollouts: every transition, stage, node, deploy call, look and gate.

One database per run directory (``<run>/rollout.sqlite``, WAL mode so ``status`` and ``abort`` can
read while the controller writes). The controller commits after every transition and every side
effect, so a controller killed with ``kill -9`` at any point finds on ``resume`` exactly what it had
done. Node deploys are write-ahead: the node row is written as ``deploying`` (with the version it ran
before) *before* the admin call and flipped to ``deployed`` in the same transaction that logs the
call, so a crash in between is resolved by asking the node its version instead of deploying twice.

Tables (times are unix seconds; JSON columns hold the documents named):

* ``rollouts``: id, version, state, stage (0-based index, -1 before the first), spec (JSON,
  :class:`gpuobs.rollout.controller.RolloutSpec`), reason, target (the terminal state a RollingBack
  rollout ends in), abort_reason (an operator's pending abort), trace (JSON trace/span id of the
  root span), pages_at_start (JSON list of pages ignored under an override), paused (JSON: ``{}``, or
  ``{"operator", "reason", "ts"}`` while an operator holds the rollout), promote_request (JSON: ``{}``,
  or ``{"operator", "reason", "ts"}`` until the controller applies it), created_at, updated_at.
* ``transitions``: rollout_id, seq, ts, from_state, to_state, stage, reason.
* ``stages``: one row per stage: kind (canary|promote), hosts (JSON), status
  (deploying|analysing|baking|passed|failed|inconclusive|aborted), started_at, analysis_start,
  deadline, ended_at, last_look (time of the last look, errors included), looks, errors
  (consecutive Prometheus errors), verdict, verdict_doc (JSON
  Verdict.to_dict()), verdict_table (text), analysis_state (JSON AnalysisState.to_dict()).
* ``nodes``: rollout_id, hostname, previous version, status (deploying|deployed|reverting|reverted;
  ``reverting`` is written before a rollback's deploy call, so a resumed rollback logs it once), stage.
* ``deploys``: every admin deploy call made: seq, rollout_id, ts, hostname, version, previous, purpose.
* ``analyses``: every look: stage, look, ts, elapsed_s, verdict, final, summary (JSON).
* ``gates``: every gate evaluation: ts, gate (compat|error-budget), stage, outcome, detail (JSON).
* ``events``: every human decision and what the controller did with it: ts, kind (pause | resume |
  promote: the operator's request; held | promoted | not-acted: the controller), operator, reason,
  stage (0-based, -1 before the first).

A database written before ``paused``/``promote_request`` existed gets them on open (``ALTER TABLE``).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
  id TEXT PRIMARY KEY, version TEXT NOT NULL, state TEXT NOT NULL, stage INTEGER NOT NULL DEFAULT -1,
  spec TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', target TEXT NOT NULL DEFAULT '',
  abort_reason TEXT NOT NULL DEFAULT '', trace TEXT NOT NULL DEFAULT '{}', pages_at_start TEXT NOT NULL DEFAULT '[]',
  created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS transitions (
  rollout_id TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL, from_state TEXT NOT NULL,
  to_state TEXT NOT NULL, stage INTEGER NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (rollout_id, seq));
CREATE TABLE IF NOT EXISTS stages (
  rollout_id TEXT NOT NULL, idx INTEGER NOT NULL, kind TEXT NOT NULL, hosts TEXT NOT NULL, status TEXT NOT NULL,
  started_at REAL NOT NULL, analysis_start REAL, deadline REAL, ended_at REAL, last_look REAL,
  looks INTEGER NOT NULL DEFAULT 0,
  errors INTEGER NOT NULL DEFAULT 0, verdict TEXT NOT NULL DEFAULT '', verdict_doc TEXT NOT NULL DEFAULT '{}',
  verdict_table TEXT NOT NULL DEFAULT '', analysis_state TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (rollout_id, idx));
CREATE TABLE IF NOT EXISTS nodes (
  rollout_id TEXT NOT NULL, hostname TEXT NOT NULL, previous TEXT NOT NULL, status TEXT NOT NULL,
  stage INTEGER NOT NULL, PRIMARY KEY (rollout_id, hostname));
CREATE TABLE IF NOT EXISTS deploys (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL, ts REAL NOT NULL, hostname TEXT NOT NULL,
  version TEXT NOT NULL, previous TEXT NOT NULL, purpose TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS analyses (
  rollout_id TEXT NOT NULL, stage INTEGER NOT NULL, look INTEGER NOT NULL, ts REAL NOT NULL,
  elapsed_s REAL NOT NULL, verdict TEXT NOT NULL, final INTEGER NOT NULL, summary TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gates (
  rollout_id TEXT NOT NULL, ts REAL NOT NULL, gate TEXT NOT NULL, stage INTEGER NOT NULL, outcome TEXT NOT NULL,
  detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  rollout_id TEXT NOT NULL, ts REAL NOT NULL, kind TEXT NOT NULL, operator TEXT NOT NULL, reason TEXT NOT NULL,
  stage INTEGER NOT NULL);
"""
#: Columns added after the first schema: (name, definition), added to an older database on open.
_ADDED_COLUMNS = (("paused", "TEXT NOT NULL DEFAULT '{}'"), ("promote_request", "TEXT NOT NULL DEFAULT '{}'"))
_JSON_COLS = {"spec", "trace", "pages_at_start", "hosts", "verdict_doc", "analysis_state", "summary", "detail",
              "paused", "promote_request"}


@dataclass
class RolloutRecord:
    """A ``rollouts`` row; ``spec`` and ``trace`` are dicts, ``pages_at_start`` a list of page keys;
    ``paused`` / ``promote_request``: ``{}`` or ``{"operator", "reason", "ts"}``."""

    id: str
    version: str
    state: str
    stage: int
    spec: dict[str, Any]
    reason: str = ""
    target: str = ""
    abort_reason: str = ""
    trace: dict[str, Any] = field(default_factory=dict)
    pages_at_start: list[str] = field(default_factory=list)
    paused: dict[str, Any] = field(default_factory=dict)
    promote_request: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass
class StageRecord:
    """A ``stages`` row (see the module doc for ``status`` values)."""

    idx: int
    kind: str
    hosts: list[str]
    status: str
    started_at: float
    analysis_start: float | None = None
    deadline: float | None = None
    ended_at: float | None = None
    last_look: float | None = None
    looks: int = 0
    errors: int = 0
    verdict: str = ""
    verdict_doc: dict[str, Any] = field(default_factory=dict)
    verdict_table: str = ""
    analysis_state: dict[str, Any] = field(default_factory=dict)


@dataclass
class NodeRecord:
    """A ``nodes`` row: the version ``hostname`` ran before the rollout touched it, and its status."""

    hostname: str
    previous: str
    status: str
    stage: int


def _dump(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in _JSON_COLS else v for k, v in row.items()}


def _load(cls: type, row: sqlite3.Row) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: json.loads(row[k]) if k in _JSON_COLS else row[k] for k in row.keys() if k in names})


class RolloutStore:
    """The rollout database at ``path`` (created with its schema if missing). Not thread-safe."""

    def __init__(self, path: Path | str, clock: Any = time.time):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.db = sqlite3.connect(self.path, timeout=30.0)
        self.db.row_factory = sqlite3.Row
        # Another process (a controller starting, `rollout status`) may open the same file at once.
        # Switching to WAL and creating the schema can meet its lock without SQLite's busy wait
        # ("database is locked" at once), so the set-up is retried for up to the busy timeout; the
        # columns are read and extended under the write lock, so only one opener adds each.
        deadline = time.monotonic() + 30.0
        while True:
            try:
                self._set_up()
                return
            except sqlite3.OperationalError as err:
                if self.db.in_transaction:
                    self.db.rollback()
                if "locked" not in str(err) or time.monotonic() > deadline:
                    self.db.close()
                    raise
                time.sleep(0.02)

    def _set_up(self) -> None:
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.db.execute("BEGIN IMMEDIATE")
        have = {r[1] for r in self.db.execute("PRAGMA table_info(rollouts)")}
        for name, definition in _ADDED_COLUMNS:
            if name not in have:
                self.db.execute(f"ALTER TABLE rollouts ADD COLUMN {name} {definition}")
        self.db.commit()

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    # ---- rollouts -----------------------------------------------------------------------------
    def create(self, rec: RolloutRecord) -> RolloutRecord:
        """Insert a new rollout (its first transition ``-> state`` is logged too)."""
        now = self.clock()
        rec.created_at = rec.updated_at = now
        row = _dump(asdict(rec))
        with self.db:
            self.db.execute(f"INSERT INTO rollouts ({','.join(row)}) VALUES ({','.join('?' * len(row))})",
                            tuple(row.values()))
            self.db.execute("INSERT INTO transitions VALUES (?,?,?,?,?,?,?)",
                            (rec.id, 0, now, "", rec.state, rec.stage, "created"))
        return rec

    def get(self, rollout_id: str) -> RolloutRecord:
        """The rollout ``rollout_id``; KeyError if unknown."""
        row = self.db.execute("SELECT * FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
        if row is None:
            raise KeyError(f"no rollout {rollout_id!r} in {self.path}")
        return _load(RolloutRecord, row)

    def latest(self, active_only: bool = False, terminal: tuple[str, ...] = ()) -> RolloutRecord | None:
        """The most recently created rollout (with ``active_only``: whose state is not in ``terminal``)."""
        q, args = "SELECT * FROM rollouts", ()
        if active_only and terminal:
            q += f" WHERE state NOT IN ({','.join('?' * len(terminal))})"
            args = terminal
        row = self.db.execute(q + " ORDER BY created_at DESC, rowid DESC LIMIT 1", args).fetchone()
        return _load(RolloutRecord, row) if row else None

    def update(self, rollout_id: str, **values: Any) -> RolloutRecord:
        """Set columns of a rollout without a state change (e.g. ``trace``, ``abort_reason``)."""
        values["updated_at"] = self.clock()
        row = _dump(values)
        with self.db:
            self.db.execute(f"UPDATE rollouts SET {','.join(f'{k}=?' for k in row)} WHERE id=?",
                            (*row.values(), rollout_id))
        return self.get(rollout_id)

    def transition(self, rollout_id: str, to_state: str, stage: int | None = None, reason: str = "",
                   **values: Any) -> RolloutRecord:
        """Move to ``to_state`` (and ``stage``), logging the transition, in one transaction."""
        cur = self.get(rollout_id)
        now = self.clock()
        stage = cur.stage if stage is None else stage
        row = _dump({**values, "state": to_state, "stage": stage, "updated_at": now,
                     **({"reason": reason} if reason else {})})
        with self.db:
            seq = self.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM transitions WHERE rollout_id=?",
                                  (rollout_id,)).fetchone()[0]
            self.db.execute("INSERT INTO transitions VALUES (?,?,?,?,?,?,?)",
                            (rollout_id, seq, now, cur.state, to_state, stage, reason))
            self.db.execute(f"UPDATE rollouts SET {','.join(f'{k}=?' for k in row)} WHERE id=?",
                            (*row.values(), rollout_id))
        return self.get(rollout_id)

    def transitions(self, rollout_id: str) -> list[dict[str, Any]]:
        """The transition log, oldest first."""
        rows = self.db.execute("SELECT * FROM transitions WHERE rollout_id=? ORDER BY seq", (rollout_id,))
        return [dict(r) for r in rows]

    # ---- stages -------------------------------------------------------------------------------
    def stage(self, rollout_id: str, idx: int) -> StageRecord | None:
        """Stage ``idx`` of the rollout, or None before it started."""
        row = self.db.execute("SELECT * FROM stages WHERE rollout_id=? AND idx=?", (rollout_id, idx)).fetchone()
        return _load(StageRecord, row) if row else None

    def stages(self, rollout_id: str) -> list[StageRecord]:
        """Every started stage, in order."""
        rows = self.db.execute("SELECT * FROM stages WHERE rollout_id=? ORDER BY idx", (rollout_id,))
        return [_load(StageRecord, r) for r in rows]

    def save_stage(self, rollout_id: str, st: StageRecord) -> None:
        """Insert or replace a stage row."""
        row = _dump({"rollout_id": rollout_id, **asdict(st)})
        with self.db:
            self.db.execute(f"INSERT OR REPLACE INTO stages ({','.join(row)}) VALUES ({','.join('?' * len(row))})",
                            tuple(row.values()))

    # ---- nodes and deploy calls ---------------------------------------------------------------
    def node(self, rollout_id: str, hostname: str) -> NodeRecord | None:
        """The node row, or None if the rollout never touched ``hostname``."""
        row = self.db.execute("SELECT hostname, previous, status, stage FROM nodes WHERE rollout_id=? AND hostname=?",
                              (rollout_id, hostname)).fetchone()
        return NodeRecord(**dict(row)) if row else None

    def nodes(self, rollout_id: str) -> list[NodeRecord]:
        """Every node the rollout touched (or was about to), in stage order."""
        rows = self.db.execute("SELECT hostname, previous, status, stage FROM nodes WHERE rollout_id=? "
                               "ORDER BY stage, hostname", (rollout_id,))
        return [NodeRecord(**dict(r)) for r in rows]

    def set_node(self, rollout_id: str, node: NodeRecord, deploy: tuple[str, str, str] | None = None) -> None:
        """Write ``node``; with ``deploy=(version, previous, purpose)`` also log that admin call, atomically."""
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO nodes VALUES (?,?,?,?,?)",
                            (rollout_id, node.hostname, node.previous, node.status, node.stage))
            if deploy is not None:
                self.db.execute("INSERT INTO deploys (rollout_id, ts, hostname, version, previous, purpose) "
                                "VALUES (?,?,?,?,?,?)", (rollout_id, self.clock(), node.hostname, *deploy))

    def deploys(self, rollout_id: str | None = None) -> list[dict[str, Any]]:
        """Logged deploy calls (of one rollout, or all), oldest first."""
        q = "SELECT * FROM deploys" + (" WHERE rollout_id=?" if rollout_id else "") + " ORDER BY seq"
        return [dict(r) for r in self.db.execute(q, (rollout_id,) if rollout_id else ())]

    # ---- looks and gates ----------------------------------------------------------------------
    def log_analysis(self, rollout_id: str, stage: int, look: int, elapsed_s: float, verdict: str, final: bool,
                     summary: dict[str, Any]) -> None:
        """Record one look of the canary analysis."""
        with self.db:
            self.db.execute("INSERT INTO analyses VALUES (?,?,?,?,?,?,?,?)",
                            (rollout_id, stage, look, self.clock(), elapsed_s, verdict, int(final),
                             json.dumps(summary)))

    def analyses(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every look, oldest first (``summary`` decoded)."""
        rows = self.db.execute("SELECT * FROM analyses WHERE rollout_id=? ORDER BY rowid", (rollout_id,))
        return [{**dict(r), "summary": json.loads(r["summary"]), "final": bool(r["final"])} for r in rows]

    def log_gate(self, rollout_id: str, gate: str, stage: int, outcome: str, detail: dict[str, Any]) -> None:
        """Record one gate evaluation."""
        with self.db:
            self.db.execute("INSERT INTO gates VALUES (?,?,?,?,?,?)",
                            (rollout_id, self.clock(), gate, stage, outcome, json.dumps(detail)))

    def log_event(self, rollout_id: str, kind: str, operator: str, reason: str, stage: int) -> None:
        """Record a human decision (pause, resume, promote) or the controller's handling of one."""
        with self.db:
            self.db.execute("INSERT INTO events VALUES (?,?,?,?,?,?)",
                            (rollout_id, self.clock(), kind, operator, reason, stage))

    def events(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every recorded decision, oldest first: ts, kind, operator, reason, stage."""
        rows = self.db.execute("SELECT ts, kind, operator, reason, stage FROM events WHERE rollout_id=? "
                               "ORDER BY rowid", (rollout_id,))
        return [dict(r) for r in rows]

    def gates(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every gate evaluation, oldest first (``detail`` decoded)."""
        rows = self.db.execute("SELECT * FROM gates WHERE rollout_id=? ORDER BY rowid", (rollout_id,))
        return [{**dict(r), "detail": json.loads(r["detail"])} for r in rows]


class RunLock:
    """An exclusive ``flock`` on ``<run>/rollout.lock`` (flag rollouts: ``flag.lock``) held by the
    process driving a rollout.

    The kernel drops it when the process dies (``kill -9`` included), so ``abort`` can tell a live
    controller (lock busy: ask it through the database) from a dead one (lock free: act itself).
    """

    def __init__(self, run_dir: Path | str, name: str = "rollout.lock"):
        self.path = Path(run_dir) / name
        self._fd: int | None = None

    def acquire(self, wait: bool = False) -> bool:
        """Take the lock; without ``wait`` False at once if another process holds it, with ``wait``
        block until it is free (for a lock held only for a moment: ``decide.START_LOCK``)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock (no-op if not held)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
