"""Golden-output tests of the DCGM and vLLM pages, like node_exporter's collector/fixtures/e2e-output.txt:
a seeded node's pages are compared byte for byte with committed fixtures, so any change to a name, a
HELP text, a label order or a number format shows up in review as a diff of the fixture.

Regenerate after an intended change with ``pytest tests/exporter/test_golden_page.py --update-golden``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.collectors.vllm import EngineCollector
from gpuobs.exporter.exposition import render
from gpuobs.exporter.sim import faults
from gpuobs.exporter.sim.mig import parse_mig_spec
from gpuobs.exporter.sim.node import Node, NodeConfig

FIXTURES = Path(__file__).parent / "fixtures"


def pages() -> dict[str, str]:
    """Fixture name -> page text, from seeded nodes advanced by fixed steps (no wall clock involved).

    DCGM pages per exporter profile (gpuobs/exporter/sim/profiles.py): stock (dcgm-exporter 4.x
    default-counters.csv), helm (the chart's ConfigMap), recommended (deploy/dcgm-exporter/recommended.csv
    + gpuobs extras), and a MIG node on stock.
    """
    def fresh() -> Node:
        return Node(NodeConfig(index=1, gpus=2, seed=7))

    def faulted() -> Node:
        node = Node(NodeConfig(index=2, gpus=2, seed=11))
        node.inject(faults.validate({"kind": "xid", "gpu": 1, "code": 48}, 2))
        for _ in range(5):
            node.advance(1.0)
        return node

    def training() -> Node:
        node = Node(NodeConfig(index=3, gpus=2, seed=5, role="training"))
        for _ in range(3):
            node.advance(1.0)
        return node

    out = {}
    for profile in ("stock", "helm", "recommended"):
        out[f"dcgm-{profile}-fresh.prom"] = render(DcgmCollector(fresh(), profile=profile).collect())
        out[f"dcgm-{profile}-xid48.prom"] = render(DcgmCollector(faulted(), profile=profile).collect())
    for profile in ("stock", "recommended"):
        out[f"dcgm-{profile}-training.prom"] = render(DcgmCollector(training(), profile=profile).collect())
    out["dcgm-stock-mig.prom"] = render(DcgmCollector(fresh(), mig=parse_mig_spec("0=3g.40gb", 2)).collect())
    out["vllm-xid48.prom"] = render(EngineCollector(faulted()).collect())
    return out


@pytest.mark.parametrize("name", sorted(pages()))
def test_page_matches_the_golden_fixture(name, request):
    text = pages()[name]
    path = FIXTURES / name
    if request.config.getoption("--update-golden"):
        path.write_text(text)
    assert path.exists(), f"missing fixture {path}; run with --update-golden"
    assert text == path.read_text(), f"{name} changed; if intended, rerun with --update-golden and review the diff"


def test_the_pages_are_deterministic():
    assert pages() == pages()


def test_every_fixture_is_generated():
    """No stale fixture is left behind when a page is renamed or dropped."""
    assert sorted(p.name for p in FIXTURES.glob("*.prom")) == sorted(pages())
