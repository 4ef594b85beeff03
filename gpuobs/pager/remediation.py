"""What the remediation controller did, shown where the on-call person looks: each incident's timeline
gets the controller's steps for the incident's nodes (who or what did each), and the console's front
page the nodes out of service, the breaker and the holds.

Read over the controller's HTTP API (``GET /api/timeline?node=N``, ``GET /api/status``,
:mod:`gpuobs.remediate.server`) with a short timeout; when the controller cannot answer, the incident
says so and nothing else changes (the pager never depends on it).
"""

from __future__ import annotations

import time
from typing import Any

import requests

from gpuobs.core.reach import is_connection_error, unreachable

#: Seconds of the controller's timeline before an incident opened and after it resolved that belong to it.
BEFORE_S, AFTER_S = 120.0, 900.0
TIMEOUT_S = 2.0


def with_remediation(inc: dict, url: str | None, now: float | None = None) -> dict:
    """``inc`` with ``remediation`` (the controller's timeline entries for its nodes, each ``{at, kind,
    by, node, detail}``) merged into its ``timeline`` in time order; ``remediation_error`` when the
    controller could not answer. ``url`` None: unchanged."""
    if not url or not inc.get("nodes"):
        return inc
    lo = inc["opened_at"] - BEFORE_S
    hi = (inc.get("resolved_at") or (time.time() if now is None else now)) + AFTER_S
    entries: list[dict[str, Any]] = []
    for node in inc["nodes"][:10]:
        try:
            r = requests.get(f"{url.rstrip('/')}/api/timeline", params={"node": node}, timeout=TIMEOUT_S)
            r.raise_for_status()
            rows = r.json()["timeline"]
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            inc["remediation_error"] = (unreachable("remediation controller", url, exc) if is_connection_error(exc)
                                        else f"remediation controller at {url}: {type(exc).__name__}")
            continue
        for e in rows:
            if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)) and lo <= e["ts"] <= hi:
                entries.append({"at": e["ts"], "kind": f"remediation {e.get('kind', '')}", "by": e.get("actor", ""),
                                "node": node, "detail": e.get("detail", "")})
    inc["remediation"] = entries
    inc["timeline"] = sorted([*inc.get("timeline", []), *entries], key=lambda ev: ev["at"])
    return inc


def status(url: str | None) -> dict[str, Any] | None:
    """The controller's ``/api/status`` or ``{"error": ...}``; None without a controller."""
    if not url:
        return None
    try:
        r = requests.get(f"{url.rstrip('/')}/api/status", timeout=TIMEOUT_S)
        r.raise_for_status()
        doc = r.json()
        if not isinstance(doc, dict) or "breaker" not in doc:
            raise ValueError("not a remediation controller answer")
        return doc
    except (requests.RequestException, ValueError) as exc:
        return {"error": (unreachable("remediation controller", url, exc) if is_connection_error(exc)
                          else f"remediation controller at {url}: {type(exc).__name__}")}
