"""SimActions (the remediation controller's node actions on the simulated fleet) against a real fleet
process (SimFleet, on free loopback ports) described by a stack.json-shaped StackState: views, cordon
marks, drain, actions, health checks, and every failure translated into ActionError."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from gpuobs.exporter.sim.faults import FaultRequest
from gpuobs.exporter.simfleet import SimFleet, SimFleetSpec
from gpuobs.exporter.sim.node import CHECKPOINT_S
from gpuobs.remediate.adapters.sim import SimActions
from gpuobs.remediate.interfaces import ActionError, HealthResult, NodeActions
from gpuobs.stack.state import StackState, StackUrls
from tests.conftest import TOKEN, free_port_range


def _state(tmp_path, fleet: SimFleet, base: int) -> StackState:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    n = len(fleet.nodes)
    urls = StackUrls(prometheus="http://127.0.0.1:1", alertmanager="http://127.0.0.1:1", pager="http://127.0.0.1:1",
                     nodes=[f"http://127.0.0.1:{base + i}/metrics" for i in range(n)])
    return StackState(run_dir=str(tmp_path), urls=urls, hostnames=[nd.hostname for nd in fleet.nodes],
                      token_file=str(token_file), nodes=n, gpus=fleet.cfg.gpus, training_nodes=fleet.cfg.training_nodes)


@pytest.fixture
def fleet(tmp_path):
    """Two serving nodes and one training node, 4 GPUs each; the ticker is slow (tests drive simulated
    time with Node.advance). Yields (SimActions, {hostname: Node}, StackState)."""
    base = free_port_range(3)
    fl = SimFleet(SimFleetSpec(nodes=3, gpus=4, base_port=base, engine_base_port=None, training_nodes=1,
                               tick_s=3600.0), TOKEN)
    fl.start()
    try:
        state = _state(tmp_path, fl, base)
        yield SimActions(state, timeout_s=5.0), {n.hostname: n for n in fl.nodes}, state
    finally:
        fl.stop()


def test_is_a_node_actions_and_views_every_node_with_its_pool(fleet):
    actions, nodes, _ = fleet
    for name in ("nodes", "view", "cordon", "uncordon", "drain", "act", "health_check"):  # the protocol's shape
        assert (list(inspect.signature(getattr(NodeActions, name)).parameters)[1:]
                == list(inspect.signature(getattr(actions, name)).parameters)), name
    views = actions.nodes()
    assert [(v.node, v.pool) for v in views] == [("gpu-node-00", "serving"), ("gpu-node-01", "serving"),
                                                 ("gpu-node-02", "training")]
    v = views[0]
    assert not v.cordoned and v.cordoned_by == "" and v.in_flight > 0 and v.boot_id == nodes[v.node].boot_id
    assert v.detail["draining"] is False and v.detail["rebooting"] is False and v.detail["engine_generation"] == 0
    assert views[2].in_flight == 1


def test_cordon_drain_and_in_flight_reaches_zero(fleet):
    actions, nodes, _ = fleet
    node = nodes["gpu-node-00"]
    actions.cordon("gpu-node-00", "XidCritical: Xid 48 on GPU 1")
    actions.cordon("gpu-node-00", "again")  # idempotent
    actions.drain("gpu-node-00")
    v = actions.view("gpu-node-00")
    assert v.cordoned and v.cordoned_by == "gpuobs" and v.detail["draining"] and v.detail["cordon_reason"] == "again"
    for _ in range(60):
        node.advance(1.0)
    assert actions.view("gpu-node-00").in_flight == 0
    actions.uncordon("gpu-node-00")
    actions.uncordon("gpu-node-00")
    v = actions.view("gpu-node-00")
    assert not v.cordoned and not v.detail["draining"]


def test_uncordon_leaves_a_human_cordon(fleet):
    actions, nodes, _ = fleet
    nodes["gpu-node-01"].cordon("human", "maintenance")
    actions.cordon("gpu-node-01", "Xid 79")
    assert actions.view("gpu-node-01").cordoned_by == "human"
    actions.uncordon("gpu-node-01")
    v = actions.view("gpu-node-01")
    assert v.cordoned and v.cordoned_by == "human" and v.detail["cordons"] == ["human"]


def test_training_drain_checkpoints_then_stops(fleet):
    actions, nodes, _ = fleet
    actions.cordon("gpu-node-02", "straggler")
    actions.drain("gpu-node-02")
    assert actions.view("gpu-node-02").in_flight == 1
    for _ in range(int(CHECKPOINT_S) + 1):
        nodes["gpu-node-02"].advance(1.0)
    assert actions.view("gpu-node-02").in_flight == 0


def test_reset_gpu_clears_xid48_and_fails_on_row_remap_failure(fleet):
    actions, nodes, _ = fleet
    node = nodes["gpu-node-00"]
    node.inject(FaultRequest("xid", 1, {"code": 48, "repeat_s": 0.0}))
    node.inject(FaultRequest("row-remap-failure", 2, {}))
    assert actions.health_check("gpu-node-00", 1) == HealthResult(
        False, ("GPU 1: Xid 48 (Double Bit ECC Error (uncorrectable))",))
    detail = actions.act("gpu-node-00", "reset-gpu", 1)
    assert "GPU 1 reset" in detail and "xid 48" in detail and "\n" not in detail
    assert actions.health_check("gpu-node-00", 1) == HealthResult(True, ())
    with pytest.raises(ActionError, match=r"^gpu-node-00: GPU 2 reset failed: row remap failure \(Xid 64\): RMA"):
        actions.act("gpu-node-00", "reset-gpu", 2)
    assert actions.health_check("gpu-node-00", None).failures == ("GPU 2: row remap failure (Xid 64)",)


def test_reboot_clears_xid79_and_health_check_has_no_verdict_meanwhile(fleet):
    actions, nodes, _ = fleet
    node = nodes["gpu-node-01"]
    node.inject(FaultRequest("xid", 3, {"code": 79, "repeat_s": 0.0}))
    assert not actions.health_check("gpu-node-01", None).passed
    with pytest.raises(ActionError, match="Xid 79"):
        actions.act("gpu-node-01", "reset-gpu", 3)
    boot = actions.view("gpu-node-01").boot_id
    assert boot in actions.act("gpu-node-01", "reboot", None)
    v = actions.view("gpu-node-01")
    assert v.detail["rebooting"] and v.in_flight == 0
    with pytest.raises(ActionError, match=r"gpu-node-01: health check failed: .*rebooting.*\(HTTP 409\)"):
        actions.health_check("gpu-node-01", None)
    node.advance(30.0)
    v = actions.view("gpu-node-01")
    assert not v.detail["rebooting"] and v.boot_id != boot
    assert actions.health_check("gpu-node-01", None) == HealthResult(True, ())


def test_restart_engine_ends_fragmentation_and_is_refused_on_training(fleet):
    actions, nodes, _ = fleet
    node = nodes["gpu-node-00"]
    node.inject(FaultRequest("fragmentation", 0, {"rate_mib_per_min": 1500.0}))
    assert "engine restarted (generation 1)" in actions.act("gpu-node-00", "restart-engine", None)
    assert node.list_faults() == [] and actions.view("gpu-node-00").detail["engine_generation"] == 1
    with pytest.raises(ActionError, match=r"gpu-node-02: restart-engine failed: .*training node.*\(HTTP 400\)"):
        actions.act("gpu-node-02", "restart-engine", None)


def test_bad_calls_raise_action_error(fleet):
    actions, _, _ = fleet
    with pytest.raises(ActionError, match="unknown node 'gpu-node-09'"):
        actions.view("gpu-node-09")
    with pytest.raises(ActionError, match="unknown action 'none'"):
        actions.act("gpu-node-00", "none", None)
    with pytest.raises(ActionError, match="unknown action 'explode'"):
        actions.act("gpu-node-00", "explode", None)
    with pytest.raises(ActionError, match="reset-gpu needs a GPU index"):
        actions.act("gpu-node-00", "reset-gpu", None)
    with pytest.raises(ActionError, match=r"0\.\.3.*\(HTTP 400\)"):
        actions.act("gpu-node-00", "reset-gpu", 7)
    with pytest.raises(ActionError, match="HTTP 400"):
        actions.health_check("gpu-node-00", 9)


def test_wrong_token_unreachable_node_and_missing_token_file(fleet, tmp_path):
    _, _, state = fleet
    with pytest.raises(ActionError, match=r"gpu-node-00: status query failed: missing or wrong bearer token \(HTTP 401\)"):
        SimActions(state, token="wrong").view("gpu-node-00")
    dead = dataclasses.replace(state, urls=dataclasses.replace(
        state.urls, nodes=[f"http://127.0.0.1:{free_port_range(1)}/metrics"] * 3))
    with pytest.raises(ActionError, match=r"gpu-node-00: cordon failed: cannot reach"):
        SimActions(dead, timeout_s=1.0).cordon("gpu-node-00", "x")
    with pytest.raises(ActionError, match="gpu-node-00"):
        SimActions(dead, timeout_s=1.0).nodes()
    with pytest.raises(ActionError, match="admin token"):
        SimActions(dataclasses.replace(state, token_file=str(tmp_path / "absent")))


def test_fleet_ticker_brings_a_rebooted_node_back(tmp_path):
    """The real fleet process: its ticker advances simulated time with the wall clock, so a reboot
    of 1 s ends by itself (reboot_s sets the downtime)."""
    from tests.polling import poll

    base = free_port_range(1)
    fl = SimFleet(SimFleetSpec(nodes=1, gpus=1, base_port=base, engine_base_port=None, tick_s=0.05), TOKEN)
    fl.start()
    try:
        actions = SimActions(_state(tmp_path, fl, base), reboot_s=1.0)
        boot = actions.view("gpu-node-00").boot_id
        assert "rebooting for 1 s" in actions.act("gpu-node-00", "reboot", None)
        assert actions.view("gpu-node-00").detail["rebooting"]
        poll("node back", lambda: not actions.view("gpu-node-00").detail["rebooting"], timeout_s=5, every_s=0.05)
        assert actions.view("gpu-node-00").boot_id != boot
    finally:
        fl.stop()
