"""Feature flags in the simulated engine: hidden profiles, evaluation per node, the flag gauge, /admin/flags."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from gpuobs.exporter.collectors.vllm import EngineCollector
from gpuobs.exporter.exposition import render
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim.behaviour import Profile, combine, load
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.reference.releases import CatalogueError
from gpuobs.reference.releases import load as load_catalogue


def test_catalogue_lists_flags_and_release_tooling_sees_no_profile():
    cat = load_catalogue()
    assert set(cat.flags) == {"spec_decode", "kv_policy_v2"}
    assert not hasattr(cat.flags["spec_decode"], "itl_multiplier")
    sim = load()
    assert sim.flag_profile("spec_decode").itl_multiplier == pytest.approx(0.85)
    assert sim.flag_profile("spec_decode").long_prompt_error_delta == pytest.approx(0.02)
    assert sim.flag_profile("kv_policy_v2") == Profile()


def test_combine_multiplies_multipliers_and_adds_deltas():
    p = combine(Profile(ttft_multiplier=1.2, error_rate_delta=0.01), Profile(itl_multiplier=0.85, ttft_multiplier=0.5,
                                                                            long_prompt_error_delta=0.02,
                                                                            long_prompt_tokens=512))
    assert (p.ttft_multiplier, p.itl_multiplier, p.error_rate_delta) == pytest.approx((0.6, 0.85, 0.01))
    assert (p.long_prompt_error_delta, p.long_prompt_tokens) == (0.02, 512)


@pytest.mark.parametrize("doc,needle", [
    ("flags: [a]", "'flags' must be a mapping"),
    ("flags: {Bad-Key: {description: x}}", "key must match"),
    ("flags: {ok: {}}", "'description'"),
])
def test_bad_flag_entries_are_refused_by_name(tmp_path, doc, needle):
    path = tmp_path / "r.yaml"
    path.write_text('releases: {"1.0.0": {engine: vllm==0.10.1, cuda: "12.8"}}\n' + doc + "\n")
    with pytest.raises(CatalogueError, match=needle):
        load_catalogue(path)


def _serve(node, n_ticks=1500):
    for _ in range(n_ticks):
        node.advance(1.0)
    e = node.engine
    total = sum(e.finished.values())
    return e.finished["error"] / total, e.tpot.sum / e.tpot.count


def test_spec_decode_lowers_tpot_and_adds_errors_on_long_prompts_only_where_on():
    on, off = Node(NodeConfig(index=0, gpus=1, seed=5)), Node(NodeConfig(index=1, gpus=1, seed=5))
    on.flag_source = lambda flag, host: flag == "spec_decode" and host == on.hostname
    off.flag_source = lambda flag, host: flag == "spec_decode" and host == on.hostname
    err_on, tpot_on = _serve(on)
    err_off, tpot_off = _serve(off)
    assert on.flags == {"spec_decode": True, "kv_policy_v2": False} and not any(off.flags.values())
    assert tpot_on / tpot_off == pytest.approx(0.85, abs=0.03)
    # +2% on the 58% of prompts over 512 tokens: ~1.2% more errors overall
    assert 0.008 < err_on - err_off < 0.016


def test_flag_gauge_has_one_series_per_catalogue_flag_and_admin_flags_reports_them():
    node = Node(NodeConfig(index=0, gpus=1, seed=5))
    node.flag_source = lambda flag, host: flag == "kv_policy_v2"
    node.advance(1.0)
    page = render(EngineCollector(node).collect())
    page = page.decode() if isinstance(page, bytes) else page
    lines = [x for x in page.splitlines() if x.startswith("gpuobs_feature_flag_enabled{")]
    assert lines == ['gpuobs_feature_flag_enabled{model_name="meta-llama/Llama-3.1-70B-Instruct",engine="0",'
                     'flag="kv_policy_v2"} 1.0',
                     'gpuobs_feature_flag_enabled{model_name="meta-llama/Llama-3.1-70B-Instruct",engine="0",'
                     'flag="spec_decode"} 0.0']
    srv = NodeServer(("127.0.0.1", 0), node, "tok", EngineCollector(node), True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{srv.server_address[1]}/admin/flags",
                                     headers={"Authorization": "Bearer tok"})
        body = json.loads(urllib.request.urlopen(req, timeout=5).read())
        assert body == {"hostname": node.hostname, "flags": {"spec_decode": False, "kv_policy_v2": True}}
    finally:
        srv.shutdown()
        srv.server_close()
