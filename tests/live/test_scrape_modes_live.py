"""Live: a stock-profile fleet scraped the kube-prometheus way (servicemonitor scrape mode, host label =
the exporter pod's name), through the real Prometheus: what a real GPU Operator fleet stores.

Checks what gpuobs's rules must live with: `job` is the Service name, the target's `pod` is the
exporter pod, the page's own pod/namespace/container arrive as exported_*, `node` comes from the
relabelling, Hostname is the exporter pod's name, and both change when the exporter pod is replaced.
"""

from __future__ import annotations

import time

import pytest
import requests

from gpuobs.exporter.scrape import promtool_series, stored_series
from gpuobs.promapi.exporter_admin import AdminClient
from tests.conftest import live_stack

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from live_stack(tmp_path_factory, "sm-run", nodes=2, gpus=1, training_nodes=1, timeout_s=90,
                          scrape_mode="servicemonitor", host_label_mode="pod")


def query(stack, expr: str) -> list[dict]:
    r = requests.get(f"{stack.urls.prometheus}/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    return [s["metric"] for s in r.json()["data"]["result"]]


def wait_for(stack, expr: str, ok, deadline_s: float = 40.0) -> list[dict]:
    deadline, got = time.monotonic() + deadline_s, []
    while time.monotonic() < deadline:
        got = query(stack, expr)
        if ok(got):
            return got
        time.sleep(1.0)
    raise AssertionError(f"{expr}: still {got}")


def test_targets_and_series_carry_kube_prometheus_labels(stack):
    assert (stack.exporter_profile, stack.scrape_mode, stack.host_label_mode) == ("stock", "servicemonitor", "pod")
    up = wait_for(stack, 'up{job="nvidia-dcgm-exporter"} == 1', lambda r: len(r) == 2)
    assert {m["node"] for m in up} == {"gpu-node-00", "gpu-node-01"}
    assert all(m["namespace"] == "gpu-operator" and m["pod"].startswith("nvidia-dcgm-exporter-") for m in up)
    engines = wait_for(stack, 'up{job="vllm-engine"} == 1', lambda r: len(r) == 1)
    assert engines[0]["node"] == "gpu-node-00" and "Hostname" not in engines[0]
    temps = wait_for(stack, "DCGM_FI_DEV_GPU_TEMP", lambda r: len(r) == 2)
    by_node = {m["node"]: m for m in temps}
    serving, training = by_node["gpu-node-00"], by_node["gpu-node-01"]
    # the page's pod labels (the workload owning the GPU) are renamed; the target's win
    assert (serving["exported_namespace"], serving["exported_container"]) == ("serving", "vllm")
    assert serving["exported_pod"].startswith("vllm-engine-")
    assert (training["exported_namespace"], training["exported_pod"]) == ("training", "llama3-70b-pretrain-worker-1")
    # Hostname is the exporter pod, the same name the target's pod label has
    assert all(m["Hostname"] == m["pod"] for m in temps)
    assert not query(stack, '{__name__=~"gpuobs_.*|pytorch_.*", job="nvidia-dcgm-exporter"}')  # stock page


def test_the_stored_shapes_predicted_by_gpuobs_exporter_scrape_are_what_prometheus_stores(stack):
    """gpuobs.exporter.scrape (used to build promtool series) merges target and page labels exactly
    like the real Prometheus: same label sets for every series of both DCGM pages and the engine page."""
    targets = requests.get(f"{stack.urls.prometheus}/api/v1/targets", params={"state": "active"}, timeout=5).json()
    checked = 0
    for t in targets["data"]["activeTargets"]:
        if t["scrapePool"] == "prometheus":
            continue
        page = requests.get(t["scrapeUrl"], timeout=5).text
        want = {promtool_series(n, lb) for n, lb, _ in stored_series(page, t["labels"])}
        got = {promtool_series(m.pop("__name__"), m)
               for m in query(stack, f'{{instance="{t["labels"]["instance"]}", job="{t["labels"]["job"]}"}}')
               if m["__name__"] in {n for n, _, _ in stored_series(page, t["labels"])}}
        assert got == want, t["labels"]
        checked += len(want)
    assert checked > 50


def test_a_replaced_exporter_pod_changes_hostname_and_the_target_pod(stack):
    old = {m["node"]: m["pod"] for m in query(stack, 'up{job="nvidia-dcgm-exporter"}')}
    admin = AdminClient(stack.urls.node_bases[0], stack.token())
    # A downtime longer than the file_sd refresh (5 s), as in Kubernetes where the new pod is a new
    # endpoint: the new page is never scraped under the old pod's target.
    admin.inject({"kind": "exporter-restart", "downtime_s": 8.0})
    got = wait_for(stack, 'DCGM_FI_DEV_GPU_TEMP{node="gpu-node-00"}',
                   lambda r: len(r) == 1 and r[0]["Hostname"] != old["gpu-node-00"])
    assert got[0]["Hostname"] == got[0]["pod"] and got[0]["pod"].startswith("nvidia-dcgm-exporter-")
    after = {m["node"]: m["pod"] for m in query(stack, 'up{job="nvidia-dcgm-exporter"}')}
    assert after["gpu-node-01"] == old["gpu-node-01"]
