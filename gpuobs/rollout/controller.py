"""Progressive rollout controller: compatibility gate, error-budget gates, canary stages by node share
with statistical analysis, automatic rollback, SQLite persistence after every transition.

:meth:`Controller.run` reads the persisted state and applies one handler per state until a terminal
state; every handler commits its transition before acting on the next, and deploys are write-ahead
logged (:mod:`gpuobs.rollout.store`), so a resumed controller never redeploys a node. States (with their
Flagger/Argo names), gates, rollback policy and exit codes: :mod:`gpuobs.rollout.model` and docs/rollout.md.
Sources: Flagger's canary analysis (phases, webhooks), Argo Rollouts' analysis runs (Successful /
Failed / Inconclusive / Error, consecutiveErrorLimit), the SRE workbook's error-budget policy.

Human decisions (:mod:`gpuobs.rollout.decisions`: pause, resume, promote) are read from the store
at every wait, like an abort: while paused the controller takes no look, acts on no verdict and
advances no stage; a promote passes the current stage (or ends the bake) at once, recorded on the
stage (verdict ``PROMOTE (operator)``), in the transition's reason and in the ``events`` table.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from gpuobs.canary.analyzer import AnalysisState
from gpuobs.canary.verdict import describe
from gpuobs.compat.inventory import judge_fleet
from gpuobs.core import log
from gpuobs.rollout import tracing
from gpuobs.rollout.interfaces import (
    AnalyzerFactory,
    Fleet,
    FleetError,
    Signals,
    SignalsUnavailable,
)
from gpuobs.rollout.model import (
    ABORTED,
    CANARY,
    CANARY_ROLLBACK,
    COMPAT_CHECKED,
    EXIT_CODES,
    PENDING,
    PROMOTING,
    REJECTED,
    ROLLED_BACK,
    ROLLING_BACK,
    SUCCEEDED,
    TERMINAL,
    RolloutSpec,
    UsageError,
    fmt_labels,
)
from gpuobs.rollout.store import NodeRecord, RolloutRecord, RolloutStore, StageRecord

LOG = log.get("rollout")
#: A stage passed by an operator's ``gpuobs rollout promote`` (not by the canary analysis).
OPERATOR_PROMOTE = "PROMOTE (operator)"


class Controller:
    """Drives rollouts stored in ``store`` against ``fleet``; every dependency is injected.

    ``clock()`` -> unix seconds and ``sleep(s)`` are used for all waiting (tests pass a fake clock);
    ``out(line)`` receives the progress lines; ``poll_s`` is how often an operator's abort is
    noticed while waiting.
    """

    #: The command group and the noun of the progress lines (a subclass for flags or drivers sets its own).
    group, noun = "rollout", "rollout"

    def __init__(self, store: RolloutStore, fleet: Fleet, signals: Signals, analyzers: AnalyzerFactory, *,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 out: Callable[[str], None] = print, tracer: tracing.Tracing | None = None, poll_s: float = 1.0):
        self.store, self.fleet, self.signals, self.analyzers = store, fleet, signals, analyzers
        self.clock, self.sleep, self.out, self.poll_s = clock, sleep, out, poll_s
        self.tracer = (tracer or tracing.noop()).tracer

    # ---- entry points -------------------------------------------------------------------------
    def create(self, spec: RolloutSpec) -> RolloutRecord:
        """Persist a new Pending rollout with a snapshot of the current target labels.

        Raises :class:`UsageError` if another rollout in this store is not finished, or an override
        has no reason. Raises :class:`FleetError` if the labels cannot be read.
        """
        active = self.store.latest(active_only=True, terminal=TERMINAL)
        if active:
            raise UsageError(f"{self.noun} {active.id} ({active.version}) is {active.state}: resume or abort it first")
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        rid, n = f"{self.id_stem(spec)}-{stamp}", 1
        while self._exists(rid):
            n += 1
            rid = f"{self.id_stem(spec)}-{stamp}-{n}"
        # versions_before: what the fleet ran when the rollout started (the report's baseline when
        # nothing gets deployed, e.g. a release the compatibility gate rejects)
        doc = {**spec.to_dict(), "label_snapshot": self.fleet.label_snapshot(),
               "versions_before": {h: self.fleet.version(h) for h in spec.hosts}, **self.record_extras(spec)}
        rec = self.store.create(RolloutRecord(rid, spec.version, PENDING, -1, doc))
        self._say(rec, f"created: {self.describe(spec)} on {len(spec.hosts)} serving "
                       f"node(s), stages {'/'.join(str(s) for s in spec.stages)} nodes")
        return rec

    def id_stem(self, spec: RolloutSpec) -> str:
        """Rollout ids are ``<stem>-<UTC stamp>``; the stem is the version (a flag rollout: the flag)."""
        return spec.version

    def describe(self, spec: RolloutSpec) -> str:
        """What is rolled out, for the first progress line."""
        return f"{spec.version} ({spec.engine}, CUDA {spec.cuda})"

    def record_extras(self, spec: RolloutSpec) -> dict[str, Any]:
        """Further keys persisted in the rollout's spec document at creation (none for a release)."""
        return {}

    def stage_analyzer(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord) -> Any:
        """The analyzer of canary stage ``st``: ``analyzers(stage timeout, interval)`` (the canary
        cohort is told apart by its ``track`` labels)."""
        return self.analyzers(spec.stage_timeout_s, spec.interval_s)

    #: What the deploy log calls a stage (a driver upgrade: ``batch``).
    stage_word = "stage"

    def plain_version(self, version: str) -> str:
        """``version`` as the deploy log records it (:meth:`Fleet.version` may decorate it: a driver
        upgrade's ``" (in upgrade)"``)."""
        return version

    def nodes_to_revert(self, rec: RolloutRecord) -> list[NodeRecord]:
        """The nodes a rollback sets back: every touched node not reverted yet."""
        return [n for n in self.store.nodes(rec.id) if n.status != "reverted"]

    def run(self, rollout_id: str) -> RolloutRecord:
        """Drive the rollout from its persisted state to a terminal state (or an incomplete rollback)."""
        rec = self.store.get(rollout_id)
        if rec.state in TERMINAL:
            return rec
        parent = tracing.remote_parent(rec.trace) if rec.trace else None
        attrs = {"rollout.id": rec.id, "rollout.version": rec.version, "rollout.stages": rec.spec["stages"]}
        with self.tracer.start_as_current_span("rollout.resume" if parent else "rollout", context=parent,
                                               attributes=tracing.clean_attrs(attrs)) as root:
            if not rec.trace:
                self.store.update(rec.id, trace=tracing.span_ids(root))
            while True:
                rec = self.store.get(rollout_id)
                if rec.state in TERMINAL:
                    break
                if rec.state == ROLLING_BACK:
                    rec = self._rollback(rec)
                    if rec.state == ROLLING_BACK:
                        break
                elif rec.abort_reason:
                    self._begin_rollback(rec, ABORTED, f"aborted by operator: {rec.abort_reason}")
                else:
                    {PENDING: self._compat, COMPAT_CHECKED: self._start_gate, CANARY: self._canary_stage,
                     PROMOTING: self._promote}[rec.state](rec)
            root.set_attributes(tracing.clean_attrs({"rollout.state": rec.state, "rollout.reason": rec.reason,
                                                     "rollout.exit_code": EXIT_CODES[rec.state]}))
            if rec.state != SUCCEEDED:
                root.set_status(Status(StatusCode.ERROR, f"{rec.state}: {rec.reason}"))
        self._say(rec, f"{rec.state}: {rec.reason}")
        return rec

    def abort(self, rollout_id: str, reason: str) -> RolloutRecord:
        """Abort a rollout no controller is driving: record the reason, roll back, end Aborted."""
        rec = self.store.get(rollout_id)
        if rec.state in TERMINAL:
            return rec
        self.store.update(rollout_id, abort_reason=reason or "no reason given")
        return self.run(rollout_id)

    # ---- states -------------------------------------------------------------------------------
    def _compat(self, rec: RolloutRecord) -> None:
        spec = RolloutSpec.from_dict(rec.spec)
        gate = {"gate.name": "compat", "gate.stage": 0}
        with self.tracer.start_as_current_span("rollout.gate", attributes=gate) as sp:
            try:
                rows = self._retry(rec, self.signals.inventory)
            except SignalsUnavailable as err:
                sp.set_attribute("gate.outcome", "error")
                self._begin_rollback(rec, ABORTED, f"compatibility gate: cannot read the inventory: {err}")
                return
            rows, release, what = self.compat_subject(spec, rows)
            report = judge_fleet(rows, release, list(spec.hosts))
            outcome = "rejected" if report.exit_code else "passed"
            sp.set_attributes({"gate.outcome": outcome, "gate.detail": report.verdict})
        self.store.log_gate(rec.id, "compat", 0, outcome, {**report.to_dict(), "table": report.table()})
        for line in report.table().splitlines():
            self._say(rec, f"compat | {line}")
        if report.exit_code:
            self.store.transition(rec.id, REJECTED, reason=f"compatibility gate{f' ({what})' if what else ''}: "
                                                           + "; ".join(report.blockers()))
        else:
            self.store.transition(rec.id, COMPAT_CHECKED, reason=f"{report.verdict} on {len(spec.hosts)} node(s)"
                                                                 + (f" with {what}" if what else ""))

    def compat_subject(self, spec: RolloutSpec, rows: list[Any]) -> tuple[list[Any], Any, str]:
        """What the compatibility gate judges: ``(inventory rows, release, what)``; a release rollout
        judges its release on the rows as they are (``what`` empty; a driver upgrade: the fleet's
        release with the new driver)."""
        return rows, spec.release, ""

    def _start_gate(self, rec: RolloutRecord) -> None:
        outcome, why = self._budget_gate(rec, 0)
        if outcome == "error":
            self.store.transition(rec.id, ABORTED, reason=f"error-budget gate: {why}")
        elif outcome == "frozen":
            self.store.transition(rec.id, REJECTED, reason=f"error-budget freeze: {why}; rerun with "
                                                           "--override-freeze --reason TEXT to override")
        else:
            self.store.transition(rec.id, CANARY, 0, reason="gates passed")

    def _budget_gate(self, rec: RolloutRecord, idx: int) -> tuple[str, str]:
        """Evaluate the error-budget gate before stage ``idx`` (0-based; stage 0 also refuses a page
        already firing). Returns ``(outcome, why)``: outcome open | overridden | frozen | error."""
        spec = RolloutSpec.from_dict(rec.spec)
        with self.tracer.start_as_current_span("rollout.gate", attributes={"gate.name": "error-budget",
                                                                           "gate.stage": idx + 1}) as sp:
            try:
                rows = self._retry(rec, self.signals.budget)
                pages = sorted(self._retry(rec, self.signals.pages)) if idx == 0 else []
            except SignalsUnavailable as err:
                sp.set_attribute("gate.outcome", "error")
                self.store.log_gate(rec.id, "error-budget", idx, "error", {"error": str(err)})
                return "error", f"cannot evaluate the error budget: {err}"
            problems = [f"{fmt_labels(r.labels)} {r.remaining:+.1%} of the error budget left"
                        for r in rows if r.exhausted]
            problems += [f"SLO-burn page already firing: {p}" for p in pages]
            outcome = "open" if not problems else "overridden" if spec.override_reason else "frozen"
            detail = {"budget": [{"labels": r.labels, "remaining": r.remaining, "requests": r.requests,
                                  "judged": r.judged} for r in rows], "pages": pages,
                      "problems": problems, "override_reason": spec.override_reason}
            sp.set_attributes({"gate.outcome": outcome, "gate.detail": "; ".join(problems) or "budget left"})
        self.store.log_gate(rec.id, "error-budget", idx, outcome, detail)
        left = ", ".join(f"{r.labels.get('slo', fmt_labels(r.labels))} {r.remaining:.1%}" + (
            "" if r.judged else f" (not judged: {r.requests:.0f} < {r.min_requests:.0f} requests in the SLO window)")
            for r in rows) or "no slo:error_budget_remaining:ratio series yet: nothing to judge"
        self._say(rec, f"error-budget gate before stage {idx + 1}: {outcome} ({left})"
                       + (f"; override: {spec.override_reason}" if outcome == "overridden" else ""))
        if outcome == "overridden" and pages:
            self.store.update(rec.id, pages_at_start=pages)
        return outcome, "; ".join(problems)

    def _canary_stage(self, rec: RolloutRecord) -> None:
        spec, k = RolloutSpec.from_dict(rec.spec), rec.stage
        st = self.store.stage(rec.id, k) or StageRecord(k, "canary", list(spec.hosts[: spec.stages[k]]), "deploying",
                                                        self.clock())
        with self.tracer.start_as_current_span("rollout.stage", attributes=self._stage_attrs(spec, st)) as sp:
            if st.status == "deploying" and self._deploy(rec, spec, st):
                st.analysis_start = self.clock() + spec.settle_s
                st.deadline, st.status = st.analysis_start + spec.stage_timeout_s, "analysing"
                self.store.save_stage(rec.id, st)
            if st.status == "analysing":
                self._analyse(rec, spec, st)
            sp.set_attributes(tracing.clean_attrs({"stage.status": st.status, "stage.verdict": st.verdict,
                                                   "stage.looks": st.looks}))
        if st.status == "passed":
            self._advance(rec, spec)

    def _analyse(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord) -> None:
        """Look every interval until PROMOTE, ROLLBACK, a page, the error limit or the deadline."""
        analyzer = self.stage_analyzer(rec, spec, st)
        state = AnalysisState.from_dict(st.analysis_state)
        name = self._stage_name(spec, st.idx)
        while st.status == "analysing":
            if self._wait_due(rec, spec, st):  # the wait is outside the look's span
                continue
            with self.tracer.start_as_current_span("rollout.analysis", attributes={"canary.look": st.looks + 1,
                                                                                   "stage.index": st.idx + 1}) as sp:
                done, v = self._step(rec, spec, st, lambda end: analyzer.analyze(st.analysis_start, end, state),
                                     wait=False)
                if v is not None:
                    sp.set_attributes(tracing.verdict_attrs(v))
            if done or v is None:
                continue
            # the table without the assumptions: the rollout's report says them once, in its header
            st.verdict, st.verdict_doc, st.verdict_table = v.verdict, v.to_dict(), v.table(assumptions=False)
            st.analysis_state = state.to_dict()
            self.store.save_stage(rec.id, st)
            self.store.log_analysis(rec.id, st.idx, st.looks, v.end - v.start, v.verdict, v.final,
                                    {"reasons": v.reasons, "metrics": {m.name: describe(m) for m in v.metrics}})
            self._say(rec, f"{name} look {st.looks} ({v.end - v.start:.0f}s = {v.time_fraction:.0%} of the stage): "
                           f"{v.verdict}  " + "; ".join(describe(m) for m in v.metrics if m.critical))
            held = self.store.get(rec.id).paused
            if held:  # paused during the look: the verdict is recorded, not acted on
                self.store.log_event(rec.id, "not-acted", held.get("operator", "?"),
                                     f"look {st.looks} verdict {v.verdict} not acted on: paused", st.idx)
                self._say(rec, f"{name}: verdict {v.verdict} not acted on: paused by {held.get('operator')}")
                continue
            if v.verdict == "ROLLBACK":
                self._begin_rollback(rec, ROLLED_BACK, f"{CANARY_ROLLBACK} in {name}: " + "; ".join(v.reasons),
                                     st, "failed")
            elif v.verdict == "PROMOTE":
                self._end_stage(rec, st, "passed")
            elif st.last_look >= st.deadline:
                self._begin_rollback(rec, ABORTED, f"inconclusive: HOLD at the {name} deadline "
                                                   f"({spec.stage_timeout_s:.0f}s): " + "; ".join(v.reasons),
                                     st, "inconclusive")

    def _wait_due(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord) -> bool:
        """Wait until the next look of ``st`` is due (holding while paused); True when the stage ended:
        an operator aborted (rollback begun) or promoted (stage passed)."""
        due = (st.last_look or st.analysis_start) + spec.interval_s
        if (st.last_look or 0.0) < st.deadline:
            due = min(due, st.deadline)
        got = self._wait_until(rec.id, due, st.idx)
        if got is None:
            return False
        kind, what = got
        if kind == "abort":
            self._begin_rollback(rec, ABORTED, f"aborted by operator: {what}", st, "aborted")
            return True
        who, why = what.get("operator", "?"), what.get("reason", "")
        st.verdict = OPERATOR_PROMOTE
        self.store.log_event(rec.id, "promoted", who, why, st.idx)
        self._say(rec, f"{self._stage_name(spec, st.idx)}: promoted by {who}: {why}")
        self._end_stage(rec, st, "passed")
        return True

    def _step(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord,
              look: Callable[[float], Any], wait: bool = True) -> tuple[bool, Any]:
        """One look of stage ``st``: wait until it is due (unless ``wait`` is false: the caller did),
        honour an operator abort, check the SLO-burn page, then ``look(end)`` (end = now, capped at the
        deadline).

        Returns ``(True, None)`` when the stage ended (a rollback has begun), ``(False, None)`` after a
        Prometheus error below the limit (``st.errors`` counts it), else ``(False, look's result)``.
        """
        if wait and self._wait_due(rec, spec, st):
            return True, None
        st.last_look = self.clock()
        name = self._stage_name(spec, st.idx)
        try:
            pages = self.signals.pages() - set(rec.pages_at_start)
            result = None if pages else look(min(st.last_look, st.deadline))
        except SignalsUnavailable as err:
            st.errors += 1
            self.store.save_stage(rec.id, st)
            trace.get_current_span().set_status(Status(StatusCode.ERROR, str(err)))
            self._say(rec, f"{name}: Prometheus error {st.errors}/{spec.error_limit} (not a verdict): {err}")
            if st.errors < spec.error_limit:
                return False, None
            self._begin_rollback(rec, ABORTED, f"{st.errors} consecutive Prometheus errors; last: {err}", st, "aborted")
            return True, None
        if pages:
            trace.get_current_span().set_attribute("slo.pages", sorted(pages))
            self._begin_rollback(rec, ROLLED_BACK, f"SLO-burn page firing during {name}: {', '.join(sorted(pages))}",
                                 st, "failed")
            return True, None
        st.errors, st.looks = 0, st.looks + 1
        return False, result

    def _advance(self, rec: RolloutRecord, spec: RolloutSpec) -> None:
        got = self._wait_until(rec.id, self.clock(), rec.stage)  # hold here while paused
        if got is not None and got[0] == "abort":
            self._begin_rollback(rec, ABORTED, f"aborted by operator: {got[1]}")
            return
        if got is not None:  # a promote for the stage that has just passed on its own: nothing left to do
            self.store.log_event(rec.id, "not-acted", got[1].get("operator", "?"),
                                 f"stage {rec.stage + 1} had already passed", rec.stage)
        nxt = rec.stage + 1
        outcome, why = self._budget_gate(rec, nxt)
        if outcome in ("frozen", "error"):
            self._begin_rollback(rec, ABORTED, f"error-budget {'freeze' if outcome == 'frozen' else 'gate'} "
                                               f"before stage {nxt + 1}: {why}")
        else:
            st = self.store.stage(rec.id, rec.stage)
            how = "passed"
            if st is not None and st.verdict == OPERATOR_PROMOTE:
                ev = [e for e in self.store.events(rec.id) if e["kind"] == "promoted" and e["stage"] == rec.stage]
                how = (f"promoted by operator {ev[-1]['operator']}: {ev[-1]['reason']}" if ev
                       else "promoted by an operator")
            self.store.transition(rec.id, CANARY if spec.stages[nxt] < len(spec.hosts) else PROMOTING, nxt,
                                  reason=f"stage {rec.stage + 1} {how}")

    def _promote(self, rec: RolloutRecord) -> None:
        spec, k = RolloutSpec.from_dict(rec.spec), rec.stage
        st = self.store.stage(rec.id, k) or StageRecord(k, "promote", list(spec.hosts), "deploying", self.clock())
        with self.tracer.start_as_current_span("rollout.stage", attributes=self._stage_attrs(spec, st)) as sp:
            if st.status == "deploying" and self._deploy(rec, spec, st):
                st.analysis_start = self.clock()
                st.deadline, st.status = st.analysis_start + spec.bake_s, "baking"
                self.store.save_stage(rec.id, st)
                self._say(rec, f"promoting: baking {spec.bake_s:.0f}s while watching the SLO-burn page")
            while st.status == "baking":
                done, _ = self._step(rec, spec, st, lambda end: end)
                if done:
                    break
                self.store.save_stage(rec.id, st)
                if st.errors == 0 and st.last_look >= st.deadline:
                    self._end_stage(rec, st, "passed")
            sp.set_attributes({"stage.status": st.status, "stage.looks": st.looks})
        if st.status != "passed":
            return
        try:
            self.fleet.apply_labels(rec.spec["label_snapshot"], None)
        except FleetError as err:
            self._say(rec, f"warning: could not restore the target labels: {err}")
        early = " (bake ended early by an operator's promote)" if st.verdict == OPERATOR_PROMOTE else ""
        self.store.transition(rec.id, SUCCEEDED, reason=f"{spec.version} on {len(st.hosts)}/{len(spec.hosts)} "
                                                        f"serving nodes{early}")

    # ---- deploy and rollback ------------------------------------------------------------------
    def _deploy(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord) -> bool:
        """Deploy ``st.hosts`` not yet on the version (write-ahead), then label them canary; False if
        that failed (the rollback to Aborted has then begun)."""
        name = self._stage_name(spec, st.idx)
        self.store.save_stage(rec.id, st)
        done: list[str] = []
        try:
            for host in st.hosts:
                node = self._claim(rec, spec, st, host)
                if node is None:
                    continue
                previous = self.fleet.deploy(host, spec.version)
                self.store.set_node(rec.id, dataclasses.replace(node, status="deployed"),
                                    deploy=(spec.version, previous, f"stage {st.idx + 1}"))
                trace.get_current_span().add_event("deploy", {"host": host, "version": spec.version,
                                                              "previous": previous})
                done.append(f"{host} ({previous} -> {spec.version})")
            self.fleet.apply_labels(rec.spec["label_snapshot"], set(st.hosts))
        except FleetError as err:
            self._begin_rollback(rec, ABORTED, f"{name}: deploy or relabel failed: {err}", st, "aborted")
            return False
        self._say(rec, f"{name}: {len(st.hosts)}/{len(spec.hosts)} node(s) on {spec.version}"
                       + (f", deployed {', '.join(done)}" if done else "") + "; canary labels applied")
        return True

    def _claim(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord, host: str) -> NodeRecord | None:
        """The write-ahead step before ``host``'s deploy in stage ``st``: its node record, written as
        ``deploying`` with the version it runs (:meth:`plain_version` of what the fleet says), or None
        when there is nothing to deploy: recorded deployed already; on the version before the rollout
        (recorded deployed, nothing to undo); or deployed by a controller killed before recording it
        (recorded now, with :meth:`late_deploy`'s log entry). Raises FleetError."""
        node = self.store.node(rec.id, host)
        if node is not None and node.status == "deployed":
            return None
        current = self.fleet.version(host)
        if node is None:
            node = NodeRecord(host, self.plain_version(current), "deploying", st.idx)
            if current == spec.version:  # already there before the rollout: nothing to do or undo
                self.store.set_node(rec.id, dataclasses.replace(node, status="deployed"))
                return None
            self.store.set_node(rec.id, node)
        elif current == spec.version:  # killed after the call, before recording it
            self.store.set_node(rec.id, dataclasses.replace(node, status="deployed"),
                                deploy=self.late_deploy(spec, st, node))
            return None
        return node

    def late_deploy(self, spec: RolloutSpec, st: StageRecord, node: NodeRecord) -> tuple[str, str, str] | None:
        """The deploy log entry of a deploy a killed controller made but did not record (none for a
        release: its admin call is the deploy, logged by the node)."""
        return None

    def _begin_rollback(self, rec: RolloutRecord, target: str, reason: str, st: StageRecord | None = None,
                        stage_status: str = "") -> None:
        """Enter RollingBack (then mark ``st`` ended with ``stage_status``) and roll back."""
        self._say(rec, f"rolling back ({target}): {reason}")
        rec = self.store.transition(rec.id, ROLLING_BACK, reason=reason, target=target)
        if st is not None:
            self._end_stage(rec, st, stage_status)
        self._rollback(rec)

    def _rollback(self, rec: RolloutRecord) -> RolloutRecord:
        """Revert every touched node to its previous version (asking first), restore the labels."""
        failed, reverted = [], []
        with self.tracer.start_as_current_span("rollout.rollback", attributes={
                "rollback.target": rec.target, "rollback.reason": rec.reason}) as sp:
            for node in self.nodes_to_revert(rec):
                for attempt in range(3):
                    try:
                        current = self.fleet.version(node.hostname)
                        call = None
                        if (node.status == "deploying" and self.plain_version(current) == rec.version
                                and node.previous != rec.version):  # deployed by a killed controller, unrecorded
                            node = dataclasses.replace(node, status="deployed")
                            self.store.set_node(rec.id, node, deploy=(
                                rec.version, node.previous,
                                f"{self.stage_word} {node.stage + 1} (recorded after a restart)"))
                        if self.plain_version(current) == node.previous != current:
                            # on its previous version, its procedure unfinished (a killed controller): complete
                            # it (no install); a revert is logged only if a killed rollback made one
                            self.fleet.deploy(node.hostname, node.previous)
                            if node.status == "reverting":
                                call = (node.previous, rec.version, "rollback (recorded after a restart)")
                        elif current != node.previous:
                            if node.status != "reverting":  # write-ahead: a resumed rollback logs it once
                                node = dataclasses.replace(node, status="reverting")
                                self.store.set_node(rec.id, node)
                            self.fleet.deploy(node.hostname, node.previous)
                            call = (node.previous, self.plain_version(current), "rollback")
                            reverted.append(f"{node.hostname} ({self.plain_version(current)} -> {node.previous})")
                        elif node.status == "reverting":  # reverted by a controller killed before recording it
                            call = (node.previous, rec.version, "rollback (recorded after a restart)")
                        self.store.set_node(rec.id, dataclasses.replace(node, status="reverted"), deploy=call)
                        break
                    except FleetError as err:
                        if attempt == 2:
                            failed.append(f"{node.hostname}: {err}")
                        else:
                            self.sleep(self.poll_s)
            try:
                self.fleet.apply_labels(rec.spec["label_snapshot"], None)
            except FleetError as err:
                failed.append(f"target labels: {err}")
            sp.set_attribute("rollback.nodes", reverted)
            if failed:
                sp.set_status(Status(StatusCode.ERROR, "; ".join(failed)))
        if reverted:
            self._say(rec, f"rolled back {', '.join(reverted)}" + ("; labels restored" if rec.spec.get("label_snapshot")
                                                                    else ""))
        if failed:
            self._say(rec, "error: rollback incomplete (" + "; ".join(failed) + f"): run `gpuobs {self.group} resume`")
            return self.store.get(rec.id)
        return self.store.transition(rec.id, rec.target, reason=rec.reason)

    # ---- helpers ------------------------------------------------------------------------------
    def _end_stage(self, rec: RolloutRecord, st: StageRecord, status: str) -> None:
        st.status, st.ended_at = status, self.clock()
        self.store.save_stage(rec.id, st)

    def _wait_until(self, rollout_id: str, t: float, stage: int | None = None) -> tuple[str, Any] | None:
        """Sleep until ``t``, and past it while the rollout is paused.

        Returns ``("abort", reason)`` as soon as an operator's abort is recorded, ``("promote",
        request)`` for a promote of ``stage`` (consumed; it lifts a pause too), else None once ``t``
        has passed and the rollout is not paused. A promote meant for another stage (or arriving
        where nothing can be promoted, ``stage`` None) is consumed and recorded as not acted on."""
        noticed = False
        while True:
            rec = self.store.get(rollout_id)
            now = self.clock()
            if rec.abort_reason:
                return "abort", rec.abort_reason
            req = rec.promote_request
            if req:
                self.store.update(rollout_id, promote_request={}, paused={})
                if stage is not None and req.get("stage") == stage and stage == rec.stage:
                    return "promote", req
                self.store.log_event(rollout_id, "not-acted", req.get("operator", "?"),
                                     f"promote for stage {int(req.get('stage', -1)) + 1} arrived at stage "
                                     f"{rec.stage + 1} ({rec.state}): nothing to promote", rec.stage)
                self._say(rec, f"promote by {req.get('operator')} not acted on: the stage it was for has passed")
                continue
            if rec.paused:
                if not noticed:
                    noticed = True
                    p = rec.paused
                    self.store.log_event(rollout_id, "held", p.get("operator", "?"), p.get("reason", ""), rec.stage)
                    self._say(rec, f"paused by {p.get('operator')}: {p.get('reason')}; holding (no look, no verdict "
                                   f"acted on, no stage advance) until `gpuobs {self.group} resume` or `promote`")
                self.sleep(self.poll_s)
                continue
            if noticed:
                noticed = False
                self._say(rec, "resumed")
            if now >= t:
                return None
            self.sleep(min(self.poll_s, t - now))

    def _retry(self, rec: RolloutRecord, fn: Callable[[], Any]) -> Any:
        """``fn()``, retried up to the error limit one interval apart on SignalsUnavailable."""
        spec = RolloutSpec.from_dict(rec.spec)
        for attempt in range(1, spec.error_limit + 1):
            try:
                return fn()
            except SignalsUnavailable:
                if attempt == spec.error_limit:
                    raise
                self.sleep(spec.interval_s)
        raise AssertionError("unreachable")

    def _exists(self, rollout_id: str) -> bool:
        try:
            self.store.get(rollout_id)
        except KeyError:
            return False
        return True

    @staticmethod
    def _stage_name(spec: RolloutSpec, idx: int) -> str:
        return f"stage {idx + 1}/{len(spec.stages)}"

    @staticmethod
    def _stage_attrs(spec: RolloutSpec, st: StageRecord) -> dict[str, Any]:
        return tracing.clean_attrs({"stage.index": st.idx + 1, "stage.kind": st.kind, "stage.nodes": len(st.hosts),
                                    "stage.hosts": st.hosts, "stage.share": len(st.hosts) / len(spec.hosts)})

    def _say(self, rec: RolloutRecord, msg: str) -> None:
        """A progress line to ``out`` (human) and the same event as a JSON log line (:mod:`gpuobs.core.log`)."""
        stamp = time.strftime("%H:%M:%SZ", time.gmtime(self.clock()))
        self.out(f"{stamp} {self.noun} {rec.id}: {msg}")
        LOG.info(msg, extra={"fields": {"rollout": rec.id, "version": rec.version}})
