"""Shared test helpers: free ports and in-process servers on 127.0.0.1."""

from __future__ import annotations

import socket
import threading

import pytest

from gpuobs.exporter.collector import DcgmCollector
from gpuobs.exporter.node import Node, NodeConfig
from gpuobs.exporter.server import NodeServer


def free_port_range(count: int, start: int = 20000, stop: int = 60000) -> int:
    """First port p such that p..p+count-1 are all free on 127.0.0.1 (probing from a random offset)."""
    import random

    base = random.randrange(start, stop - count)
    for p in range(base, stop - count, count):
        socks = []
        try:
            for q in range(p, p + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


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
