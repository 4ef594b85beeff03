"""Clients of the alert pipeline's read APIs, used by drills, the soak and the benches:

* :class:`AlertsClient`: Prometheus's ``GET /api/v1/alerts`` (the alerts its rules hold, pending or firing;
  prometheus/prometheus ``web/api/v1/api.go``, v2.42).
* :class:`PagerClient`: the gpuobs pager's ``GET /api/pages`` (notifications Alertmanager delivered).

Both raise :class:`AlertApiError` (a :class:`~gpuobs.core.errors.Failure`) when the service cannot be
reached or answers something that is not its API, so callers count an error instead of crashing.
"""

from __future__ import annotations

from typing import Any

import requests

from gpuobs.core.errors import Failure


class AlertApiError(Failure):
    """The alerts or pages API could not be read: unreachable, non-2xx or not the expected JSON."""


def _get_json(url: str, params: dict[str, Any] | None, timeout_s: float) -> Any:
    try:
        resp = requests.get(url, params=params, timeout=timeout_s)
        resp.raise_for_status()
        return resp.json()
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
