"""Flag rollout controller over fakes (fake clock, scripted canary): the release rollout's stages, gates
and persistence, with the flag gate and the kill switch."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuobs.rollout import tracing
from gpuobs.rollout.flag import FlagController, parse_variant, variant
from gpuobs.rollout.model import ABORTED, EXIT_CODES, REJECTED, ROLLED_BACK, SUCCEEDED, BudgetRow
from gpuobs.rollout.notices import notice
from gpuobs.rollout.store import RolloutStore
from tests.fakes.flag_rollout import FLAG, OFF, ON, FakeFlagFleet, flag_rig, fspec
from tests.fakes.rollout import HOSTS, T0, Crash, FakeSignals, ScriptedAnalyzers

H0, H1, H2 = HOSTS


def transitions(r, rid):
    return [t["to_state"] for t in r.store.transitions(rid)]


def test_variant_round_trip_and_bad_input():
    assert variant("spec_decode", True) == "spec_decode=on" and parse_variant("kv_policy_v2=off") == ("kv_policy_v2", False)
    for bad in ("spec_decode", "spec_decode=maybe", "=on"):
        with pytest.raises(ValueError, match="not a flag state"):
            parse_variant(bad)


def test_good_flag_turns_on_stage_by_stage_and_ends_on_everywhere(tmp_path):
    r = flag_rig(tmp_path, {1: ["HOLD", "PROMOTE"], 2: ["PROMOTE"]})
    rec = r.controller.create(fspec())
    assert rec.id.startswith(f"{FLAG}-") and rec.version == ON
    rec = r.controller.run(rec.id)
    assert rec.state == SUCCEEDED and EXIT_CODES[rec.state] == 0
    assert transitions(r, rec.id) == ["Pending", "CompatChecked", "Canary", "Canary", "Promoting", "Succeeded"]
    assert r.fleet.versions == dict.fromkeys(HOSTS, ON) and r.fleet.kills == []
    assert r.fleet.deploys == [(H0, ON), (H1, ON), (H2, ON)]  # one flip per node
    assert r.fleet.labels == [{H0}, {H0, H1}, {H0, H1, H2}, None]  # canary = flag on, baseline = flag off
    assert [g["gate"] for g in r.store.gates(rec.id)] == ["flag", "error-budget", "error-budget", "error-budget"]
    assert r.analyzers.made == [(60.0, 10.0), (60.0, 10.0)]  # the same analyzer, horizon = stage timeout


def test_rollback_verdict_pulls_the_kill_switch_in_the_same_look(tmp_path):
    r = flag_rig(tmp_path, {1: ["PROMOTE"], 2: ["HOLD", "ROLLBACK"]})
    rec = r.controller.run(r.controller.create(fspec()).id)
    assert rec.state == ROLLED_BACK and EXIT_CODES[rec.state] == 1
    assert rec.reason.startswith("canary analysis ROLLBACK in stage 2/3")
    assert r.fleet.versions == dict.fromkeys(HOSTS, OFF)
    last_look_end = r.analyzers.looks[-1][2]
    assert [t for t, _ in r.fleet.kills] == [last_look_end]  # one kill, at the deciding look's time
    assert [(d["hostname"], d["version"], d["purpose"]) for d in r.store.deploys(rec.id)] == [
        (H0, ON, "stage 1"), (H1, ON, "stage 2"), (H0, OFF, "kill switch"), (H1, OFF, "kill switch")]
    assert r.fleet.deploys == [(H0, ON), (H1, ON)]  # no per-node revert calls: the kill did it in one write
    assert r.fleet.labels[-1] is None
    assert {n.status for n in r.store.nodes(rec.id)} == {"reverted"}
    assert any(f"kill switch: {FLAG} off on every node (was on for {H0}, {H1})" in line for line in r.lines)
    # the stage row keeps the deciding verdict for the report
    assert r.store.stage(rec.id, 1).verdict == "ROLLBACK" and r.store.stage(rec.id, 1).verdict_table


def test_slo_burn_page_kills_the_flag(tmp_path):
    r = flag_rig(tmp_path, {1: ["HOLD"]}, pages_fn=lambda now: {"ServingErrorBudgetBurn{slo=availability}"}
                 if now >= T0 + 25 else set())
    rec = r.controller.run(r.controller.create(fspec()).id)
    assert rec.state == ROLLED_BACK and "SLO-burn page firing during stage 1/3" in rec.reason
    assert len(r.fleet.kills) == 1 and r.fleet.versions == dict.fromkeys(HOSTS, OFF)


def test_inconclusive_stage_and_operator_abort_also_end_off_everywhere(tmp_path):
    r = flag_rig(tmp_path, {1: ["HOLD"]})
    rec = r.controller.run(r.controller.create(fspec()).id)
    assert rec.state == ABORTED and rec.reason.startswith("inconclusive: HOLD at the stage 1/3 deadline")
    assert r.fleet.versions == dict.fromkeys(HOSTS, OFF) and len(r.fleet.kills) == 1

    r2 = flag_rig(tmp_path / "b", {1: ["HOLD"]})
    rid = r2.controller.create(fspec()).id
    r2.store.update(rid, abort_reason="INC-9")
    rec = r2.controller.run(rid)
    assert rec.state == ABORTED and "INC-9" in rec.reason and r2.fleet.kills


def test_error_budget_freeze_rejects_before_any_flip(tmp_path):
    r = flag_rig(tmp_path, {1: ["PROMOTE"]}, budget_fn=lambda now: [BudgetRow({"slo": "availability"}, -0.1)])
    rec = r.controller.run(r.controller.create(fspec()).id)
    assert rec.state == REJECTED and "error-budget freeze" in rec.reason
    assert r.fleet.deploys == [] and r.fleet.kills == []


def test_flag_gate_rejects_when_an_engine_does_not_evaluate_the_flag(tmp_path):
    r = flag_rig(tmp_path, {1: ["PROMOTE"]}, fleet=FakeFlagFleet(unknown={H2}))
    rec = r.controller.run(r.controller.create(fspec()).id)
    assert rec.state == REJECTED and f"the engines on {H2} do not evaluate {FLAG}" in rec.reason
    assert r.fleet.deploys == []


def test_crash_after_a_flip_then_resume_flips_no_node_twice(tmp_path):
    """A simulated kill -9 right after stage 2's flip of H1 (before it was recorded), then a new
    controller resumes: it asks the fleet, sees H1 already on, and never flips it again."""
    fleet = FakeFlagFleet(crash_after_deploy={H1})
    r = flag_rig(tmp_path, {1: ["PROMOTE"], 2: ["PROMOTE"]}, fleet=fleet)
    rid = r.controller.create(fspec()).id
    with pytest.raises(Crash):
        r.controller.run(rid)
    assert r.store.get(rid).state == "Canary" and fleet.versions[H1] == ON
    assert r.store.node(rid, H1).status == "deploying"  # write-ahead row, call not recorded
    r.store.close()
    store = RolloutStore(tmp_path / "flag.sqlite", clock=r.clock)  # a new process: new store, new controller
    ctl = FlagController(store, fleet, FakeSignals(r.clock), ScriptedAnalyzers(fleet, {1: ["PROMOTE"], 2: ["PROMOTE"]}),
                         clock=r.clock, sleep=r.clock.sleep, out=r.lines.append)
    rec = ctl.run(rid)
    assert rec.state == SUCCEEDED
    assert fleet.deploys == [(H0, ON), (H1, ON), (H2, ON)]  # each node flipped exactly once
    assert [(d["hostname"], d["purpose"]) for d in store.deploys(rid)] == [(H0, "stage 1"), (H2, "stage 3")]
    assert store.node(rid, H1).status == "deployed"


def test_crash_during_the_kill_switch_resumes_to_off_everywhere(tmp_path):
    class KillCrash(FakeFlagFleet):
        crashes = 1

        def kill(self, reason):
            out = super().kill(reason)
            if self.crashes:
                self.crashes -= 1
                raise Crash("killed right after the kill switch write")
            return out

    fleet = KillCrash()
    r = flag_rig(tmp_path, {1: ["ROLLBACK"]}, fleet=fleet)
    rid = r.controller.create(fspec()).id
    with pytest.raises(Crash):
        r.controller.run(rid)
    assert r.store.get(rid).state == "RollingBack" and fleet.versions == dict.fromkeys(HOSTS, OFF)
    rec = r.controller.run(rid)  # resume
    assert rec.state == ROLLED_BACK and fleet.deploys == [(H0, ON)] and len(fleet.kills) == 2


def test_spans_and_notice_name_the_flag(tmp_path):
    exp = InMemorySpanExporter()
    tr = tracing.setup(exp, env={})
    r = flag_rig(tmp_path, {1: ["ROLLBACK"]}, tracer=tr)
    rec = r.controller.run(r.controller.create(fspec()).id)
    names = [s.name for s in exp.get_finished_spans()]
    assert names.count("rollout.kill_switch") == 1 and "rollout" in names
    kill = next(s for s in exp.get_finished_spans() if s.name == "rollout.kill_switch")
    assert kill.attributes["flag.key"] == FLAG and list(kill.attributes["kill.hosts_were_on"]) == [H0]
    gate = next(s for s in exp.get_finished_spans() if s.name == "rollout.gate")
    assert gate.attributes["gate.name"] == "flag"
    a = notice(rec, "/tmp/run", "https://runbooks.example", now=T0, flag=FLAG, stage=r.store.stage(rec.id, rec.stage))
    assert a["labels"] == {"alertname": "FlagRolloutRolledBack", "severity": "warning", "rollout": rec.id,
                           "version": ON, "flag": FLAG}
    assert "gpuobs flag status --run-dir /tmp/run" in a["annotations"]["report"]
    # from the stored stage: where it ended and the deciding test, in at most five lines
    lines = a["annotations"]["description"].splitlines()
    assert len(lines) <= 5 and "ended RolledBack in stage 1/3" in lines[0]
    assert lines[1] == "Deciding: ttft: High (+20.0% [+12.0%, +28.0%])"
    assert a["annotations"]["runbook_url"] == "https://runbooks.example/runbooks/rollout.md#flagrolloutrolledback"
