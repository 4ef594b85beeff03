"""Feature-flag rollouts: progressive enablement of one flag by node share, judged like a release.

A flag rollout is a rollout (:class:`gpuobs.rollout.controller.Controller`) whose "version" on a node
is the flag's state there: ``spec_decode=on`` or ``spec_decode=off`` (:func:`variant`). Everything a
release rollout guarantees carries over unchanged, because it is the same code: stages by node share
(:func:`gpuobs.rollout.model.parse_stages`), the canary cohort relabelled ``track="canary"`` (flag on)
against ``track="baseline"`` (flag off) for the same canary analyzer, config and alpha, the
error-budget gate before every stage, the SLO-burn page checked at every look, the Prometheus error
limit, SQLite persistence after every transition with write-ahead flips (a resumed controller asks
the flag file before flipping, so no node is flipped twice), OpenTelemetry spans, notices.

What differs (:class:`FlagController`):

* **Flag gate** instead of the compatibility gate (a flag ships inside the release already running;
  there is no build to check): every serving node's engine must evaluate the flag (it is in the
  engine's catalogue and the flag file), else **Rejected** before anything is flipped.
* **Kill switch** instead of per-node revert: any rollback (canary ROLLBACK, an SLO-burn page, an
  inconclusive HOLD at the deadline, an operator abort, a freeze mid-rollout) first turns the flag
  off on *every* node in one atomic write of the flag file (:meth:`FlagFleet.kill`), in the same look
  that decided it, and marks it killed so nothing re-enables it until a new rollout. Every node the
  flag was on for is logged as a ``kill switch`` flip. Nodes where the flag was on before the
  rollout go off too: after a kill the flag is off everywhere, by design.

Rollout ids are ``<flag>-<UTC stamp>``; the record's ``version`` is ``<flag>=on``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

from opentelemetry.trace import Status, StatusCode

from gpuobs.rollout import tracing
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.interfaces import Fleet, FleetError
from gpuobs.rollout.model import ABORTED, COMPAT_CHECKED, REJECTED, RolloutSpec
from gpuobs.rollout.store import RolloutRecord

ON, OFF = "on", "off"


def variant(flag: str, on: bool) -> str:
    """The rollout "version" of ``flag`` being on (``spec_decode=on``) or off."""
    return f"{flag}={ON if on else OFF}"


def parse_variant(text: str) -> tuple[str, bool]:
    """``"spec_decode=on"`` -> ``("spec_decode", True)``; ValueError for anything else."""
    flag, sep, state = str(text).rpartition("=")
    if not sep or not flag or state not in (ON, OFF):
        raise ValueError(f"{text!r} is not a flag state (<flag>=on | <flag>=off)")
    return flag, state == ON


def flag_spec(flag: str, hosts: tuple[str, ...], stages: tuple[int, ...], **timing: float | int | str) -> RolloutSpec:
    """The :class:`RolloutSpec` that turns ``flag`` on across ``hosts`` in ``stages`` (timing keywords
    as RolloutSpec's: interval_s, stage_timeout_s, settle_s, bake_s, error_limit, override_reason)."""
    return RolloutSpec(variant(flag, True), f"feature flag {flag}", "", tuple(hosts), tuple(stages), **timing)


class FlagFleet(Fleet, Protocol):
    """A :class:`~gpuobs.rollout.interfaces.Fleet` whose versions are one flag's states, plus the kill
    switch (real one: :class:`gpuobs.rollout.adapters.flags.StackFlagFleet`). Raises FleetError only."""

    flag: str

    def known(self, host: str) -> bool: ...
    def kill(self, reason: str) -> tuple[list[str], list[str]]: ...
    def clear_kill(self, reason: str) -> None: ...


class FlagController(Controller):
    """The rollout controller with the flag gate and the kill switch; ``fleet`` is a :class:`FlagFleet`."""

    fleet: FlagFleet
    group = "flag"

    def id_stem(self, spec: RolloutSpec) -> str:
        return parse_variant(spec.version)[0]

    def describe(self, spec: RolloutSpec) -> str:
        return f"feature flag {parse_variant(spec.version)[0]} (on for the canary cohort, off for the baseline)"

    def create(self, spec: RolloutSpec) -> RolloutRecord:
        """As :meth:`Controller.create`; a new rollout also re-arms a killed flag (the operator's intent)."""
        rec = super().create(spec)
        self.fleet.clear_kill(f"rollout {rec.id}")
        return rec

    def _compat(self, rec: RolloutRecord) -> None:
        """The flag gate: every serving engine evaluates the flag."""
        spec = RolloutSpec.from_dict(rec.spec)
        flag = parse_variant(spec.version)[0]
        with self.tracer.start_as_current_span("rollout.gate", attributes={"gate.name": "flag", "gate.stage": 0}) as sp:
            try:
                unknown = [h for h in spec.hosts if not self.fleet.known(h)]
            except FleetError as err:
                sp.set_attribute("gate.outcome", "error")
                self.store.log_gate(rec.id, "flag", 0, "error", {"error": str(err)})
                self._begin_rollback(rec, ABORTED, f"flag gate: cannot ask the engines: {err}")
                return
            outcome = "rejected" if unknown else "passed"
            sp.set_attributes({"gate.outcome": outcome, "gate.detail": ", ".join(unknown) or "every engine"})
        self.store.log_gate(rec.id, "flag", 0, outcome, {"flag": flag, "unknown_on": unknown})
        if unknown:
            self.store.transition(rec.id, REJECTED, reason=f"flag gate: the engines on {', '.join(unknown)} do not "
                                                           f"evaluate {flag} (not in their catalogue or flag file)")
        else:
            self._say(rec, f"flag gate: every one of {len(spec.hosts)} serving engine(s) evaluates {flag}")
            self.store.transition(rec.id, COMPAT_CHECKED, reason=f"{flag} evaluated by {len(spec.hosts)} engine(s)")

    def _rollback(self, rec: RolloutRecord) -> RolloutRecord:
        """Kill switch (flag off everywhere, one write), then the shared rollback end (labels, state).

        Idempotent: a resumed RollingBack rollout pulls the switch again (nodes already off do not flip)."""
        flag = parse_variant(rec.version)[0]
        pending = [n for n in self.store.nodes(rec.id) if n.status != "reverted"]
        t0 = time.monotonic()
        with self.tracer.start_as_current_span("rollout.kill_switch", attributes={
                "flag.key": flag, "rollback.target": rec.target, "rollback.reason": rec.reason}) as sp:
            try:
                was_on, unconfirmed = self.fleet.kill(f"{rec.target}: {rec.reason}"[:500])
            except FleetError as err:
                sp.set_status(Status(StatusCode.ERROR, str(err)))
                self._say(rec, f"error: kill switch failed ({err}): run `gpuobs flag resume` or "
                               f"`gpuobs flag kill {flag}`")
                return self.store.get(rec.id)
            for node in pending:
                self.store.set_node(rec.id, dataclasses.replace(node, status="reverted"),
                                    deploy=(variant(flag, False), variant(flag, True), "kill switch")
                                    if node.hostname in was_on else None)
            took = time.monotonic() - t0
            sp.set_attributes(tracing.clean_attrs({"kill.hosts_were_on": was_on, "kill.unconfirmed": unconfirmed,
                                                   "kill.seconds": took}))
        self._say(rec, f"kill switch: {flag} off on every node (was on for {', '.join(was_on) or 'none'}); "
                       + (f"every engine confirmed off in {took:.2f}s" if not unconfirmed else
                          f"not yet confirmed by {', '.join(unconfirmed)} (the file says off; they read it when back)"))
        return super()._rollback(self.store.get(rec.id))
