"""The DCGM page: parses with prometheus_client, dcgm-exporter label order and value formatting."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.exposition import Family, label_string, render
from gpuobs.exporter.sim.faults import FaultRequest
from gpuobs.exporter.sim.node import Node, NodeConfig

DCGM_ORDER = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
REQUIRED = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]  # DCGM_FI_DEV_XID_ERRORS: only after an Xid (test below)


def page(node: Node, **kw) -> str:
    return render(DcgmCollector(node, **kw).collect())


def parse(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_page_parses_and_has_required_metrics_with_types():
    fams = parse(page(Node(NodeConfig(index=0, gpus=8, seed=3))))
    for name in REQUIRED:
        base = name
        assert base in fams or base.removesuffix("_TOTAL") in fams, name
    # prometheus_client strips _total from counter family names; the energy counter has no suffix.
    assert fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert fams["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    assert len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 8
    temps = [s.value for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples]
    assert all(30 <= t <= 90 for t in temps)
    powers = [s.value for s in fams["DCGM_FI_DEV_POWER_USAGE"].samples]
    assert all(70 <= p <= 700 for p in powers)


def test_label_order_matches_dcgm_exporter():
    text = page(Node(NodeConfig(index=2, gpus=2, seed=3)))
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_SM_CLOCK{"))
    names = [kv.split("=", 1)[0] for kv in line[line.index("{") + 1: line.index("}")].split('",')]
    assert names == DCGM_ORDER
    assert 'Hostname="gpu-node-02"' in line and 'device="nvidia0"' in line
    assert 'modelName="NVIDIA H100 80GB HBM3"' in line and 'pci_bus_id="00000000:18:00.0"' in line


def test_hostname_label_case_is_configurable():
    text = page(Node(NodeConfig(index=0, gpus=1)), host_label_mode="hostname")
    assert 'hostname="gpu-node-00"' in text and "Hostname=" not in text


def host_values(text: str) -> set[tuple[str, str]]:
    fam = parse(text)["DCGM_FI_DEV_GPU_TEMP"]
    return {(k, v) for s in fam.samples for k, v in s.labels.items() if k.lower() == "hostname"}


def test_host_label_modes_print_what_real_exporters_print():
    node = Node(NodeConfig(index=4, gpus=2, seed=3))
    assert host_values(page(node, host_label_mode="Hostname")) == {("Hostname", "gpu-node-04")}
    assert host_values(page(node, host_label_mode="localhost")) == {("Hostname", "localhost")}
    assert host_values(page(node, host_label_mode="none")) == set()
    ((name, pod),) = host_values(page(node, host_label_mode="pod"))
    assert name == "Hostname" and re.fullmatch(r"nvidia-dcgm-exporter-[bcdfghjklmnpqrstvwxz2456789]{5}", pod)
    other = Node(NodeConfig(index=5, gpus=2, seed=3))
    assert host_values(page(other, host_label_mode="pod")) != {(name, pod)}  # one pod per node
    # A replaced exporter pod has a new name; its page is gone for downtime_s meanwhile.
    node.inject(FaultRequest("exporter-restart", None, {"downtime_s": 5.0, "xid_state": "kept"}))
    assert node.exporter_unavailable
    node.advance(6.0)
    assert not node.exporter_unavailable
    ((_, new_pod),) = host_values(page(node, host_label_mode="pod"))
    assert new_pod != pod and new_pod.startswith("nvidia-dcgm-exporter-")
    with pytest.raises(ValueError, match="Hostname, hostname, localhost, pod, none"):
        page(node, host_label_mode="HOSTNAME")


@pytest.mark.parametrize("xid_state, after", [("kept", {"1": 48}), ("cleared", {})])
def test_exporter_restart_keeps_or_forgets_the_last_xid(xid_state, after):
    node = Node(NodeConfig(index=0, gpus=2))
    node.inject(FaultRequest("xid", 1, {"code": 48, "repeat_s": 0.0}))
    node.inject(FaultRequest("exporter-restart", None, {"downtime_s": 0.0, "xid_state": xid_state}))
    fams = parse(page(node))
    assert {s.labels["gpu"]: s.value for s in fams.get("DCGM_FI_DEV_XID_ERRORS", Family("", "", "")).samples} == after


def test_value_formatting_integers_plain_floats_six_decimals():
    text = page(Node(NodeConfig(index=0, gpus=1)))
    lines = {ln.split("{")[0]: ln.rsplit(" ", 1)[1] for ln in text.splitlines() if not ln.startswith("#")}
    assert lines["DCGM_FI_DEV_SM_CLOCK"].isdigit()
    assert lines["DCGM_FI_DEV_GPU_TEMP"].isdigit()
    power = lines["DCGM_FI_DEV_POWER_USAGE"]
    assert len(power.split(".")[1]) == 6
    assert len(lines["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].split(".")[1]) == 6


def test_uuids_and_bus_ids_stable_per_seed_and_differ_across_seeds():
    def ids(seed):
        n = Node(NodeConfig(index=0, gpus=4, seed=seed))
        return [(g.ident.uuid, g.ident.pci_bus_id) for g in n.gpus]
    assert ids(5) == ids(5)
    assert [u for u, _ in ids(5)] != [u for u, _ in ids(6)]
    assert all(u.startswith("GPU-") and len(u) == 40 for u, _ in ids(5))


def test_values_move_over_time():
    node = Node(NodeConfig(index=0, gpus=2, seed=9))
    before = [g.power_w for g in node.gpus]
    for _ in range(60):
        node.advance(1.0)
    after = [g.power_w for g in node.gpus]
    assert before != after


def xid_counts(fams: dict) -> list[tuple]:
    return [(s.labels["gpu"], s.labels.get("xid"), s.labels["window_size_in_ms"], s.value)
            for s in fams["DCGM_EXP_XID_ERRORS_COUNT"].samples]


@pytest.mark.parametrize("profile", ["stock", "helm", "recommended"])
def test_xid_gauge_is_absent_until_the_first_xid_then_holds_the_last_code(profile):
    """dcgm-exporter 4.4+/4.5.x (gpu_collector.go): no series before an Xid; then the last code with
    err_code and dcgm-exporter's err_msg text, held after the window has passed."""
    node = Node(NodeConfig(index=0, gpus=2, xid_window_ms=10_000))
    assert "DCGM_FI_DEV_XID_ERRORS" not in parse(page(node, profile=profile))
    node.inject(FaultRequest("xid", 1, {"code": 48, "repeat_s": 0.0}))
    fams = parse(page(node, profile=profile))
    xid = {s.labels["gpu"]: s for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert list(xid) == ["1"]
    assert xid["1"].value == 48 and xid["1"].labels["err_code"] == "48"
    assert xid["1"].labels["err_msg"] == "Double Bit ECC Error"
    node.inject(FaultRequest("xid", 1, {"code": 94, "repeat_s": 0.0}))
    fams = parse(page(node, profile=profile))
    assert [(s.labels["err_code"], s.value) for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples] == [("94", 94)]
    for _ in range(11):
        node.advance(1.0)
    fams = parse(page(node, profile=profile))
    assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples} == {"1": 94}  # never resets


