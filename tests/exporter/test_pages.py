"""Validity of every page the exporter serves: sim, MIG, Kubernetes labels, engine, training;
prometheus_client's parser and `promtool check metrics` accept them; collectors fail in isolation."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.exporter.collectors import dcgm as collmod
from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.collectors.vllm import EngineCollector
from gpuobs.exporter.exposition import render
from gpuobs.exporter.sim.gpu import H100_SXM
from gpuobs.exporter.sim.mig import parse_mig_spec
from gpuobs.exporter.sim.node import Node, NodeConfig


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def promtool_problems(text: str) -> list[str]:
    """promtool check metrics output minus the naming lints dcgm-exporter's/vLLM's names trigger."""
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    allowed = ("label names should be written in 'snake_case' not 'camelCase'",
               "metric names should be written in 'snake_case' not 'camelCase'",
               "metric names should not contain ':'",
               "counter metrics should have \"_total\" suffix",
               "non-histogram and non-summary metrics should not have \"_bucket\" suffix",
               "metric name should not include type 'counter'")  # DCGM_FI_DEV_PCIE_REPLAY_COUNTER
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    return [ln for ln in lines if not any(a in ln for a in allowed)]


@pytest.fixture(scope="module")
def serving():
    return Node(NodeConfig(index=0, gpus=8, seed=2))


@pytest.fixture(scope="module")
def training():
    return Node(NodeConfig(index=3, gpus=4, seed=2, role="training"))


def test_dcgm_page_has_the_whole_contract_and_passes_promtool(serving):
    text = render(DcgmCollector(serving, profile="recommended").collect())  # every field the simulator serves
    fams = families(text)
    for name, mtype, *_ in collmod.DCGM_FIELDS:
        base = name.removesuffix("_TOTAL") if mtype == "counter" and name.endswith("_TOTAL") else name
        assert base in fams or name in fams, name
    assert fams["DCGM_FI_DEV_THERMAL_VIOLATION"].type == "counter"
    assert fams["DCGM_FI_PROF_PCIE_TX_BYTES"].type == "gauge"  # bytes per second, a rate
    assert fams["pytorch_cuda_memory_reserved_bytes"].type == "gauge"
    assert {s.labels["collector"]: s.value for s in fams["gpuobs_exporter_collector_success"].samples} == {
        "dcgm": 1, "xid": 1, "allocator": 1, "training": 1}
    assert promtool_problems(text) == []


def test_engine_page_uses_vllm_names_buckets_and_parses(serving):
    text = render(EngineCollector(serving).collect())
    fams = families(text)
    ttft = fams["vllm:time_to_first_token_seconds"]
    les = [s.labels["le"] for s in ttft.samples if s.name.endswith("_bucket")]
    assert les[:3] == ["0.001", "0.005", "0.01"] and les[-2:] == ["2560.0", "+Inf"]
    assert fams["vllm:request_success"].type == "counter"
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error"}
    assert 0 < fams["vllm:kv_cache_usage_perc"].samples[0].value < 1
    assert fams["gpuobs_engine_build_info"].samples[0].labels["version"] == "1.4.0"
    for gone in ("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"):
        assert gone not in fams
    assert promtool_problems(text) == []


def test_engine_page_has_the_per_request_histograms_vllms_dashboard_plots():
    """The five V1 per-request histograms (vllm/v1/metrics/loggers.py; vLLM's example dashboard's prompt
    and generation length heatmaps, prefill/decode time, max generation tokens), consistent with the
    token counters and the latency histograms of the same requests."""
    import numpy as np

    from gpuobs.exporter.sim.behaviour import Profile
    from gpuobs.exporter.sim.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(rate_rps=20.0), seed=3)
    for _ in range(30):
        eng.advance(1.0, 1.0, 1.0, 1.0, Profile())
    n = eng.ttft.count
    assert n > 400
    assert eng.prefill.count == eng.decode.count == eng.prompt_len.count == eng.generation_len.count == n
    assert eng.prompt_len.sum == eng.prompt_tokens and eng.generation_len.sum == eng.generation_tokens
    assert eng.prefill.sum + eng.queue.sum == pytest.approx(eng.ttft.sum)
    assert eng.prefill.sum + eng.queue.sum + eng.decode.sum == pytest.approx(eng.e2e.sum)
    assert eng.max_generation_len.sum == n * eng.cfg.max_tokens
    les = [float(b) for b in eng.prompt_len.bounds]
    assert les[:7] == [1, 2, 5, 10, 20, 50, 100] and les[-1] == 100_000  # build_1_2_5_buckets(131072)
    assert np.array_equal(eng.prefill.bounds, eng.e2e.bounds)  # the request-latency buckets
    text = render(EngineCollector(Node(NodeConfig(index=0, gpus=2, seed=2))).collect())
    fams = families(text)
    for name in ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens"):
        assert fams[name].type == "histogram", name
    assert promtool_problems(text) == []


def test_training_page_has_per_rank_series(training):
    fams = families(render(DcgmCollector(training).collect()))
    ranks = sorted(int(s.labels["rank"]) for s in fams["training_mfu_ratio"].samples)
    assert ranks == [12, 13, 14, 15]
    coll = {s.labels["collective"] for s in fams["nccl_collective_duration_seconds"].samples}
    assert coll == {"allreduce"}
    with pytest.raises(ValueError, match="only serving nodes"):
        EngineCollector(training)


def test_mig_page_splits_instances_and_repeats_parent_values(serving):
    mig = parse_mig_spec("0=1g.10gb,1=3g.40gb", 8)
    text = render(DcgmCollector(serving, mig=mig).collect())
    fams = families(text)
    temps = [s for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples if s.labels["gpu"] == "0"]
    assert sorted(int(s.labels["GPU_I_ID"]) for s in temps) == [7, 8, 9, 10, 11, 12, 13]
    assert {s.labels["GPU_I_PROFILE"] for s in temps} == {"1g.10gb"}
    assert {s.value for s in temps} == {round(serving.gpus[0].temp_c)}
    util_gpus = {s.labels["gpu"] for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert "0" not in util_gpus and "1" not in util_gpus and "2" in util_gpus
    # H100 MIG instances carry no FB_* series (dcgm-exporter #512, #380); the whole GPUs keep theirs.
    assert {s.labels["gpu"] for s in fams["DCGM_FI_DEV_FB_USED"].samples} == {str(i) for i in range(2, 8)}
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_SM_CLOCK{") and "GPU_I_ID" in ln)
    order = [kv.split("=")[0] for kv in line[line.index("{") + 1:line.index("}")].split('",')]
    assert order == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID",
                     "Hostname", "DCGM_FI_DRIVER_VERSION"]
    assert promtool_problems(text) == []


def test_mig_instances_split_framebuffer_where_the_product_reports_it():
    """A product whose MIG instances report FB_* (not H100): each instance's used + free is its share."""
    model = dataclasses.replace(H100_SXM, mig_instance_fb=True)
    node = Node(NodeConfig(index=0, gpus=2, seed=4, model=model))
    fams = families(render(DcgmCollector(node, mig=parse_mig_spec("1=3g.40gb", 2)).collect()))
    used = [s.value for s in fams["DCGM_FI_DEV_FB_USED"].samples if s.labels["gpu"] == "1"]
    free = [s.value for s in fams["DCGM_FI_DEV_FB_FREE"].samples if s.labels["gpu"] == "1"]
    assert len(used) == 2 and all(u + f == pytest.approx(40192, abs=1) for u, f in zip(used, free))
    assert {s.labels["gpu"] for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples} == {"0"}


