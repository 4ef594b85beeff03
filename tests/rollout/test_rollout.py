"""Rollout controller state machine over fakes: no network, no sleeps (fake clock)."""

from __future__ import annotations

import pytest

from gpuobs.compat.inventory import InventoryRow
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.interfaces import FleetError
from gpuobs.rollout.model import (
    ABORTED,
    EXIT_CODES,
    REJECTED,
    ROLLED_BACK,
    ROLLING_BACK,
    SUCCEEDED,
    BudgetRow,
    UsageError,
    parse_stages,
)
from gpuobs.rollout.store import RolloutStore
from tests.fakes.rollout import DRIVER, H100, HOSTS, T0, Crash, FakeFleet, rig, spec

H0, H1, H2 = HOSTS


def states(r) -> list[str]:
    rid = r.store.latest().id
    return [t["to_state"] for t in r.store.transitions(rid)]


@pytest.mark.parametrize("text,n,expected", [
    ("1,25%,50%,100%", 4, [1, 2, 4]),       # 25% of 4 = 1 node: collapses into the first stage
    ("1,25%,50%,100%", 8, [1, 2, 4, 8]),
    ("1,50%,100%", 3, [1, 2, 3]),           # shares round up (ceil), as Argo does for replicas
    ("1", 3, [1, 3]),                       # 100% is appended
    ("2, 50% ,75%", 4, [2, 3, 4]),
])
def test_parse_stages(text, n, expected):
    assert parse_stages(text, n) == expected


@pytest.mark.parametrize("text,n,needle", [
    ("100%", 3, "must leave a baseline"), ("1", 1, "at least 2 serving nodes"), ("0,2", 3, "expected 1..3"),
    ("2,1", 3, "below the previous stage"), ("one", 3, "not a node count"), ("150%", 3, "expected 1..3"),
])
def test_parse_stages_rejects(text, n, needle):
    with pytest.raises(UsageError, match=needle):
        parse_stages(text, n)


def test_healthy_release_walks_every_stage_and_succeeds(tmp_path):
    r = rig(tmp_path, {1: ["HOLD", "PROMOTE"], 2: ["PROMOTE"]})
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == SUCCEEDED and EXIT_CODES[rec.state] == 0
    assert states(r) == ["Pending", "CompatChecked", "Canary", "Canary", "Promoting", "Succeeded"]
    assert r.fleet.deploys == [(H0, "1.5.0"), (H1, "1.5.0"), (H2, "1.5.0")]
    assert r.fleet.versions == dict.fromkeys(HOSTS, "1.5.0")
    assert r.fleet.labels == [{H0}, {H0, H1}, {H0, H1, H2}, None]  # canary labels per stage, then restored
    st = r.store.stages(rec.id)
    assert [(s.kind, s.hosts, s.status, s.looks, s.verdict) for s in st] == [
        ("canary", [H0], "passed", 2, "PROMOTE"), ("canary", [H0, H1], "passed", 1, "PROMOTE"),
        ("promote", list(HOSTS), "passed", 1, "")]
    # stage 1: settle 5 s, looks at +10 s and +20 s of the window; stage 2 one look; bake 10 s
    assert st[0].started_at == T0 and st[0].analysis_start == T0 + 5 and st[0].deadline == T0 + 65
    assert [(c, s - T0, e - T0) for c, s, e in r.analyzers.looks] == [(1, 5, 15), (1, 5, 25), (2, 30, 40)]
    assert st[2].analysis_start == T0 + 40 and st[2].ended_at == T0 + 50
    assert r.clock.slept == 50.0
    assert r.analyzers.made == [(60.0, 10.0), (60.0, 10.0)]  # horizon = stage timeout
    assert [g["outcome"] for g in r.store.gates(rec.id)] == ["passed", "open", "open", "open"]
    assert any("stage 1/3 look 2 (20s = 33% of the stage): PROMOTE" in line for line in r.lines)


