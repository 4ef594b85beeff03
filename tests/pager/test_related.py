"""An incident that overlaps a drill or a rollout on its node shows it (API, console page, postmortem)."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from gpuobs.core import activity
from gpuobs.pager import postmortem
from gpuobs.pager.server import PagerServer
from gpuobs.pager.store import PageStore
from tests.pager.test_incidents import XID
from tests.pager.test_pager import AUTH, TOKEN


@pytest.fixture
def linked_pager(tmp_path):
    store = PageStore(tmp_path / "pager.sqlite")
    srv = PagerServer(("127.0.0.1", 0), store, None, token=TOKEN, runbook_base="http://127.0.0.1:9097",
                      activity_file=activity.path_in(tmp_path))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", tmp_path
    srv.shutdown()
    srv.server_close()
    store.close()


def test_incident_shows_the_drill_on_its_node_and_not_the_others(linked_pager, tmp_path):
    url, run = linked_pager
    now = time.time()
    activity.record(run, "drill", "xid-1", title="drill xid", nodes=["gpu-node-01"], started_at=now - 30,
                    detail={"report": "gpuobs report drill xid --run-dir .run"})
    activity.record(run, "drill", "thermal-1", title="drill thermal", nodes=["gpu-node-02"], started_at=now - 30)
    activity.record(run, "rollout", "1.5.0-old", title="rollout 1.5.0", nodes=["gpu-node-01"],
                    started_at=now - 9000, ended_at=now - 8000)
    assert requests.post(f"{url}/hook/page", json=XID, headers=AUTH, timeout=5).status_code == 200
    activity.record(run, "drill", "xid-1", ended_at=time.time(), detail={"outcome": "PASS"})
    inc = requests.get(f"{url}/api/incidents/1", timeout=5).json()
    assert [(r["kind"], r["id"], r["match"]) for r in inc["related"]] == [("drill", "xid-1", "node gpu-node-01")]
    kinds = [e["kind"] for e in inc["timeline"]]
    assert kinds[0] == "drill started" and "drill ended" in kinds and "opened" in kinds
    assert kinds.index("drill started") < kinds.index("opened") < kinds.index("drill ended")
    ended = next(e for e in inc["timeline"] if e["kind"] == "drill ended")
    assert (ended["drill"], ended["on"], ended["outcome"]) == ("xid-1", "gpu-node-01", "PASS")
    assert [e["at"] for e in inc["timeline"]] == sorted(e["at"] for e in inc["timeline"])
    page = requests.get(f"{url}/incidents/1", timeout=5).text
    assert "Related drills and rollouts" in page and "drill xid" in page and "drill thermal" not in page
    assert "gpuobs report drill xid --run-dir .run" in page and "rollout 1.5.0" not in page
    md = postmortem.markdown_draft(inc, [], None)
    assert "| drill | drill started: drill xid on gpu-node-01 (related by node gpu-node-01) |" in md
    assert "drill ended: drill xid on gpu-node-01 (related by node gpu-node-01), PASS" in md


def test_no_activity_file_links_nothing(linked_pager):
    url, _ = linked_pager
    assert requests.post(f"{url}/hook/page", json=XID, headers=AUTH, timeout=5).status_code == 200
    inc = requests.get(f"{url}/api/incidents/1", timeout=5).json()
    assert inc["related"] == [] and "Related drills" not in requests.get(f"{url}/incidents/1", timeout=5).text
