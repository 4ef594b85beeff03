"""What Prometheus stores from simulated pages (gpuobs/exporter/scrape.py): the honor_labels merge
rule, and the stored shapes per scrape mode that promtool suites can be built from."""

from __future__ import annotations

import pytest

from gpuobs.exporter.scrape import (
    page_series,
    promtool_series,
    stored_labels,
    target_labels,
)
from gpuobs.exporter.sim import faults
from gpuobs.exporter.sim.node import Node, NodeConfig


def test_page_labels_that_clash_with_target_labels_become_exported():
    page = {"gpu": "0", "pod": "llama-0", "namespace": "serving", "container": "vllm", "empty": ""}
    target = {"job": "nvidia-dcgm-exporter", "pod": "nvidia-dcgm-exporter-x7k2p", "namespace": "gpu-operator",
              "container": "nvidia-dcgm-exporter", "node": "n1"}
    assert stored_labels(page, target) == {
        "gpu": "0", "job": "nvidia-dcgm-exporter", "node": "n1", "pod": "nvidia-dcgm-exporter-x7k2p",
        "namespace": "gpu-operator", "container": "nvidia-dcgm-exporter", "exported_pod": "llama-0",
        "exported_namespace": "serving", "exported_container": "vllm"}
    # equal values clash too; an exported_ name already taken gets another prefix; honor_labels keeps the page's
    assert stored_labels({"instance": "a", "exported_instance": "b"}, {"instance": "a"}) == {
        "instance": "a", "exported_instance": "b", "exported_exported_instance": "a"}
    assert stored_labels({"pod": "p"}, {"pod": "t", "job": "j"}, honor_labels=True) == {"pod": "p", "job": "j"}


def test_file_sd_shape_has_node_and_the_page_hostname():
    node = Node(NodeConfig(index=2, gpus=1, seed=3))
    temps = [lb for n, lb, _ in page_series(node) if n == "DCGM_FI_DEV_GPU_TEMP"]
    assert temps == [{"gpu": "0", "UUID": node.gpus[0].ident.uuid, "pci_bus_id": "00000000:18:00.0",
                      "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-02",
                      "DCGM_FI_DRIVER_VERSION": "550.54.15", "job": "dcgm", "instance": "127.0.0.1:9400",
                      "node": "gpu-node-02"}]
    names = {n for n, _, _ in page_series(node)}
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in names and "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in names  # as written
    engine = {n for n, lb, _ in page_series(node, "vllm", address="127.0.0.1:8000") if lb.get("Hostname") == "gpu-node-02"}
    assert "vllm:num_requests_running" in engine


def test_servicemonitor_shape_with_pod_host_labels_and_pod_churn():
    node = Node(NodeConfig(index=1, gpus=1, seed=3))
    before = next(lb for n, lb, _ in page_series(node, scrape_mode="servicemonitor", host_label_mode="pod")
                  if n == "DCGM_FI_DEV_GPU_TEMP")
    assert before["job"] == "nvidia-dcgm-exporter" and before["node"] == "gpu-node-01"
    assert before["Hostname"] == before["pod"] == node.exporter_pod
    assert before["exported_namespace"] == "serving" and before["exported_pod"].startswith("vllm-engine-")
    node.inject(faults.validate({"kind": "exporter-restart", "downtime_s": 0}, 1))
    after = next(lb for n, lb, _ in page_series(node, scrape_mode="servicemonitor", host_label_mode="pod")
                 if n == "DCGM_FI_DEV_GPU_TEMP")
    assert after["Hostname"] == after["pod"] != before["pod"]
    assert {k: v for k, v in after.items() if k not in ("Hostname", "pod")} == {
        k: v for k, v in before.items() if k not in ("Hostname", "pod")}


def test_no_host_label_mode_leaves_only_the_target_identity():
    node = Node(NodeConfig(index=0, gpus=1))
    labels = next(lb for n, lb, _ in page_series(node, host_label_mode="none") if n == "DCGM_FI_DEV_GPU_TEMP")
    assert "Hostname" not in labels and "hostname" not in labels and labels["node"] == "gpu-node-00"


def test_promtool_series_spelling_and_errors():
    assert promtool_series("up", {"job": "x", "a": 'q"\\'}) == 'up{a="q\\"\\\\",job="x"}'
    with pytest.raises(ValueError, match="file_sd, servicemonitor"):
        target_labels("dcgm", "static", "n", "a")
    with pytest.raises(ValueError, match="dcgm or vllm"):
        page_series(Node(NodeConfig(index=0, gpus=1)), "nvml")
