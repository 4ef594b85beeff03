"""The pager: Alertmanager v4 payload validation, SQLite storage before 200, JSON and HTML views."""

from __future__ import annotations

import copy
import json
import sqlite3
import threading

import pytest
import requests

from gpuobs.pager.server import PagerServer
from gpuobs.pager.store import PageStore

PAYLOAD = {
    "version": "4", "groupKey": '{}/{severity="critical"}:{alertname="GpuXidCritical", Hostname="gpu-node-01"}',
    "truncatedAlerts": 0, "status": "firing", "receiver": "page",
    "groupLabels": {"alertname": "GpuXidCritical", "Hostname": "gpu-node-01"},
    "commonLabels": {"alertname": "GpuXidCritical", "severity": "critical"},
    "commonAnnotations": {"summary": "A GPU reported a critical Xid"},
    "externalURL": "http://127.0.0.1:9093",
    "alerts": [{
        "status": "firing",
        "labels": {"alertname": "GpuXidCritical", "severity": "critical", "Hostname": "gpu-node-01", "gpu": "3", "xid": "48"},
        "annotations": {"summary": "A GPU reported a critical Xid <script>", "runbook_url": "http://127.0.0.1:9097/runbooks/xid.md#gpuxidcritical"},
        "startsAt": "2026-11-30T05:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://127.0.0.1:9090/graph", "fingerprint": "abc123",
    }],
}


@pytest.fixture
def pager(tmp_path):
    store = PageStore(tmp_path / "pager.sqlite")
    rb = tmp_path / "runbooks"
    rb.mkdir()
    (rb / "xid.md").write_text("# Xid\n")
    srv = PagerServer(("127.0.0.1", 0), store, rb)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", store, tmp_path / "pager.sqlite"
    srv.shutdown()
    srv.server_close()
    store.close()


def test_valid_payload_is_stored_before_200_and_listed_newest_first(pager):
    url, _, db = pager
    assert requests.post(f"{url}/hook/page", json=PAYLOAD, timeout=5).status_code == 200
    # Committed: a separate connection sees it immediately.
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM notifications").fetchone()[0] == 1
    resolved = copy.deepcopy(PAYLOAD)
    resolved["status"] = "resolved"
    resolved["alerts"][0]["status"] = "resolved"
    assert requests.post(f"{url}/hook/page", json=resolved, timeout=5).status_code == 200
    pages = requests.get(f"{url}/api/pages", timeout=5).json()["pages"]
    assert [p["status"] for p in pages] == ["resolved", "firing"]
    assert pages[1]["channel"] == "page" and pages[1]["receiver"] == "page"
    assert pages[1]["alerts"][0]["labels"]["xid"] == "48"
    only = requests.get(f"{url}/api/pages", params={"status": "firing"}, timeout=5).json()["pages"]
    assert len(only) == 1
    assert requests.get(f"{url}/api/pages", params={"alertname": "Nope"}, timeout=5).json()["pages"] == []


@pytest.mark.parametrize("mutate, field", [
    (lambda p: p.pop("alerts"), "alerts"),
    (lambda p: p.update(alerts=[]), "alerts"),
    (lambda p: p.update(version="3"), "version"),
    (lambda p: p.update(status="exploded"), "status"),
    (lambda p: p["alerts"][0].pop("fingerprint"), "alerts[0].fingerprint"),
    (lambda p: p["alerts"][0]["labels"].pop("alertname"), "alerts[0].labels"),
    (lambda p: p["alerts"][0].update(labels={"a": 1}), "alerts[0].labels"),
    (lambda p: p.update(truncatedAlerts=-1), "truncatedAlerts"),
    (lambda p: p.update(commonLabels=[]), "commonLabels"),
])
def test_malformed_payload_gets_400_and_nothing_stored(pager, mutate, field):
    url, store, _ = pager
    bad = copy.deepcopy(PAYLOAD)
    mutate(bad)
    r = requests.post(f"{url}/hook/page", json=bad, timeout=5)
    assert r.status_code == 400 and r.json()["field"] == field
    assert store.count() == 0
    assert requests.get(f"{url}/health", timeout=5).json() == {"status": "ok", "notifications": 0}


def test_not_json_unknown_channel_and_server_keeps_running(pager):
    url, store, _ = pager
    assert requests.post(f"{url}/hook/page", data=b"\xff\xfe", timeout=5).status_code == 400
    assert requests.post(f"{url}/hook/sms", json=PAYLOAD, timeout=5).status_code == 404
    assert requests.get(f"{url}/api/pages", params={"limit": "lots"}, timeout=5).status_code == 400
    assert store.count() == 0
    assert requests.post(f"{url}/hook/ticket", json=PAYLOAD, timeout=5).status_code == 200
    assert requests.get(f"{url}/api/pages", timeout=5).json()["pages"][0]["channel"] == "ticket"


def test_html_lists_status_summary_and_runbook_escaped(pager):
    url, _, _ = pager
    requests.post(f"{url}/hook/page", json=PAYLOAD, timeout=5)
    html = requests.get(f"{url}/", timeout=5).text
    assert "GpuXidCritical" in html and "firing" in html
    assert '<a href="http://127.0.0.1:9097/runbooks/xid.md#gpuxidcritical">runbook</a>' in html
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_runbooks_are_served_and_paths_cannot_escape(pager):
    url, _, _ = pager
    assert requests.get(f"{url}/runbooks/xid.md", timeout=5).text == "# Xid\n"
    assert requests.get(f"{url}/runbooks/../pager.sqlite", timeout=5).status_code == 404
    assert requests.get(f"{url}/runbooks/%2e%2e%2fpager.sqlite", timeout=5).status_code == 404


def test_lone_surrogates_and_hostile_json_are_rejected_and_the_page_stays_up(pager):
    url, store, _ = pager
    bad = copy.deepcopy(PAYLOAD)
    bad["alerts"][0]["annotations"]["summary"] = "\ud800"
    raw = json.dumps(bad).encode()  # json.dumps escapes the surrogate as \\ud800
    r = requests.post(f"{url}/hook/page", data=raw, timeout=5)
    assert r.status_code == 400 and r.json()["field"].startswith("alerts[0].annotations")
    for body in (b"[" * 30000 + b"]" * 30000, b'{"version": ' + b"9" * 5000 + b"}"):
        assert requests.post(f"{url}/hook/page", data=body, timeout=5).status_code == 400
    assert store.count() == 0
    assert requests.get(f"{url}/", timeout=5).status_code == 200


def test_head_then_get_on_one_connection(pager):
    url, _, _ = pager
    with requests.Session() as s:
        h = s.head(f"{url}/runbooks/xid.md", timeout=5)
        assert h.status_code == 200 and h.text == ""
        assert s.get(f"{url}/runbooks/xid.md", timeout=5).text == "# Xid\n"
