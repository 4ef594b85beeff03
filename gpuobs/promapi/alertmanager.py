"""Clients of the alert pipeline's read APIs, used by drills, the soak and the benches:

* :class:`AlertsClient`: Prometheus's ``GET /api/v1/alerts`` (the alerts its rules hold, pending or firing;
  prometheus/prometheus ``web/api/v1/api.go``, v2.42).
* :class:`UnionAlertsClient`: the same over several evaluators (the HA topology's Prometheus replicas
  and vmalert), one entry per label set.
* :class:`PagerClient`: the gpuobs pager's ``GET /api/pages`` (notifications Alertmanager delivered).

Both raise :class:`AlertApiError` (a :class:`~gpuobs.core.errors.Failure`) when the service cannot be
reached or answers something that is not its API, so callers count an error instead of crashing.
"""

from __future__ import annotations

from typing import Any

import requests

from gpuobs.core.errors import Failure
from gpuobs.core.reach import unreachable


class AlertApiError(Failure):
    """The alerts or pages API could not be read: unreachable, non-2xx or not the expected JSON."""


def _get_json(url: str, params: dict[str, Any] | None, timeout_s: float) -> Any:
    try:
        resp = requests.get(url, params=params, timeout=timeout_s)
        resp.raise_for_status()
        return resp.json()
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise AlertApiError(unreachable("pager" if "/api/pages" in url or "/api/incidents" in url else "Prometheus",
                                        url, exc)) from None
    except (requests.RequestException, ValueError) as exc:
        raise AlertApiError(f"GET {url}: {exc}") from None


class AlertsClient:
    """Prometheus's alert list at ``base_url`` (``http://127.0.0.1:9090``)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s

    def alerts(self) -> list[dict[str, Any]]:
        """Every active alert: ``[{"labels": {...}, "annotations": {...}, "state": "pending"|"firing",
        "activeAt": RFC 3339, "value": str}]``. Raises AlertApiError."""
        doc = _get_json(f"{self.base_url}/api/v1/alerts", None, self.timeout_s)
        try:
            return list(doc["data"]["alerts"])
        except (KeyError, TypeError) as exc:
            raise AlertApiError(f"{self.base_url}/api/v1/alerts: not a Prometheus alerts answer ({exc})") from None


class UnionAlertsClient:
    """The alerts of several evaluators that share the work (the HA topology's Prometheus replicas and
    vmalert, whose ``/api/v1/alerts`` answers in Prometheus's shape), as one list.

    An alert held by several evaluators (the replicas of a shard) is listed once, keyed by its label
    set: ``firing`` wins over ``pending`` and the earliest ``activeAt`` is kept. A member that does not
    answer is skipped (a killed replica is what the HA topology is for); :class:`AlertApiError` only
    when none answers."""

    def __init__(self, base_urls: list[str], timeout_s: float = 5.0):
        if not base_urls:
            raise ValueError("UnionAlertsClient needs at least one base URL")
        self.members = [AlertsClient(u, timeout_s) for u in base_urls]

    def alerts(self) -> list[dict[str, Any]]:
        """Like :meth:`AlertsClient.alerts`, over every member. Raises AlertApiError if none answers."""
        merged: dict[tuple, dict[str, Any]] = {}
        errors = []
        for member in self.members:
            try:
                got = member.alerts()
            except AlertApiError as exc:
                errors.append(str(exc))
                continue
            for a in got:
                key = tuple(sorted((a.get("labels") or {}).items()))
                old = merged.get(key)
                if old is None or (a.get("state") == "firing" and old.get("state") != "firing") or (
                        a.get("state") == old.get("state") and str(a.get("activeAt", "")) < str(old.get("activeAt", ""))):
                    merged[key] = a
        if len(errors) == len(self.members):
            raise AlertApiError("no evaluator answered: " + "; ".join(errors))
        return list(merged.values())


class PagerClient:
    """The gpuobs pager at ``base_url`` (``http://127.0.0.1:9097``)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s

    def pages(self, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest ``limit`` stored notifications, newest first: ``[{"id", "received_at" (epoch s),
        "receiver", "status", "alertname", "labels", "annotations", ...}]``. Raises AlertApiError."""
        doc = _get_json(f"{self.base_url}/api/pages", {"limit": limit}, self.timeout_s)
        try:
            return list(doc["pages"])
        except (KeyError, TypeError) as exc:
            raise AlertApiError(f"{self.base_url}/api/pages: not a pager answer ({exc})") from None

    def incidents(self, limit: int = 500) -> list[dict[str, Any]]:
        """The pager's incidents (``GET /api/incidents``; shape: docs/incidents.md, each with ``impact``).
        Raises AlertApiError."""
        doc = _get_json(f"{self.base_url}/api/incidents", {"limit": limit}, self.timeout_s)
        try:
            return list(doc["incidents"])
        except (KeyError, TypeError) as exc:
            raise AlertApiError(f"{self.base_url}/api/incidents: not a pager answer ({exc})") from None

    def incident(self, incident_id: int) -> dict[str, Any]:
        """One incident with its ``timeline`` (``GET /api/incidents/<id>``; shape: docs/incidents.md).
        Raises AlertApiError."""
        doc = _get_json(f"{self.base_url}/api/incidents/{int(incident_id)}", {}, self.timeout_s)
        if not isinstance(doc, dict) or "timeline" not in doc:
            raise AlertApiError(f"{self.base_url}/api/incidents/{incident_id}: not a pager answer")
        return doc

    def measure_impact(self, incident_id: int, timeout_s: float = 60.0) -> dict[str, Any]:
        """Have the pager measure incident ``incident_id``'s impact now (``POST
        /api/incidents/<id>/impact``) and return it (:mod:`gpuobs.pager.impact`'s dict). Raises
        AlertApiError when the pager cannot (no Prometheus configured, Prometheus failing, unknown id)."""
        url = f"{self.base_url}/api/incidents/{int(incident_id)}/impact"
        try:
            resp = requests.post(url, timeout=timeout_s)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise AlertApiError(unreachable("pager", url, exc)) from None
        except requests.RequestException as exc:
            raise AlertApiError(f"POST {url}: {type(exc).__name__}") from None
        try:
            doc = resp.json()
        except ValueError:
            raise AlertApiError(f"POST {url}: HTTP {resp.status_code}: not a pager answer (no JSON)") from None
        if resp.status_code != 200 or not isinstance(doc, dict) or "line" not in (doc.get("impact") or {}):
            err = doc.get("error") or (doc.get("impact") or {}).get("error") if isinstance(doc, dict) else None
            raise AlertApiError(f"POST {url}: HTTP {resp.status_code}: {err or 'no impact'}")
        return doc["impact"]
