"""Shared test helpers: free ports and in-process servers on 127.0.0.1."""

from __future__ import annotations

import threading

import pytest

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.stack.ports import free_port_range  # noqa: F401  (re-exported for tests)

TOKEN = "test-token-123"


def live_stack(tmp_path_factory, name: str, **cfg):
    """Start a native stack on free loopback ports in its own run directory; a generator for module
    fixtures: yields the StackState, then stops the stack and checks nothing it started still runs."""
    import io

    from gpuobs.stack import supervisor
    from gpuobs.stack.render import Ports

    base = free_port_range(16)
    ports = Ports(prometheus=base, alertmanager=base + 1, pager=base + 2, node_base=base + 3, engine_base=base + 10)
    run = tmp_path_factory.mktemp(name)
    out = io.StringIO()
    state = supervisor.up(supervisor.StackConfig(run_dir=run, ports=ports, **cfg), out=out)
    try:
        yield state
    finally:
        supervisor.down(run, out=out)
        for comp in state.components.values():
            assert not supervisor.alive(comp.pid, comp.argv), f"{comp.argv[0]} still running after down"


@pytest.fixture
def node_server():
    """A NodeServer for a 4-GPU node on a free port, recommended exporter profile (the Xid-count
    series are on its page); yields (base_url, node)."""
    node = Node(NodeConfig(index=1, gpus=4, seed=7))
    srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node, profile="recommended"))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", node
    srv.shutdown()
    srv.server_close()


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden-output fixtures (tests/exporter/fixtures) instead of comparing")
