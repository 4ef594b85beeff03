"""Node actions of the simulator (cordon, drain, GPU reset, reboot, engine restart, diag), on the Node
(simulated time driven with Node.advance, no sleeps) and through POST /admin/node."""

from __future__ import annotations

import pytest
import requests

from gpuobs.exporter.sim.actions import NodeActionError, NodeStateError
from gpuobs.exporter.sim.faults import FaultRequest
from gpuobs.exporter.sim.node import CHECKPOINT_S, Node, NodeConfig
from tests.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def run(node: Node, seconds: float, step: float = 1.0) -> None:
    for _ in range(int(seconds / step)):
        node.advance(step)


def xid(gpu: int, code: int) -> FaultRequest:
    return FaultRequest("xid", gpu, {"code": code, "repeat_s": 0.0})


def kinds(node: Node) -> list[tuple[str, int | None]]:
    return [(f["kind"], f["gpu"]) for f in node.list_faults()]


# ---- cordon / drain ---------------------------------------------------------------------------------
def test_cordon_stops_arrivals_and_in_flight_drains_to_zero():
    node = Node(NodeConfig(index=0, gpus=2, seed=3))
    before = node.in_flight
    assert before > 5
    finished = sum(node.engine.finished.values())
    st = node.cordon("gpuobs", "Xid 48 on GPU 1")
    assert st["cordoned"] and st["cordoned_by"] == "gpuobs" and st["cordon_reason"] == "Xid 48 on GPU 1"
    tau = node.engine._service_s(1.0, node.profile)
    run(node, tau, step=tau / 10)
    assert 0.3 * before < node.in_flight < 0.45 * before  # exponential decay, time constant = service time
    run(node, 8 * tau)
    assert node.in_flight == 0 and node.status()["in_flight"] == 0
    assert sum(node.engine.finished.values()) == finished  # no new arrivals were served
    assert max(g.activity for g in node.gpus) < 0.01  # the GPUs went idle with the traffic
    node.uncordon("gpuobs")
    run(node, 2)
    assert node.in_flight > 5 and sum(node.engine.finished.values()) > finished


def test_human_cordon_is_not_removed_by_gpuobs_uncordon():
    node = Node(NodeConfig(index=0, gpus=1))
    node.cordon("human")
    node.cordon("gpuobs")
    assert node.status()["cordoned_by"] == "human" and node.status()["cordons"] == ["gpuobs", "human"]
    st = node.uncordon("gpuobs")
    assert st["cordoned"] and st["cordoned_by"] == "human"
    assert node.uncordon("gpuobs")["cordoned"]  # idempotent, still the human's
    st = node.uncordon("human")
    assert not st["cordoned"] and st["cordoned_by"] == ""
    node.cordon("gpuobs")
    assert not node.uncordon("human")["cordoned"]  # a human uncordon removes any cordon
    with pytest.raises(NodeActionError) as exc:
        node.cordon("robot")
    assert exc.value.field == "by"


def test_drain_on_serving_stops_traffic_without_cordon_and_uncordon_ends_it():
    node = Node(NodeConfig(index=0, gpus=1))
    st = node.drain()
    assert st["draining"] and not st["cordoned"]
    run(node, 60)
    assert node.in_flight == 0
    node.cordon("gpuobs")
    assert node.drain()["draining"]  # idempotent
    node.uncordon("gpuobs")
    assert not node.status()["draining"]
    run(node, 2)
    assert node.in_flight > 0


def test_training_cordon_keeps_running_drain_checkpoints_then_stops():
    node = Node(NodeConfig(index=0, gpus=2, role="training"))
    node.cordon("gpuobs")
    steps = node.training.steps
    run(node, 10)
    assert node.training.steps > steps and node.in_flight == 1  # cordon alone does not stop the job
    st = node.drain()
    assert st["checkpointing"] and st["in_flight"] == 1
    run(node, CHECKPOINT_S - 1)
    assert node.in_flight == 1
    run(node, 2)
    st = node.status()
    assert st["in_flight"] == 0 and st["training_stopped"] and not st["checkpointing"]
    steps = node.training.steps
    run(node, 10)
    assert node.training.steps == steps and node.training.mfu == [0.0, 0.0]
    node.uncordon("gpuobs")
    run(node, 5)
    assert node.training.steps > steps and node.in_flight == 1


