"""Live: a recurrence always pages (issue 32, item 5).

The sequence that swallowed a page: a drill's Xid page is open, the stack is brought down without
resolving it, the fault ends while it is down, the stack comes up again on the same run directory,
and the same fault comes back. Alertmanager's
notification log, kept in the run directory, still held the open page's firing notification, so the
same alert firing again was deduplicated for ``repeat_interval`` (4h; Alertmanager v0.25.0
``notify/notify.go`` ``DedupStage.needsUpdate``). ``gpuobs stack up`` now starts Alertmanager without
the previous run's notification log (silences kept): the second page arrives.
"""

from __future__ import annotations

import io
import time

import pytest
import requests

from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.stack import supervisor
from gpuobs.stack.ports import free_port_range
from gpuobs.stack.render import Ports
from tests.polling import poll

pytestmark = pytest.mark.live


def _xid_page_since(pager: str, since: float) -> list[dict]:
    pages = requests.get(f"{pager}/api/pages", params={"alertname": "GpuKernelXidCritical", "status": "firing"},
                         timeout=5).json()["pages"]
    return [p for p in pages if p["received_at"] >= since]


def _firing(prometheus: str) -> bool:
    alerts = requests.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return any(a["labels"]["alertname"] == "GpuKernelXidCritical" and a["state"] == "firing" for a in alerts)


def test_a_page_left_open_by_down_does_not_swallow_the_same_faults_next_page(tmp_path):
    base = free_port_range(16)
    ports = Ports(prometheus=base, alertmanager=base + 1, pager=base + 2, node_base=base + 3, engine_base=base + 10)
    cfg = supervisor.StackConfig(run_dir=tmp_path / "run", ports=ports, nodes=1, gpus=2, training_nodes=0,
                                 profile="drill", logwatch=True, timeout_s=90)
    out = io.StringIO()
    state = supervisor.up(cfg, out=out)
    try:
        AdminClient(state.urls.node_bases[0], state.token()).inject({"kind": "xid", "gpu": 1, "code": 48})
        t0 = time.time()
        poll("the first Xid 48 page", lambda: _xid_page_since(state.urls.pager, t0 - 1), 60)
        supervisor.down(cfg.run_dir, out=out)  # the page is still open: its resolution is never sent
        # The Xid stays "recent" for 1 minute (drill profile): it ends while the stack is down, so no
        # resolution ever reaches an Alertmanager and the notification log keeps the page as firing.
        time.sleep(max(0.0, t0 + 75 - time.time()))
        state = supervisor.up(cfg, out=out)
        assert "removed the previous run's notification log" in out.getvalue()
        assert not _firing(state.urls.prometheus)
        AdminClient(state.urls.node_bases[0], state.token()).inject({"kind": "xid", "gpu": 1, "code": 48})
        t1 = time.time()
        page = poll("the recurrence's page", lambda: _xid_page_since(state.urls.pager, t1 - 1), 90)[-1]
        labels = next(a["labels"] for a in page["alerts"] if a["labels"]["alertname"] == "GpuKernelXidCritical")
        assert (labels["gpu"], labels["xid"]) == ("1", "48")
        print(f"\nrecurrence paged {page['received_at'] - t1:.1f}s after the fault, after down/up on the same run dir")
    finally:
        supervisor.down(cfg.run_dir, out=out)
        for comp in state.components.values():
            assert not supervisor.alive(comp.pid, comp.argv), f"{comp.argv[0]} still running after down"