def test_xid_count_window_and_its_zero_series_on_the_recommended_profile():
    """DCGM_EXP_XID_ERRORS_COUNT (expcollector.go): a GPU without an Xid in the window has one 0
    series without an ``xid`` label; stock and helm pages have no such family."""
    node = Node(NodeConfig(index=0, gpus=2, xid_window_ms=10_000))
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in parse(page(node))
    assert xid_counts(parse(page(node, profile="recommended"))) == [("0", None, "10000", 0), ("1", None, "10000", 0)]
    node.inject(FaultRequest("xid", 1, {"code": 48, "repeat_s": 0.0}))
    node.inject(FaultRequest("xid", 1, {"code": 48, "repeat_s": 0.0}))
    assert xid_counts(parse(page(node, profile="recommended"))) == [("0", None, "10000", 0), ("1", "48", "10000", 2)]
    for _ in range(11):
        node.advance(1.0)
    # the window moved past the events
    assert xid_counts(parse(page(node, profile="recommended"))) == [("0", None, "10000", 0), ("1", None, "10000", 0)]


def test_label_values_with_quotes_backslashes_newlines_round_trip():
    tricky = 'a "quoted" \\ back\nslash'
    text = render([Family("x_metric", "gauge", "help with \\ and\nnewline", False,
                          [(label_string([("k", tricky)]), 1.5)])])
    fam = parse(text)["x_metric"]
    assert fam.samples[0].labels["k"] == tricky
    assert fam.samples[0].value == 1.5
