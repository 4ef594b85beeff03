"""The pager: Alertmanager v4 payload validation, SQLite storage before 200, JSON and HTML views."""

from __future__ import annotations

import copy
import json
import sqlite3
import threading

import pytest
import requests

from gpuobs.pager.server import PagerServer
from gpuobs.pager.store import PageStore, delivery_key

TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

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
    srv = PagerServer(("127.0.0.1", 0), store, rb, token=TOKEN, runbook_base="http://127.0.0.1:9097")
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", store, tmp_path / "pager.sqlite"
    srv.shutdown()
    srv.server_close()
    store.close()


def test_valid_payload_is_stored_before_200_and_listed_newest_first(pager):
    url, _, db = pager
    assert requests.post(f"{url}/hook/page", json=PAYLOAD, headers=AUTH, timeout=5).status_code == 200
    # Committed: a separate connection sees it immediately.
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM notifications").fetchone()[0] == 1
    resolved = copy.deepcopy(PAYLOAD)
    resolved["status"] = "resolved"
    resolved["alerts"][0]["status"] = "resolved"
    assert requests.post(f"{url}/hook/page", json=resolved, headers=AUTH, timeout=5).status_code == 200
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
    r = requests.post(f"{url}/hook/page", json=bad, headers=AUTH, timeout=5)
    assert r.status_code == 400 and r.json()["field"] == field
    assert store.count() == 0
    assert requests.get(f"{url}/health", timeout=5).json() == {"status": "ok", "notifications": 0, "duplicates": 0}


def test_not_json_unknown_channel_and_server_keeps_running(pager):
    url, store, _ = pager
    assert requests.post(f"{url}/hook/page", data=b"\xff\xfe", headers=AUTH, timeout=5).status_code == 400
    assert requests.post(f"{url}/hook/sms", json=PAYLOAD, headers=AUTH, timeout=5).status_code == 404
    assert requests.get(f"{url}/api/pages", params={"limit": "lots"}, timeout=5).status_code == 400
    assert store.count() == 0
    assert requests.post(f"{url}/hook/ticket", json=PAYLOAD, headers=AUTH, timeout=5).status_code == 200
    assert requests.get(f"{url}/api/pages", timeout=5).json()["pages"][0]["channel"] == "ticket"


def test_html_lists_status_summary_and_runbook_escaped(pager):
    url, _, _ = pager
    requests.post(f"{url}/hook/page", json=PAYLOAD, headers=AUTH, timeout=5)
    for page in ("/notifications", "/"):  # the notification log and the incident console
        html = requests.get(f"{url}{page}", timeout=5).text
        assert "GpuXidCritical" in html and ("firing" if page != "/" else "open") in html
        assert '<a href="http://127.0.0.1:9097/runbooks/xid.md#gpuxidcritical">runbook</a>' in html
        assert "<script>" not in html and "&lt;script&gt;" in html


def test_runbooks_are_served_and_paths_cannot_escape(pager):
    url, _, _ = pager
    assert requests.get(f"{url}/runbooks/xid.md", params={"format": "markdown"}, timeout=5).text == "# Xid\n"
    r = requests.get(f"{url}/runbooks/xid.md", timeout=5)
    assert r.headers["Content-Type"].startswith("text/html") and '<h1 id="xid">Xid</h1>' in r.text
    assert requests.get(f"{url}/runbooks/../pager.sqlite", timeout=5).status_code == 404
    assert requests.get(f"{url}/runbooks/%2e%2e%2fpager.sqlite", timeout=5).status_code == 404


def test_lone_surrogates_and_hostile_json_are_rejected_and_the_page_stays_up(pager):
    url, store, _ = pager
    bad = copy.deepcopy(PAYLOAD)
    bad["alerts"][0]["annotations"]["summary"] = "\ud800"
    raw = json.dumps(bad).encode()  # json.dumps escapes the surrogate as \\ud800
    r = requests.post(f"{url}/hook/page", data=raw, headers=AUTH, timeout=5)
    assert r.status_code == 400 and r.json()["field"].startswith("alerts[0].annotations")
    for body in (b"[" * 30000 + b"]" * 30000, b'{"version": ' + b"9" * 5000 + b"}"):
        assert requests.post(f"{url}/hook/page", data=body, headers=AUTH, timeout=5).status_code == 400
    assert store.count() == 0
    assert requests.get(f"{url}/", timeout=5).status_code == 200


def test_head_then_get_on_one_connection(pager):
    url, _, _ = pager
    with requests.Session() as s:
        h = s.head(f"{url}/runbooks/xid.md", timeout=5)
        assert h.status_code == 200 and h.text == ""
        assert s.get(f"{url}/runbooks/xid.md?format=markdown", timeout=5).text == "# Xid\n"


def _resolved(payload: dict) -> dict:
    out = copy.deepcopy(payload)
    out["status"] = "resolved"
    out["alerts"][0].update(status="resolved", endsAt="2026-11-30T05:03:00Z")
    return out


