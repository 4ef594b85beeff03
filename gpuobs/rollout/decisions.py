"""Human decisions on a running rollout: pause, resume, promote (``gpuobs rollout pause|resume|promote``).

A decision is a request written to the rollout's database (:class:`gpuobs.rollout.store.RolloutStore`)
and logged in its ``events`` table with the operator's name and reason; the controller driving the
rollout (or the next ``gpuobs rollout resume``) acts on it at its next wait
(:mod:`gpuobs.rollout.controller`), as it does an abort. Semantics follow Argo Rollouts'
``kubectl argo rollouts pause`` / ``promote``:

* **pause**: the controller holds where it is: no canary look, no verdict acted on, no stage
  advance, no bake step. The stage deadline keeps running (the analysis horizon is fixed), so a
  pause past it ends the stage with the final look's verdict once resumed. Abort still works.
* **resume**: lifts the pause; the controller continues where it held.
* **promote**: the current stage passes now, whatever the analysis says (recorded as the stage's
  verdict ``PROMOTE (operator)``); a bake at 100% ends now. Lifts a pause too. The error-budget
  gate before the next stage still runs: promote overrides the canary analysis, not the freeze.

Every function raises :class:`gpuobs.rollout.model.UsageError` for an ended rollout, a missing
reason or operator, a pause of a paused rollout or a resume of one that is not paused (its message
calls the rollout ``noun``: "rollout", "flag rollout", "driver upgrade"), and KeyError for an
unknown rollout id.
"""

from __future__ import annotations

from gpuobs.rollout.model import TERMINAL, UsageError
from gpuobs.rollout.store import RolloutRecord, RolloutStore


def _check(store: RolloutStore, rollout_id: str, operator: str, reason: str, what: str,
           need_reason: bool = True, noun: str = "rollout") -> RolloutRecord:
    rec = store.get(rollout_id)
    if rec.state in TERMINAL:
        raise UsageError(f"{noun} {rec.id} already ended {rec.state}; nothing to {what}")
    if not operator.strip():
        raise UsageError("--operator: an operator name is required (it is recorded with the decision)")
    if need_reason and not reason.strip():
        raise UsageError(f"--reason: say why you {what} {noun} {rec.id} (it is recorded)")
    return rec


def pause(store: RolloutStore, rollout_id: str, operator: str, reason: str, noun: str = "rollout") -> RolloutRecord:
    """Hold the rollout: recorded as ``paused`` and a ``pause`` event."""
    rec = _check(store, rollout_id, operator, reason, "pause", noun=noun)
    if rec.paused:
        raise UsageError(f"{noun} {rec.id} is already paused by {rec.paused.get('operator')}: "
                         f"{rec.paused.get('reason')}")
    decision = {"operator": operator.strip(), "reason": reason.strip(), "ts": store.clock()}
    store.log_event(rec.id, "pause", decision["operator"], decision["reason"], rec.stage)
    return store.update(rec.id, paused=decision)


def resume(store: RolloutStore, rollout_id: str, operator: str, reason: str = "",
           noun: str = "rollout") -> RolloutRecord:
    """Lift a pause: ``paused`` cleared, a ``resume`` event recorded."""
    rec = _check(store, rollout_id, operator, reason, "resume", need_reason=False, noun=noun)
    if not rec.paused:
        raise UsageError(f"{noun} {rec.id} is not paused")
    store.log_event(rec.id, "resume", operator.strip(), reason.strip(), rec.stage)
    return store.update(rec.id, paused={})


def promote(store: RolloutStore, rollout_id: str, operator: str, reason: str,
            noun: str = "rollout") -> RolloutRecord:
    """Ask the controller to pass the current stage now: ``promote_request`` set, a ``promote`` event."""
    rec = _check(store, rollout_id, operator, reason, "promote", noun=noun)
    if rec.promote_request:
        raise UsageError(f"a promote of {noun} {rec.id} by {rec.promote_request.get('operator')} is already "
                         "pending")
    decision = {"operator": operator.strip(), "reason": reason.strip(), "ts": store.clock(), "stage": rec.stage}
    store.log_event(rec.id, "promote", decision["operator"], decision["reason"], rec.stage)
    return store.update(rec.id, promote_request=decision)
