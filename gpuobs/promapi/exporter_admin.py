"""Client of a node's admin API: faults, deploys, flags and node actions (see :mod:`gpuobs.exporter.server`)."""

from __future__ import annotations

import requests

from gpuobs.core.errors import Failure
from gpuobs.core.reach import unreachable


class AdminError(Failure):
    """The admin API refused a call; ``status`` is the HTTP status (0 = unreachable), ``field`` the bad field."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


class AdminClient:
    """Calls ``/admin/faults`` on one node at ``base_url`` (``http://127.0.0.1:9400``) with a bearer token."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            resp = requests.request(method, f"{self.base_url}{path}", json=body, headers=self._headers,
                                    timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise AdminError(0, unreachable("node's admin API", self.base_url, exc)) from None
        try:
            doc = resp.json()
        except ValueError:
            doc = {"error": resp.text.strip()}
        if resp.status_code >= 400:
            raise AdminError(resp.status_code, doc.get("error", f"HTTP {resp.status_code}"), doc.get("field"))
        return doc

    def inject(self, body: dict) -> dict:
        """POST a fault; returns the created fault (``id``, ``kind``, ``gpu``, ``params``, ``injected_at``)."""
        return self._call("POST", "/admin/faults", body)

    def clear(self, fault_id: str) -> dict:
        """DELETE a fault by id; returns the cleared fault. AdminError(404) if unknown."""
        return self._call("DELETE", f"/admin/faults/{fault_id}")

    def deploy(self, version: str) -> dict:
        """POST /admin/deploy; returns ``{"version", "previous", "hostname"}``. AdminError(400) if unknown."""
        return self._call("POST", "/admin/deploy", {"version": version})

    def version(self) -> str:
        """The engine version the node runs."""
        return self._call("GET", "/admin/deploy")["version"]

    def flags(self) -> dict[str, bool]:
        """GET /admin/flags: every catalogue flag as the node's engine evaluates it now."""
        return dict(self._call("GET", "/admin/flags")["flags"])

    def node_status(self) -> dict:
        """GET /admin/node: cordoned, cordoned_by, draining, in_flight, boot_id, rebooting, engine_generation, ..."""
        return self._call("GET", "/admin/node")

    def node_action(self, action: str, **params) -> dict:
        """POST /admin/node ``{"action": action, **params}`` (cordon, uncordon, drain, reset-gpu, reboot,
        restart-engine, diag). Returns the node's answer; AdminError(400) for a bad action or field,
        AdminError(409) when the node cannot take it now (rebooting, down)."""
        return self._call("POST", "/admin/node", {"action": action, **params})

    def list(self) -> list[dict]:
        """Active faults of the node."""
        return self._call("GET", "/admin/faults")["faults"]
