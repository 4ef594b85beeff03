"""The rollout controller's fleet adapter for the native dev stack (the Prometheus signals are in
:mod:`gpuobs.rollout.adapters.prometheus`).

* :class:`StackFleet`: serving nodes of a stack started by ``gpuobs stack up`` (``<run>/stack.json``):
  versions and deploys through each node's admin API (:class:`~gpuobs.promapi.exporter_admin.AdminClient`,
  bearer token from the run directory), and ``track`` labels through the file_sd files that
  :func:`gpuobs.stack.render.write_targets` writes (Prometheus re-reads them within its 5 s
  ``refresh_interval``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuobs.core.fleet import shipped_fleet
from gpuobs.promapi.exporter_admin import AdminClient, AdminError
from gpuobs.rollout.interfaces import FleetError
from gpuobs.stack.render import write_targets
from gpuobs.stack.state import StackState

JOBS = ("dcgm", "vllm")
_HOST_LABELS = ("Hostname", "track")  # written by write_targets itself (with the identity label), or by us


def admin_clients(stack: StackState, token: str | None = None, timeout_s: float = 5.0) -> dict[str, AdminClient]:
    """``{hostname: AdminClient}`` for every node of ``stack`` (its admin API is its metrics URL without
    ``/metrics``), with ``token`` or the run directory's admin token. Raises FleetError when the token
    cannot be read."""
    try:
        token = token or stack.token()
    except OSError as exc:
        raise FleetError(f"admin token: {exc}") from None
    return {h: AdminClient(u.removesuffix("/metrics"), token, timeout_s)
            for h, u in zip(stack.hostnames, stack.urls.nodes)}


class StackFleet:
    """The serving fleet of the native stack described by ``stack`` (a loaded stack.json).

    Serving nodes are the first ``nodes - training_nodes`` hostnames; node i's admin API is
    ``urls.nodes[i]`` without ``/metrics``. Raises :class:`FleetError` (never AdminError/OSError).
    """

    def __init__(self, stack: StackState, token: str | None = None, timeout_s: float = 5.0):
        self.run = Path(stack.run_dir)
        self.hosts: list[str] = list(stack.serving_hosts)
        self._admin = admin_clients(stack, token, timeout_s)

    def _client(self, host: str) -> AdminClient:
        try:
            return self._admin[host]
        except KeyError:
            raise FleetError(f"unknown node {host!r}; serving nodes: {', '.join(self.hosts)}") from None

    def version(self, host: str) -> str:
        """The release ``host`` runs now (GET /admin/deploy)."""
        try:
            return self._client(host).version()
        except AdminError as exc:
            raise FleetError(f"{host}: version query failed: {exc}") from None

    def deploy(self, host: str, version: str) -> str:
        """Deploy ``version`` on ``host`` (POST /admin/deploy); returns the version it ran before."""
        try:
            return str(self._client(host).deploy(version)["previous"])
        except (AdminError, KeyError) as exc:
            raise FleetError(f"{host}: deploy {version} failed: {exc}") from None

    def label_snapshot(self) -> dict[str, Any]:
        """The current file_sd targets: ``{job: [[hostname, port, {extra labels}], ...]}`` (``track`` dropped)."""
        snap: dict[str, Any] = {}
        for job in JOBS:
            path = self.run / "prometheus" / "targets" / f"{job}-nodes.json"
            try:
                groups = json.loads(path.read_text())
                ident = shipped_fleet().identity_label
                snap[job] = [[g["labels"][ident], int(t.rsplit(":", 1)[1]),
                              {k: v for k, v in g["labels"].items() if k not in (ident, *_HOST_LABELS)}]
                             for g in groups for t in g["targets"]]
            except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                raise FleetError(f"cannot read the {job} targets in {path}: {exc}") from None
        return snap

    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None:
        """Rewrite both jobs' targets from ``snapshot``: serving hosts get ``track="canary"`` if in
        ``canary`` else ``track="baseline"``; ``canary=None`` restores the snapshot as it was."""
        try:
            for job in JOBS:
                targets = []
                for host, port, extra in snapshot[job]:
                    track = {} if canary is None or host not in self.hosts else {
                        "track": "canary" if host in canary else "baseline"}
                    targets.append((host, int(port), {**extra, **track}))
                write_targets(self.run, job, targets)
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise FleetError(f"relabelling the targets failed: {exc}") from None
