"""Fault kinds that do nothing on a node's role are refused (400 naming the role); inject names the node."""

from __future__ import annotations

import threading

import pytest
import requests

from gpuobs.cli import run as cli_run
from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim.faults import FaultError, validate
from gpuobs.exporter.sim.node import Node, NodeConfig
from tests.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("role, body", [
    ("serving", {"kind": "straggler", "gpu": 1}),
    ("serving", {"kind": "collective-hang"}),
    ("training", {"kind": "kv-pressure", "factor": 2.5}),
])
def test_kind_without_effect_on_the_role_is_refused(role, body):
    with pytest.raises(FaultError) as ei:
        validate(body, 8, role)
    assert ei.value.field == "kind" and f"this node's role is {role}" in str(ei.value)
    other = "training" if role == "serving" else "serving"
    assert validate(body, 8, other).kind == body["kind"]  # where it acts, it is accepted
    assert validate({"kind": "xid", "gpu": 0, "code": 48}, 8, role).kind == "xid"  # GPU faults act everywhere


@pytest.fixture
def training_node():
    node = Node(NodeConfig(index=3, gpus=8, seed=7, role="training"))
    srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", node
    srv.shutdown()
    srv.server_close()


def test_admin_api_400_names_the_role_and_stores_nothing(node_server, training_node):
    url, node = node_server  # a serving node
    r = requests.post(f"{url}/admin/faults", json={"kind": "straggler", "gpu": 0}, headers=AUTH, timeout=5)
    assert r.status_code == 400 and r.json()["field"] == "kind" and "serving" in r.json()["error"]
    assert node.faults == {}
    turl, tnode = training_node
    r = requests.post(f"{turl}/admin/faults", json={"kind": "kv-pressure"}, headers=AUTH, timeout=5)
    assert r.status_code == 400 and "role is training" in r.json()["error"] and tnode.faults == {}
    r = requests.post(f"{turl}/admin/faults", json={"kind": "straggler", "gpu": 5}, headers=AUTH, timeout=5)
    assert r.status_code == 201 and (r.json()["hostname"], r.json()["role"]) == (tnode.hostname, "training")


def test_cli_inject_echoes_the_node_and_refuses_with_exit_2(training_node, capsys):
    turl, tnode = training_node
    flags = ["--url", turl, "--token", TOKEN]
    assert cli_run(["fault", "inject", *flags, "--gpu", "5", "straggler"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("injected ") and f"on {tnode.hostname} ({turl}): straggler on gpu 5" in out
    assert cli_run(["fault", "inject", *flags, "kv-pressure", "--factor", "2.5"]) == 2
    assert "does nothing on a training node" in capsys.readouterr().err


def test_inject_help_shows_each_parameter_default(capsys):
    with pytest.raises(SystemExit):
        cli_run(["fault", "inject", "kv-pressure", "--help"])
    assert "(default 2.5)" in capsys.readouterr().out


def test_fault_ids_are_unique_across_the_fleet(node_server, training_node):
    url, node = node_server
    turl, tnode = training_node
    a = requests.post(f"{url}/admin/faults", json={"kind": "xid", "gpu": 0, "code": 13}, headers=AUTH, timeout=5).json()
    b = requests.post(f"{turl}/admin/faults", json={"kind": "xid", "gpu": 0, "code": 13}, headers=AUTH, timeout=5).json()
    assert a["id"] != b["id"] and (a["id"], b["id"]) == (f"n{node.cfg.index}-f1", f"n{tnode.cfg.index}-f1")
    assert requests.delete(f"{turl}/admin/faults/{b['id']}", headers=AUTH, timeout=5).status_code == 200
