"""What the remediation controller needs from the world, and the only errors those parts may raise.

The controller (:mod:`gpuobs.remediate.controller`) sees :class:`NodeActions` (cordon, drain, act,
health-check one node) and :class:`Signals` (is an alert still firing; which nodes a rollout holds).
It never sees HTTP, Kubernetes or the simulator: adapters (:mod:`gpuobs.remediate.adapters`)
implement these and translate their transport failures into :class:`ActionError`, as the rollout's
Fleet protocol does (:mod:`gpuobs.rollout.interfaces`) and Flagger's providers do
(fluxcd/flagger ``pkg/metrics/providers/provider.go``).

Every method is idempotent on its arguments except :meth:`NodeActions.act`, which the controller
calls write-ahead (logged as started before the call, done after) and never repeats after a crash:
a started action with no recorded outcome is resolved by the health check, not by calling it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuobs.core.errors import Failure

#: Actions :meth:`NodeActions.act` takes (``none``: the fault class needs no node action).
ACTIONS = ("reset-gpu", "reboot", "restart-engine", "none")


class ActionError(Failure):
    """A node action or query failed (transport, API refusal, unknown node); never a verdict on health."""


@dataclass(frozen=True)
class NodeView:
    """One node as the adapter sees it now.

    ``pool``: the node's pool (simulator: its role; Kubernetes: the configured pool label's value).
    ``cordoned``: new work is not placed on it. ``cordoned_by``: ``"gpuobs"`` when the remediation
    controller's mark is on it (taint / annotation / admin flag), ``"human"`` when it is cordoned
    without that mark, ``""`` when not cordoned. ``in_flight``: requests (serving) or unsaved
    training steps still running on it; 0 when drained. ``boot_id`` changes on each reboot.
    """

    node: str
    pool: str
    cordoned: bool = False
    cordoned_by: str = ""
    in_flight: float = 0.0
    boot_id: str = ""
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HealthResult:
    """An active health check (the simulator's equivalent of ``dcgmi diag -r 2``; Kubernetes: the
    diagnostic Job's result). ``passed`` is False with ``failures`` naming each failed test/GPU."""

    passed: bool
    failures: tuple[str, ...] = ()


class NodeActions(Protocol):
    """Node actions (simulator: :class:`gpuobs.remediate.adapters.sim.SimActions`; Kubernetes:
    :class:`gpuobs.remediate.adapters.kubernetes.KubeActions`). All raise :class:`ActionError` only."""

    def nodes(self) -> list[NodeView]:
        """Every node the adapter manages, with its pool (pool sizes for the caps come from here)."""
        ...

    def view(self, node: str) -> NodeView:
        """One node now (cordon state and who set it, in-flight work)."""
        ...

    def cordon(self, node: str, reason: str) -> None:
        """Stop placing new work on ``node`` and mark it as the controller's (idempotent)."""
        ...

    def uncordon(self, node: str) -> None:
        """Remove the controller's cordon and mark (idempotent; leaves a human's cordon alone)."""
        ...

    def drain(self, node: str) -> None:
        """Start moving work off ``node`` (serving: stop routing, let in-flight finish; training: signal a
        checkpoint; Kubernetes: evict pods honouring PodDisruptionBudgets). Idempotent; progress is read
        through :meth:`view`'s ``in_flight``."""
        ...

    def act(self, node: str, action: str, gpu: int | None) -> str:
        """Take ``action`` (one of :data:`ACTIONS` but ``none``) on ``node`` (``gpu`` for ``reset-gpu``);
        returns a one-line detail. Raises ActionError when the action could not be taken."""
        ...

    def health_check(self, node: str, gpu: int | None) -> HealthResult:
        """Run the active health check on ``node`` (``gpu``: only that GPU, None: all)."""
        ...


class Signals(Protocol):
    """What the controller reads besides the node (real one: :class:`gpuobs.remediate.adapters.prom.PromSignals`)."""

    def firing(self, node: str, alertname: str, gpu: int | None = None) -> bool:
        """True while ``alertname`` fires for ``node`` (and ``gpu`` when given: another GPU's alert is another
        fault) in Prometheus ``ALERTS``. Raises ActionError when the source cannot answer (the controller
        then waits; it never treats an outage as clear)."""
        ...

    def rollout_holds(self) -> dict[str, str]:
        """``{node: rollout id}`` for every node an active rollout or driver upgrade holds."""
        ...

    def abort_rollout(self, rollout_id: str, reason: str) -> None:
        """Ask the rollout holding a faulty canary node to abort (it rolls itself back)."""
        ...