@pytest.mark.parametrize("spec, message", [("9=1g.10gb", "out of range 0..7"), ("2g.30gb", "unknown profile"),
                                           ("x=1g.10gb", "not an integer")])
def test_bad_mig_spec(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_mig_spec(spec, 8)


def test_kubernetes_labels_only_on_mapped_gpus(serving):
    k8s = {"gpu-node-00": {1: {"pod": "llama-0", "namespace": "serving", "container": "vllm"}}}
    fams = families(render(DcgmCollector(serving, k8s=k8s).collect()))
    by_gpu = {s.labels["gpu"]: s.labels for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert (by_gpu["1"]["pod"], by_gpu["1"]["namespace"], by_gpu["1"]["container"]) == ("llama-0", "serving", "vllm")
    assert not {"pod", "namespace", "container"} & set(by_gpu["0"])
    text = render(DcgmCollector(serving, k8s=k8s).collect())
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\""))
    assert line.index("DCGM_FI_DRIVER_VERSION") < line.index("container=") < line.index("namespace=") < line.index("pod=")


def test_a_failing_collector_is_reported_and_the_rest_of_the_page_survives(serving, monkeypatch):
    coll = DcgmCollector(serving, profile="recommended")  # the profile with the allocator and success gauges
    monkeypatch.setattr(coll, "_allocator", lambda present: 1 / 0)
    fams = families(render(coll.collect()))
    assert "pytorch_cuda_memory_reserved_bytes" not in fams
    assert "DCGM_FI_DEV_GPU_TEMP" in fams
    ok = {s.labels["collector"]: s.value for s in fams["gpuobs_exporter_collector_success"].samples}
    assert ok["allocator"] == 0 and ok["dcgm"] == 1
