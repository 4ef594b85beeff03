"""The driver upgrade controller (gpuobs.rollout.driver) over fakes: stratified batches, the driver's
compatibility gate, one verdict per GPU model with its own baseline and alpha share, the regressed
model's rollback only, health-check failures, and kill -9 in every phase of a batch then resume
without upgrading or rolling back any node twice."""

from __future__ import annotations

import collections

import pytest

from gpuobs.rollout.driver import (
    DriverController,
    batch_groups,
    driver_spec,
    parse_batches,
    short_model,
    stratify,
)
from gpuobs.rollout.model import ABORTED, REJECTED, ROLLED_BACK, SUCCEEDED, UsageError
from gpuobs.rollout.store import RolloutStore
from tests.fakes.driver_fleet import H100, L40S, NEW, OLD, PHASES, FakeDriverFleet, ModelScript, mixed_models
from tests.fakes.rollout import Crash, FakeClock, FakeSignals

T_BATCHES = "canary,50%,100%"


def test_short_model_names():
    assert short_model(H100) == "H100" and short_model(L40S) == "L40S" and short_model("Tesla V100-SXM2-32GB") == \
        "V100-SXM2-32GB"


def test_stratify_puts_one_node_of_every_model_first_rarest_first():
    models = mixed_models(19, 1)
    order = stratify(models)
    assert order[:2] == ["gpu-node-19", "gpu-node-00"]  # the one L40S, then the first H100
    assert sorted(order) == sorted(models) and len(set(order)) == 20
    three = {**mixed_models(4, 0), "a-l40s": L40S, "b-l40s": L40S, "c-a100": "NVIDIA A100-SXM4-80GB"}
    first = stratify(three)[:3]
    assert [three[h] for h in first] == ["NVIDIA A100-SXM4-80GB", L40S, H100]
    # the remaining nodes of each model are spread: the second L40S is not left to the very end
    rest = stratify(three)[3:]
    assert rest.index("b-l40s") < len(rest) - 1


def test_parse_batches_canary_token_counts_the_models():
    hosts, counts = parse_batches("canary,25%,50%,100%", mixed_models(19, 1))
    assert counts == [2, 5, 10, 20] and hosts[0] == "gpu-node-19"
    with pytest.raises(UsageError, match="--batches"):
        parse_batches("canary,x", mixed_models(3, 1))
    with pytest.raises(UsageError, match="baseline"):
        parse_batches("100%", mixed_models(3, 1))


def test_batch_groups_use_the_models_own_baseline_else_every_node_left_with_a_note():
    models = mixed_models(5, 1)
    g = batch_groups(models, ["gpu-node-05", "gpu-node-00"], ["gpu-node-01", "gpu-node-02", "gpu-node-03"])
    assert g[H100] == (["gpu-node-00"], ["gpu-node-01", "gpu-node-02", "gpu-node-03"], "")
    canary, base, note = g[L40S]
    assert canary == ["gpu-node-05"] and base == ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
    assert "no L40S node is left on the old driver" in note
    assert batch_groups(models, ["gpu-node-01"], []) == {}


def _rig(tmp_path, script, models=None, fleet=None, **signal_kw):
    models = models or mixed_models(5, 1)
    clock = FakeClock()
    fleet = fleet or FakeDriverFleet(models)
    signals = FakeSignals(clock, inventory_rows=fleet.inventory(), **signal_kw)
    factory = ModelScript(models, script)
    store = RolloutStore(tmp_path / "upgrade.sqlite", clock=clock)
    lines: list[str] = []

    def controller():
        return DriverController(store, fleet, signals, factory, clock=clock, sleep=clock.sleep, out=lines.append,
                                identity_label="Hostname")

    hosts, counts = parse_batches(T_BATCHES, models)
    spec = driver_spec(NEW, "vllm==0.10.1", "12.8", hosts, counts, interval_s=10.0, stage_timeout_s=120.0,
                       settle_s=5.0, bake_s=10.0)
    return store, fleet, factory, controller, spec, lines