def test_rollback_verdict_reverts_touched_nodes_and_labels(tmp_path):
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["HOLD", "ROLLBACK"]})
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == ROLLED_BACK and EXIT_CODES[rec.state] == 1
    assert rec.reason.startswith("canary analysis ROLLBACK in stage 2/3: ttft: High")
    assert r.fleet.versions == dict.fromkeys(HOSTS, "1.4.0")
    assert r.fleet.deploys == [(H0, "1.5.0"), (H1, "1.5.0"), (H0, "1.4.0"), (H1, "1.4.0")]  # H2 never touched
    assert r.fleet.labels[-1] is None
    assert [(d["hostname"], d["previous"], d["version"], d["purpose"]) for d in r.store.deploys(rec.id)] == [
        (H0, "1.4.0", "1.5.0", "stage 1"), (H1, "1.4.0", "1.5.0", "stage 2"),
        (H0, "1.5.0", "1.4.0", "rollback"), (H1, "1.5.0", "1.4.0", "rollback")]
    assert states(r)[-2:] == ["RollingBack", "RolledBack"]
    assert r.store.stage(rec.id, 1).status == "failed"


def test_incompatible_release_is_rejected_before_any_deploy(tmp_path):
    r = rig(tmp_path, {1: ["PROMOTE"]})
    rec = r.controller.run(r.controller.create(spec(version="2.0.0", engine="vllm==0.26.0", cuda="13.0")).id)
    assert rec.state == REJECTED and EXIT_CODES[rec.state] == 1
    assert rec.reason.startswith(f"compatibility gate: {H0}: INCOMPATIBLE (toolkit-min-driver, minor-version-compat")
    assert r.fleet.deploys == [] and r.fleet.labels == [] and r.analyzers.looks == []
    assert states(r) == ["Pending", "Rejected"]
    gate = r.store.gates(rec.id)[0]
    assert gate["gate"] == "compat" and gate["detail"]["verdict"] == "INCOMPATIBLE"
    assert [n["driver"] for n in gate["detail"]["nodes"]] == [DRIVER] * 3


def test_a_serving_node_missing_from_the_inventory_is_rejected(tmp_path):
    rows = [InventoryRow(H0, H100, DRIVER, 2), InventoryRow(H1, H100, DRIVER, 2)]
    r = rig(tmp_path, {1: ["PROMOTE"]}, inventory_rows=rows)
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == REJECTED and f"{H2}: no modelName/DCGM_FI_DRIVER_VERSION series" in rec.reason
    assert r.fleet.deploys == []


def test_exhausted_budget_freezes_the_start(tmp_path):
    budget = lambda now: [BudgetRow({"slo": "ttft"}, -0.25), BudgetRow({"slo": "availability"}, 0.9)]  # noqa: E731
    r = rig(tmp_path, {1: ["PROMOTE"]}, budget_fn=budget)
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == REJECTED and EXIT_CODES[rec.state] == 1
    assert rec.reason.startswith("error-budget freeze: {slo=ttft} -25.0% of the error budget left")
    assert "--override-freeze --reason" in rec.reason
    assert r.fleet.deploys == []
    assert r.store.gates(rec.id)[-1]["outcome"] == "frozen"


def test_a_budget_over_too_few_requests_is_not_judged(tmp_path):
    budget = lambda now: [BudgetRow({"slo": "availability"}, -0.4, requests=2500, min_requests=10_000)]  # noqa: E731
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["PROMOTE"]}, budget_fn=budget)
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == SUCCEEDED
    assert any("error-budget gate before stage 1: open (availability -40.0% (not judged: 2500 < 10000 requests "
               "in the SLO window))" in line for line in r.lines)
    assert r.store.gates(rec.id)[1]["detail"]["budget"][0]["judged"] is False


def test_override_with_reason_lets_a_frozen_rollout_proceed_and_is_recorded(tmp_path):
    budget = lambda now: [BudgetRow({"slo": "ttft"}, 0.0)]  # noqa: E731
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["PROMOTE"]}, budget_fn=budget)
    rec = r.controller.run(r.controller.create(spec(override_reason="INC-42 fix, approved by on-call")).id)
    assert rec.state == SUCCEEDED
    gates = [g for g in r.store.gates(rec.id) if g["gate"] == "error-budget"]
    assert [g["outcome"] for g in gates] == ["overridden"] * 3
    assert gates[0]["detail"]["override_reason"] == "INC-42 fix, approved by on-call"
    assert any("override: INC-42 fix" in line for line in r.lines)


def test_budget_exhausted_before_a_later_stage_rolls_back_and_aborts(tmp_path):
    budget = lambda now: [BudgetRow({"slo": "availability"}, 0.5 if now < T0 + 20 else -0.1)]  # noqa: E731
    r = rig(tmp_path, {1: ["HOLD", "PROMOTE"], 2: ["PROMOTE"]}, budget_fn=budget)
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == ABORTED and EXIT_CODES[rec.state] == 3
    assert rec.reason.startswith("error-budget freeze before stage 2: {slo=availability} -10.0%")
    assert r.fleet.deploys == [(H0, "1.5.0"), (H0, "1.4.0")]


