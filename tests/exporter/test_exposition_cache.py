"""The exporter's hot path (cached label strings, pre-compiled page templates, cached histogram
labels) must print exactly the bytes a straightforward rendering prints, whatever changes between
scrapes: driver version, an Xid, a GPU falling off the bus and coming back, MIG, pod labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.collectors.vllm import EngineCollector
from gpuobs.exporter.exposition import (
    Family,
    Prerendered,
    Template,
    label_string,
    render,
)
from gpuobs.exporter.histogram import TTFT_BUCKETS, Histogram, _fmt_le
from gpuobs.exporter.sim import faults
from gpuobs.exporter.sim.mig import parse_mig_spec
from gpuobs.exporter.sim.node import Node, NodeConfig

TRICKY = 'we"ird %s %d %% \\ pod\nname'


def inject(node: Node, **body) -> str:
    return node.inject(faults.validate(body, len(node.gpus))).id


def assert_same(cached: DcgmCollector, reference: DcgmCollector) -> str:
    fast = cached.collect()
    assert any(isinstance(f, Prerendered) for f in fast), "the cached collector must take the template path"
    text = render(fast)
    assert text == render(reference.collect())
    return text


@pytest.mark.parametrize("kw", [
    {},
    {"profile": "recommended"},
    {"host_label_mode": "hostname"},
    {"host_label_mode": "pod"},
    {"mig": parse_mig_spec("0=1g.10gb,1=3g.40gb,5=7g.80gb", 8)},
    {"k8s": {"gpu-node-00": {1: {"pod": TRICKY, "namespace": "serving", "container": "vllm"}, 3: {"pod": "p3"}}}},
    {"mig": parse_mig_spec("2g.20gb", 8), "k8s": {"gpu-node-00": {0: {"pod": "a%b", "namespace": "n"}}}},
])
def test_cached_dcgm_page_is_byte_identical_across_state_changes(kw):
    node = Node(NodeConfig(index=0, gpus=8, seed=5))
    cached, reference = DcgmCollector(node, **kw), DcgmCollector(node, cache=False, **kw)
    pages = [assert_same(cached, reference)]
    node.advance(1.0)
    pages.append(assert_same(cached, reference))
    drv = inject(node, kind="driver", version="580.95.05")  # DCGM_FI_DRIVER_VERSION label changes
    pages.append(assert_same(cached, reference))
    assert 'DCGM_FI_DRIVER_VERSION="580.95.05"' in pages[-1]
    inject(node, kind="xid", gpu=2, code=48)  # err_code/err_msg labels, window counter appears
    node.advance(1.0)
    pages.append(assert_same(cached, reference))
    off = inject(node, kind="xid", gpu=1, code=79)  # GPU 1 vanishes from the page
    node.advance(1.0)
    pages.append(assert_same(cached, reference))
    assert 'gpu="1"' not in pages[-1].split("DCGM_FI_DEV_XID_ERRORS")[0]
    inject(node, kind="ecc-dbe", gpu=4, count=2)
    pages.append(assert_same(cached, reference))
    node.clear(off)  # ... and comes back
    node.clear(drv)
    node.advance(1.0)
    pages.append(assert_same(cached, reference))
    assert 'gpu="1"' in pages[-1] and 'DCGM_FI_DRIVER_VERSION="550.54.15"' in pages[-1]
    if cached.pods:  # pod labels edited in place: the cache must notice
        cached.pods[3] = reference.pods[3] = {"pod": "moved", "namespace": "other"}
        pages.append(assert_same(cached, reference))
        assert 'pod="moved"' in pages[-1]
    assert len(set(pages)) == len(pages)  # every step really changed the page


def test_training_node_page_with_histograms_is_identical():
    node = Node(NodeConfig(index=3, gpus=4, seed=2, role="training"))
    cached = DcgmCollector(node, profile="recommended")
    reference = DcgmCollector(node, cache=False, profile="recommended")
    for step in range(3):
        node.advance(5.0)
        assert_same(cached, reference)
        if step == 1:
            inject(node, kind="driver", version="535.104.05")  # training labels carry the driver version


def reference_histogram_rows(h: Histogram, name: str, labels: list[tuple[str, str]]) -> list[tuple]:
    """Histogram samples rendered from scratch (the pre-cache implementation)."""
    cum = np.cumsum(h.counts)
    rows = [(f"{name}_bucket", label_string(labels + [("le", _fmt_le(b))]), float(c))
            for b, c in zip(h.bounds, cum[:-1])]
    rows.append((f"{name}_bucket", label_string(labels + [("le", "+Inf")]), float(cum[-1])))
    rows.append((f"{name}_sum", label_string(labels), h.sum))
    rows.append((f"{name}_count", label_string(labels), float(h.count)))
    return rows


def test_histogram_rows_match_fresh_rendering_when_labels_or_counts_change():
    h = Histogram(TTFT_BUCKETS)
    rng = np.random.default_rng(1)
    base = [("model_name", "m"), ("engine", "0")]
    for labels in (base, [("model_name", TRICKY)], base):
        for _ in range(2):
            h.observe_many(rng.lognormal(-2, 1.5, 500))
            assert h.samples("vllm:ttft", labels) == reference_histogram_rows(h, "vllm:ttft", labels)
    assert h.samples("other", []) == reference_histogram_rows(h, "other", [])


def test_engine_page_is_stable_between_scrapes_and_parses():
    node = Node(NodeConfig(index=0, gpus=8, seed=5))
    coll = EngineCollector(node)
    assert render(coll.collect()) == render(coll.collect())  # no state change -> same bytes


@pytest.mark.parametrize("integer, values", [
    (True, [0, 7, 3.99, -1.5, 1e20, np.int64(12), np.float64(2.7), True]),
    (False, [0, 1.5, -0.0, 1e-9, 123456789.123456789, np.float64(0.25), math.inf, -math.inf, math.nan]),
    (None, [0, 1.5, -0.0, 1e-9, 1e300, np.float64(0.1), 12]),
    (None, [1.0, math.inf, -math.inf, math.nan, 2]),  # non-finite: +Inf/-Inf/NaN like prometheus_client
])
def test_template_fill_equals_render(integer, values):
    labels = [label_string([("k", f"v{i}%d"), ("odd", TRICKY)]) for i in range(len(values))]
    fams = [Family("x_%d_metric", "gauge", "help with %r and %s\n", integer, list(zip(labels, values))),
            Family("empty", "gauge", "no samples", integer, []),
            Family("hist", "histogram", "h", None, [("hist_bucket", 'le="+Inf"', 3.0), ("hist_count", "", 3.0)])]
    flat = list(values) + [3.0, 3.0]
    assert Template(fams).fill(flat) == render(fams)


def test_template_rejects_a_wrong_number_of_values():
    t = Template([Family("a", "gauge", "h", True, [("", 1), ('x="1"', 2)])])
    assert t.fill([5, 6]) == "# HELP a h\n# TYPE a gauge\na 5\na{x=\"1\"} 6\n"
    with pytest.raises(ValueError, match="2 samples"):
        t.fill([1])
