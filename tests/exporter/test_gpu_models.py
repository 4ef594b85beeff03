"""GPU models of the simulator: the registry, the L40S on a node's DCGM page (modelName, power held at
its 350 W limit, no NVLink traffic), and the --gpu-models spec that places them on the serving nodes."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.core.errors import InputError
from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.exposition import render
from gpuobs.exporter.sim.gpu import GPU_MODELS, H100_SXM, L40S, parse_gpu_models
from gpuobs.exporter.sim.node import Node, NodeConfig


def page(node: Node) -> dict:
    text = render(DcgmCollector(node, profile="recommended").collect())
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_registry_names_and_l40s_datasheet_figures():
    assert GPU_MODELS == {"H100": H100_SXM, "L40S": L40S}
    assert L40S.name == "NVIDIA L40S" and L40S.tdp_w == 350 and L40S.max_sm_clock_mhz == 2520
    assert L40S.fb_total_mib == 46068 and L40S.nvlink_bytes_per_s_at_full_load == 0
    assert H100_SXM.ttft_scale == H100_SXM.itl_scale == 1.0  # the default fleet's latency is unchanged


def test_l40s_page_carries_its_model_name_and_stays_under_its_power_limit():
    node = Node(NodeConfig(index=0, gpus=2, seed=4, model=L40S))
    for _ in range(60):
        node.advance(1.0)
    fams = page(node)
    power = [s for s in fams["DCGM_FI_DEV_POWER_USAGE"].samples]
    assert {s.labels["modelName"] for s in power} == {"NVIDIA L40S"}
    assert all(L40S.idle_w < s.value <= L40S.tdp_w for s in power)
    assert {s.value for s in fams["DCGM_FI_DEV_MEM_CLOCK"].samples} == {9001}
    used = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_FB_USED"].samples}
    free = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_FB_FREE"].samples}
    assert all(used[g] + free[g] + L40S.fb_reserved_mib == pytest.approx(L40S.fb_total_mib, abs=1) for g in used)
    assert all(0 < free[g] for g in free)  # the engine's share of memory scales with the framebuffer
    # A dense load is power-capped at 350 W with SW_POWER_CAP, as the H100 is at 700 W.
    g = node.gpus[0]
    for _ in range(120):
        g.advance(1.0, 1.0, node._rng)
    assert g.power_w == pytest.approx(350.0, abs=0.5) and g.clock_event_reasons & 0x4


def test_h100_node_numbers_unchanged_by_the_model_fields():
    a, b = Node(NodeConfig(index=1, gpus=2, seed=9)), Node(NodeConfig(index=1, gpus=2, seed=9, model=H100_SXM))
    assert [g.alloc.allocated for g in a.gpus] == [g.alloc.allocated for g in b.gpus]
    assert a.profile == b.profile and a.profile.ttft_multiplier == 1.0


def test_l40s_latency_scale_reaches_the_engine():
    node = Node(NodeConfig(index=0, gpus=1, seed=4, model=L40S))
    assert node.profile.ttft_multiplier == pytest.approx(1.3) and node.profile.itl_multiplier == pytest.approx(1.3)
    assert node.engine.kv_usage < 0.9  # the default workload stays inside the KV cache


def test_parse_gpu_models_places_models_in_order():
    assert parse_gpu_models("", 3) == [H100_SXM] * 3
    assert parse_gpu_models("H100:2,L40S:1", 3) == [H100_SXM, H100_SXM, L40S]
    assert parse_gpu_models(" L40S:1 , H100:1 ", 2) == [L40S, H100_SXM]


@pytest.mark.parametrize("spec, fragment", [
    ("H100:2", "--gpu-models 'H100:2': counts sum to 2, expected 3"),
    ("H100:2,L40S:2", "counts sum to 4, expected 3"),
    ("A100:3", "unknown GPU model 'A100'; known: H100, L40S"),
    ("H100", "entry 'H100' must be MODEL:COUNT"),
    ("H100:x", "must be MODEL:COUNT"),
    ("H100:0,L40S:3", "count of H100 must be at least 1"),
    ("H100:-1", "must be MODEL:COUNT"),
])
def test_parse_gpu_models_errors_name_the_flag(spec, fragment):
    with pytest.raises(InputError) as err:
        parse_gpu_models(spec, 3)
    assert fragment in str(err.value) and "--gpu-models" in str(err.value) and "\n" not in str(err.value)