def test_slo_burn_page_during_a_stage_rolls_back_even_while_the_analysis_holds(tmp_path):
    page = "ServingErrorBudgetBurn{severity=critical,slo=ttft}"
    r = rig(tmp_path, {1: ["HOLD"]}, pages_fn=lambda now: {page} if now >= T0 + 25 else set())
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == ROLLED_BACK
    assert rec.reason == f"SLO-burn page firing during stage 1/3: {page}"
    assert r.fleet.versions[H0] == "1.4.0" and len(r.analyzers.looks) == 1  # look 2 never ran


def test_page_firing_at_start_freezes_unless_overridden_and_then_only_new_pages_count(tmp_path):
    old, new = "ServingErrorBudgetBurn{slo=availability}", "ServingErrorBudgetBurn{slo=ttft}"
    pages = lambda now: {old} | ({new} if now >= T0 + 15 else set())  # noqa: E731
    r = rig(tmp_path / "a", {1: ["HOLD"]}, pages_fn=pages)
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == REJECTED and f"SLO-burn page already firing: {old}" in rec.reason
    r = rig(tmp_path / "b", {1: ["HOLD"]}, pages_fn=pages)
    rec = r.controller.run(r.controller.create(spec(override_reason="known incident, unrelated")).id)
    assert rec.pages_at_start == [old]
    assert rec.state == ROLLED_BACK and rec.reason == f"SLO-burn page firing during stage 1/3: {new}"


def test_consecutive_prometheus_errors_abort_with_rollback(tmp_path):
    r = rig(tmp_path, {1: ["ERROR"]})
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == ABORTED and EXIT_CODES[rec.state] == 3
    assert rec.reason.startswith("3 consecutive Prometheus errors; last: Prometheus at http://prometheus.test")
    assert r.fleet.versions == dict.fromkeys(HOSTS, "1.4.0")
    assert r.store.analyses(rec.id) == []  # an error is never recorded as a verdict


def test_errors_below_the_limit_reset_on_a_good_look(tmp_path):
    r = rig(tmp_path, {1: ["ERROR", "ERROR", "HOLD", "ERROR", "ERROR", "PROMOTE"], 2: ["PROMOTE"]})
    rec = r.controller.run(r.controller.create(spec(stage_timeout_s=120.0)).id)
    assert rec.state == SUCCEEDED
    assert [a["verdict"] for a in r.store.analyses(rec.id)] == ["HOLD", "PROMOTE", "PROMOTE"]


def test_hold_until_the_deadline_is_inconclusive_rolls_back_and_aborts(tmp_path):
    r = rig(tmp_path, {1: ["HOLD"]})
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == ABORTED and rec.reason.startswith("inconclusive: HOLD at the stage 1/3 deadline (60s)")
    st = r.store.stage(rec.id, 0)
    assert st.status == "inconclusive" and st.looks == 6 and st.verdict_doc["final"] is True
    assert r.analyzers.looks[-1][2] == st.deadline  # the last look is exactly at the horizon
    assert r.fleet.versions[H0] == "1.4.0"


def test_operator_abort_is_noticed_while_waiting(tmp_path):
    r = rig(tmp_path, {1: ["HOLD"]})
    rid = r.controller.create(spec()).id

    def pages(now):  # the operator runs `gpuobs rollout abort` between look 1 and look 2
        if now >= T0 + 15:
            r.store.update(rid, abort_reason="wrong build tag")
        return set()

    r.signals.pages_fn = pages
    rec = r.controller.run(rid)
    assert rec.state == ABORTED and rec.reason == "aborted by operator: wrong build tag"
    assert r.clock.t < T0 + 25  # noticed within one poll, before look 2
    assert r.fleet.versions[H0] == "1.4.0"


def test_abort_of_a_rollout_no_controller_drives(tmp_path):
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["CRASH"]})
    rid = r.controller.create(spec()).id
    with pytest.raises(Crash):
        r.controller.run(rid)
    assert r.store.get(rid).state == "Canary" and r.fleet.versions[H1] == "1.5.0"
    rec = r.controller.abort(rid, "stop it")
    assert rec.state == ABORTED and rec.reason == "aborted by operator: stop it"
    assert r.fleet.versions == dict.fromkeys(HOSTS, "1.4.0")