def test_hung_training_job_cannot_finish_its_checkpoint():
    node = Node(NodeConfig(index=0, gpus=2, role="training"))
    f = node.inject(FaultRequest("collective-hang", None, {}))
    node.drain()
    run(node, 60)
    assert node.in_flight == 1 and node.status()["checkpointing"]
    node.clear(f.id)
    run(node, CHECKPOINT_S + 1)
    assert node.in_flight == 0


# ---- GPU reset ------------------------------------------------------------------------------------------
def test_reset_clears_xid48_and_ecc_dbe_and_restarts_the_engine():
    node = Node(NodeConfig(index=0, gpus=4))
    node.inject(xid(1, 48))
    node.inject(FaultRequest("ecc-dbe", 1, {"count": 2, "repeat_s": 0.0}))
    node.inject(FaultRequest("nvlink-errors", 1, {"rate_per_s": 50.0}))
    node.inject(FaultRequest("pcie-replay", 1, {"rate_per_s": 5.0}))
    node.inject(xid(2, 48))
    run(node, 5)
    g = node.gpus[1]
    assert g.row_remap_pending == 1 and g.xid_counts() and g.last_xid is not None
    served = node.engine.finished["stop"]
    ok, detail = node.reset_gpu(1)
    assert ok, detail
    assert "GPU 1 reset" in detail and "ecc-dbe" in detail and "row remap activated" in detail
    assert kinds(node) == [("pcie-replay", 1), ("xid", 2)]  # a link fault stays; other GPUs untouched
    assert g.row_remap_pending == 0 and g.last_xid is None and g.xid_counts() == {}
    assert node.gpus[2].xid_counts() == {48: 1}
    assert node.engine_generation == 1 and node.engine.finished["stop"] == 0 < served
    run(node, 2)
    assert g.nvlink_error_rate == 0 and node.engine.finished["stop"] > 0


@pytest.mark.parametrize("fault, fragment", [
    (FaultRequest("row-remap-failure", 0, {}), "row remap failure (Xid 64): RMA path"),
    (xid(0, 79), "fallen off the bus (Xid 79): reboot the node (RESTART_BM)"),
    (FaultRequest("thermal", 0, {"cooling_factor": 3.0}), "thermal"),
    (FaultRequest("power-brake", 0, {"clock_factor": 0.6}), "power brake"),
])
def test_reset_fails_on_non_resettable_faults_and_keeps_them(fault, fragment):
    node = Node(NodeConfig(index=0, gpus=2))
    node.inject(fault)
    node.inject(xid(0, 48))
    before = node.list_faults()
    ok, detail = node.reset_gpu(0)
    assert not ok and fragment in detail and detail.startswith("GPU 0 reset failed")
    assert node.list_faults() == before and node.engine_generation == 0
    assert node.reset_gpu(1)[0]  # the other GPU resets fine


def test_reset_rejects_a_bad_index_and_a_rebooting_node():
    node = Node(NodeConfig(index=0, gpus=2))
    with pytest.raises(NodeActionError) as exc:
        node.reset_gpu(2)
    assert exc.value.field == "gpu"
    node.reboot(10)
    with pytest.raises(NodeStateError, match="rebooting"):
        node.reset_gpu(0)


# ---- reboot -------------------------------------------------------------------------------------------
def test_reboot_clears_xid79_with_new_boot_id_and_is_down_meanwhile():
    node = Node(NodeConfig(index=0, gpus=4))
    node.inject(xid(2, 79))
    node.inject(xid(0, 48))
    node.inject(FaultRequest("row-remap-failure", 3, {}))
    node.inject(FaultRequest("fragmentation", 1, {"rate_mib_per_min": 1500.0}))
    node.cordon("gpuobs")
    boot, log_len = node.boot_id, len(node.kernel_log)
    assert log_len > 0 and not node.gpus[2].present
    detail = node.reboot(30)
    assert boot in detail
    st = node.status()
    assert st["rebooting"] and st["down"] and st["reboot_remaining_s"] == 30
    assert node.engine_down and node.exporter_unavailable and st["in_flight"] == 0
    run(node, 29)
    assert node.rebooting and node.boot_id == boot
    run(node, 1)
    st = node.status()
    assert not st["rebooting"] and not st["down"] and st["boot_id"] != boot
    assert node.kernel_log == [] and all(g.present for g in node.gpus)
    assert all(g.last_xid is None and g.xid_counts() == {} for g in node.gpus)
    assert kinds(node) == [("row-remap-failure", 3)]  # persistent hardware fault survives
    assert node.gpus[3].row_remap_failure == 1
    assert st["cordoned"] and st["cordoned_by"] == "gpuobs"  # cordon survives the reboot
    assert st["engine_generation"] == 1
    assert not node.reset_gpu(3)[0]  # still the RMA path


