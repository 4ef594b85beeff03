"""Rollout vocabulary shared by the controller, its adapters and the CLI: states, exit codes, errors,
stage parsing and the
persisted :class:`RolloutSpec`. The controller is :mod:`gpuobs.rollout.controller`.

States (named as the references name them: Flagger's canary phases are Initializing, Initialized,
Progressing, Promoting, Finalising, Succeeded, Failed; Argo Rollouts' are Progressing, Paused,
Healthy, Degraded, Aborted)::

    Pending -> CompatChecked -> Canary(stage k) ... -> Promoting -> Succeeded
       |            |               |                    |
       v            v               v                    v
    Rejected    Rejected       RollingBack -> RolledBack | Aborted

* Pending (Flagger Initializing): created; the compatibility gate runs (:mod:`gpuobs.compat.inventory`: each
  serving node's modelName and driver from Prometheus against the release's engine and CUDA build).
  INCOMPATIBLE, or a node the gate cannot judge -> **Rejected** before anything is deployed.
* CompatChecked (Flagger Initialized): the error-budget gate runs. Any ``slo:error_budget_remaining:
  ratio`` series <= 0 (judged once its window holds enough requests), or an SLO-burn page already
  firing -> **Rejected** (the release freeze of the SRE workbook's error-budget policy), unless the
  operator overrides with a reason (recorded; the pages firing at that moment are then not held
  against the release).
* Canary(k) (Flagger/Argo Progressing, one canary step): deploy stage k's nodes through the admin API,
  relabel the file_sd targets (``track="canary"`` on nodes running the new version,
  ``track="baseline"`` on the other serving nodes), wait ``settle`` for Prometheus to pick the labels
  up, then analyse every ``interval`` from that moment (one growing window, the analyzer's
  group-sequential boundaries with horizon = stage timeout). PROMOTE -> error-budget gate -> next
  stage; ROLLBACK -> roll back, **RolledBack**; HOLD at the deadline -> inconclusive: roll back,
  **Aborted** (Argo counts such a run Inconclusive and pauses; a paused half-fleet is a state nobody
  owns, so we return to the known release and say the result was not a failure). A critical
  SLO-burn page firing at any look -> roll back, **RolledBack**. ``error_limit`` consecutive
  Prometheus errors (Argo's consecutiveErrorLimit; an error is never a verdict) -> roll back,
  **Aborted**. An error-budget freeze before a later stage -> roll back, **Aborted**.
* Promoting (Flagger Promoting + Finalising): a stage at 100% has no baseline left to compare
  with, so it is not analysed: the rest of the fleet is deployed, then a bake of ``bake`` seconds
  watches the SLO-burn page; labels are restored to what they were -> **Succeeded**.
* RollingBack: transitional and persisted, so a controller killed mid-rollback finishes it on
  resume. Every touched node is set back to the version it ran before (asking it first, so no
  node is deployed twice), labels are restored, then the recorded target state is entered. A node
  that cannot be reverted keeps the rollout in RollingBack (exit 1; ``resume`` retries).

Exit codes (:data:`EXIT_CODES`; docs/rollout.md#exit-codes): 0 Succeeded; 1 RolledBack, Rejected, or a rollback left
incomplete; 3 Aborted (no verdict on the release); 2 usage errors (:class:`UsageError`, mapped by the CLI).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from gpuobs.core.errors import InputError
from gpuobs.reference.releases import Release

PENDING, COMPAT_CHECKED, CANARY, PROMOTING = "Pending", "CompatChecked", "Canary", "Promoting"
ROLLING_BACK, SUCCEEDED, ROLLED_BACK = "RollingBack", "Succeeded", "RolledBack"
REJECTED, ABORTED = "Rejected", "Aborted"
TERMINAL = (SUCCEEDED, ROLLED_BACK, REJECTED, ABORTED)
EXIT_CODES = {SUCCEEDED: 0, ROLLED_BACK: 1, REJECTED: 1, ROLLING_BACK: 1, ABORTED: 3}
#: How the reason of a rollback the canary analysis decided begins (``<this> in stage k/N: <reasons>``);
#: :mod:`gpuobs.rollout.notices` then reads the deciding tests from that stage's verdict.
CANARY_ROLLBACK = "canary analysis ROLLBACK"


class UsageError(InputError):
    """A bad request (stages, override without reason, a rollout already active): exit 2."""


@dataclass(frozen=True)
class BudgetRow:
    """One error-budget series: its labels and the remaining ratio (1 = untouched, <= 0 = exhausted).

    ``requests``: requests in the SLO window behind it, when known; with fewer than ``min_requests``
    the ratio is noise (a 99.9% SLO over 700 requests is exhausted by one error), so it is not judged.
    """

    labels: dict[str, str]
    remaining: float
    requests: float | None = None
    min_requests: float = 0.0

    @property
    def judged(self) -> bool:
        """Whether the window holds enough requests for the ratio to mean anything."""
        return self.requests is None or self.requests >= self.min_requests

    @property
    def exhausted(self) -> bool:
        """Judged and not above zero."""
        return self.judged and not self.remaining > 0


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
        except (ValueError, OverflowError):  # OverflowError: an infinite share (inf%, 1e400%)
            raise UsageError(f"--stages: {item!r} is not a node count (1) or a share (25%)") from None
        if not 1 <= n <= serving or (item.endswith("%") and not 0 < float(item[:-1]) <= 100):
            raise UsageError(f"--stages: {item!r} gives {n} node(s); expected 1..{serving} "
                             f"(of {serving} serving nodes)")
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
        return Release(self.version, self.engine, self.cuda)


def fmt_labels(d: dict[str, str]) -> str:
    """``{k=v,...}`` sorted by key, for messages."""
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(d.items())) + "}"