def test_resume_after_a_crash_mid_stage_does_not_redeploy_finished_stages(tmp_path):
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["HOLD", "CRASH", "PROMOTE"]})
    rid = r.controller.create(spec()).id
    with pytest.raises(Crash):
        r.controller.run(rid)
    before = r.store.stage(rid, 1)
    assert (before.status, before.looks) == ("analysing", 1)
    # a new process: new store connection, new controller, same database and fleet
    store2 = RolloutStore(tmp_path / "rollout.sqlite", clock=r.clock)
    ctl2 = Controller(store2, r.fleet, r.signals, r.analyzers, clock=r.clock, sleep=r.clock.sleep, out=r.lines.append)
    rec = ctl2.run(rid)
    assert rec.state == SUCCEEDED
    assert r.fleet.deploys == [(H0, "1.5.0"), (H1, "1.5.0"), (H2, "1.5.0")]  # each node exactly once
    st = store2.stage(rid, 1)
    assert st.looks == 2 and st.analysis_start == before.analysis_start  # same window, look count kept
    assert [(c, s) for c, s, _ in r.analyzers.looks if c == 2] == [(2, before.analysis_start)] * 3


def test_crash_between_deploy_call_and_its_record_is_not_deployed_twice(tmp_path):
    fleet = FakeFleet(crash_after_deploy={H1})
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["PROMOTE"]}, fleet=fleet)
    rid = r.controller.create(spec()).id
    with pytest.raises(Crash):
        r.controller.run(rid)
    assert r.store.node(rid, H1).status == "deploying" and fleet.versions[H1] == "1.5.0"
    rec = r.controller.run(rid)
    assert rec.state == SUCCEEDED
    assert fleet.deploys.count((H1, "1.5.0")) == 1
    assert [d["hostname"] for d in r.store.deploys(rid)] == [H0, H2]  # H1's call was never confirmed
    assert r.store.node(rid, H1).previous == "1.4.0"


def test_incomplete_rollback_stays_rolling_back_until_resumed(tmp_path):
    r = rig(tmp_path, {1: ["ROLLBACK"]})
    rid = r.controller.create(spec()).id
    real_deploy = r.fleet.deploy

    def no_way_back(host, version):  # the node's admin API dies after the canary deploy
        if version == "1.4.0":
            raise FleetError(f"{host}: node gone")
        return real_deploy(host, version)

    r.fleet.deploy = no_way_back
    rec = r.controller.run(rid)
    assert rec.state == ROLLING_BACK and EXIT_CODES[rec.state] == 1
    assert any("rollback incomplete (gpu-node-00: gpu-node-00: node gone)" in line for line in r.lines)
    assert r.fleet.versions[H0] == "1.5.0"
    r.fleet.deploy = real_deploy
    rec = r.controller.run(rid)
    assert rec.state == ROLLED_BACK and r.fleet.versions[H0] == "1.4.0"


def test_deploy_failure_aborts_and_reverts_what_was_deployed(tmp_path):
    r = rig(tmp_path, {1: ["PROMOTE"]}, fleet=FakeFleet(fail={H1}))
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == ABORTED and rec.reason.startswith("stage 2/3: deploy or relabel failed: gpu-node-01")
    assert r.fleet.versions == dict.fromkeys(HOSTS, "1.4.0")


def test_a_second_rollout_is_refused_while_one_is_active(tmp_path):
    r = rig(tmp_path, {1: ["CRASH"]})
    rid = r.controller.create(spec()).id
    with pytest.raises(Crash):
        r.controller.run(rid)
    with pytest.raises(UsageError, match=f"rollout {rid} .* is Canary: resume or abort it first"):
        r.controller.create(spec(version="1.6.0"))


def test_node_already_on_the_version_is_neither_deployed_nor_rolled_back(tmp_path):
    fleet = FakeFleet(versions={H0: "1.5.0", H1: "1.4.0", H2: "1.4.0"})
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["ROLLBACK"]}, fleet=fleet)
    rec = r.controller.run(r.controller.create(spec()).id)
    assert rec.state == ROLLED_BACK
    assert fleet.deploys == [(H1, "1.5.0"), (H1, "1.4.0")]
    assert fleet.versions == {H0: "1.5.0", H1: "1.4.0", H2: "1.4.0"}
