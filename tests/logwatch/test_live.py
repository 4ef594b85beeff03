"""Live: the native stack with one logwatch per node (drill profile), real Prometheus and Alertmanager.

On node 0, Xid 48 three times: three counted events and a page (GpuKernelXidCritical, and
GpuKernelXidRepeated for the repeat); DCGM's GpuXidCritical stands aside in its own expression (the
node's logwatch reads its source) and never fires. On node 1, Xid 79: GpuFallenOffBus pages through the
log path (GpuMissing, which would fire 2 minutes later, is inhibited by it: tests/mixin). Then
logwatch on node 0 is killed (SIGKILL) while more Xids are logged, restarted, and counts exactly.
Fault-to-page times are printed (run with -s to see them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.stack import supervisor
from tests.conftest import live_stack

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # The DCGM Xid path it checks against reads DCGM_EXP_XID_ERRORS_COUNT (enhanced): recommended profile.
    yield from live_stack(tmp_path_factory, "lw", nodes=2, gpus=4, training_nodes=0, profile="drill", timeout_s=90,
                          exporter_profile="recommended")


def xid48_count(url: str, gpu: str) -> float | None:
    try:
        text = requests.get(url, timeout=2).text
    except requests.RequestException:
        return None
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "gpuobs_xid_events_total" and s.labels["xid"] == "48" and s.labels["gpu"] == gpu)


def wait(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_xid48_three_times_and_xid79_page_through_the_log_path_and_restart_counts_exactly(stack):
    urls = stack.urls
    admin = [AdminClient(u, stack.token()) for u in urls.node_bases]
    pager, prom = urls.pager, urls.prometheus
    lw0 = urls.logwatch[0]

    def pages(name: str, host: str) -> list[dict]:
        out = requests.get(f"{pager}/api/pages", params={"alertname": name, "status": "firing"}, timeout=5).json()["pages"]
        return [p for p in out if any(a["labels"].get("node") == host and a["labels"]["alertname"] == name
                                      for a in p["alerts"])]

    def firing(name: str, host: str) -> bool:
        alerts = requests.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return any(a["labels"]["alertname"] == name and a["labels"].get("node") == host and a["state"] == "firing"
                   for a in alerts)

    t48 = time.time()
    for _ in range(3):
        admin[0].inject({"kind": "xid", "gpu": 1, "code": 48})
    t79 = time.time()
    admin[1].inject({"kind": "xid", "gpu": 2, "code": 79})

    wait("3 counted Xid 48 events", lambda: xid48_count(lw0, "1") == 3, 20)
    p79 = wait("GpuFallenOffBus page", lambda: pages("GpuFallenOffBus", "gpu-node-01"), 45)[-1]
    labels = next(a["labels"] for a in p79["alerts"] if a["labels"]["alertname"] == "GpuFallenOffBus")
    assert (labels["gpu"], labels["pci_bus_id"], labels["severity"]) == ("2", "00000000:3A:00.0", "critical")
    p48 = wait("GpuKernelXidCritical page", lambda: pages("GpuKernelXidCritical", "gpu-node-00"), 75)[-1]
    a48 = next(a for a in p48["alerts"] if a["labels"]["alertname"] == "GpuKernelXidCritical")
    assert (a48["labels"]["gpu"], a48["labels"]["xid"]) == ("1", "48")
    assert a48["annotations"]["runbook_url"].endswith("/runbooks/xid.md#gpukernelxidcritical")
    rep = wait("GpuKernelXidRepeated page", lambda: pages("GpuKernelXidRepeated", "gpu-node-00"), 20)[-1]
    print(f"\nfault-to-page via the kernel log: Xid 79 {p79['received_at'] - t79:.1f}s (GpuFallenOffBus), "
          f"Xid 48 {p48['received_at'] - t48:.1f}s (GpuKernelXidCritical, no for:), "
          f"repeat {rep['received_at'] - t48:.1f}s (GpuKernelXidRepeated)")
    # The DCGM path stands aside where logwatch reads: it neither fires nor pages (one page per incident).
    time.sleep(8)  # > a scrape, an evaluation and group_wait: a DCGM alert would be firing and paged by now
    assert not firing("GpuXidCritical", "gpu-node-00")
    assert not pages("GpuXidCritical", "gpu-node-00")
    assert not pages("GpuMissing", "gpu-node-01")
    assert len(pages("GpuKernelXidCritical", "gpu-node-00")) == 1

    # Restart mid-stream: SIGKILL the node's agent, log two more Xids while it is down, restart it.
    comp = stack.components["logwatch-0"]
    os.kill(comp.pid, signal.SIGKILL)
    wait("logwatch-0 gone", lambda: not supervisor.alive(comp.pid, comp.argv), 10)
    admin[0].inject({"kind": "xid", "gpu": 1, "code": 48})
    admin[0].inject({"kind": "xid", "gpu": 1, "code": 48})
    log = open(comp.log, "ab")
    proc = subprocess.Popen(comp.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=stack.run_dir)
    try:
        wait("5 counted Xid 48 events after the restart", lambda: xid48_count(lw0, "1") == 5, 20)
        time.sleep(1.5)  # a few more polls: still exactly 5
        assert xid48_count(lw0, "1") == 5
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
