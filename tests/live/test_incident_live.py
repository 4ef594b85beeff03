"""Live: an incident delivered by the real Alertmanager, silenced from the CLI through Alertmanager's
API v2, the silence suppressing the alert and shown on the incident, then expired.

The alert is posted to Alertmanager's ``/api/v2/alerts`` (as Prometheus would), so routing (critical ->
page), grouping and the bearer-token webhook are the stack's own; no fault has to ripen first.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import requests

from gpuobs.cli import run as cli_run
from tests.conftest import live_stack
from tests.polling import poll

pytestmark = pytest.mark.live

LABELS = {"alertname": "GpuXidCritical", "severity": "critical", "Hostname": "gpu-node-live", "gpu": "2",
          "xid": "48", "UUID": "GPU-live-2"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from live_stack(tmp_path_factory, "incident", nodes=1, gpus=2, training_nodes=0, logwatch=False,
                          timeout_s=90)


def _poll(fn, deadline_s: float, what: str):
    return poll(what, fn, deadline_s, transient=(requests.RequestException,))


def test_silence_from_an_incident_reaches_alertmanager_and_suppresses_the_alert(stack, capsys):
    am, pager = stack.urls.alertmanager, stack.urls.pager
    now = dt.datetime.now(dt.timezone.utc)
    alert = {"labels": LABELS, "annotations": {
        "summary": "A GPU reported a critical Xid", "description": "GPU 2 on gpu-node-live reported Xid 48",
        "runbook_url": f"{pager}/runbooks/xid.md#gpuxidcritical"},  # what the stack's rules carry
        "startsAt": now.isoformat(), "endsAt": (now + dt.timedelta(minutes=10)).isoformat()}
    assert requests.post(f"{am}/api/v2/alerts", json=[alert], timeout=5).status_code == 200

    def incident():
        incs = requests.get(f"{pager}/api/incidents", params={"state": "open"}, timeout=5).json()["incidents"]
        return next((i for i in incs if "gpu-node-live" in i["nodes"]), None)

    inc = _poll(incident, 60, "the page to reach the console")
    assert (inc["channel"], inc["gpus"], inc["xids"]) == ("page", ["2"], ["48"])
    assert inc["descriptions"] == ["GPU 2 on gpu-node-live reported Xid 48"]

    args = ["--pager-url", pager, "--author", "oncall-test"]
    assert cli_run(["incident", "silence", str(inc["id"]), "--duration", "2h", "--comment", "RMA filed", *args]) == 0
    out = capsys.readouterr().out
    sid = out.split("silence ", 1)[1].split()[0]
    sil = requests.get(f"{am}/api/v2/silence/{sid}", timeout=5).json()
    assert sil["status"]["state"] == "active" and sil["createdBy"] == "oncall-test" and sil["comment"] == "RMA filed"
    matchers = {m["name"]: m["value"] for m in sil["matchers"]}
    assert matchers["alertname"] == "GpuXidCritical" and matchers["Hostname"] == "gpu-node-live"
    ends = dt.datetime.fromisoformat(sil["endsAt"].replace("Z", "+00:00"))
    assert dt.timedelta(minutes=119) < ends - now < dt.timedelta(minutes=121)

    def suppressed():
        got = requests.get(f"{am}/api/v2/alerts", params={"filter": 'Hostname="gpu-node-live"'}, timeout=5).json()
        return got and got[0]["status"]["state"] == "suppressed" and sid in got[0]["status"]["silencedBy"]
    _poll(suppressed, 15, "Alertmanager to mark the alert silenced")

    page = requests.get(f"{pager}/incidents/{inc['id']}", timeout=5).text
    assert sid in page and "RMA filed" in page and "<td>active</td>" in page
    assert cli_run(["incident", "silences", "--alertmanager-url", am]) == 0
    assert sid in capsys.readouterr().out

    # A postmortem draft: the rule's expression comes from the real Prometheus's rules API (this alert
    # was posted by hand, so no series of the simulated fleet matches it and the draft says so).
    out_dir = Path(stack.run_dir) / "postmortems"
    assert cli_run(["incident", "postmortem", str(inc["id"]), "--pager-url", pager,
                    "--prometheus", stack.urls.prometheus, "--out", str(out_dir)]) == 0
    note = capsys.readouterr().out
    assert "GpuXidCritical: the rule's expression returned no series matching the alert" in note, note
    md = (out_dir / f"postmortem-incident-{inc['id']}.md").read_text()
    assert f"silence {sid} by oncall-test" in md and "## Timeline (UTC)" in md

    assert cli_run(["incident", "unsilence", str(inc["id"]), sid, *args]) == 0
    assert requests.get(f"{am}/api/v2/silence/{sid}", timeout=5).json()["status"]["state"] == "expired"
    kinds = [e["kind"] for e in requests.get(f"{pager}/api/incidents/{inc['id']}", timeout=5).json()["timeline"]]
    assert kinds[-2:] == ["silenced", "silence_expired"]


def test_rollout_notice_lands_in_the_console_as_a_ticket(stack):
    from gpuobs.rollout.notices import send
    from gpuobs.rollout.store import RolloutRecord

    rec = RolloutRecord("9.9.9-live", "9.9.9", "RolledBack", 1, {"hosts": ["gpu-node-00"]},
                        "canary verdict ROLLBACK: errors +3 pp")
    line = send(stack.urls.alertmanager, rec, stack.run_dir, stack.runbook_base)
    assert line and line.startswith("notice RolloutRolledBack sent")

    def notice_incident():
        incs = requests.get(f"{stack.urls.pager}/api/incidents", params={"channel": "ticket"}, timeout=5).json()
        return next((i for i in incs["incidents"] if i["alertnames"] == ["RolloutRolledBack"]), None)

    inc = _poll(notice_incident, 60, "the rollout notice to reach the console")
    assert inc["state"] == "open" and inc["severity"] == "warning"
    (desc,) = inc["descriptions"]
    assert len(desc.splitlines()) <= 5 and "Why: canary verdict ROLLBACK: errors +3 pp" in desc, desc
    ann = inc["alerts"][0]["annotations"]
    assert "gpuobs report rollout" in ann["report"]
    # the stack's rules link runbooks to its own pager, and so does the notice (stack.json's runbook_base)
    assert stack.runbook_base and ann["runbook_url"] == f"{stack.runbook_base}/runbooks/rollout.md#rolloutrolledback"
    assert requests.get(ann["runbook_url"], timeout=5).status_code == 200


def _chromium(args: list[str], profile) -> str:
    """Run headless Chromium (Debian's ``chromium``) once; returns stdout. Fails when it is absent:
    `make binaries` (run by `make test`) installs it, and a browser test that skips checks nothing."""
    import shutil
    import subprocess

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("Debian's chromium is not installed: run `make binaries` as root (apt-get install chromium)")
    r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--disable-extensions", "--disable-background-networking",
                        f"--user-data-dir={profile}", "--window-size=1400,1000", *args],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_console_incident_and_runbook_as_a_browser_renders_them(stack, tmp_path):
    """After the first test: the incident for gpu-node-live is open. Chromium renders the console, the
    incident page and the runbook its link points at; the DOM holds the incident, its description and
    the anchor; screenshots go to <run dir>/screenshots."""
    import re
    from pathlib import Path

    pager = stack.urls.pager
    shots = Path(stack.run_dir) / "screenshots"
    shots.mkdir(exist_ok=True)
    inc = next(i for i in requests.get(f"{pager}/api/incidents", timeout=5).json()["incidents"]
               if "gpu-node-live" in i["nodes"])
    dom = _chromium(["--dump-dom", f"{pager}/"], tmp_path / "p1")
    row = re.search(rf'<tr class="sev-critical state-open" id="incident-{inc["id"]}"[^>]*>(.*?)</tr>', dom, re.S)
    assert row, dom[:3000]
    assert 'class="open state">open<' in row.group(1) and "GPU 2 on gpu-node-live reported Xid 48" in row.group(1)
    assert '<span class="xid">48</span>' in row.group(1) and "Acknowledge</button>" in row.group(1)
    href = re.search(r'<a href="([^"]+)">runbook</a>', row.group(1)).group(1)
    assert href.startswith(f"{pager}/runbooks/xid.md#") and href.endswith("#gpuxidcritical")
    page = _chromium(["--dump-dom", f"{pager}/incidents/{inc['id']}"], tmp_path / "p2")
    assert "<h1>Incident #" in page and '<td class="kind">silenced</td>' in page
    rb = _chromium(["--dump-dom", href], tmp_path / "p3")
    assert '<h2 id="gpuxidcritical">GpuXidCritical</h2>' in rb
    for name, url in (("console", f"{pager}/"), ("incident", f"{pager}/incidents/{inc['id']}"), ("runbook", href)):
        _chromium([f"--screenshot={shots / f'{name}.png'}", url], tmp_path / f"s-{name}")
        assert (shots / f"{name}.png").stat().st_size > 5000


def test_prometheus_ui_paths_printed_by_make_up_answer(stack):
    from gpuobs.stack.ui import prometheus_pages

    pages = prometheus_pages(stack.urls.prometheus)
    assert {"alerts", "targets", "graph"} <= set(pages), pages
    for url in pages.values():
        assert requests.get(url, timeout=5).status_code == 200
