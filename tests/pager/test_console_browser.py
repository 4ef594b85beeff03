"""The incident console as a person sees it, in headless Chromium at 1280 px (tests/browser.py, DevTools
protocol): one open page with its impact, one acknowledged page, one open ticket and one resolved
ticket. Checks the layout (no horizontal scroll, grouped by node, worst first, severity by colour and
word, impact line, age), the filters, acknowledging with a name and a note, the name remembered for the
next incident, and the list refreshing in place. Screenshots go to ``$GPUOBS_SCREENSHOTS_DIR`` when set
(``docs/img`` holds the ones docs/on-call.md shows), else to the test's temporary directory."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import requests

from gpuobs.pager import impact
from tests.browser import Browser
from tests.pager.test_impact import CFG, T0, StubProm, serving_series, incident as impact_incident
from tests.pager.test_incidents import _payload, _ticket
from tests.pager.test_pager import AUTH, pager  # noqa: F401 (the pager server fixture)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _page(node: str, gpu: str, fp: str, xid: str = "48") -> dict:
    p = _payload(Hostname=node, gpu=gpu, xid=xid)
    p["groupKey"] = f'{{}}/{{severity="critical"}}:{{alertname="GpuXidCritical", Hostname="{node}"}}'
    a = p["alerts"][0]
    a["fingerprint"] = fp
    what = {"48": "double-bit ECC error", "79": "GPU has fallen off the bus"}[xid]
    a["annotations"]["description"] = f"GPU {gpu} on {node} reported Xid {xid} ({what})"
    return p


def _fill(url: str, store) -> dict[str, int]:
    post = lambda ch, body: requests.post(f"{url}/hook/{ch}", json=body, headers=AUTH, timeout=5)  # noqa: E731
    assert post("page", _page("gpu-node-00", "0", "a1")).status_code == 200
    assert post("page", _page("gpu-node-01", "3", "b2", "79")).status_code == 200
    assert post("ticket", _ticket()).status_code == 200  # GpuXidWarning on gpu-node-02, stays open
    done = copy.deepcopy(_ticket())
    done["groupKey"] = done["groupKey"].replace("gpu-node-02", "gpu-node-03")
    done["alerts"][0].update(fingerprint="t9", labels={**done["alerts"][0]["labels"], "Hostname": "gpu-node-03"})
    assert post("ticket", done).status_code == 200
    done["status"] = done["alerts"][0]["status"] = "resolved"
    assert post("ticket", done).status_code == 200
    ids = {(", ".join(i["nodes"])): i["id"] for i in store.incidents()}
    store.acknowledge(ids["gpu-node-01"], "dana", note="draining the node")
    doc = impact.measure(StubProm(serving_series(0.21, 0.5), [{"node": "gpu-node-00", "gpu": "0"}], 32), CFG,
                         impact_incident(T0, None), now=T0 + 300)
    store.record_impact(ids["gpu-node-00"], doc)
    return ids


def test_console_reads_at_a_glance_at_1280px(pager, tmp_path):  # noqa: F811
    url, store, _ = pager
    ids = _fill(url, store)
    shots = Path(os.environ.get("GPUOBS_SCREENSHOTS_DIR") or tmp_path)
    with Browser(1280, 900) as b:
        b.open(f"{url}/")
        assert b.eval("document.documentElement.scrollWidth") <= 1280, "the console scrolls sideways at 1280 px"
        groups = b.eval("[...document.querySelectorAll('#active section.node-group')].map(s => s.dataset.node)")
        # open critical page first, then the open warning ticket, then the acknowledged page; resolved apart
        assert groups == ["gpu-node-00", "gpu-node-02", "gpu-node-01"], groups
        sev = b.eval("(() => { const s = document.querySelector('#incident-%d .sev');"
                     " return [s.textContent, getComputedStyle(s).backgroundColor]; })()" % ids["gpu-node-00"])
        assert sev == ["critical", "rgb(204, 0, 0)"]
        warn = b.eval("getComputedStyle(document.querySelector('#incident-%d .sev')).backgroundColor" % ids["gpu-node-02"])
        assert warn == "rgb(242, 194, 0)"
        row = b.eval("document.querySelector('#incident-%d').innerText" % ids["gpu-node-00"])
        assert "630 requests failed (600 above baseline)" in row and "goodput lost 2,100 requests" in row, row
        assert re.search(r"\t(\d+[smhd]|\d+h\d\dm)\t", row), row  # the age column
        acked = b.eval("document.querySelector('#incident-%d').innerText" % ids["gpu-node-01"])
        assert "acknowledged" in acked and "by dana" in acked
        assert b.eval("document.querySelector('#resolved summary').textContent") == "Recently resolved (1)"
        b.screenshot(shots / "console.png")

        # Filters are plain GET parameters: critical only leaves the two pages.
        b.eval("document.querySelector('select[name=severity]').value = 'critical';"
               " document.querySelector('#filters').submit()")
        b.wait("location.search.includes('severity=critical')")
        b.wait("document.readyState === 'complete'")
        assert b.eval("[...document.querySelectorAll('#active section.node-group')].map(s => s.dataset.node)") == [
            "gpu-node-00", "gpu-node-01"]

        # Acknowledge with a name and a note, as a person types them.
        b.open(f"{url}/")
        iid = ids["gpu-node-00"]
        b.eval(f"(() => {{ const f = document.querySelector('form[action=\"/incidents/{iid}/ack\"]');"
               " f.querySelector('input[name=by]').value = 'sam';"
               " f.querySelector('input[name=note]').value = 'resetting GPU 0';"
               " f.querySelector('button').click(); })()")
        b.wait(f"location.pathname === '/incidents/{iid}'")
        b.wait("document.readyState === 'complete'")
        one = requests.get(f"{url}/api/incidents/{iid}", timeout=5).json()
        assert one["state"] == "acknowledged" and one["acknowledged_by"] == "sam"
        ack = next(e for e in one["timeline"] if e["kind"] == "acknowledged")
        assert ack["note"] == "resetting GPU 0"
        text = b.eval("document.body.innerText")
        assert "Impact" in text and "goodput lost" in text and "PromQL" in text
        b.screenshot(shots / "incident.png")

        # The name is remembered in this browser for the next incident.
        b.open(f"{url}/")
        tid = ids["gpu-node-02"]
        assert b.eval(f"document.querySelector('form[action=\"/incidents/{tid}/ack\"] input[name=by]').value") == "sam"

        # A new page appears without reloading: the list refreshes itself in place.
        b.eval("window.__marker = 1")
        assert requests.post(f"{url}/hook/page", json=_page("gpu-node-05", "7", "c3"), headers=AUTH,
                             timeout=5).status_code == 200
        b.wait("document.querySelector('section.node-group[data-node=\"gpu-node-05\"]') !== null", timeout_s=25)
        assert b.eval("window.__marker") == 1  # same document: refreshed, not reloaded


def test_on_call_doc_shows_the_console_screenshots():
    text = (DOCS / "on-call.md").read_text()
    for name in ("console.png", "incident.png"):
        assert f"img/{name}" in text, f"docs/on-call.md does not show img/{name}"
        assert (DOCS / "img" / name).stat().st_size > 10_000
