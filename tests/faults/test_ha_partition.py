"""Fault suite, HA topology: a partition of one Alertmanager member during a live incident.

One HA stack (gpuobs.stack.ha: 2 shards x 2 Prometheus replicas, a 3-member Alertmanager cluster with
``--cluster.peer-timeout=3s``, VictoriaMetrics, vmalert; drill profile, 2 nodes, no logwatch). A node
goes down (``{"kind": "down"}``: GpuExporterDown, a node-local page from the shards). Two partitions,
each by SIGSTOP (the process neither answers HTTP nor gossips; its peers mark it failed) for
``STOP_S`` = 30 s, ten peer timeouts and past memberlist's failure detection, then SIGCONT:

1. **before the page**: ``alertmanager-0``, the member that notifies first (position 0, no wait), is
   stopped as soon as it holds the alert, inside ``group_wait``; the page must come from another
   member while it is stopped, and when it resumes its own flush runs with a notification log that
   may not yet hold the others' entry;
2. **after the page**: ``alertmanager-1`` is stopped while the alert keeps firing and resumed.

Then the fault is cleared and the resolution must arrive. Measured (docs/ha.md, "Partition of one
Alertmanager"): webhook deliveries made by each member (``alertmanager_notifications_total``), the
pager's stored notifications and the deliveries it absorbed as duplicates (delivery key,
docs/alert-delivery.md). Must hold: exactly one page (one firing notification of the incident's
alert stored on the page channel) and one resolution, no page for anything else. Every wait polls
with a deadline. Runs only in ``make test-faults`` (GPUOBS_FAULT_SUITE=1): about 4 minutes.
"""

from __future__ import annotations

import io
import os
import signal
import time

import pytest
import requests

from gpuobs.promapi.alertmanager import PagerClient
from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.stack import ha, supervisor
from gpuobs.stack.ports import free_port_range
from gpuobs.stack.render import Ports
from tests.faults.conftest import record
from tests.polling import poll

pytestmark = [pytest.mark.live, pytest.mark.skipif(os.environ.get("GPUOBS_FAULT_SUITE") != "1",
                                                   reason="live incidents run in `make test-faults`")]

ALERT = "GpuExporterDown"
STOP_S = 30.0
MEMBERS = [f"alertmanager-{i}" for i in range(3)]


def _pages(state) -> tuple[list[dict], list[dict]]:
    """(this incident's notifications on the page channel, any other page-channel notification)."""
    pages = [p for p in PagerClient(state.urls.pager).pages(1000) if p["channel"] == "page"]
    mine = [p for p in pages if any(a["labels"].get("alertname") == ALERT for a in p["alerts"])]
    return sorted(mine, key=lambda p: p["id"]), [p for p in pages if p not in mine]


def _holds_alert(url: str) -> bool:
    alerts = requests.get(f"{url}/api/v2/alerts", timeout=2).json()
    return any(a["labels"].get("alertname") == ALERT and a["status"]["state"] == "active" for a in alerts)


def _webhook_sent(url: str) -> float:
    """``alertmanager_notifications_total{integration="webhook"}`` of one member (every receiver)."""
    text = requests.get(f"{url}/metrics", timeout=3).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("alertmanager_notifications_total{") and 'integration="webhook"' in line)


def _partition(state, name: str, out: list[str]) -> None:
    """SIGSTOP ``name`` for STOP_S, then SIGCONT and wait until the cluster has 3 peers on every member."""
    (pid,) = supervisor.find_processes(state, name)
    os.kill(pid, signal.SIGSTOP)
    t = time.monotonic()
    try:
        others = [state.members[m] for m in MEMBERS if m != name]
        # Failure detection: the stopped member leaves its peers' view while it is stopped.
        poll(f"{name} to drop out of its peers' cluster view", lambda: all(ha._cluster_size(u) == 2 for u in others),
              STOP_S - 5)
        out.append(f"{name} left the peers' view {time.monotonic() - t:.0f} s after SIGSTOP")
        time.sleep(max(0.0, t + STOP_S - time.monotonic()))
    finally:
        os.kill(pid, signal.SIGCONT)
    back = time.monotonic()
    poll("the cluster to re-form", lambda: all(ha._cluster_size(state.members[m]) == 3 for m in MEMBERS), 60,
          every_s=0.1)
    out.append(f"cluster re-formed {time.monotonic() - back:.1f} s after SIGCONT")


def _tally(state) -> str:
    """Webhook deliveries per member and the pager's stored / absorbed counts, as one short string."""
    sent = [_webhook_sent(state.members[m]) for m in MEMBERS]
    health = requests.get(f"{state.urls.pager}/health", timeout=5).json()
    return (f"deliveries by member 0/1/2 {'/'.join(f'{v:.0f}' for v in sent)}, pager stored "
            f"{health['notifications']} absorbed {health['duplicates']}")


def test_a_partitioned_alertmanager_pages_once(tmp_path):
    base = free_port_range(32)
    ports = Ports(pager=base, node_base=base + 1, engine_base=base + 3)
    out = io.StringIO()
    cfg = ha.HAConfig(stack=supervisor.StackConfig(run_dir=tmp_path / "run", ports=ports, nodes=2, gpus=2,
                                                   training_nodes=0, logwatch=False, profile="drill", timeout_s=180),
                      base_port=base + 8)
    state = ha.up(cfg, out=out)
    notes: list[str] = []
    try:
        admin = AdminClient(state.urls.node_bases[0], state.token())
        injected = time.time()
        fault = admin.inject({"kind": "down"})
        am0 = state.members["alertmanager-0"]
        poll("alertmanager-0 to hold the alert", lambda: _holds_alert(am0), 120, every_s=0.2)
        early = _pages(state)[0]  # empty unless a member already notified (then phase 1 is after the page)
        notes.append(f"phase 1 started {'after' if early else 'before'} the page")
        notes.append(f"before phase 1: {_tally(state)}")
        _partition(state, "alertmanager-0", notes)
        firing = poll("the page", lambda: [p for p in _pages(state)[0] if p["status"] == "firing"], 60)
        notes.append(f"page at +{firing[0]['received_at'] - injected:.0f} s")
        time.sleep(15)  # group_interval (10 s) + slack: a resumed member's stale flush is out by now
        notes.append(f"after phase 1: {_tally(state)}")
        _partition(state, "alertmanager-1", notes)
        time.sleep(15)
        notes.append(f"after phase 2: {_tally(state)}")
        premature = [p for p in _pages(state)[0] if p["status"] == "resolved"]
        cleared = time.time()
        admin.clear(fault["id"])
        poll("the resolution", lambda: [p for p in _pages(state)[0] if p["status"] == "resolved"], 150)
        time.sleep(20)  # late duplicates of the resolution
        mine, others = _pages(state)
        notes.append(f"at the end: {_tally(state)}")
    finally:
        supervisor.down(tmp_path / "run", out=out)
    firing = [p for p in mine if p["status"] == "firing"]
    resolved = [p for p in mine if p["status"] == "resolved"]
    measured = (f"{len(firing)} page, {len(resolved)} resolution, {len(others)} other pages stored; "
                + "; ".join(notes))
    ok = (len(firing) == 1 and len(resolved) == 1 and not others and not premature
          and resolved[0]["received_at"] > cleared)
    record("live HA: Alertmanager partition (SIGSTOP 30 s x 2)",
           "node down across a stop of the first-notifying member before the page and another after it", measured, ok)
    print(measured)
    assert ok, (measured, [(p["status"], p["received_at"]) for p in mine],
                [[a["labels"].get("alertname") for a in p["alerts"]] for p in others])
