"""What the rollout controller needs from the world, and the only errors those parts may raise.

The controller (:mod:`gpuobs.rollout.controller`) sees a :class:`Fleet` (who runs which version; deploy;
canary/baseline labels), :class:`Signals` (the compatibility inventory, the error budget, SLO-burn
pages) and an :data:`AnalyzerFactory` (canary looks). It never sees HTTP, Prometheus or the dev stack:
adapters (:mod:`gpuobs.rollout.adapters`, wired in ``gpuobs.cli.rollout``) implement these and
translate their transport failures into :class:`SignalsUnavailable` or :class:`FleetError`, as
Flagger's metric providers return ``ErrNoValuesFound`` and never an HTTP error to the canary
controller (fluxcd/flagger ``pkg/metrics/providers/provider.go``, ``errors.go``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from gpuobs.core.errors import Failure

if TYPE_CHECKING:  # pragma: no cover - types only
    from gpuobs.compat.inventory import InventoryRow
    from gpuobs.rollout.model import BudgetRow


class FleetError(Failure):
    """A deploy, version query or relabel failed."""


class SignalsUnavailable(Failure):
    """The signal source (Prometheus, the analyzer's backend) could not answer: never a verdict.

    The controller counts consecutive ones against the stage's error limit."""


class Fleet(Protocol):
    """What the controller needs from the fleet (real one: :class:`gpuobs.rollout.adapters.native.StackFleet`)."""

    def version(self, host: str) -> str: ...
    def deploy(self, host: str, version: str) -> str: ...
    def label_snapshot(self) -> dict[str, Any]: ...
    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None: ...


class Signals(Protocol):
    """What the controller reads from Prometheus (real one: :class:`gpuobs.rollout.adapters.prometheus.PromSignals`)."""

    def inventory(self) -> list[InventoryRow]: ...
    def budget(self) -> list[BudgetRow]: ...
    def pages(self) -> set[str]: ...


AnalyzerFactory = Callable[[float, float], Any]  # (horizon_s, interval_s) -> object with .analyze(start, end, state)