def test_clean_driver_reaches_every_node_and_each_model_is_judged_on_its_own(tmp_path):
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["HOLD", "PROMOTE"], L40S: ["PROMOTE"]})
    ctl = controller()
    rec = ctl.run(ctl.create(spec).id)
    assert rec.state == SUCCEEDED, rec.reason
    assert set(fleet.drivers.values()) == {NEW} and not fleet.cordoned
    assert collections.Counter(h for h, _ in fleet.installs) == dict.fromkeys(fleet.models, 1)
    # batch 1: one analyzer per model, Bonferroni over 2 models x 2 analysed batches; L40S against the
    # H100s left (none of its own)
    first = [m for m in factory.made if m[1] in (["gpu-node-05"], ["gpu-node-00"])]
    assert {m[0] for m in first} == {H100, L40S}
    cfg_alpha = factory.config.alpha
    assert all(abs(a - cfg_alpha / 4) < 1e-12 for _, _, _, a, _ in first)
    l40s = next(m for m in first if m[0] == L40S)
    assert "gpu-node-05" not in l40s[2] and "gpu-node-00" not in l40s[2] and len(l40s[2]) == 4
    # the pre-stage period ends when the batch began (before the drain), not at the analysis start
    st0 = store.stage(rec.id, 0)
    assert l40s[4] == st0.started_at < st0.analysis_start
    # L40S promoted at its first look and is not looked at again; H100 needed two
    assert [m for m, _, _ in factory.looks[:3]] == [H100, L40S, H100]
    doc = st0.verdict_doc
    assert doc["by_model"] == {H100: "PROMOTE", L40S: "PROMOTE"}
    assert any(m["name"].startswith("H100:") for m in doc["metrics"])  # the deciding look: H100 only


def test_a_regressed_model_is_rolled_back_alone_and_the_upgrade_halts(tmp_path):
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["HOLD", "ROLLBACK"]})
    ctl = controller()
    rec = ctl.run(ctl.create(spec).id)
    assert rec.state == ROLLED_BACK
    assert "L40S:" in rec.reason and "canary analysis ROLLBACK" in rec.reason
    assert fleet.drivers["gpu-node-05"] == OLD  # the L40S back on the old driver
    assert fleet.drivers["gpu-node-00"] == NEW  # the H100 canary passed: it keeps the new driver
    assert all(fleet.drivers[h] == OLD for h in ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"))
    assert fleet.installs == [("gpu-node-05", NEW), ("gpu-node-00", NEW), ("gpu-node-05", OLD)]
    assert not fleet.cordoned
    assert store.stage(rec.id, 1) is None  # no second batch


def test_an_operator_abort_rolls_every_upgraded_node_back(tmp_path):
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["PROMOTE"],
                                                                     })
    factory.script = {H100: ["PROMOTE", "HOLD"], L40S: ["PROMOTE", "HOLD"]}
    ctl = controller()
    rid = ctl.create(spec).id
    fleet.crash_in = {("gpu-node-01", "uncordon")}
    with pytest.raises(Crash):
        ctl.run(rid)
    rec = controller().abort(rid, "change freeze")
    assert rec.state == ABORTED
    assert set(fleet.drivers.values()) == {OLD} and not fleet.cordoned


def test_health_check_failure_rolls_the_model_back(tmp_path):
    models = mixed_models(5, 1)
    fleet = FakeDriverFleet(models, diag_fails={(L40S, NEW)})
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["PROMOTE"]},
                                                          models, fleet)
    ctl = controller()
    rec = ctl.run(ctl.create(spec).id)
    assert rec.state == ROLLED_BACK and "health check failed" in rec.reason
    assert fleet.drivers["gpu-node-05"] == OLD and fleet.drivers["gpu-node-00"] == NEW
    assert not fleet.cordoned and not factory.looks  # no analysis ran


def test_the_compatibility_gate_rejects_before_any_node_is_touched(tmp_path):
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["PROMOTE"]})
    ctl = controller()
    bad = driver_spec(NEW, "vllm==0.26.0", "13.0", spec.hosts, spec.stages)  # CUDA 13 needs a 580 driver
    rec = ctl.run(ctl.create(bad).id)
    assert rec.state == REJECTED and "compatibility gate" in rec.reason
    assert not fleet.installs and not fleet.cordoned


def test_nodes_an_operator_or_remediation_cordoned_are_not_touched(tmp_path):
    models = mixed_models(5, 1)
    fleet = FakeDriverFleet(models, cordoned={"gpu-node-00": "human"})
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["PROMOTE"]},
                                                          models, fleet)
    ctl = controller()
    rec = ctl.run(ctl.create(spec).id)
    assert rec.state == ABORTED and "cordoned by human" in rec.reason
    assert fleet.cordoned == {"gpu-node-00": "human"} and set(fleet.drivers.values()) == {OLD}


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("outcome", ["good", "regressed"])
def test_kill_in_every_phase_then_resume_upgrades_and_rolls_back_each_node_once(tmp_path, phase, outcome):
    script = {H100: ["PROMOTE"], L40S: ["PROMOTE"] if outcome == "good" else ["ROLLBACK"]}
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, script)
    rid = controller().create(spec).id
    # killed in the phase on the second batch's first node (good) or in the L40S rollback (regressed)
    victim = spec.hosts[2] if outcome == "good" else "gpu-node-05"
    fleet.crash_in = {(victim, phase)}
    if outcome == "regressed":
        real = fleet.upgrade

        def upgrade(hosts, version, real=real):  # arm the crash only for the rollback's procedure
            if version == NEW:
                saved, fleet.crash_in = fleet.crash_in, set()
                try:
                    return real(hosts, version)
                finally:
                    fleet.crash_in = saved
            return real(hosts, version)
        fleet.upgrade = upgrade
    with pytest.raises(Crash):
        controller().run(rid)
    rec = controller().run(rid)
    assert rec.state == (SUCCEEDED if outcome == "good" else ROLLED_BACK), rec.reason
    counts = collections.Counter(fleet.installs)
    assert all(n == 1 for n in counts.values()), counts
    # the deploy log has every install exactly once, also one the killed controller did not record
    logged = collections.Counter((d["hostname"], d["version"]) for d in store.deploys(rid))
    assert logged == counts, (logged, counts)
    assert all(d["previous"] != d["version"] for d in store.deploys(rid)), store.deploys(rid)  # no X -> X
    assert not fleet.cordoned
    if outcome == "good":
        assert set(fleet.drivers.values()) == {NEW}
    else:
        assert fleet.drivers["gpu-node-05"] == OLD and fleet.drivers["gpu-node-00"] == NEW