def test_reboot_is_idempotent_while_rebooting_and_zero_downtime_boots_at_once():
    node = Node(NodeConfig(index=0, gpus=1))
    node.reboot(20)
    run(node, 10)
    assert "already rebooting" in node.reboot(20)
    run(node, 10)
    assert not node.rebooting
    boot = node.boot_id
    node.reboot(0)
    assert not node.rebooting and node.boot_id != boot
    with pytest.raises(NodeActionError):
        node.reboot(-1)


def test_reboot_clears_down_fault_and_kept_drained_training_rank_stopped():
    node = Node(NodeConfig(index=0, gpus=1, role="training"))
    node.inject(FaultRequest("down", None, {}))
    node.drain()
    node.reboot(5)
    run(node, 6)
    st = node.status()
    assert not st["down"] and node.list_faults() == [] and st["training_stopped"] and st["in_flight"] == 0


# ---- engine restart -----------------------------------------------------------------------------------
def test_restart_engine_ends_fragmentation_and_kv_pressure():
    node = Node(NodeConfig(index=0, gpus=2))
    node.inject(FaultRequest("fragmentation", 0, {"rate_mib_per_min": 6000.0}))
    node.inject(FaultRequest("kv-pressure", None, {"factor": 3.0}))
    node.inject(xid(1, 48))
    run(node, 60)
    alloc = node.gpus[0].alloc
    assert alloc.gap > 4 * alloc.base_gap and node.kv_factor == 3.0
    detail = node.restart_engine()
    assert "generation 1" in detail and "ended" in detail
    assert kinds(node) == [("xid", 1)]
    assert alloc.gap == alloc.base_gap and node.kv_factor == 1.0 and node.gpus[0].frag_bytes_per_s == 0
    assert node.engine.finished == dict.fromkeys(node.engine.finished, 0)
    run(node, 60)
    assert alloc.gap == alloc.base_gap


def test_restart_engine_refused_on_training_and_without_a_gpu():
    training = Node(NodeConfig(index=0, gpus=1, role="training"))
    with pytest.raises(NodeActionError) as exc:
        training.restart_engine()
    assert exc.value.field == "action" and "training node" in str(exc.value)
    serving = Node(NodeConfig(index=0, gpus=2))
    serving.inject(xid(1, 79))
    with pytest.raises(NodeStateError, match="fell off the bus"):
        serving.restart_engine()


# ---- diag ---------------------------------------------------------------------------------------------
def test_diag_passes_on_a_healthy_node_and_names_each_failure():
    node = Node(NodeConfig(index=0, gpus=8))
    assert node.diag() == {"passed": True, "failures": []}
    node.inject(FaultRequest("row-remap-failure", 3, {}))
    node.inject(xid(1, 48))
    node.inject(xid(1, 13))  # warning severity: an application error, not hardware
    node.inject(xid(2, 79))
    node.inject(FaultRequest("ecc-dbe", 4, {"count": 1, "repeat_s": 0.0}))
    node.inject(FaultRequest("nvlink-errors", 5, {"rate_per_s": 50.0}))
    node.inject(FaultRequest("pcie-replay", 6, {"rate_per_s": 20.0}))
    node.inject(FaultRequest("power-brake", 7, {"clock_factor": 0.6}))
    node.inject(FaultRequest("thermal", 0, {"cooling_factor": 3.0}))
    out = node.diag()
    assert not out["passed"]
    f = out["failures"]
    assert "GPU 3: row remap failure (Xid 64)" in f
    assert "GPU 1: Xid 48 (Double Bit ECC Error (uncorrectable))" in f
    assert "GPU 2: not found on the PCIe bus (Xid 79: fallen off the bus)" in f
    assert any(s.startswith("GPU 4: uncorrectable ECC errors") for s in f)
    assert "GPU 5: NVLink CRC errors (50/s)" in f and "GPU 6: PCIe replays (20/s)" in f
    assert "GPU 7: power brake asserted (HW_POWER_BRAKE)" in f
    assert any(s.startswith("GPU 0: thermal") for s in f)
    assert len(f) == 8 and not any("13" in s for s in f)
    assert node.diag(3) == {"passed": False, "failures": ["GPU 3: row remap failure (Xid 64)"]}
    node2 = Node(NodeConfig(index=1, gpus=2))
    assert node2.diag(1)["passed"]
    with pytest.raises(NodeActionError):
        node2.diag(5)
    node2.inject(FaultRequest("down", None, {}))
    with pytest.raises(NodeStateError, match="down"):
        node2.diag()


