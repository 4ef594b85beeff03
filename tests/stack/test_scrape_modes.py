"""Scrape modes of the native stack: file_sd (gpuobs's targets, label `node`) and servicemonitor
(targets labelled the way a kube-prometheus ServiceMonitor scrape labels them, plus gpuobs's `node`)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from gpuobs.exporter.sim import k8s
from gpuobs.exporter.sim.identity import exporter_pod_name
from gpuobs.stack import supervisor
from gpuobs.stack.render import Ports, render_prometheus, scrape_pools
from gpuobs.stack.state import StackState, StackUrls

NODES = [("gpu-node-00", 9400), ("gpu-node-01", 9401)]
ENGINES = [("gpu-node-00", 8000)]


def targets(run, job):
    return json.loads((run / "prometheus" / "targets" / f"{job}-nodes.json").read_text())


def test_file_sd_targets_carry_node_and_the_classic_jobs(tmp_path):
    cfg = yaml.safe_load(render_prometheus(tmp_path, Ports(), NODES, ENGINES, "http://x").read_text())
    assert [sc["job_name"] for sc in cfg["scrape_configs"]][:2] == ["dcgm", "vllm"] == list(scrape_pools())
    assert targets(tmp_path, "dcgm")[0] == {"targets": ["127.0.0.1:9400"], "labels": {"node": "gpu-node-00"}}
    assert targets(tmp_path, "vllm")[0]["labels"] == {"node": "gpu-node-00", "Hostname": "gpu-node-00"}


def test_servicemonitor_targets_look_like_kube_prometheus_plus_node(tmp_path):
    pods = {h: (exporter_pod_name(1, i), k8s.engine_pod_name(1, i)) for i, (h, _) in enumerate(NODES)}
    path = render_prometheus(tmp_path, Ports(), NODES, ENGINES, "http://x", scrape_mode="servicemonitor", pods=pods)
    cfg = yaml.safe_load(path.read_text())
    pools = [sc["job_name"] for sc in cfg["scrape_configs"]][:2]
    assert pools == ["serviceMonitor/gpu-operator/nvidia-dcgm-exporter/0", "serviceMonitor/serving/vllm-engine/0"]
    assert tuple(pools) == scrape_pools("servicemonitor")
    assert "honor_labels" not in cfg["scrape_configs"][0]  # false: page labels clash -> exported_*
    dcgm = targets(tmp_path, "dcgm")[1]
    assert dcgm["targets"] == ["127.0.0.1:9401"]
    assert dcgm["labels"] == {"node": "gpu-node-01", "job": "nvidia-dcgm-exporter", "namespace": "gpu-operator",
                              "service": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
                              "container": "nvidia-dcgm-exporter", "pod": exporter_pod_name(1, 1),
                              "instance": "127.0.0.1:9401"}
    engine = targets(tmp_path, "vllm")[0]["labels"]
    assert (engine["job"], engine["service"], engine["namespace"], engine["node"]) == (
        "vllm-engine", "vllm-engine", "serving", "gpu-node-00")
    assert "Hostname" not in engine
    assert engine["pod"].startswith("vllm-engine-") and engine["pod"] == k8s.engine_pod_name(1, 0)
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    with pytest.raises(ValueError, match="file_sd, servicemonitor"):
        scrape_pools("podmonitor")


def test_pod_map_gives_every_gpu_its_workload_pod():
    m = k8s.pod_map([("a", 0, "serving"), ("b", 1, "training")], gpus=2, seed=1)
    assert m["a"][1] == {"pod": k8s.engine_pod_name(1, 0), "namespace": "serving", "container": "vllm"}
    assert m["b"][0] == {"pod": "llama3-70b-pretrain-worker-1", "namespace": "training", "container": "pytorch"}


@pytest.mark.parametrize("field, value, message", [
    ("exporter_profile", "enhanced", "exporter profile must be one of stock, helm, recommended"),
    ("host_label_mode", "fqdn", "host label mode must be one of Hostname, hostname, localhost, pod, none"),
    ("scrape_mode", "podmonitor", "scrape mode must be one of file_sd, servicemonitor"),
    ("collect_interval_s", -1.0, "collect interval must be >= 0"),
    ("clock_events_name", "throttle", "clock events name must be one of canonical, legacy"),
])
def test_bad_modes_are_refused_before_anything_starts(tmp_path, field, value, message):
    cfg = supervisor.StackConfig(run_dir=tmp_path / "run", **{field: value})
    with pytest.raises(supervisor.StackError, match=message) as exc:
        supervisor.up(cfg)
    assert exc.value.exit_code == 2 and not (tmp_path / "run" / "stack.json").exists()


def test_stack_json_records_the_modes():
    urls = StackUrls("p", "a", "g", ["n"])
    state = StackState("r", urls, ["h"], "t", 1, exporter_profile="helm", host_label_mode="pod",
                       scrape_mode="servicemonitor")
    back = StackState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert (back.exporter_profile, back.host_label_mode, back.scrape_mode) == ("helm", "pod", "servicemonitor")
    old = state.to_dict()
    for k in ("exporter_profile", "host_label_mode", "scrape_mode"):
        del old[k]
    assert StackState.from_dict(old).exporter_profile == "stock"  # stack.json written before the modes
