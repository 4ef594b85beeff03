"""The remediation controller: pages in, one state machine per node, interlocks before every action.

An episode (one node fault) moves ``pending -> quarantined -> draining -> acting -> verifying ->
returned``, or ends ``escalated`` (the node stays cordoned, an RMA ticket), ``overridden`` (a person
took over) or ``dry-run``/``observed`` (the mode forbids acting). :meth:`Controller.ingest` takes
Alertmanager webhook payloads (version 4, https://prometheus.io/docs/alerting/latest/configuration/
#webhook_config); :meth:`Controller.tick` advances every open episode by at most one step. Both are
idempotent: an alert already received (same fingerprint, ``startsAt`` and status) changes nothing, a
tick after a crash resumes from the store (:mod:`gpuobs.remediate.store`), and an action whose
outcome was not recorded before a crash is never repeated: the episode goes on to verification.

Interlocks, each logged on the timeline (actor ``interlock:<name>``) when it holds an action back and
counted in ``gpuobs_remediation_interlock_holds_total``:

* ``human``: a person's hold (``gpuobs remediate hold``), cordon or uncordon always wins; a person's
  uncordon mid-remediation ends the episode and holds the node until ``gpuobs remediate release``;
  the controller never uncordons a node a person cordoned (NVIDIA/NVSentinel #141).
* ``rollout``: no action on a node a rollout holds; a canary node's fault asks that rollout to abort.
* ``breaker``: distinct nodes with events within ``breaker_window`` at or above the threshold trip it
  (fleet-wide cause): no new quarantine and no action until a person closes it
  (``gpuobs remediate breaker close``); one ``RemediationHalted`` page through the breaker's metric.
* ``pool-concurrency`` / ``pool-rate``: out-of-service nodes and quarantines per hour per pool.
* ``attempts``: actions per node per window; past it the episode escalates instead of acting again.
* ``drain``: a drain that did not finish by its deadline escalates and never reaches an action.
* ``stale``: an event older than the node's last state change is ignored (NVIDIA/NVSentinel #1280),
  and so is a firing alert that arrives after its own resolution (a retried, out-of-order delivery).
* ``escalated``: a node whose remediation escalated is not acted on again until a person releases it.
* ``mode``: in dry-run, an episode an enforcing run left past ``pending`` is left as it is (no drain,
  action or uncordon) until a person or an enforcing run takes it on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import datetime
from typing import Any

from gpuobs.remediate import policy
from gpuobs.remediate.config import RemediationConfig
from gpuobs.remediate.interfaces import ActionError, NodeActions, NodeView, Signals
from gpuobs.remediate.store import OPEN_STATES, Episode, RemediationStore

log = logging.getLogger("gpuobs.remediate")


def parse_time(text: str) -> float | None:
    """Alertmanager's RFC 3339 ``startsAt`` (nanoseconds allowed) -> unix seconds; None when unparseable."""
    if not isinstance(text, str) or not text:
        return None
    s = text.strip().replace("Z", "+00:00")
    if "." in s:  # Python parses at most 6 fractional digits
        head, _, rest = s.partition(".")
        digits = "".join(ch for ch in rest if ch.isdigit())
        s = f"{head}.{digits[:6]}{rest[len(digits):]}"
    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        return None


def fingerprint(alert: dict[str, Any]) -> str:
    """The alert's ``fingerprint`` (Alertmanager sends it), else a hash of its sorted labels."""
    fp = alert.get("fingerprint")
    if isinstance(fp, str) and fp:
        return fp
    labels = alert.get("labels") or {}
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