# ---- admin API ----------------------------------------------------------------------------------------
def act(url: str, body, headers=AUTH):
    return requests.post(f"{url}/admin/node", json=body, headers=headers, timeout=5)


def test_admin_node_status_and_cordon_round_trip(node_server):
    url, node = node_server
    r = requests.get(f"{url}/admin/node", headers=AUTH, timeout=5)
    assert r.status_code == 200
    st = r.json()
    assert st["hostname"] == node.hostname and st["role"] == "serving" and st["boot_id"] == node.boot_id
    assert set(st) >= {"cordoned", "cordoned_by", "draining", "in_flight", "rebooting", "engine_generation"}
    r = act(url, {"action": "cordon"})  # by defaults to human
    assert r.status_code == 200 and r.json()["cordoned_by"] == "human"
    assert act(url, {"action": "uncordon", "by": "gpuobs"}).json()["cordoned"]
    r = act(url, {"action": "cordon", "by": "gpuobs", "reason": "Xid 79"})
    assert r.json()["cordons"] == ["gpuobs", "human"]
    assert not act(url, {"action": "uncordon", "by": "human"}).json()["cordoned"]
    assert act(url, {"action": "drain"}).json()["draining"]
    assert requests.get(f"{url}/admin/node", timeout=5).status_code == 401
    assert act(url, {"action": "cordon"}, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert not node.cordoned


def test_admin_reset_reboot_restart_diag(node_server):
    url, node = node_server
    fid = requests.post(f"{url}/admin/faults", json={"kind": "xid", "gpu": 2, "code": 48}, headers=AUTH,
                        timeout=5).json()["id"]
    requests.post(f"{url}/admin/faults", json={"kind": "row-remap-failure", "gpu": 3}, headers=AUTH, timeout=5)
    r = act(url, {"action": "diag", "gpu": 2})
    assert r.status_code == 200 and r.json() == {"passed": False, "failures": [
        "GPU 2: Xid 48 (Double Bit ECC Error (uncorrectable))"]}
    r = act(url, {"action": "reset-gpu", "gpu": 2})
    assert r.status_code == 200 and r.json()["ok"] and "xid 48" in r.json()["detail"]
    faults = requests.get(f"{url}/admin/faults", headers=AUTH, timeout=5).json()["faults"]
    assert fid not in [f["id"] for f in faults] and len(faults) == 1
    r = act(url, {"action": "reset-gpu", "gpu": 3})
    assert r.status_code == 200 and r.json()["ok"] is False and "RMA" in r.json()["detail"]
    assert act(url, {"action": "diag"}).json() == {"passed": False, "failures": ["GPU 3: row remap failure (Xid 64)"]}
    r = act(url, {"action": "restart-engine"})
    assert r.status_code == 200 and r.json()["engine_generation"] == 2 and "restarted" in r.json()["detail"]
    boot = node.boot_id
    r = act(url, {"action": "reboot", "downtime_s": 15})
    assert r.status_code == 200 and r.json()["rebooting"] and boot in r.json()["detail"]
    with pytest.raises(requests.ConnectionError):  # scrapes fail while it is down
        requests.get(f"{url}/metrics", timeout=5)
    r = act(url, {"action": "diag"})
    assert r.status_code == 409 and "rebooting" in r.json()["error"]
    assert act(url, {"action": "restart-engine"}).status_code == 409
    assert act(url, {"action": "reset-gpu", "gpu": 0}).status_code == 409
    node.advance(15.0)
    st = requests.get(f"{url}/admin/node", headers=AUTH, timeout=5).json()
    assert not st["rebooting"] and st["boot_id"] != boot
    assert requests.get(f"{url}/admin/kernel-log", headers=AUTH, timeout=5).headers["X-Boot-Id"] == st["boot_id"]
    assert requests.get(f"{url}/metrics", timeout=5).status_code == 200


@pytest.mark.parametrize("body, field, fragment", [
    ({"action": "explode"}, "action",
     "must be one of cordon, uncordon, drain, reset-gpu, reboot, restart-engine, diag, install-driver; got 'explode'"),
    ({}, "action", "must be one of"),
    ([1], "body", "JSON object"),
    ({"action": "cordon", "by": "robot"}, "by", "gpuobs, human"),
    ({"action": "reset-gpu"}, "gpu", "required"),
    ({"action": "reset-gpu", "gpu": 4}, "gpu", "0..3"),
    ({"action": "reset-gpu", "gpu": True}, "gpu", "integer GPU index"),
    ({"action": "diag", "gpu": "1"}, "gpu", "integer GPU index"),
    ({"action": "reboot", "downtime_s": -1}, "downtime_s", "between 0 and 3600"),
    ({"action": "reboot", "downtime_s": "soon"}, "downtime_s", "number of seconds"),
    ({"action": "reboot", "gpu": 1}, "gpu", "allowed fields: action, downtime_s"),
    ({"action": "drain", "by": "gpuobs"}, "by", "allowed fields: action, reason"),
    ({"action": "cordon", "reason": 5}, "reason", "string"),
])
def test_bad_node_actions_get_400_naming_the_field(node_server, body, field, fragment):
    url, node = node_server
    r = act(url, body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and fragment in r.json()["error"]
    assert not node.cordoned and not node.rebooting


def test_admin_bad_json_and_infinite_downtime_are_400(node_server):
    url, _ = node_server
    r = requests.post(f"{url}/admin/node", data=b"{nope", headers=AUTH, timeout=5)
    assert r.status_code == 400 and r.json()["field"] == "body"
    r = requests.post(f"{url}/admin/node", data=b'{"action": "reboot", "downtime_s": Infinity}', headers=AUTH,
                      timeout=5)
    assert r.status_code == 400 and r.json()["field"] == "downtime_s"


def test_restart_engine_on_training_node_is_400(tmp_path):
    import threading

    from gpuobs.exporter.collectors.dcgm import DcgmCollector
    from gpuobs.exporter.server import NodeServer

    node = Node(NodeConfig(index=2, gpus=2, role="training"))
    srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        r = act(url, {"action": "restart-engine"})
        assert r.status_code == 400 and r.json()["field"] == "action" and "training node" in r.json()["error"]
        assert act(url, {"action": "drain"}).json()["checkpointing"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_engine_port_has_no_node_route(node_server):
    import threading

    from gpuobs.exporter.collectors.vllm import EngineCollector
    from gpuobs.exporter.server import NodeServer

    _, node = node_server
    srv = NodeServer(("127.0.0.1", 0), node, TOKEN, EngineCollector(node), admin=False)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert requests.get(f"{url}/admin/node", headers=AUTH, timeout=5).status_code == 404
        assert act(url, {"action": "cordon"}).status_code == 404
        node.restart_engine()  # the engine page follows the node's new engine
        assert "vllm:request_success_total" in requests.get(f"{url}/metrics", timeout=5).text
    finally:
        srv.shutdown()
        srv.server_close()


def test_hostile_node_action_bodies_never_get_500(node_server):
    """Mutated bodies (hostile values, dropped and added keys) are answered 200, 400, 409 or 413."""
    import json
    import random

    from tests.faults import fuzz

    url, node = node_server
    rng = random.Random("node-actions")
    templates = [{"action": "cordon", "by": "gpuobs", "reason": "x"}, {"action": "reset-gpu", "gpu": 1},
                 {"action": "reboot", "downtime_s": 0}, {"action": "diag", "gpu": 0}, {"action": "drain"}]
    seen = set()
    for _ in range(200):
        body = json.dumps(fuzz.mutate_json(rng.choice(templates), rng)).encode()
        r = requests.post(f"{url}/admin/node", data=body, headers=AUTH, timeout=5)
        assert r.status_code in (200, 400, 409, 413), (body[:200], r.text)
        assert "error" in r.json() if r.status_code >= 400 else True
        seen.add(r.status_code)
    assert {200, 400} <= seen
    assert requests.get(f"{url}/admin/node", headers=AUTH, timeout=5).status_code == 200
