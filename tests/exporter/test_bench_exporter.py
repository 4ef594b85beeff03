"""Smoke test of the exporter benchmark's pieces (no timings): the prometheus_client baseline serves
the same DCGM content as our page, so the bench compares like with like."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.exposition import render
from gpuobs.exporter.sim.node import Node, NodeConfig

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_exporter.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_exporter", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_prometheus_client_baseline_serves_our_dcgm_content():
    bench = load_bench()
    node = Node(NodeConfig(index=0, gpus=8, seed=1))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(bench.DcgmLikeCollector(node))
    theirs = samples(generate_latest(registry).decode())
    ours = samples(render(DcgmCollector(node, profile="recommended").collect()))
    from gpuobs.exporter.collectors.dcgm import ALLOCATOR_FIELDS, DCGM_FIELDS
    # Per GPU: every DCGM field, every allocator field, the Xid-count 0 series (no Xid yet, so no
    # last-Xid gauge); per node: expected GPUs and the four collector-success gauges.
    assert len(theirs) == 8 * (len(DCGM_FIELDS) + len(ALLOCATOR_FIELDS) + 1) + 1 + 4
    # Every baseline series is on our page (ours formats values dcgm-style and adds self-metrics).
    ours_by_key = {(n.removesuffix("_total"), labels): v for (n, labels), v in ours.items()}
    missing = [k for k in theirs if (k[0].removesuffix("_total"), k[1]) not in ours_by_key]
    assert missing == []
    assert bench.count_samples(render(DcgmCollector(node, profile="recommended").collect()).encode()) == len(ours)
