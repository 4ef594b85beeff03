"""Durable analysis runs of ``gpuobs canary serve``, and the verdict semantics a controller may rely on.

A *run* is one analysis of one canary at one analysis step: its key is the canary identity (the
caller's ``run`` id, e.g. Argo's canary pod-template hash or Flagger's namespace/name/checksum, plus
the canary and baseline selectors) and the ``step`` (Argo: a literal per Rollout step; Flagger: the
revision checksum already differs per analysis). A new step is a new run, with its own window and
sequential state.

Semantics (what docs/canary.md promises Argo Rollouts and Flagger):

* **Sticky decisions.** The first look that yields PROMOTE or ROLLBACK decides the run: every later
  look of that run answers the same verdict (``sticky: true``) without querying the backend, so no
  controller timing can turn a decided canary into something else.
* **Explicit INCONCLUSIVE.** The first look at or past the horizon (``time_fraction >= 1``: all alpha
  is spent) that does not decide answers ``INCONCLUSIVE`` and that, too, is sticky. It is neither
  PROMOTE nor ROLLBACK, so no success or failure condition keyed on those two ever fires on it.
  Past the horizon plus ``grace_s`` a look that cannot reach the backend also answers INCONCLUSIVE
  (instead of an error), which bounds how many errors in a row a controller can see.
* **No data never promotes.** A PROMOTE is accepted only when at least one critical metric was
  judged and no critical metric is NoData; otherwise the look answers HOLD.
* **Durable.** Runs live in SQLite (``<state-dir>/canary-runs.sqlite``, WAL); a restarted server
  continues each run with its original start and sequential state. Without a state dir the store is
  in memory (a restart starts every run afresh: documented as unsafe for controllers).
* **Expiry.** A run silent for longer than one horizon has ended; its key starts a new run at the
  next look (a retried rollout of the same canary after the analysis was abandoned).

Shapes: times are unix seconds (float). Answers are the JSON dicts of
:meth:`gpuobs.canary.verdict.Verdict.to_dict` plus ``run`` (``{"key", "step", "start", "looks",
"sticky", "decided_at"}``); ``verdict`` is one of :data:`VERDICTS`.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMOTE, ROLLBACK, HOLD, INCONCLUSIVE = "PROMOTE", "ROLLBACK", "HOLD", "INCONCLUSIVE"
VERDICTS = (PROMOTE, ROLLBACK, HOLD, INCONCLUSIVE)
#: Exit-code style numbers (:mod:`gpuobs.core.errors`): INCONCLUSIVE shares HOLD's 3 ("no decision").
CODES = {PROMOTE: 0, ROLLBACK: 1, HOLD: 3, INCONCLUSIVE: 3}
DB_NAME = "canary-runs.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    key TEXT PRIMARY KEY,
    step TEXT NOT NULL,
    start REAL NOT NULL,
    last_seen REAL NOT NULL,
    looks INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT '{}',
    decision TEXT,
    decided_at REAL,
    answer TEXT,
    last_look REAL,
    last_answer TEXT,
    steps_granted INTEGER NOT NULL DEFAULT 0
)"""


@dataclass
class RunRecord:
    """One run's row. ``state``: :meth:`AnalysisState.to_dict` form; ``answer``: the sticky final answer;
    ``last_answer``/``last_look``: the latest computed answer and its time (reused for looks that come
    within the reuse window); ``steps_granted``: Flagger traffic increases confirmed so far."""

    key: str
    step: str
    start: float
    last_seen: float
    looks: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    decision: str | None = None
    decided_at: float | None = None
    answer: dict[str, Any] | None = None
    last_look: float | None = None
    last_answer: dict[str, Any] | None = None
    steps_granted: int = 0

    def info(self, sticky: bool) -> dict[str, Any]:
        """The ``run`` object of an answer."""
        return {"key": self.key, "step": self.step, "start": self.start, "looks": self.looks,
                "sticky": sticky, "decided_at": self.decided_at}


