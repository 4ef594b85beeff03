"""Planned disruptions on the stack (drills, rollouts), recorded so the incident console can link them.

Data flows one way: the drill runner (:mod:`gpuobs.drills.runner`) and the rollout command
(:mod:`gpuobs.cli.rollout`) append records to ``<run dir>/activity.jsonl``; the pager
(:mod:`gpuobs.pager.server`) reads it when it shows an incident and puts every related drill or rollout
on the incident's timeline. Neither side imports the other; this module (the lowest layer) owns the
format.

The file is JSON Lines, one object per line, appended with a single ``write`` (a reader never sees
half a record from one writer; a line it cannot parse is skipped)::

    {"kind": "drill" | "rollout", "id": "xid-1764570000", "title": "drill xid",
     "nodes": ["gpu-node-00"],          # [] = fleet-wide (every node)
     "started_at": 1764570000.0, "ended_at": null | 1764570042.0,   # epoch seconds
     "until": 1764571500.0,             # optional: the latest it can end (a runner that died
                                        # before writing ended_at does not stay "running" for ever)
     "detail": {"report": "gpuobs report drill xid --run-dir .run", "outcome": "PASS", ...}}

A record is written when the activity starts (``ended_at`` null) and again when it ends; records with
the same ``(kind, id)`` are merged, later values winning (:func:`load`).

An incident is related to an activity (:func:`related`) when their own recorded time spans intersect
and their nodes meet: a shared node, or either side fleet-wide (no node). The activity's span is
``started_at .. ended_at`` (a drill ends after its alerts resolved, a rollout after its verdict), or
``started_at .. now`` while it runs (capped by ``until``); the incident's is ``opened_at ..
resolved_at`` (or now). The only slack is :data:`SKEW_S` on either side, for the clocks of the
pager and the runner that wrote the record (the same host or NTP-synced hosts); there is no fixed
"within 5 minutes" padding, which linked a drill that had ended before the incident opened, or one
about to start after it resolved, to an incident it did not cause. A rollout notice (label
``rollout``) is related to that rollout only.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

FILE_NAME = "activity.jsonl"
KINDS = ("drill", "rollout")
#: Clock-skew tolerance in seconds between the activity's recorder and the pager: two spans still
#: intersect when they miss each other by at most this much. Not a "related if near" window.
SKEW_S = 5.0


@dataclass
class Activity:
    """One drill or rollout: ``nodes`` empty means fleet-wide; ``ended_at`` None while it runs."""

    kind: str
    id: str
    title: str = ""
    nodes: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    until: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def span_end(self, now: float | None) -> float:
        """End of the activity's own span, epoch s: ``ended_at``; while it runs, ``now`` capped by
        ``until`` (``now`` None: ``until``, else infinity)."""
        if self.ended_at is not None:
            return self.ended_at
        running = math.inf if now is None else now
        return min(running, self.until) if self.until is not None else running

    @property
    def end(self) -> float:
        """When it ended: ``ended_at``, else ``until``, else infinity (still running)."""
        return self.ended_at if self.ended_at is not None else self.until if self.until is not None else math.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the record's fields)."""
        return {"kind": self.kind, "id": self.id, "title": self.title, "nodes": list(self.nodes),
                "started_at": self.started_at, "ended_at": self.ended_at, "until": self.until,
                "detail": dict(self.detail)}


def path_in(run_dir: Path | str) -> Path:
    """``<run_dir>/activity.jsonl``."""
    return Path(run_dir) / FILE_NAME


def record(run_dir: Path | str, kind: str, ident: str, *, title: str = "", nodes: Iterable[str] | None = None,
           started_at: float | None = None, ended_at: float | None = None, until: float | None = None,
           detail: Mapping[str, Any] | None = None) -> None:
    """Append one record to ``<run_dir>/activity.jsonl`` (created with the directory if missing).

    Raises ValueError for an unknown ``kind`` or an empty ``ident``; OSError when the file cannot be
    written (callers report it and carry on: a missing link must never stop a drill or a rollout)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not str(ident).strip():
        raise ValueError("an activity needs an id")
    doc: dict[str, Any] = {"kind": kind, "id": str(ident)}
    if title:
        doc["title"] = title
    if nodes is not None:
        doc["nodes"] = [str(n) for n in nodes]
    if started_at is not None:
        doc["started_at"] = float(started_at)
    if ended_at is not None:
        doc["ended_at"] = float(ended_at)
    if until is not None:
        doc["until"] = float(until)
    if detail:
        doc["detail"] = dict(detail)
    line = (json.dumps(doc, sort_keys=True, default=str) + "\n").encode()
    path = path_in(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)  # one write of one line: appends from several writers do not interleave
    finally:
        os.close(fd)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def load(path: Path | str) -> list[Activity]:
    """Every activity in the file, records merged by ``(kind, id)``, in order of first appearance.
    A missing file is no activity; a line that is not a valid record is skipped."""
    try:
        text = Path(path).read_text("utf-8", "replace")
    except FileNotFoundError:
        return []
    acts: dict[tuple[str, str], Activity] = {}
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("kind") not in KINDS or not doc.get("id"):
            continue
        key = (doc["kind"], str(doc["id"]))
        a = acts.setdefault(key, Activity(*key))
        if isinstance(doc.get("title"), str):
            a.title = doc["title"]
        if isinstance(doc.get("nodes"), list):
            a.nodes = [str(n) for n in doc["nodes"]]
        for k in ("started_at", "ended_at", "until"):
            if _num(doc.get(k)) is not None:
                setattr(a, k, _num(doc[k]))
        if isinstance(doc.get("detail"), dict):
            a.detail.update(doc["detail"])
    return list(acts.values())


def related(activities: Iterable[Activity], nodes: Iterable[str], opened_at: float, resolved_at: float | None,
            labels: Mapping[str, str] | None = None, now: float | None = None,
            skew_s: float = SKEW_S) -> list[tuple[Activity, str]]:
    """The activities related to an incident (see the module doc), each with how it matched:
    ``"rollout label"``, ``"node <name>"``, ``"fleet-wide activity"`` or ``"fleet-wide incident"``.

    ``nodes``: the incident's nodes; ``opened_at``/``resolved_at``: its span (None: still open, up to
    ``now``); ``labels``: its common labels (a ``rollout`` label links that rollout only); ``skew_s``:
    clock-skew tolerance in seconds (:data:`SKEW_S`). Spans intersect when ``a.started_at - skew_s <=
    incident end`` and ``opened_at <= activity end + skew_s``; an activity without ``started_at`` is
    never related by time."""
    inc_nodes = set(nodes)
    labels = labels or {}
    end = resolved_at if resolved_at is not None else (now if now is not None else math.inf)
    out = []
    for a in activities:
        if labels.get("rollout"):
            if a.kind == "rollout" and a.id == labels["rollout"]:
                out.append((a, "rollout label"))
            continue
        if a.started_at is None:
            continue
        a_end = a.span_end(now)
        if not (a.started_at - skew_s <= end and opened_at <= a_end + skew_s):
            continue
        shared = sorted(inc_nodes & set(a.nodes))
        if shared:
            out.append((a, f"node {', '.join(shared)}"))
        elif not a.nodes:
            out.append((a, "fleet-wide activity"))
        elif not inc_nodes:
            out.append((a, "fleet-wide incident"))
    return out
