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


def test_an_incident_alertmanager_lost_is_resolved_after_the_grace_only(store):
    (inc,) = store.incidents()
    rec = Reconciler(store, lambda: set(), grace_s=720.0)
    assert rec.check(1000.0 + 719) == [] and store.incident(inc["id"])["state"] == "open"
    assert rec.check(1000.0 + 720) == [inc["id"]]
    after = store.incident(inc["id"])
    assert after["state"] == "resolved" and [a["status"] for a in after["alerts"]] == ["resolved"]
    ev = [e for e in after["timeline"] if e["kind"] == "reconciled"]
    assert len(ev) == 1 and "Alertmanager holds none of its alerts" in ev[0]["reason"]
    assert rec.check(1000.0 + 2000) == []  # once
    # a later firing notification of the group re-opens it as usual
    store.add("page", _payload("firing"), received_at=5000.0)
    assert store.incident(inc["id"])["state"] == "open"


def test_an_incident_whose_alert_alertmanager_still_holds_stays_open(store):
    (inc,) = store.incidents()
    assert Reconciler(store, lambda: {"fp-xid", "other"}, grace_s=60.0).check(99999.0) == []
    assert store.incident(inc["id"])["state"] == "open"


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