def test_a_model_judged_against_other_models_is_judged_within_node_only(tmp_path):
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["PROMOTE"]})
    ctl = controller()
    ctl.run(ctl.create(spec).id)
    assert factory.within_only == {H100: False, L40S: True}


def test_within_only_latency_without_pre_stage_data_is_nodata_not_a_cross_model_comparison():
    import numpy as np

    from gpuobs.canary.histstats import HistContext, NoData
    from gpuobs.canary.stats import bin_log_centres

    bounds = np.array([0.1, 0.25, 0.5, 1.0, 2.5])
    x = bin_log_centres(bounds)
    cc = np.array([[10.0, 40, 60, 30, 8, 2]]) * 1.3  # a slower GPU model: its level differs by design
    cb = np.array([[20.0, 60, 50, 20, 5, 1], [18, 62, 52, 18, 4, 2]])
    n_c, n_b = cc.sum(1), cb.sum(1)
    args = (bounds, x, cc, cb, n_c, n_b, n_c, n_b, np.log1p(0.015), 4.0)
    assert HistContext(*args).test("location")["stat"] is not None  # between nodes: judged
    with pytest.raises(NoData, match="within-node design is required"):
        HistContext(*args, within_only=True).test("location")
    with pytest.raises(NoData, match="within-node design is required"):
        HistContext(*args, within_only=True).test("p99")


def test_the_report_plots_the_regressed_model_against_the_nodes_it_was_compared_with(tmp_path):
    from gpuobs.rollout.report import report_doc

    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["ROLLBACK"]})
    ctl = controller()
    rec = ctl.run(ctl.create(spec).id)
    doc = report_doc(store, rec.id, identity_label="node")
    assert doc["report_model"] == L40S
    assert doc["canary_selector"] == 'node=~"gpu-node-05"'
    assert doc["baseline_selector"].startswith('node=~"gpu-node-01|')
    assert report_doc(store, rec.id)["canary_selector"] == 'track="canary"'  # no identity label: as before


def test_the_install_log_names_plain_drivers_when_a_rollback_meets_a_node_left_in_the_procedure(tmp_path):
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["PROMOTE"]})
    rid = controller().create(spec).id
    fleet.crash_in = {(spec.hosts[0], "reload")}  # killed in the first batch, the node still held
    with pytest.raises(Crash):
        controller().run(rid)
    rec = controller().abort(rid, "operator")
    assert rec.state == ABORTED and not fleet.cordoned
    logged = [(d["hostname"], d["previous"], d["version"]) for d in store.deploys(rid)]
    assert logged and all("(in upgrade)" not in f"{p} {v}" for _, p, v in logged), logged
    assert not any("(in upgrade)" in line for line in lines if "rolled back" in line), lines
    # the killed controller's installs are logged once, before their rollback
    assert collections.Counter((h, v) for h, _, v in logged) == collections.Counter(fleet.installs), logged


@pytest.mark.parametrize("phase", ["cordon", "drain"])
def test_an_abort_after_a_kill_before_the_install_logs_no_rollback(tmp_path, phase):
    store, fleet, factory, controller, spec, lines = _rig(tmp_path, {H100: ["PROMOTE"], L40S: ["PROMOTE"]})
    rid = controller().create(spec).id
    fleet.crash_in = {(spec.hosts[0], phase)}
    with pytest.raises(Crash):
        controller().run(rid)
    rec = controller().abort(rid, "operator")
    assert rec.state == ABORTED and not fleet.cordoned and not fleet.installs
    assert store.deploys(rid) == [] and not any("rolled back" in line for line in lines), lines
