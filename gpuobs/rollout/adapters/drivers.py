"""The driver upgrade's fleet adapter for the native dev stack: drivers and the node procedure
through each node's admin API (``GET /admin/node``, ``POST /admin/node``).

:class:`StackDriverFleet` implements :class:`gpuobs.rollout.driver.DriverFleet`. The procedure per
batch, phase by phase across the batch (the GPU Operator's driver upgrade state machine does the
same per node: ``cordon-required`` -> ``wait-for-jobs-required`` -> ``drain-required`` ->
``pod-restart-required`` (the driver pod reinstalls the module) -> ``validation-required`` ->
``uncordon-required`` -> ``upgrade-done``; NVIDIA/gpu-operator docs, "GPU Driver Upgrades", and
k8s-operator-libs ``pkg/upgrade/consts.go``): cordon (mark ``gpuobs``, reason ``driver upgrade to
V``), drain, wait until no request is in flight (a training rank: its checkpoint written), the
``install-driver`` node action where the driver differs, wait until the node is back from the module
reload, health check (``diag``: ``dcgmi diag -r 2``), uncordon the nodes that passed.

A person's action wins: a node an operator cordoned, or one the remediation controller quarantined
(a ``gpuobs`` cordon for another reason), is not touched (FleetError). Raises FleetError only (never
AdminError or OSError).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from gpuobs.promapi.exporter_admin import AdminClient, AdminError
from gpuobs.rollout.adapters.native import admin_clients
from gpuobs.rollout.driver import IN_UPGRADE, NodeUpgrade
from gpuobs.rollout.interfaces import FleetError
from gpuobs.stack.state import StackState

#: The cordon reason of a node the upgrade holds; how :meth:`StackDriverFleet.version` tells its own
#: cordon from the remediation controller's (both are ``gpuobs`` marks).
REASON_PREFIX = "driver upgrade to "


class StackDriverFleet:
    """The serving nodes of the native stack ``stack`` (a loaded stack.json) as a driver fleet.

    ``drain_timeout_s`` / ``reload_timeout_s``: how long to wait for a batch to drain and for its
    nodes to come back from the driver reload (seconds, wall clock); ``reload_s``: the simulated
    reload's downtime asked of the node; ``poll_s``: status polling period."""

    def __init__(self, stack: StackState, token: str | None = None, timeout_s: float = 5.0,
                 drain_timeout_s: float = 180.0, reload_timeout_s: float = 180.0, reload_s: float = 20.0,
                 poll_s: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.hosts: list[str] = list(stack.serving_hosts)
        self._admin = admin_clients(stack, token, timeout_s)
        self.drain_timeout_s, self.reload_timeout_s, self.reload_s = drain_timeout_s, reload_timeout_s, reload_s
        self.poll_s, self.sleep, self.clock = poll_s, sleep, clock

    # ---- Fleet ---------------------------------------------------------------------------------
    def _client(self, host: str) -> AdminClient:
        try:
            return self._admin[host]
        except KeyError:
            raise FleetError(f"unknown node {host!r}; serving nodes: {', '.join(self.hosts)}") from None

    def status(self, host: str) -> dict[str, Any]:
        """``GET /admin/node`` of ``host``."""
        try:
            return self._client(host).node_status()
        except AdminError as exc:
            raise FleetError(f"{host}: status query failed: {exc}") from None

    def _action(self, host: str, action: str, **params: Any) -> dict[str, Any]:
        try:
            return self._client(host).node_action(action, **params)
        except AdminError as exc:
            raise FleetError(f"{host}: {action} failed: {exc}") from None

    @staticmethod
    def operator_hold(host: str, st: dict[str, Any]) -> str:
        """What holds ``host`` for an operator (its status ``st`` has a person's cordon, which wins:
        the upgrade never touches such a node), as ``"<host> is cordoned by an operator (<reason>)"``;
        "" when no person holds it."""
        if st.get("cordoned_by") != "human":
            return ""
        return f"{host} is cordoned by an operator ({st.get('cordon_reason') or 'no reason'})"

    @staticmethod
    def ours(st: dict[str, Any]) -> bool:
        """The upgrade's own cordon is on the node."""
        return st.get("cordoned_by") == "gpuobs" and str(st.get("cordon_reason", "")).startswith(REASON_PREFIX)

    def version(self, host: str) -> str:
        """The node's driver; with ``" (in upgrade)"`` appended while the upgrade's cordon is on it or
        it is down (an interrupted procedure)."""
        st = self.status(host)
        drv = str(st.get("driver_version", ""))
        if not drv:
            raise FleetError(f"{host}: the node's status has no driver_version")
        return drv + IN_UPGRADE if self.ours(st) or st.get("down") or st.get("rebooting") else drv

    def model(self, host: str) -> str:
        """The node's GPU model (modelName, as DCGM reports it)."""
        return str(self.status(host).get("gpu_model", ""))

    def deploy(self, host: str, version: str) -> str:
        """The procedure on one node (the rollback path); returns the driver it ran before. FleetError
        when its health check fails (the node stays cordoned; ``resume`` retries)."""
        res = self.upgrade([host], version)[host]
        if res.failures:
            raise FleetError(f"{host}: health check failed on driver {version}: {'; '.join(res.failures)}")
        return res.previous

    def label_snapshot(self) -> dict[str, Any]:
        """Nothing: a driver upgrade selects nodes by their identity label, it relabels no target."""
        return {}

    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None:
        """Nothing (see :meth:`label_snapshot`)."""

    # ---- the procedure -------------------------------------------------------------------------
    def upgrade(self, hosts: list[str], version: str) -> dict[str, NodeUpgrade]:
        """Cordon, drain, install, health-check and uncordon ``hosts`` (see the module doc), phase by
        phase; idempotent (a node already on ``version`` is not reinstalled, an interrupted procedure
        is completed). Returns ``{host: NodeUpgrade}``. Raises FleetError: a node held by someone
        else, before the procedure or by its end (an operator's cordon, a remediation quarantine put on
        while the upgrade held it: that node is not uncordoned, the batch's other nodes are), an admin
        call failing, a drain or reload past its timeout."""
        before = {h: self.status(h) for h in hosts}
        for h, st in before.items():
            if self.operator_hold(h, st):
                raise FleetError(f"{self.operator_hold(h, st)}: not touched; uncordon it or leave it out "
                                 "(`gpuobs upgrade run --exclude HOST`)")
            if st.get("cordoned_by") == "gpuobs" and not self.ours(st):
                raise FleetError(f"{h} is quarantined by the remediation controller "
                                 f"({st.get('cordon_reason') or 'no reason'}): not touched")
        for h in hosts:
            self._action(h, "cordon", by="gpuobs", reason=f"{REASON_PREFIX}{version}"[:200])
            self._action(h, "drain", reason=f"{REASON_PREFIX}{version}"[:200])
        self._wait(hosts, lambda st: bool(st.get("drained")) or bool(st.get("down")), self.drain_timeout_s, "drain")
        out: dict[str, NodeUpgrade] = {}
        for h in hosts:
            previous = str(before[h].get("driver_version", ""))
            installed = False
            st = self._status_or_down(h)
            if st.get("down") and st.get("driver_target") != version:
                # a reload (or reboot) a killed controller left running: the node takes no install until back
                self._wait([h], lambda st: not st.get("down"), self.reload_timeout_s, "driver reload")
                st = self.status(h)
            # already on it, or reloading into it (installed by a controller killed mid-reload): no install
            if previous != version and version not in (st.get("installed_driver"), st.get("driver_target")):
                got = self._action(h, "install-driver", version=version, reload_s=self.reload_s)
                installed = bool(got.get("changed", True))
            out[h] = NodeUpgrade(previous, installed)
        self._wait(hosts, lambda st: not st.get("down") and not st.get("rebooting"), self.reload_timeout_s,
                   "driver reload")
        held: list[str] = []
        for h in hosts:
            st = self.status(h)
            if st.get("driver_version") != version:
                raise FleetError(f"{h}: runs driver {st.get('driver_version')} after installing {version}")
            diag = self._action(h, "diag")
            failures = tuple(str(f) for f in diag.get("failures", [])) if not diag.get("passed") else ()
            if not failures:
                st = self.status(h)  # a person or the remediation controller may have cordoned it meanwhile
                if self.ours(st):
                    self._action(h, "uncordon", by="gpuobs")
                else:
                    held.append(f"{h} (cordoned by {st.get('cordoned_by') or 'nobody'}: "
                                f"{st.get('cordon_reason') or 'no reason'})")
            out[h] = NodeUpgrade(out[h].previous, out[h].installed, failures)
        if held:
            raise FleetError(f"{'; '.join(held)}: held by someone else during the procedure, not returned to "
                             f"service; the other nodes of the batch are back in service")
        return out

    def _wait(self, hosts: list[str], ok: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> None:
        deadline = self.clock() + timeout_s
        waiting = list(hosts)
        while True:
            waiting = [h for h in waiting if not ok(self._status_or_down(h))]
            if not waiting:
                return
            if self.clock() >= deadline:
                raise FleetError(f"{what} not done after {timeout_s:.0f}s on {', '.join(waiting)}")
            self.sleep(self.poll_s)

    def _status_or_down(self, host: str) -> dict[str, Any]:
        """Status, or ``{"down": True}`` while the node's admin API does not answer (its reload)."""
        try:
            return self._client(host).node_status()
        except AdminError as exc:
            if exc.status in (0, 502, 503):
                return {"down": True}
            raise FleetError(f"{host}: status query failed: {exc}") from None
