"""Shared test helpers: free ports and in-process servers on 127.0.0.1."""

from __future__ import annotations

import threading

import pytest

from gpuobs.exporter.collector import DcgmCollector
from gpuobs.exporter.node import Node, NodeConfig
from gpuobs.exporter.server import NodeServer
from gpuobs.stack.ports import free_port_range  # noqa: F401  (re-exported for tests)


TOKEN = "test-token-123"


@pytest.fixture
def node_server():
    """A NodeServer for a 4-GPU node on a free port; yields (base_url, node)."""
    node = Node(NodeConfig(index=1, gpus=4, seed=7))
    srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", node
    srv.shutdown()
    srv.server_close()
