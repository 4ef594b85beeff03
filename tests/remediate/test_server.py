"""``gpuobs remediate serve``'s HTTP side on a free loopback port: webhook auth and validation, the
loop, /api/status, /metrics; and the person's commands (hold, release, status) on the same database."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from gpuobs.cli import run as cli_run
from gpuobs.remediate.config import RemediationConfig
from gpuobs.remediate.controller import Controller
from gpuobs.remediate.server import serve
from gpuobs.remediate.store import RemediationStore
from tests.fakes.remediate_fleet import Clock, FakeFleet, alert, payload
from tests.polling import poll

TOKEN = "s3cret"


def _am_payload(*alerts):
    doc = payload(*alerts)
    doc.update({"groupKey": "{}:{node=\"x\"}", "externalURL": "http://127.0.0.1:9093", "groupLabels": {},
                "commonLabels": {}, "commonAnnotations": {}, "truncatedAlerts": 0})
    for a in doc["alerts"]:
        a["generatorURL"] = "http://127.0.0.1:9090/graph"
    return doc


@pytest.fixture
def server(tmp_path):
    clock = Clock(time.time())
    fleet = FakeFleet(clock, {"serving": 4}, drain_s=0.0)
    store = RemediationStore(tmp_path / "remediate.sqlite", clock)
    cfg = RemediationConfig(mode="enforce", settle=0.0, verify_hold=0.0)
    c = Controller(store, fleet, fleet, cfg, "node", clock)
    box: dict = {}
    started = threading.Event()

    def ready(srv, done):
        box["srv"], box["done"] = srv, done
        started.set()
    t = threading.Thread(target=serve, args=("127.0.0.1", 0, c, TOKEN, 0.05), kwargs={"ready": ready}, daemon=True)
    t.start()
    assert started.wait(10)
    url = f"http://127.0.0.1:{box['srv'].server_address[1]}"
    yield url, fleet, clock, tmp_path
    box["done"].set()
    t.join(10)
    assert not t.is_alive()


def test_webhook_needs_the_token_and_a_valid_payload(server):
    url, fleet, clock, _ = server
    body = _am_payload(alert("serving-0"))
    assert requests.post(f"{url}/hook/remediate", json=body, timeout=5).status_code == 401
    r = requests.post(f"{url}/hook/remediate", json={"version": "3"}, headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=5)
    assert r.status_code == 400 and r.json()["field"] == "version"
    r = requests.post(f"{url}/hook/remediate", data=b"{not json", timeout=5,
                      headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert r.status_code == 400
    assert requests.post(f"{url}/nope", json={}, timeout=5).status_code == 404


def test_webhook_to_return_through_the_loop_and_metrics(server):
    url, fleet, clock, _ = server
    fleet.fault("serving-1", "GpuXidCritical")
    h = {"Authorization": f"Bearer {TOKEN}"}
    r = requests.post(f"{url}/hook/remediate", json=_am_payload(alert("serving-1")), headers=h, timeout=5)
    assert r.status_code == 200 and r.json()["outcomes"] == {"opened": 1}
    r = requests.post(f"{url}/hook/remediate", json=_am_payload(alert("serving-1")), headers=h, timeout=5)
    assert r.json()["outcomes"] == {"duplicate": 1}

    def returned():
        clock.advance(5.0)
        st = requests.get(f"{url}/api/status", timeout=5).json()
        return st["recent"] and st["recent"][0]["state"] == "returned"
    poll("the episode to return the node", returned, 30, 0.1)
    text = requests.get(f"{url}/metrics", timeout=5).text
    assert 'gpuobs_remediation_steps_total{status="done",step="act"} 1.0' in text
    assert 'gpuobs_remediation_events_total{outcome="opened"} 1.0' in text
    assert "gpuobs_remediation_breaker_open 0.0" in text
    assert 'gpuobs_remediation_mode{mode="enforce"} 1.0' in text
    tl = requests.get(f"{url}/api/timeline", params={"node": "serving-1"}, timeout=5).json()["timeline"]
    assert [e["kind"] for e in tl][-1] == "returned"


def test_cli_hold_stops_the_running_controller(server, capsys):
    url, fleet, clock, tmp = server
    fleet.nodes_["serving-2"].stuck = True
    fleet.fault("serving-2", "GpuXidCritical")
    h = {"Authorization": f"Bearer {TOKEN}"}
    requests.post(f"{url}/hook/remediate", json=_am_payload(alert("serving-2")), headers=h, timeout=5)
    poll("the quarantine", lambda: fleet.nodes_["serving-2"].cordoned, 20, 0.1)
    assert cli_run(["remediate", "hold", "serving-2", "--run-dir", str(tmp), "--by", "alice", "--reason", "mine"]) == 0

    def overridden():
        return requests.get(f"{url}/api/status", timeout=5).json()["recent"][0]["state"] == "overridden"
    poll("the hold to stop the episode", overridden, 20, 0.1)
    assert fleet.actions_on("serving-2") == 0
    assert cli_run(["remediate", "status", "--run-dir", str(tmp), "--node", "serving-2"]) == 0
    out = capsys.readouterr().out
    assert "serving-2" in out and "by alice: mine" in out
    assert cli_run(["remediate", "release", "serving-2", "--run-dir", str(tmp), "--by", "alice"]) == 0
    assert cli_run(["remediate", "release", "serving-2", "--run-dir", str(tmp)]) == 1


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cli_run(["remediate", "status", "--run-dir", str(tmp_path)]) == 2
    assert "no remediation database" in capsys.readouterr().err
    bad = tmp_path / "cfg.yaml"
    bad.write_text("mode: sometimes\n")
    assert cli_run(["remediate", "serve", "--run-dir", str(tmp_path), "--config", str(bad), "--no-auth"]) == 2
    err = capsys.readouterr().err
    assert "remediate.mode" in err and "Traceback" not in err
    bad.write_text("mode: [\n")
    assert cli_run(["remediate", "serve", "--run-dir", str(tmp_path), "--config", str(bad), "--no-auth"]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert cli_run(["remediate", "serve", "--run-dir", str(tmp_path), "--no-auth"]) == 2
    assert "needs a stack" in capsys.readouterr().err


def test_pager_shows_the_controllers_steps_and_state(server):
    from gpuobs.pager import console
    from gpuobs.pager.remediation import status, with_remediation

    url, fleet, clock, _ = server
    fleet.fault("serving-3", "GpuXidCritical")
    h = {"Authorization": f"Bearer {TOKEN}"}
    requests.post(f"{url}/hook/remediate", json=_am_payload(alert("serving-3")), headers=h, timeout=5)
    poll("the quarantine", lambda: fleet.nodes_["serving-3"].cordoned, 20, 0.1)
    inc = {"nodes": ["serving-3"], "opened_at": time.time() - 5, "resolved_at": None,
           "timeline": [{"at": time.time() - 5, "kind": "opened"}]}
    out = with_remediation(inc, url)
    kinds = [e["kind"] for e in out["timeline"]]
    assert kinds[0] == "opened" and "remediation quarantined" in kinds
    assert {e["by"] for e in out["remediation"]} >= {"alertmanager", "gpuobs"}
    html = console.index([], {"page": {"open": 0, "acknowledged": 0}, "ticket": {"open": 0, "acknowledged": 0}},
                         lambda u: u, status(url))
    assert 'id="remediation"' in html and "Breaker closed" in html
    down = with_remediation({"nodes": ["x"], "opened_at": 0, "timeline": []}, "http://127.0.0.1:9")
    assert "remediation_error" in down and down["timeline"] == []
    assert "error" in status("http://127.0.0.1:9")
