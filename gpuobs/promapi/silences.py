"""Alertmanager API v2 client: silences (create, list, get, expire) and posting alerts.

Endpoints and shapes from alertmanager v0.25.0 ``api/v2/openapi.yaml``:

* ``POST /api/v2/silences`` body ``postableSilence`` = ``{"matchers": [{"name", "value", "isRegex",
  "isEqual"}], "startsAt", "endsAt" (RFC 3339), "createdBy", "comment"}`` -> ``{"silenceID": str}``;
* ``GET /api/v2/silences`` -> ``[gettableSilence]`` (``id``, ``status.state`` active|pending|expired,
  ``updatedAt`` and the postable fields);
* ``GET /api/v2/silence/{id}`` -> one ``gettableSilence`` (404 when unknown);
* ``DELETE /api/v2/silence/{id}`` -> 200 (expires it; 404 when unknown);
* ``POST /api/v2/alerts`` body ``postableAlerts`` -> 200.

Errors: :class:`SilenceApiError` (a :class:`~gpuobs.core.errors.Failure`, exit 1) when Alertmanager
cannot be reached or answers an error; :class:`SilenceInputError` (exit 2) for a bad duration, comment
or matcher set, and for a silence id Alertmanager does not know.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import requests

from gpuobs.core.errors import Failure, InputError
from gpuobs.core.reach import unreachable

#: Longest silence created from an incident: a week (longer hides the next incident of the group).
MAX_DURATION_S = 7 * 86400.0
#: Labels never used as silence matchers: they identify a scrape target or carry measured values,
#: not what the on-call means to silence.
_VOLATILE = ("value",)


class SilenceApiError(Failure):
    """Alertmanager's silences API could not be used: unreachable, non-2xx or not its JSON."""


class SilenceInputError(InputError):
    """A silence request the user has to fix (duration, comment, author, unknown id)."""


def rfc3339(ts: float) -> str:
    """Epoch seconds -> ``2026-12-01T17:00:00.000Z``."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def matchers_for(labels: dict[str, str]) -> list[dict[str, Any]]:
    """Equality matchers for ``labels`` (sorted by name); raises SilenceInputError when empty or lacking
    ``alertname`` (a silence without it could hide unrelated alerts)."""
    m = [{"name": k, "value": v, "isRegex": False, "isEqual": True}
         for k, v in sorted(labels.items()) if k not in _VOLATILE and v != ""]
    if not any(x["name"] == "alertname" for x in m):
        raise SilenceInputError("matchers: the incident's common labels lack 'alertname'; refusing a silence "
                                "that could hide unrelated alerts")
    return m


class AlertmanagerClient:
    """Alertmanager at ``base_url`` (``http://127.0.0.1:9093``)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s

    def _call(self, method: str, path: str, **kw: Any) -> requests.Response:
        url = f"{self.base_url}{path}"
        try:
            resp = requests.request(method, url, timeout=self.timeout_s, **kw)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise SilenceApiError(unreachable("Alertmanager", url, exc)) from None
        except requests.RequestException as exc:
            raise SilenceApiError(f"{method} {url}: {exc}") from None
        if resp.status_code == 404 and "/silence/" in path:
            raise SilenceInputError(f"silence id {path.rsplit('/', 1)[1]!r}: Alertmanager knows no such silence")
        if resp.status_code >= 400:
            raise SilenceApiError(f"{method} {url}: HTTP {resp.status_code}: {resp.text.strip()[:300]}")
        return resp

    def fingerprints(self) -> set[str]:
        """The fingerprints of every alert Alertmanager holds now, whatever its state (active,
        silenced, inhibited, unprocessed). Raises SilenceApiError."""
        url = f"{self.base_url}/api/v2/alerts"
        resp = self._call("GET", "/api/v2/alerts", params={"active": "true", "silenced": "true",
                                                           "inhibited": "true", "unprocessed": "true"})
        try:
            doc = resp.json()
        except ValueError:
            raise SilenceApiError(f"GET {url}: not JSON: {resp.text.strip()[:100]!r}") from None
        if not isinstance(doc, list) or not all(isinstance(a, dict) and isinstance(a.get("fingerprint"), str)
                                                for a in doc):
            raise SilenceApiError(f"GET {url}: expected a list of alerts with fingerprints, got {str(doc)[:100]!r}")
        return {a["fingerprint"] for a in doc}

    def create(self, labels: dict[str, str], duration_s: float, created_by: str, comment: str,
               now: float | None = None) -> tuple[str, dict[str, Any]]:
        """Silence alerts carrying all of ``labels`` for ``duration_s`` seconds from ``now``; returns
        ``(silence id, the posted silence)``. Raises SilenceInputError, SilenceApiError."""
        import time

        if not 0 < duration_s <= MAX_DURATION_S:
            raise SilenceInputError(f"duration: must be > 0 and at most 7d; got {duration_s:g}s")
        if not created_by.strip():
            raise SilenceInputError("author: must not be empty")
        if not comment.strip():
            raise SilenceInputError("comment: must not be empty (say why, for the next on-call)")
        start = time.time() if now is None else now
        body = {"matchers": matchers_for(labels), "startsAt": rfc3339(start), "endsAt": rfc3339(start + duration_s),
                "createdBy": created_by.strip(), "comment": comment.strip()}
        doc = self._json(self._call("POST", "/api/v2/silences", json=body))
        sid = doc.get("silenceID") if isinstance(doc, dict) else None
        if not isinstance(sid, str) or not sid:
            raise SilenceApiError(f"POST {self.base_url}/api/v2/silences: no silenceID in {str(doc)[:200]}")
        return sid, body

    def list(self) -> list[dict[str, Any]]:
        """Every silence Alertmanager holds (active, pending, expired). Raises SilenceApiError."""
        doc = self._json(self._call("GET", "/api/v2/silences"))
        if not isinstance(doc, list):
            raise SilenceApiError(f"GET {self.base_url}/api/v2/silences: not a list of silences")
        return doc

    def get(self, silence_id: str) -> dict[str, Any]:
        """One silence; raises SilenceInputError when unknown, SilenceApiError otherwise."""
        return self._json(self._call("GET", f"/api/v2/silence/{_sid(silence_id)}"))

    def expire(self, silence_id: str) -> None:
        """Expire a silence now. Raises SilenceInputError when unknown, SilenceApiError."""
        self._call("DELETE", f"/api/v2/silence/{_sid(silence_id)}")

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """``POST /api/v2/alerts`` (``postableAlerts``: ``[{"labels", "annotations", "startsAt",
        "endsAt", "generatorURL"}]``): alerts raised by gpuobs itself, routed, grouped, inhibited and
        silenced by Alertmanager like any other. Raises SilenceApiError."""
        self._call("POST", "/api/v2/alerts", json=alerts)

    def _json(self, resp: requests.Response) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise SilenceApiError(f"{resp.request.method} {resp.url}: answer is not JSON") from None


def _sid(silence_id: str) -> str:
    """A silence id as Alertmanager issues them (a UUID: hex and dashes); raises SilenceInputError."""
    s = str(silence_id)
    if not 1 <= len(s) <= 64 or not all(c in "0123456789abcdefABCDEF-" for c in s):
        raise SilenceInputError(f"silence id {s[:80]!r}: expected a UUID such as 5d0c8c6e-...")
    return s
