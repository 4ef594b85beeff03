"""Rollout vocabulary shared by the controller, its adapters and the CLI: states, exit codes, errors,
the injected interfaces (:class:`Fleet`, :class:`Signals`, analyzer factory), stage parsing and the
persisted :class:`RolloutSpec`. State semantics: :mod:`gpuobs.canary.rollout`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from gpuobs.canary.compat_fleet import InventoryRow
from gpuobs.exporter.releases import Profile, Release

PENDING, COMPAT_CHECKED, CANARY, PROMOTING = "Pending", "CompatChecked", "Canary", "Promoting"
ROLLING_BACK, SUCCEEDED, ROLLED_BACK, REJECTED, ABORTED = "RollingBack", "Succeeded", "RolledBack", "Rejected", "Aborted"
TERMINAL = (SUCCEEDED, ROLLED_BACK, REJECTED, ABORTED)
EXIT_CODES = {SUCCEEDED: 0, ROLLED_BACK: 1, REJECTED: 1, ROLLING_BACK: 1, ABORTED: 3}


class UsageError(ValueError):
    """A bad request (stages, override without reason, a rollout already active): exit 2."""


class FleetError(RuntimeError):
    """A deploy, version query or relabel failed."""


@dataclass(frozen=True)
class BudgetRow:
    """One error-budget series: its labels and the remaining ratio (1 = untouched, <= 0 = exhausted)."""

    labels: dict[str, str]
    remaining: float


class Fleet(Protocol):
    """What the controller needs from the fleet (real one: :class:`gpuobs.canary.rollout_fleet.StackFleet`)."""

    def version(self, host: str) -> str: ...
    def deploy(self, host: str, version: str) -> str: ...
    def label_snapshot(self) -> dict[str, Any]: ...
    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None: ...


class Signals(Protocol):
    """What the controller reads from Prometheus (real one: :class:`gpuobs.canary.rollout_fleet.PromSignals`)."""

    def inventory(self) -> list[InventoryRow]: ...
    def budget(self) -> list[BudgetRow]: ...
    def pages(self) -> set[str]: ...


AnalyzerFactory = Callable[[float, float], Any]  # (horizon_s, interval_s) -> object with .analyze(start, end, state)


def parse_stages(text: str, serving: int) -> list[int]:
    """``"1,25%,50%,100%"`` -> cumulative node counts for ``serving`` nodes, ending with ``serving``.

    Integers are node counts, percentages round up. Duplicates collapse; 100% is appended if missing.
    Raises :class:`UsageError` for bad items, decreasing counts, or no canary stage (the first stage
    must leave at least one baseline node).
    """
    counts: list[int] = []
    for item in (p.strip() for p in str(text).split(",")):
        try:
            n = math.ceil(float(item[:-1]) / 100 * serving) if item.endswith("%") else int(item)
        except ValueError:
            raise UsageError(f"--stages: {item!r} is not a node count (1) or a share (25%)") from None
        if not 1 <= n <= serving or (item.endswith("%") and not 0 < float(item[:-1]) <= 100):
            raise UsageError(f"--stages: {item!r} gives {n} node(s); expected 1..{serving} (of {serving} serving nodes)")
        if counts and n < counts[-1]:
            raise UsageError(f"--stages: {item!r} ({n} nodes) is below the previous stage ({counts[-1]})")
        if not counts or n > counts[-1]:
            counts.append(n)
    if not counts or counts[0] >= serving:
        raise UsageError(f"--stages: the first stage must leave a baseline: {serving} serving node(s), "
                         f"first stage {counts[0] if counts else 0}; a canary needs at least 2 serving nodes")
    return counts if counts[-1] == serving else counts + [serving]


@dataclass(frozen=True)
class RolloutSpec:
    """What to roll out and how; times in seconds. ``hosts``: serving nodes in rollout order."""

    version: str
    engine: str
    cuda: str
    hosts: tuple[str, ...]
    stages: tuple[int, ...]
    interval_s: float = 30.0
    stage_timeout_s: float = 300.0
    settle_s: float = 10.0
    bake_s: float = 30.0
    error_limit: int = 3
    override_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**dataclasses.asdict(self), "hosts": list(self.hosts), "stages": list(self.stages)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "RolloutSpec":
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in doc.items() if k in names}
        return cls(**{**kw, "hosts": tuple(kw["hosts"]), "stages": tuple(kw["stages"])})

    @property
    def release(self) -> Release:
        """The release as the compat gate sees it (no behaviour profile)."""
        return Release(self.version, self.engine, self.cuda, Profile())


def fmt_labels(d: dict[str, str]) -> str:
    """``{k=v,...}`` sorted by key, for messages."""
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(d.items())) + "}"