def test_a_redelivered_notification_is_answered_200_and_not_stored(pager):
    url, store, _ = pager
    first = requests.post(f"{url}/hook/page", json=PAYLOAD, headers=AUTH, timeout=5).json()
    assert first["duplicate"] is False
    # Alertmanager's retries and re-sends: identical, or re-serialised with keys and alerts reordered.
    shuffled = json.loads(json.dumps(PAYLOAD, sort_keys=True))
    for body in (PAYLOAD, shuffled, PAYLOAD):
        r = requests.post(f"{url}/hook/page", json=body, headers=AUTH, timeout=5)
        assert r.status_code == 200 and r.json() == {"stored": first["stored"], "duplicate": True}
    assert store.count() == 1 and store.duplicates() == 3
    # The resolution is a new notification, then its own re-delivery is a duplicate.
    assert requests.post(f"{url}/hook/page", json=_resolved(PAYLOAD), headers=AUTH, timeout=5).json()["duplicate"] is False
    assert requests.post(f"{url}/hook/page", json=_resolved(PAYLOAD), headers=AUTH, timeout=5).json()["duplicate"] is True
    # A new firing of the same group (new startsAt) pages again; so does the same one on the ticket channel.
    again = copy.deepcopy(PAYLOAD)
    again["alerts"][0]["startsAt"] = "2026-11-30T06:00:00Z"
    assert requests.post(f"{url}/hook/page", json=again, headers=AUTH, timeout=5).json()["duplicate"] is False
    assert requests.post(f"{url}/hook/ticket", json=PAYLOAD, headers=AUTH, timeout=5).json()["duplicate"] is False
    assert store.count() == 4
    assert [p["status"] for p in requests.get(f"{url}/api/pages", timeout=5).json()["pages"]] == \
        ["firing", "firing", "resolved", "firing"]


def test_delivery_key_covers_group_status_fingerprints_and_times():
    base = delivery_key("page", PAYLOAD)
    changes = [
        lambda p: p.update(groupKey="other"),
        lambda p: p.update(status="resolved"),
        lambda p: p["alerts"][0].update(fingerprint="def456"),
        lambda p: p["alerts"][0].update(startsAt="2026-11-30T05:00:01Z"),
        lambda p: p["alerts"][0].update(endsAt="2026-11-30T05:09:00Z"),
        lambda p: p["alerts"].append(dict(p["alerts"][0], fingerprint="ffff")),
    ]
    for change in changes:
        other = copy.deepcopy(PAYLOAD)
        change(other)
        assert delivery_key("page", other) != base
    same = copy.deepcopy(PAYLOAD)
    same["commonAnnotations"]["summary"] = "reworded"  # annotations are not identity
    assert delivery_key("page", same) == base
    assert delivery_key("ticket", PAYLOAD) != base


def test_dedupe_window_is_bounded(tmp_path):
    store = PageStore(tmp_path / "p.sqlite", dedupe_window_s=60)
    try:
        assert store.deliver("page", PAYLOAD, received_at=1000.0) == (1, False)
        assert store.deliver("page", PAYLOAD, received_at=1059.0) == (1, True)
        # Past the window the key is forgotten (pruned), so a repeat is stored again.
        assert store.deliver("page", PAYLOAD, received_at=1061.0) == (2, False)
        rows = store._db.execute("SELECT COUNT(*) FROM deliveries").fetchone()[0]
        assert rows == 1
    finally:
        store.close()
    with pytest.raises(ValueError):
        PageStore(tmp_path / "q.sqlite", dedupe_window_s=0)


def test_webhooks_need_the_bearer_token_and_reads_do_not(pager):
    url, store, _ = pager
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}):
        r = requests.post(f"{url}/hook/page", json=PAYLOAD, headers=headers, timeout=5)
        assert r.status_code == 401 and "WWW-Authenticate" in r.headers
    assert store.count() == 0
    # The unread body was drained: the next request on the same connection is parsed correctly.
    with requests.Session() as s:
        assert s.post(f"{url}/hook/page", json=PAYLOAD, timeout=5).status_code == 401
        assert s.get(f"{url}/health", timeout=5).json()["notifications"] == 0
    assert requests.post(f"{url}/hook/page", json=PAYLOAD, headers={"Authorization": f"bearer {TOKEN}"},
                         timeout=5).status_code == 200
    assert requests.get(f"{url}/api/pages", timeout=5).status_code == 200


def test_runbook_links_only_under_the_configured_base(pager):
    url, _, _ = pager
    hostile = ["https://evil.example/runbooks/xid.md", "http://127.0.0.1:9097/runbooksX/a.md",
               "http://127.0.0.1:90970/runbooks/a.md", "http://127.0.0.1:9097/runbooks/../admin",
               "javascript:alert(1)", "http://127.0.0.1:9097/runbooks/%2e%2e/x"]
    for i, link in enumerate(hostile):
        p = copy.deepcopy(PAYLOAD)
        p["alerts"][0]["fingerprint"] = f"fp{i}"
        p["alerts"][0]["annotations"]["runbook_url"] = link
        assert requests.post(f"{url}/hook/page", json=p, headers=AUTH, timeout=5).status_code == 200
    html = requests.get(f"{url}/notifications", timeout=5).text
    assert html.count("<a href=") == 1 and html.count("not under the runbook base") == len(hostile)  # 1: back link
    html = requests.get(f"{url}/", timeout=5).text  # the console: one incident, its first alert's URL as text
    assert "not under the runbook base" in html
    assert not any(f'href="{h}' in html for h in hostile)


def test_database_is_owner_only(tmp_path):
    import os
    import stat
    store = PageStore(tmp_path / "fresh.sqlite")
    store.deliver("page", PAYLOAD)
    store.close()
    assert stat.S_IMODE(os.stat(tmp_path / "fresh.sqlite").st_mode) == 0o600


def test_a_300_byte_runbook_name_is_404_not_500(pager):
    url, _, _ = pager
    assert requests.get(f"{url}/runbooks/{'a' * 300}.md", timeout=5).status_code == 404