class Controller:
    """See the module docstring. ``identity_label``: the fleet config's node label (the alert's node);
    ``clock``: unix seconds (tests pass a simulated clock; the store must share it)."""

    def __init__(self, store: RemediationStore, actions: NodeActions, signals: Signals, config: RemediationConfig,
                 identity_label: str, clock: Any = time.time, notifier: Any = None):
        self.store, self.actions, self.signals, self.cfg = store, actions, signals, config
        self.identity_label = identity_label
        self.clock = clock
        #: :class:`gpuobs.remediate.notices.Notifier` or None (no notices: tests of the state machine).
        self.notifier = notifier
        self._views: dict[str, NodeView] = {}
        self._inventory_read = False  # the inventory was re-read during this ingest (at most once per payload)

    # ---- events -------------------------------------------------------------------------------
    def ingest(self, payload: dict[str, Any]) -> dict[str, int]:
        """Take one Alertmanager webhook payload; returns ``{outcome: count}`` over its alerts."""
        counts: dict[str, int] = {}
        self._inventory_read = False
        for alert in payload.get("alerts") or []:
            if isinstance(alert, dict):
                outcome = self._ingest_one(alert)
                counts[outcome] = counts.get(outcome, 0) + 1
        self._check_breaker()
        return counts

    def _ingest_one(self, alert: dict[str, Any]) -> str:
        labels = {str(k): str(v) for k, v in (alert.get("labels") or {}).items()}
        alertname = labels.get("alertname", "")
        node = labels.get(self.identity_label, "")
        status = "resolved" if alert.get("status") == "resolved" else "firing"
        fp, starts = fingerprint(alert), str(alert.get("startsAt") or "")
        if self.store.seen(fp, starts, status):
            return "duplicate"
        active = self.store.active(node) if node else None

        def record(outcome: str, episode: int | None = None) -> str:
            self.store.record_event(fp, starts, node, alertname, status, labels, outcome, episode)
            return outcome

        if not node:
            return record("no-node")
        if status == "resolved":
            if active:
                self.store.log(node, "alert-resolved", f"{alertname} resolved", "alertmanager", active.id)
            return record("resolved", active.id if active else None)
        plan = policy.plan(alertname, labels)
        if plan is None:
            return record("no-policy")
        if plan.action == "none":
            self.store.log(node, "no-action", f"{alertname}: {plan.why}; no node action ({plan.fault_class})",
                           "gpuobs")
            return record("no-action")
        if self.store.seen(fp, starts, "resolved"):
            self.store.log(node, "stale", f"{alertname} started {starts} arrived after its resolution; ignored")
            return record("stale")
        started = parse_time(starts)
        last = self.store.last_change(node)
        if active is None and started is not None and last is not None and started < last:
            self.store.log(node, "stale", f"{alertname} started {starts}, before the node's last change; ignored")
            return record("stale")
        if active is not None:
            self.store.log(node, "alert", f"{alertname} (attached)", "alertmanager", active.id)
            return record("attached", active.id)
        holds = self.store.holds()
        if node in holds:
            h = holds[node]
            self.store.log(node, "held", f"{alertname}: held by {h['by']} ({h['reason']}); no action",
                           "interlock:human")
            return record("held")
        escalated = [e for e in self.store.out_of_service() if e.node == node and e.state == "escalated"]
        if escalated:
            self.store.log(node, "held", f"{alertname}: the node's remediation escalated (episode {escalated[-1].id}); "
                           f"no action until `gpuobs remediate release {node}`", "interlock:escalated")
            return record("held")
        pool = self._pool(node)
        state = "observed" if self.cfg.mode == "observe" else "pending"
        ep = self.store.open_episode(node, pool, plan.fault_class, plan.action, plan.gpu, alertname, fp, plan.why,
                                     state)
        self.store.log(node, state, f"{alertname}{'' if plan.gpu is None else f' on GPU {plan.gpu}'}: {plan.why} "
                       f"-> {plan.action}", "alertmanager", ep.id)
        return record("observed" if state == "observed" else "opened", ep.id)

    def _pool(self, node: str) -> str:
        view = self._views.get(node)
        if view is None and not self._inventory_read:  # once per payload: each read is a call per node
            self._inventory_read = True
            self._refresh_views()
            view = self._views.get(node)
        return view.pool if view else "unknown"

    def _refresh_views(self) -> bool:
        try:
            self._views = {v.node: v for v in self.actions.nodes()}
            return True
        except ActionError as exc:
            log.warning("node inventory failed: %s", exc)
            return False

    # ---- breaker ------------------------------------------------------------------------------
    def _check_breaker(self) -> None:
        if self.cfg.mode == "observe":
            return
        now = self.clock()
        closed = self.store.breaker()["closed_at"] or 0.0  # events a person has already dealt with do not re-trip it
        nodes = self.store.event_nodes_since(max(now - self.cfg.breaker_window, closed + 1e-6))
        fleet = len(self._views) or len(nodes)
        threshold = self.cfg.breaker_threshold(fleet)
        if len(nodes) >= threshold:
            self.store.open_breaker(
                f"fleet-wide event, remediation halted: {len(nodes)} of {fleet} nodes raised remediation events "
                f"within {self.cfg.breaker_window:g} s (threshold {threshold}); the likely cause is a driver, "
                f"firmware or release change, not hardware: {', '.join(nodes)}", nodes)

    # ---- the loop -----------------------------------------------------------------------------
    def tick(self) -> None:
        """Advance every open episode by at most one step (call every second or so)."""
        if self.cfg.mode == "observe":
            return
        if self._refresh_views():
            self._check_breaker()
            for ep in self.store.episodes(OPEN_STATES, limit=-1):
                ep = self.store.episode(ep.id)  # a person's command (another process) may have closed it meanwhile
                if not ep.open:
                    continue
                try:
                    self._advance(ep)
                except ActionError as exc:
                    self._note(ep, "error", f"{exc}", "gpuobs")
        if self.notifier is not None and self.cfg.mode == "enforce":  # dry-run halts nothing and escalates nothing
            self.notifier.sync(self.store, self.identity_label)

    def _note(self, ep: Episode, kind: str, detail: str, actor: str) -> None:
        """A timeline entry, not repeated while the same one is the episode's last of that kind."""
        last = self.store.last_log(ep.node, kind, ep.id)
        if last is None or last["detail"] != detail or last["actor"] != actor:
            self.store.log(ep.node, kind, detail, actor, ep.id)

    def _hold(self, ep: Episode, interlock: str, detail: str) -> None:
        self._note(ep, "held", detail, f"interlock:{interlock}")

    def _human_override(self, ep: Episode, view: NodeView | None) -> bool:
        """End the episode if a person held the node or changed its cordon, or finish the controller's own
        uncordon that a kill interrupted (the node found uncordoned); True when it did."""
        holds = self.store.holds()
        if ep.node in holds:
            h = holds[ep.node]
            self.store.set_state(ep, "overridden", f"held by {h['by']}: {h['reason']}; the node is left as it is",
                                 f"human:{h['by']}")
            return True
        if ep.state == "pending" or view is None:
            return False
        crashed = self.store.open_step(ep, "uncordon") if ep.state == "verifying" and not view.cordoned else None
        if crashed is not None:  # the controller's own uncordon, killed before its outcome was recorded
            self.store.set_state(ep, "returned", "uncordoned before a restart (the outcome was not recorded; the "
                                 "node is uncordoned)",
                                 step=(crashed["id"], "done", "found uncordoned after a restart"))
            return True
        if not view.cordoned or view.cordoned_by == "human":
            what = "uncordoned" if not view.cordoned else "took over the cordon of"
            self.store.set_state(ep, "overridden", f"a person {what} the node mid-remediation; the controller "
                                 "stopped and holds it until `gpuobs remediate release`", "human")
            self.store.hold(ep.node, "override", f"a person {what} the node during episode {ep.id}")
            return True
        return False

    def _advance(self, ep: Episode) -> None:
        view = self._views.get(ep.node)
        if self._human_override(ep, view):
            return
        now = self.clock()
        if self.cfg.mode == "dry-run" and ep.state != "pending":
            self._hold(ep, "mode", f"dry-run mode: the {ep.state} episode is left as it is (no drain, action or "
                       "uncordon) until a person or an enforcing controller takes it on")
            return
        if ep.state == "pending":
            self._pending(ep, view, now)
        elif ep.state == "quarantined":
            self._run_step(ep, "drain", lambda: self.actions.drain(ep.node), "draining",
                           lambda _: f"draining; deadline {self.cfg.drain_timeout:g} s",
                           deadline=now + self.cfg.drain_timeout)
        elif ep.state == "draining":
            fresh = self.actions.view(ep.node)
            if fresh.in_flight <= 0:
                self.store.set_state(ep, "acting", "drained: no work in flight")
            elif ep.deadline is not None and now >= ep.deadline:
                self.store.set_state(ep, "escalated", f"drain timed out with {fresh.in_flight:g} in flight; no "
                                     f"{ep.action} was taken, the node stays cordoned for a person",
                                     "interlock:drain")
            else:
                self.actions.drain(ep.node)  # idempotent: retries evictions a disruption budget refused
        elif ep.state == "acting":
            self._acting(ep, now)
        elif ep.state == "verifying":
            self._verifying(ep, now)

    def _pending(self, ep: Episode, view: NodeView | None, now: float) -> None:
        blocked = self._interlock(ep, view, now)
        if self.cfg.mode == "dry-run":
            detail = f"would quarantine, drain and {ep.action}" + (f"; held by {blocked[0]}: {blocked[1]}" if blocked else "")
            self.store.set_state(ep, "dry-run", detail)
            return
        if blocked:
            if blocked[0] == "inventory" and now - ep.opened_at >= self.cfg.verify_timeout:
                # Never act, much later, on an old alert for a node that was not there when it fired.
                self.store.set_state(ep, "cancelled", f"{ep.node} was not in the adapter's node list for "
                                     f"{now - ep.opened_at:g} s; the page went to a person", "interlock:inventory")
                return
            self._hold(ep, *blocked)
            return
        failed = [s for s in self.store.steps(episode=ep.id) if s["step"] == "cordon" and s["status"] == "failed"]
        if failed and now - failed[-1]["ts"] < min(60.0, 2.0 ** len(failed)):
            return  # back off after failed cordons: 2, 4, 8 ... 60 s, not one API call per tick
        if view is not None and view.cordoned and view.cordoned_by == "human":
            self.store.set_state(ep, "overridden", "a person had already cordoned the node; left to them", "human")
            return
        self._run_step(ep, "cordon",
                       lambda: self.actions.cordon(ep.node, f"gpuobs remediation {ep.id}: {ep.alertname}"),
                       "quarantined", lambda _: "cordoned (no new work)")
        now_ep = self.store.episode(ep.id)
        if now_ep.state == "cancelled":  # the breaker was closed while the cordon went out: take our cordon back
            self.actions.uncordon(ep.node)
            self.store.log(ep.node, "uncordoned", "the episode was cancelled while it was being quarantined", "gpuobs",
                           ep.id)

    def _interlock(self, ep: Episode, view: NodeView | None, now: float) -> tuple[str, str] | None:
        """The first interlock that holds this episode's quarantine back, as (name, detail), or None.
        Asks a rollout that holds the node to abort (once per episode; never in dry-run)."""
        if view is None:
            return "inventory", f"{ep.node} is not in the adapter's node list"
        if view.pool != ep.pool:  # the inventory was down at ingest ("unknown"), or the node moved pools
            ep = self.store.update(ep, pool=view.pool)
        if self.store.breaker()["open"]:
            return "breaker", "the fleet breaker is open; a person must close it (`gpuobs remediate breaker close`)"
        try:
            rollouts = self.signals.rollout_holds()
        except ActionError as exc:
            return "rollout", f"cannot tell whether a rollout holds the node: {exc}"
        if ep.node in rollouts:
            rid = rollouts[ep.node]
            if self.cfg.mode == "enforce" and self.store.last_log(ep.node, "rollout-abort", ep.id) is None:
                try:
                    self.signals.abort_rollout(rid, f"canary node {ep.node}: {ep.alertname} ({ep.why})")
                    self.store.log(ep.node, "rollout-abort", f"asked rollout {rid} to abort", "gpuobs", ep.id)
                except ActionError as exc:
                    return "rollout", f"rollout {rid} holds the node and could not be aborted: {exc}"
            return "rollout", f"rollout {rid} holds the node; it was asked to abort and roll back first"
        pool_nodes = [n for n, v in self._views.items() if v.pool == ep.pool]
        out = [e for e in self.store.out_of_service() if e.pool == ep.pool and e.node != ep.node]
        cap = self.cfg.pool_cap(len(pool_nodes))
        if len(out) >= cap:
            return "pool-concurrency", (f"{len(out)} of {len(pool_nodes)} {ep.pool} nodes out of service "
                                        f"({', '.join(e.node for e in out)}); cap {cap}")
        started = self.store.count_steps("cordon", now - self.cfg.rate_window, pool_nodes, failed=False)
        rate = self.cfg.rate_cap(len(pool_nodes))
        if started >= rate:
            return "pool-rate", f"{started} quarantines in the {ep.pool} pool within {self.cfg.rate_window:g} s; cap {rate}"
        return None

    def _run_step(self, ep: Episode, step: str, call: Any, state: str | None = None, reason: Any = None,
                  **values: Any) -> str:
        """Write-ahead: log ``step`` started, call, log done (or failed and re-raise). With ``state``, the
        step's outcome and the episode's move to ``state`` (``reason(detail)``, ``values``) are one commit:
        a kill between them would otherwise repeat the step, or read the controller's own uncordon as a
        person's."""
        sid = self.store.step_start(ep, step)
        try:
            detail = str(call() or "")
        except ActionError as exc:
            self.store.step_end(sid, "failed", str(exc))
            raise
        if state is None:
            self.store.step_end(sid, "done", detail)
        else:
            self.store.set_state(ep, state, reason(detail), step=(sid, "done", detail), **values)
        return detail

    def _acting(self, ep: Episode, now: float) -> None:
        if self.store.breaker()["open"]:
            self._hold(ep, "breaker", f"the fleet breaker is open: {ep.action} held back, the node stays cordoned")
            return
        crashed = self.store.open_step(ep, "act")
        if crashed is not None:  # the call may or may not have happened: never repeat it, check instead
            self.store.step_end(crashed["id"], "unknown", "controller restarted before the outcome was recorded")
            self.store.set_state(ep, "verifying", f"{ep.action} was started before a restart and its outcome is "
                                 "unknown: verifying instead of repeating it", attempts=ep.attempts + 1,
                                 deadline=now + self.cfg.settle + self.cfg.verify_timeout, verify_since=None)
            return
        try:  # a rollout that claimed the node after the quarantine still holds the action back
            rollout = self.signals.rollout_holds().get(ep.node)
        except ActionError as exc:
            self._hold(ep, "rollout", f"cannot tell whether a rollout holds the node: {exc}")
            return
        if rollout is not None:
            self._hold(ep, "rollout", f"rollout {rollout} holds the node: {ep.action} waits until it releases it")
            return
        done = self.store.count_steps("act", now - self.cfg.attempts_window, [ep.node])
        if done >= self.cfg.max_attempts:
            self.store.set_state(ep, "escalated", f"{done} actions on this node within {self.cfg.attempts_window:g} s "
                                 f"(cap {self.cfg.max_attempts}): RMA ticket, the node stays cordoned",
                                 "interlock:attempts")
            return
        last = self.store.steps(episode=ep.id)
        failed = [s for s in last if s["step"] == "act" and s["status"] == "failed"]
        if failed and now - failed[-1]["ts"] < self.cfg.settle:
            return  # back off after a failed action
        try:
            self._run_step(ep, "act", lambda: self.actions.act(ep.node, ep.action, ep.gpu), "verifying",
                           lambda detail: f"{ep.action}: {detail}", attempts=ep.attempts + 1,
                           deadline=now + self.cfg.settle + self.cfg.verify_timeout, verify_since=None)
        except ActionError as exc:
            self.store.update(ep, attempts=ep.attempts + 1)
            self.store.log(ep.node, "action-failed", f"{ep.action}: {exc}", "gpuobs", ep.id)

    def _verifying(self, ep: Episode, now: float) -> None:
        if now < ep.state_since + self.cfg.settle:
            return
        try:
            health = self.actions.health_check(ep.node, ep.gpu if ep.action == "reset-gpu" else None)
            firing = self.signals.firing(ep.node, ep.alertname, ep.gpu)
        except ActionError as exc:
            self._note(ep, "verify-wait", f"cannot verify yet: {exc}", "gpuobs")
            health, firing = None, True
        if health is not None and health.passed and not firing:
            since = ep.verify_since or now
            if ep.verify_since is None:
                self.store.update(ep, verify_since=now)
            if now - since >= self.cfg.verify_hold:
                crashed = self.store.open_step(ep, "uncordon")
                if crashed is not None:  # killed before the call reached the node: the node is still cordoned
                    self.store.step_end(crashed["id"], "unknown",
                                        "controller restarted before the outcome was recorded")
                self._run_step(ep, "uncordon", lambda: self.actions.uncordon(ep.node), "returned",
                               lambda _: f"health check passed and {ep.alertname} clear for {now - since:g} s: "
                               "uncordoned")
            return
        if ep.verify_since is not None:
            self.store.update(ep, verify_since=None)
        if health is not None and not health.passed:
            self._note(ep, "verify-failed", "; ".join(health.failures) or "health check failed", "gpuobs")
        if ep.deadline is not None and now >= ep.deadline:
            if ep.attempts >= self.cfg.max_attempts:
                self.store.set_state(ep, "escalated", f"not healthy after {ep.attempts} {ep.action} attempts: RMA "
                                     "ticket, the node stays cordoned", "interlock:attempts")
            else:
                self.store.set_state(ep, "acting", f"verification failed by its deadline; retrying {ep.action}")

    # ---- a person's commands ------------------------------------------------------------------
    def hold(self, node: str, by: str, reason: str) -> None:
        """A person holds ``node``: the controller stops any episode on it and takes no action."""
        self.store.hold(node, by, reason)
        ep = self.store.active(node)
        if ep is not None:
            self._human_override(ep, None)

    def release(self, node: str, by: str, reason: str) -> bool:
        """A person releases ``node`` (its hold, or its escalation); new events may act on it again."""
        return self.store.release(node, by, reason)

    def close_breaker(self, by: str, reason: str) -> bool:
        """A person closes the breaker. Episodes still pending behind it are cancelled, not resumed: their
        events predate the person's decision. Their pages still reached a person; an alert that fires again
        later (a new ``startsAt``) opens a new episode."""
        if not self.store.close_breaker(by, reason):
            return False
        for ep in self.store.episodes(("pending",)):
            self.store.set_state(ep, "cancelled", f"the breaker was closed by {by}; pending episode dropped",
                                 f"human:{by}")
        return True

    # ---- reading ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Everything ``gpuobs remediate status`` and the console show, as JSON-ready data."""
        eps = self.store.episodes(OPEN_STATES)
        return {
            "mode": self.cfg.mode,
            "breaker": self.store.breaker(),
            "holds": self.store.holds(),
            "open": [e.to_dict() for e in eps],
            "out_of_service": [e.to_dict() for e in self.store.out_of_service()],
            "recent": [e.to_dict() for e in self.store.episodes(limit=20)],
        }
