"""Fault suite, part 2: live incidents on the real stack (Prometheus 2.42, Alertmanager 0.25, pager).

Three incidents run at once, each on a stack of its own (drill profile, 2 nodes; free loopback ports,
own run directory). Each takes one serving node down (``{"kind": "down"}``: GpuExporterDown, a page;
its ServingEngineDown is inhibited) and, while the incident is open, disrupts one component:

* **pager stopped 60 s** (SIGSTOP: connections queue in the kernel, Alertmanager times out and retries,
  then everything queued is delivered at SIGCONT);
* **Alertmanager kill -9 + restart** (``gpuobs stack restart alertmanager``) after the page went out;
  the fault stays until Prometheus has re-sent the alert to the new Alertmanager;
* **Prometheus killed for 90 s** (kill -9, then ``gpuobs stack restart prometheus``) while the alert fires.

Then the fault is cleared. What must hold for each: exactly one page (firing notification of the
incident's alert on the page channel) and exactly one resolution, the page after the fault and the
resolution after the clear (never during the disruption), and no other page at all. Every wait polls
with a deadline. Runs only in ``make test-faults`` (GPUOBS_FAULT_SUITE=1): about 6 minutes.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from gpuobs.promapi.alertmanager import PagerClient
from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.stack import supervisor
from gpuobs.stack.ports import free_port_range
from gpuobs.stack.render import Ports
from tests.faults.conftest import record
from tests.polling import TRANSIENT, poll

pytestmark = [pytest.mark.live, pytest.mark.skipif(os.environ.get("GPUOBS_FAULT_SUITE") != "1",
                                                   reason="live incidents run in `make test-faults` (about 5 min)")]

ALERT = "GpuExporterDown"


@dataclass
class Incident:
    name: str
    injected: float = 0.0
    cleared: float = 0.0
    disrupted: tuple[float, float] = (0.0, 0.0)
    pages: list[dict] = field(default_factory=list)
    others: list[dict] = field(default_factory=list)
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def firing(self) -> list[dict]:
        return [p for p in self.pages if p["status"] == "firing"]

    def resolved(self) -> list[dict]:
        return [p for p in self.pages if p["status"] == "resolved"]


def _poll(what: str, check, timeout_s: float):
    return poll(what, check, timeout_s, every_s=1.0, transient=TRANSIENT + (supervisor.StackError,))


def _incident_pages(state) -> tuple[list[dict], list[dict]]:
    pages = PagerClient(state.urls.pager).pages(1000)
    page_channel = [p for p in pages if p["channel"] == "page"]
    mine = [p for p in page_channel if any(a["labels"].get("alertname") == ALERT for a in p["alerts"])]
    return sorted(mine, key=lambda p: p["id"]), [p for p in page_channel if p not in mine]


def _am_has_alert(state) -> bool:
    alerts = requests.get(f"{state.urls.alertmanager}/api/v2/alerts", timeout=3).json()
    return any(a["labels"].get("alertname") == ALERT and a["status"]["state"] == "active" for a in alerts)


def _prom_firing(state) -> bool:
    alerts = requests.get(f"{state.urls.prometheus}/api/v1/alerts", timeout=3).json()["data"]["alerts"]
    return any(a["labels"].get("alertname") == ALERT and a["state"] == "firing" for a in alerts)


def _pid(state, name: str) -> int:
    pids = supervisor.find_processes(state, name)
    assert pids, f"{name} is not running"
    return pids[0]


def run_incident(kind: str, run: Path, ports: Ports) -> Incident:
    out = io.StringIO()
    inc = Incident(kind)
    state = supervisor.up(supervisor.StackConfig(run_dir=run, ports=ports, nodes=2, gpus=2, training_nodes=1,
                                                 profile="drill", timeout_s=180), out=out)
    try:
        admin = AdminClient(state.urls.node_bases[0], state.token())
        if kind == "pager stopped 60 s":
            pager_pid = _pid(state, "pager")
            os.kill(pager_pid, signal.SIGSTOP)
            t_stop = time.time()
            try:
                inc.injected = time.time()
                fault = admin.inject({"kind": "down"})
                _poll("Prometheus firing", lambda: _prom_firing(state), 120)
                time.sleep(max(0.0, t_stop + 60 - time.time()))
            finally:
                os.kill(pager_pid, signal.SIGCONT)
            inc.disrupted = (t_stop, time.time())
            _poll("the page", lambda: _incident_pages(state)[0], 120)
            time.sleep(30)  # let every queued and retried delivery arrive
        else:
            inc.injected = time.time()
            fault = admin.inject({"kind": "down"})
            _poll("the page", lambda: _incident_pages(state)[0], 150)
            if kind == "Alertmanager kill -9 + restart":
                time.sleep(8)  # past one notification-log snapshot (5 s)
                t = time.time()
                os.kill(_pid(state, "alertmanager"), signal.SIGKILL)
                supervisor.restart(run, "alertmanager", out=out, timeout_s=60)
                inc.disrupted = (t, time.time())
                waited = time.time()
                _poll("Prometheus re-sends the alert to the new Alertmanager", lambda: _am_has_alert(state), 240)
                inc.notes.append(f"alert back at Alertmanager {time.time() - waited:.0f} s after its restart")
                time.sleep(25)  # group_wait + group_interval + slack: a re-page would be out by now
            else:  # Prometheus killed for 90 s
                t = time.time()
                os.kill(_pid(state, "prometheus"), signal.SIGKILL)
                time.sleep(90)
                supervisor.restart(run, "prometheus", out=out, timeout_s=90)
                restarted = time.time()
                inc.disrupted = (t, restarted)
                _poll("the restarted Prometheus fires again", lambda: _prom_firing(state), 120)
                inc.notes.append(f"firing again {time.time() - restarted:.0f} s after the restart")
                time.sleep(30)
            if any(p["status"] == "resolved" for p in _incident_pages(state)[0]):
                inc.problems.append("resolved while the fault was still active (false resolution)")
        inc.cleared = time.time()
        admin.clear(fault["id"])
        _poll("the resolution", lambda: [p for p in _incident_pages(state)[0] if p["status"] == "resolved"], 150)
        time.sleep(20)  # late duplicates of the resolution
        inc.pages, inc.others = _incident_pages(state)
        inc.duplicates = requests.get(f"{state.urls.pager}/health", timeout=5).json()["duplicates"]
    except (TimeoutError, AssertionError, supervisor.StackError) as exc:
        inc.problems.append(str(exc))
        try:
            inc.pages, inc.others = _incident_pages(state)
        except Exception:  # the report must still come out
            pass
    finally:
        supervisor.down(run, out=out)
    return inc


KINDS = ["pager stopped 60 s", "Alertmanager kill -9 + restart", "Prometheus killed 90 s"]


def test_incidents_page_once_and_resolve_once(tmp_path):
    base = free_port_range(16 * len(KINDS))
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(len(KINDS)) as pool:
        for i, kind in enumerate(KINDS):
            b = base + 16 * i
            # Every port of each parallel stack from its own block, the logwatch agents' included (left
            # to start-up, three stacks starting at once could pick the same free port).
            ports = Ports(prometheus=b, alertmanager=b + 1, pager=b + 2, node_base=b + 3, engine_base=b + 8,
                          grafana=b + 12, logwatch_base=b + 13)
            jobs[kind] = pool.submit(run_incident, kind, tmp_path / f"run{i}", ports)
        results = {k: f.result() for k, f in jobs.items()}
    failures = []
    for kind, inc in results.items():
        firing, resolved = inc.firing(), inc.resolved()
        ok = not inc.problems and len(firing) == 1 and len(resolved) == 1 and not inc.others
        if firing and resolved:
            ok = ok and firing[0]["received_at"] > inc.injected and resolved[0]["received_at"] > inc.cleared
        page_at = f"page at +{firing[0]['received_at'] - inc.injected:.0f} s" if firing else "no page"
        res_at = f"resolution {resolved[0]['received_at'] - inc.cleared:.0f} s after clear" if resolved else "no resolution"
        measured = (f"{len(firing)} page, {len(resolved)} resolution, {len(inc.others)} other pages; {page_at}, "
                    f"{res_at}; {inc.duplicates} duplicate deliveries absorbed")
        if inc.notes:
            measured += "; " + "; ".join(inc.notes)
        if inc.problems:
            measured += "; PROBLEMS: " + "; ".join(inc.problems)
        record(f"live: {kind}", "node down (GpuExporterDown page) across the disruption, then cleared", measured, ok)
        if not ok:
            failures.append((kind, measured, [(p["status"], p["received_at"]) for p in inc.pages],
                             [(p["status"], [a["labels"].get("alertname") for a in p["alerts"]]) for p in inc.others]))
    assert not failures, failures
