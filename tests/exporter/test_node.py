"""Simulated node physics and fault effects, driven by advancing simulated time (no sleeps)."""

from __future__ import annotations

from gpuobs.exporter.sim.faults import FaultRequest
from gpuobs.exporter.sim.gpu import HW_SLOWDOWN, SW_THERMAL
from gpuobs.exporter.sim.node import Node, NodeConfig


def run(node: Node, seconds: int) -> None:
    for _ in range(seconds):
        node.advance(1.0)


def test_energy_counter_is_the_integral_of_power():
    node = Node(NodeConfig(index=0, gpus=1, seed=2))
    g = node.gpus[0]
    e0 = g.energy_mj
    integral = 0.0
    for _ in range(300):
        node.advance(1.0)
        integral += g.power_w * 1000.0  # W * 1 s = J; x1000 = mJ
    assert abs((g.energy_mj - e0) - integral) < 1e-6 * integral


def test_xid79_removes_gpu_until_cleared_and_logs_kernel_line():
    node = Node(NodeConfig(index=0, gpus=4))
    f = node.inject(FaultRequest("xid", 2, {"code": 79, "repeat_s": 0.0}))
    assert [g.present for g in node.gpus] == [True, True, False, True]
    # The driver's lines (open-gpu-kernel-modules 595.45.04): the UUID line once, Xid 79 without a
    # process context, then osinit.c's "GPU has fallen off the bus." line.
    assert [line.split("] ", 1)[1] for line in node.kernel_log[-3:]] == [
        f"NVRM: GPU at PCI:0000:3a:00: {node.gpus[2].ident.uuid}",
        "NVRM: Xid (PCI:0000:3a:00): 79, GPU has fallen off the bus.",
        "NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus."]
    # DCGM never sees a 79 (DCGM #162): neither while the GPU is gone nor once it is back.
    node.clear(f.id)
    assert all(g.present for g in node.gpus)
    assert node.gpus[2].last_xid is None and node.gpus[2].xid_counts() == {}


def test_repeating_xid_refires_while_active_and_stops_after_clear():
    node = Node(NodeConfig(index=0, gpus=2, xid_window_ms=60_000))
    f = node.inject(FaultRequest("xid", 0, {"code": 48, "repeat_s": 10.0}))
    run(node, 30)
    assert node.gpus[0].xid_counts() == {48: 4}  # t=0, 10, 20, 30
    node.clear(f.id)
    run(node, 30)
    assert node.gpus[0].xid_counts() == {48: 3}  # no new events; the oldest one aged out
    assert node.gpus[1].xid_counts() == {}


def test_thermal_fault_throttles_only_the_faulted_gpu():
    node = Node(NodeConfig(index=0, gpus=4, seed=11))
    healthy_clock = node.gpus[1].sm_clock_mhz
    node.inject(FaultRequest("thermal", 1, {"cooling_factor": 3.0}))
    hot = node.gpus[1]
    peak = 0.0
    for _ in range(60):
        node.advance(1.0)
        peak = max(peak, hot.temp_c)
    assert peak >= hot.model.slowdown_temp_c  # past slowdown within 60 simulated seconds
    clocks = []
    for _ in range(120):
        node.advance(1.0)
        clocks.append(hot.sm_clock_mhz)
    assert sum(clocks) / len(clocks) <= 0.8 * healthy_clock  # governor settled at least 20% lower
    assert hot.clock_event_reasons & SW_THERMAL
    assert hot.thermal_violation_ns > 10e9
    for i in (0, 2, 3):
        g = node.gpus[i]
        assert g.temp_c < g.model.slowdown_temp_c and g.thermal_violation_ns == 0
        assert not g.clock_event_reasons & (SW_THERMAL | HW_SLOWDOWN)


def test_down_fault_is_node_wide():
    node = Node(NodeConfig(index=0, gpus=2))
    f = node.inject(FaultRequest("down", None, {}))
    assert node.down
    node.clear(f.id)
    assert not node.down
