"""Fault admin API over HTTP: auth, validation errors naming the field, and robustness."""

from __future__ import annotations

import socket

import pytest
import requests

from tests.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def post(url, body=None, data=None, headers=AUTH):
    return requests.post(f"{url}/admin/faults", json=body, data=data, headers=headers, timeout=5)


def test_token_required(node_server):
    url, _ = node_server
    assert requests.get(f"{url}/admin/faults", timeout=5).status_code == 401
    r = post(url, {"kind": "xid", "gpu": 0, "code": 48}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and "token" in r.json()["error"]
    assert requests.get(f"{url}/admin/faults", headers=AUTH, timeout=5).json()["faults"] == []


@pytest.mark.parametrize("body, field, fragment", [
    ({"kind": "meteor", "gpu": 0}, "kind", "must be one of collective-hang, down, driver, ecc-dbe, exporter-restart, fragmentation, "
                                            "kv-pressure, nvlink-errors, pcie-replay, power-brake, row-remap-failure, "
                                            "straggler, thermal, xid"),
    ({"kind": "driver", "version": "5.x"}, "version", "580.95.05"),
    ({"kind": "driver"}, "version", "required"),
    ({"kind": "fragmentation", "gpu": 0, "rate_mib_per_min": "fast"}, "rate_mib_per_min", "must be a number"),
    ({"kind": "kv-pressure", "factor": 1000}, "factor", "between 1 and 100"),
    ({"gpu": 0, "code": 48}, "kind", "must be one of"),
    ({"kind": "xid", "gpu": 4, "code": 48}, "gpu", "0..3"),
    ({"kind": "xid", "gpu": -1, "code": 48}, "gpu", "0..3"),
    ({"kind": "xid", "gpu": "1", "code": 48}, "gpu", "integer GPU index"),
    ({"kind": "xid", "code": 48}, "gpu", "required"),
    ({"kind": "xid", "gpu": 0, "code": "48"}, "code", "must be an integer"),
    ({"kind": "xid", "gpu": 0, "code": 48.5}, "code", "must be an integer"),
    ({"kind": "xid", "gpu": 0, "code": True}, "code", "must be an integer"),
    ({"kind": "xid", "gpu": 0}, "code", "required"),
    ({"kind": "xid", "gpu": 0, "code": 48, "colour": "red"}, "colour", "allowed fields: code, gpu, kind, repeat_s"),
    ({"kind": "thermal", "gpu": 0, "cooling_factor": 0.5}, "cooling_factor", "between 1 and 10"),
    ({"kind": "down", "gpu": 1}, "gpu", "whole node"),
    ([1, 2], "body", "JSON object"),
])
def test_bad_requests_get_400_naming_the_field(node_server, body, field, fragment):
    url, node = node_server
    r = post(url, body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field
    assert fragment in r.json()["error"]
    assert node.faults == {}


def test_bad_json_and_oversized_body(node_server):
    url, node = node_server
    r = post(url, data=b"{not json", headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["field"] == "body"
    r = post(url, data=b'{"kind": "kv-pressure", "factor": Infinity}', headers=AUTH)
    assert r.status_code == 400 and r.json()["field"] == "factor" and "finite" in r.json()["error"]
    r = post(url, data=b"x" * (64 * 1024 + 1), headers=AUTH)
    assert r.status_code == 413
    assert node.faults == {}


def test_inject_list_clear_round_trip(node_server):
    url, node = node_server
    r = post(url, {"kind": "xid", "gpu": 3, "code": 48})
    assert r.status_code == 201
    fault = r.json()
    assert fault["kind"] == "xid" and fault["gpu"] == 3 and fault["params"] == {"code": 48, "repeat_s": 0.0}
    listed = requests.get(f"{url}/admin/faults", headers=AUTH, timeout=5).json()["faults"]
    assert [f["id"] for f in listed] == [fault["id"]]
    metrics = requests.get(f"{url}/metrics", timeout=5).text
    assert 'err_code="48"' in metrics and 'xid="48"' in metrics
    log = requests.get(f"{url}/admin/kernel-log", headers=AUTH, timeout=5).text
    assert "NVRM: Xid (PCI:0000:5d:00): 48, pid=" in log  # lower-case hex, as the driver prints
    r = requests.delete(f"{url}/admin/faults/{fault['id']}", headers=AUTH, timeout=5)
    assert r.status_code == 200
    assert requests.delete(f"{url}/admin/faults/{fault['id']}", headers=AUTH, timeout=5).status_code == 404
    assert requests.get(f"{url}/admin/faults", headers=AUTH, timeout=5).json()["faults"] == []


def test_server_survives_garbage_and_keeps_serving(node_server):
    url, _ = node_server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"\x00\xff garbage \r\n\r\n")
        s.recv(1024)
    with socket.create_connection((host, int(port)), timeout=5) as s:  # POST with no Content-Length
        s.sendall(f"POST /admin/faults HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        assert b"411" in s.recv(1024)
    r = requests.get(f"{url}/metrics", timeout=5)
    assert r.status_code == 200 and "DCGM_FI_DEV_GPU_TEMP" in r.text


def test_down_fault_stops_scrapes_but_not_admin(node_server):
    url, _ = node_server
    fid = post(url, {"kind": "down"}).json()["id"]
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/metrics", timeout=5)
    assert requests.delete(f"{url}/admin/faults/{fid}", headers=AUTH, timeout=5).status_code == 200
    assert requests.get(f"{url}/metrics", timeout=5).status_code == 200


def test_deploy_endpoint_sets_version_and_rejects_unknown(node_server):
    url, node = node_server
    r = requests.get(f"{url}/admin/deploy", headers=AUTH, timeout=5)
    assert r.json()["version"] == "1.4.0"
    r = requests.post(f"{url}/admin/deploy", json={"version": "1.6.0"}, headers=AUTH, timeout=5)
    assert r.status_code == 200 and r.json()["previous"] == "1.4.0" and node.version == "1.6.0"
    r = requests.post(f"{url}/admin/deploy", json={"version": "9.9.9"}, headers=AUTH, timeout=5)
    assert r.status_code == 400 and r.json()["field"] == "version" and "1.5.0" in r.json()["error"]
    r = requests.post(f"{url}/admin/deploy", json={"version": "1.5.0", "force": True}, headers=AUTH, timeout=5)
    assert r.status_code == 400
    r = requests.post(f"{url}/admin/deploy", json={"version": "1.5.0"}, timeout=5)
    assert r.status_code == 401
    assert node.version == "1.6.0"


@pytest.mark.parametrize("raw, field", [
    (b"null", "body"), (b'{"kind": ["xid"], "gpu": 0}', "kind"), (b'{"kind": {}}', "kind"),
    (b'{"kind": "xid", "gpu": 0, "code": ' + b"9" * 5000 + b"}", "body"),
    (b"[" * 30000 + b"]" * 30000, "body"),
])
def test_hostile_bodies_get_400_not_500_or_silence(node_server, raw, field):
    url, node = node_server
    r = requests.post(f"{url}/admin/faults", data=raw, headers=AUTH, timeout=5)
    assert r.status_code == 400 and r.json()["field"] == field
    r = requests.post(f"{url}/admin/deploy", data=b"null", headers=AUTH, timeout=5)
    assert r.status_code == 400
    assert node.faults == {}


def test_head_401_has_no_body_and_keep_alive_survives(node_server):
    url, _ = node_server
    with requests.Session() as s:
        assert s.head(f"{url}/admin/faults", timeout=5).status_code == 401
        assert s.get(f"{url}/health", timeout=5).json()["status"] == "ok"
