"""An in-memory fleet for the remediation controller's logic tests, on a simulated clock.

It implements :class:`gpuobs.remediate.interfaces.NodeActions` and ``Signals`` with the semantics the
real adapters have (the simulator's admin API, gpuobs/remediate/adapters/sim.py; Kubernetes,
gpuobs/remediate/adapters/kubernetes.py): cordon and uncordon are idempotent and a controller's
uncordon never removes a person's cordon; a drain lets in-flight work finish over ``drain_s``
(``stuck`` nodes never finish, like a PodDisruptionBudget that never allows the eviction); a GPU reset
clears resettable faults and fails on ``non_resettable`` ones; a reboot clears every fault but the
persistent ones; an alert fires while its fault is active and for ``alert_lag_s`` after it clears (a
rule's look-back). Every action call is counted in ``calls`` so tests can prove nothing ran twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuobs.remediate.interfaces import ActionError, HealthResult, NodeView


class Clock:
    """Simulated unix seconds; ``advance`` moves it."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@dataclass
class FakeNode:
    name: str
    pool: str
    cordoned: bool = False
    cordoned_by: str = ""
    in_flight: float = 4.0
    drain_started: float | None = None
    faults: dict[str, str] = field(default_factory=dict)  # alertname -> kind: resettable | reboot | persistent
    cleared_at: dict[str, float] = field(default_factory=dict)
    stuck: bool = False
    boot: int = 0


class FakeFleet:
    """``pools``: ``{pool: node count}``; nodes are named ``<pool>-<i>``."""

    def __init__(self, clock: Clock, pools: dict[str, int], drain_s: float = 20.0, alert_lag_s: float = 60.0):
        self.clock = clock
        self.drain_s, self.alert_lag_s = drain_s, alert_lag_s
        self.nodes_: dict[str, FakeNode] = {f"{p}-{i}": FakeNode(f"{p}-{i}", p) for p, n in pools.items()
                                            for i in range(n)}
        self.calls: list[tuple[str, str, object]] = []
        self.rollouts: dict[str, str] = {}
        self.aborted: list[tuple[str, str]] = []
        self.fail_inventory = False
        self.crash_on: str | None = None  # an action name: raise KeyboardInterrupt *after* doing it

    # ---- faults the tests inject --------------------------------------------------------------
    def fault(self, node: str, alertname: str, kind: str = "resettable") -> None:
        self.nodes_[node].faults[alertname] = kind
        self.nodes_[node].cleared_at.pop(alertname, None)

    def _clear(self, n: FakeNode, kinds: tuple[str, ...]) -> None:
        for a, k in list(n.faults.items()):
            if k in kinds:
                del n.faults[a]
                n.cleared_at[a] = self.clock()

    def _node(self, node: str) -> FakeNode:
        try:
            return self.nodes_[node]
        except KeyError:
            raise ActionError(f"unknown node {node!r}") from None

    def _update_drain(self, n: FakeNode) -> None:
        if n.drain_started is not None and not n.stuck and self.clock() - n.drain_started >= self.drain_s:
            n.in_flight = 0.0

    # ---- NodeActions --------------------------------------------------------------------------
    def nodes(self) -> list[NodeView]:
        if self.fail_inventory:
            raise ActionError("inventory unavailable")
        return [self.view(n) for n in self.nodes_]

    def view(self, node: str) -> NodeView:
        n = self._node(node)
        self._update_drain(n)
        return NodeView(n.name, n.pool, n.cordoned, n.cordoned_by if n.cordoned else "", n.in_flight, str(n.boot))

    def cordon(self, node: str, reason: str) -> None:
        n = self._node(node)
        self.calls.append(("cordon", node, reason))
        if not n.cordoned:
            n.cordoned, n.cordoned_by = True, "gpuobs"

    def uncordon(self, node: str) -> None:
        n = self._node(node)
        self.calls.append(("uncordon", node, None))
        if n.cordoned and n.cordoned_by == "gpuobs":
            n.cordoned, n.cordoned_by = False, ""
            n.in_flight, n.drain_started = 4.0, None

    def drain(self, node: str) -> None:
        n = self._node(node)
        self.calls.append(("drain", node, None))
        if n.drain_started is None:
            n.drain_started = self.clock()

    def act(self, node: str, action: str, gpu: int | None) -> str:
        n = self._node(node)
        self.calls.append(("act", node, action))
        if action == "reset-gpu":
            if any(k in ("reboot", "persistent") for k in n.faults.values()):
                result = None
            else:
                self._clear(n, ("resettable",))
                result = f"GPU {gpu} reset"
        elif action == "reboot":
            self._clear(n, ("resettable", "reboot"))
            n.boot += 1
            result = "rebooted"
        elif action == "restart-engine":
            self._clear(n, ("resettable",))
            result = "engine restarted"
        else:
            raise ActionError(f"unknown action {action!r}")
        if self.crash_on == action:
            self.crash_on = None
            raise KeyboardInterrupt("controller killed mid-action")
        if result is None:
            raise ActionError(f"{node}: {action} failed: a fault that a reset cannot clear")
        return result

    def health_check(self, node: str, gpu: int | None) -> HealthResult:
        n = self._node(node)
        bad = tuple(f"{a} ({k})" for a, k in n.faults.items())
        return HealthResult(not bad, bad)

    # ---- Signals ------------------------------------------------------------------------------
    def firing(self, node: str, alertname: str, gpu: int | None = None) -> bool:
        n = self._node(node)
        if alertname in n.faults:
            return True
        cleared = n.cleared_at.get(alertname)
        return cleared is not None and self.clock() - cleared < self.alert_lag_s

    def rollout_holds(self) -> dict[str, str]:
        return dict(self.rollouts)

    def abort_rollout(self, rollout_id: str, reason: str) -> None:
        self.aborted.append((rollout_id, reason))

    # ---- helpers ------------------------------------------------------------------------------
    def actions_on(self, node: str, kind: str = "act") -> int:
        return sum(1 for c in self.calls if c[0] == kind and c[1] == node)


def alert(node: str, alertname: str = "GpuXidCritical", xid: int | None = 48, gpu: int | None = 0,
          starts_at: str = "2027-01-15T08:00:00Z", status: str = "firing", fp: str | None = None) -> dict:
    """One Alertmanager v4 alert as the webhook sends it."""
    labels = {"alertname": alertname, "node": node, "severity": "critical"}
    if xid is not None:
        labels["xid"] = str(xid)
    if gpu is not None:
        labels["gpu"] = str(gpu)
    return {"status": status, "labels": labels, "annotations": {}, "startsAt": starts_at,
            "endsAt": "0001-01-01T00:00:00Z", "fingerprint": fp or f"{node}-{alertname}-{xid}-{gpu}"}


def payload(*alerts: dict) -> dict:
    return {"version": "4", "status": "firing", "receiver": "remediate", "alerts": list(alerts)}