class RunStore:
    """SQLite-backed runs, safe to share between the server's request threads.

    ``path``: a directory (the database is ``DB_NAME`` in it, created with its parents) or None for
    an in-memory store. Raises OSError when the directory cannot be created and sqlite3.Error when the
    database cannot be opened.
    """

    def __init__(self, path: str | Path | None):
        if path is None:
            target = ":memory:"
        else:
            Path(path).mkdir(parents=True, exist_ok=True)
            target = str(Path(path) / DB_NAME)
        self.path = None if path is None else Path(target)
        self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    def key_lock(self, key: str) -> threading.Lock:
        """The lock serialising the looks of run ``key`` within this process."""
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get(self, key: str) -> RunRecord | None:
        """The stored run or None."""
        with self._lock:
            row = self._db.execute("SELECT key, step, start, last_seen, looks, state, decision, decided_at, answer, "
                                   "last_look, last_answer, steps_granted FROM runs WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        k, step, start, seen, looks, state, decision, decided_at, answer, last_look, last_answer, steps = row
        return RunRecord(k, step, start, seen, looks, json.loads(state), decision, decided_at,
                         json.loads(answer) if answer else None, last_look,
                         json.loads(last_answer) if last_answer else None, steps)

    def latest(self, prefix: str) -> RunRecord | None:
        """The most recently started run whose key starts with ``prefix`` (Flagger metric lookups)."""
        with self._lock:
            row = self._db.execute("SELECT key FROM runs WHERE substr(key, 1, ?) = ? ORDER BY start DESC LIMIT 1",
                                   (len(prefix), prefix)).fetchone()
        return None if row is None else self.get(row[0])

    def put(self, rec: RunRecord) -> None:
        """Insert or replace ``rec`` (one transaction: never half-written)."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO runs (key, step, start, last_seen, looks, state, decision, decided_at, answer, "
                "last_look, last_answer, steps_granted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rec.key, rec.step, rec.start, rec.last_seen, rec.looks, json.dumps(rec.state), rec.decision,
                 rec.decided_at, None if rec.answer is None else json.dumps(rec.answer), rec.last_look,
                 None if rec.last_answer is None else json.dumps(rec.last_answer), rec.steps_granted))

    def count(self) -> int:
        """Number of stored runs."""
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0])

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


def run_key(run: str, step: str, canary: str, baseline: str) -> str:
    """The stored key of a run: identity, step and both selectors (one canary may be judged against
    two baselines, and one id may be reused with other selectors)."""
    return json.dumps([run, step, canary, baseline], separators=(",", ":"))


def has_evidence(doc: dict[str, Any]) -> bool:
    """True when every critical metric of the answer ``doc`` was judged (no NoData) and there is at
    least one: the condition for PROMOTE to count, and for Flagger traffic increases."""
    crit = [m for m in doc.get("metrics") or [] if m.get("critical")]
    return bool(crit) and all(m.get("classification") != "NoData" for m in crit)


#: Flagger's traffic gate holds the weight while a critical metric's harm-side statistic is at least
#: this z (one-sided p <= 2.3% on one look): a canary that leans harmful is not given more traffic
#: before the judge has decided, however far from a rollback it still is. A healthy canary's tests
#: cross it on about one look in ten (ten correlated tests), which delays a ramp by one interval.
LEAN_Z = 2.0
#: The same for an error ratio: its e-value (evidence against "no more errors than the baseline").
LEAN_E = 20.0


def leans_harmful(doc: dict[str, Any]) -> list[str]:
    """Why the answer ``doc`` leans harmful: one ``"<metric>[ <test>]: z=+2.31 >= 2"`` per critical
    metric whose harm-side statistic passed :data:`LEAN_Z` (a histogram metric's tests: any test's z
    in its harmful direction; an error ratio: its e-value past :data:`LEAN_E`; a series metric: its z).
    Empty when none does. For Flagger's confirm-traffic-increase (docs/canary.md, Flagger)."""
    out = []
    for m in doc.get("metrics") or []:
        if not m.get("critical") or m.get("classification") == "NoData":
            continue
        direction = m.get("direction", "increase")
        sign = {"increase": (1,), "decrease": (-1,), "either": (1, -1)}.get(direction, (1,))
        ev = m.get("evidence") or {}
        if m.get("kind") == "errors":
            log_e = ev.get("log_e")
            if log_e is not None and log_e >= math.log(LEAN_E):
                out.append(f"{m['name']}: e={math.exp(min(log_e, 700.0)):.3g} >= {LEAN_E:g}")
            continue
        rows = [(t.get("test"), t.get("z")) for t in m.get("tests") or [] if t.get("classification") not in (
            "NoData", "n/a")] or [(None, ev.get("z"))]
        for test, z in rows:
            if isinstance(z, (int, float)) and math.isfinite(z) and any(s * z >= LEAN_Z for s in sign):
                bound = f">= {LEAN_Z:g}" if z > 0 else f"<= -{LEAN_Z:g}"
                out.append(f"{m.get('name', '?')}{' ' + test if test and test != 'location' else ''}: z={z:+.2f} "
                           f"(harm side {bound})")
                break
    return out


def settle(doc: dict[str, Any]) -> dict[str, Any]:
    """Apply the serve-level semantics to one computed look ``doc`` (a Verdict dict); returns it.

    PROMOTE without evidence (:func:`has_evidence`) becomes HOLD; a HOLD at or past the horizon
    (``time_fraction >= 1``) becomes INCONCLUSIVE. ``final`` is true exactly when the verdict is
    PROMOTE, ROLLBACK or INCONCLUSIVE; ``exit_code`` follows :data:`CODES`.
    """
    if doc["verdict"] == PROMOTE and not has_evidence(doc):
        doc["verdict"] = HOLD
        doc["reasons"] = list(doc.get("reasons") or []) + [
            "no critical metric was judged on data: no data is never a promotion"]
    if doc["verdict"] == HOLD and (doc.get("time_fraction") or 0.0) >= 1.0:
        doc["verdict"] = INCONCLUSIVE
        doc["reasons"] = list(doc.get("reasons") or []) + [
            "the horizon is reached without a decision: INCONCLUSIVE (neither promote nor roll back)"]
    doc["final"] = doc["verdict"] != HOLD
    doc["exit_code"] = CODES[doc["verdict"]]
    return doc


def inconclusive(rec: RunRecord, now: float, why: str, canary: str, baseline: str, alpha: float,
                 horizon_s: float) -> dict[str, Any]:
    """The INCONCLUSIVE answer of a run whose horizon passed without a usable look (``why``)."""
    return {"verdict": INCONCLUSIVE, "reasons": [why], "warnings": [], "metrics": [], "canary": canary,
            "baseline": baseline, "start": rec.start, "end": now, "time_fraction": (now - rec.start) / horizon_s,
            "final": True, "alpha": alpha, "score": None, "exit_code": CODES[INCONCLUSIVE], "deciding": [],
            "assumptions": []}
