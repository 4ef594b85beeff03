"""Reconciliation with Alertmanager (gpuobs.pager.reconcile): an incident whose alerts Alertmanager no
longer holds is resolved after the grace, never before, never while Alertmanager cannot answer."""

from __future__ import annotations

import pytest

from gpuobs.pager.reconcile import Reconciler
from gpuobs.pager.store import PageStore


def _payload(status: str, fp: str = "fp-xid", name: str = "GpuKernelXidCritical") -> dict:
    labels = {"alertname": name, "severity": "critical", "node": "gpu-node-00", "gpu": "1"}
    return {"version": "4", "groupKey": '{}:{node="gpu-node-00", gpu="1"}', "status": status, "receiver": "page",
            "groupLabels": {"node": "gpu-node-00", "gpu": "1"}, "commonLabels": labels, "commonAnnotations": {},
            "externalURL": "http://am", "truncatedAlerts": 0,
            "alerts": [{"status": status, "labels": labels, "annotations": {}, "startsAt": "2026-12-04T10:00:00Z",
                        "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": fp}]}


@pytest.fixture
def store(tmp_path):
    s = PageStore(tmp_path / "p.sqlite")
    s.add("page", _payload("firing"), received_at=1000.0)
    yield s
    s.close()


def test_an_incident_alertmanager_lost_is_resolved_after_the_grace_of_absence_only(store):
    (inc,) = store.incidents()
    held = {"fp-xid"}
    rec = Reconciler(store, lambda: set(held), grace_s=720.0)
    # hours after its last notification (Alertmanager repeats only every 4h) the incident is still held
    assert rec.check(1000.0 + 5 * 3600) == []
    held.clear()  # Alertmanager restarted: nothing held until Prometheus re-sends
    t = 1000.0 + 5 * 3600 + 30
    assert rec.check(t) == [] and rec.check(t + 719) == [] and store.incident(inc["id"])["state"] == "open"
    held.add("fp-xid")  # re-sent within the resend delay: the absence timer starts over
    assert rec.check(t + 750) == []
    held.clear()
    assert rec.check(t + 800) == [] and rec.check(t + 800 + 719) == []
    assert rec.check(t + 800 + 720) == [inc["id"]]
    after = store.incident(inc["id"])
    assert after["state"] == "resolved" and [a["status"] for a in after["alerts"]] == ["resolved"]
    ev = [e for e in after["timeline"] if e["kind"] == "reconciled"]
    assert len(ev) == 1 and "Alertmanager has not held any of its alerts for 720s" in ev[0]["reason"]
    assert rec.check(t + 5000) == []  # once


def test_the_same_alert_notified_again_reopens_a_reconciled_incident_even_inside_the_dedupe_window(store):
    (inc,) = store.incidents()
    rec = Reconciler(store, lambda: set(), grace_s=60.0)
    rec.check(1100.0)
    assert rec.check(1160.0) == [inc["id"]]
    _, duplicate = store.deliver("page", _payload("firing"), received_at=1200.0)  # same payload, 200 s later
    assert not duplicate and store.incident(inc["id"])["state"] == "open"


def test_an_incident_whose_alert_alertmanager_still_holds_stays_open(store):
    (inc,) = store.incidents()
    assert Reconciler(store, lambda: {"fp-xid", "other"}, grace_s=60.0).check(99999.0) == []
    assert store.incident(inc["id"])["state"] == "open"


def test_alertmanager_answering_nonsense_is_an_api_error_that_resolves_nothing():
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from gpuobs.promapi.silences import AlertmanagerClient, SilenceApiError

    bodies = iter([b"{}", b"<html>", b'[{"x": 1}]', b'[{"fingerprint": null}]'])

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = next(bodies)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = AlertmanagerClient(f"http://127.0.0.1:{srv.server_address[1]}")
        for _ in range(4):
            with pytest.raises(SilenceApiError):
                client.fingerprints()
    finally:
        srv.shutdown()
        srv.server_close()


def test_alertmanager_unreachable_resolves_nothing(store):
    def down():
        raise ConnectionError("refused")
    rec = Reconciler(store, down, grace_s=1.0)
    with pytest.raises(ConnectionError):
        rec.check(99999.0)
    assert store.incidents()[0]["state"] == "open"


def test_grace_must_be_positive(store):
    with pytest.raises(ValueError, match="grace_s"):
        Reconciler(store, set, grace_s=0)
