"""Failure drills on the running native stack: inject a fault, follow it to a page, clear, resolve.

``gpuobs drill xid`` times each hop: fault injected -> alert firing in Prometheus (HTTP API
``/api/v1/alerts``) -> notification stored by the pager on the expected receiver -> fault cleared ->
resolved notification stored.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

from gpuobs.exporter import xid as xidcat
from gpuobs.exporter.admin_client import AdminClient


class DrillError(RuntimeError):
    """A drill could not run (bad arguments or no stack); exit code 2."""


@dataclass
class DrillResult:
    """Timeline of one drill. Times are seconds since injection; None = not seen before the deadline."""

    drill: str
    fault: dict
    expected_alert: str
    expected_receiver: str
    hostname: str
    injected_at: float = 0.0
    firing_s: float | None = None
    paged_s: float | None = None
    cleared_s: float | None = None
    resolved_s: float | None = None
    receiver: str | None = None
    runbook_url: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["ok"] = self.ok
        return doc


def _label_match(labels: dict, want: dict) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


def expected_for_xid(code: int) -> tuple[str, str, dict]:
    """(alertname, receiver, extra label match) expected for an Xid code.

    Xid 79 removes the GPU from the page, so it shows as ``GpuMissing``; other codes alert through the
    windowed count: catalogue-critical codes page, ticket codes ticket. Raises DrillError for codes
    that alert nowhere (info class).
    """
    if code == 79:
        return "GpuMissing", "page", {}
    if code in xidcat.critical_codes():
        return "GpuXidCritical", "page", {"xid": str(code)}
    if code in xidcat.ticket_codes():
        return "GpuXidWarning", "ticket", {"xid": str(code)}
    raise DrillError(f"Xid {code} is info-class ({xidcat.message(code)}): no alert is expected; "
                     f"choose a critical code ({', '.join(map(str, xidcat.critical_codes()[:8]))}, ...) or a ticket code")


def _poll(check, deadline: float, interval: float = 0.5):
    while time.time() < deadline:
        try:
            got = check()
        except requests.RequestException:
            got = None
        if got:
            return got
        time.sleep(interval)
    return None


def run_xid(state: dict, code: int = 48, node: int = 0, gpu: int = 0, deadline_s: float = 60.0,
            resolve_deadline_s: float = 240.0, progress=None) -> DrillResult:
    """Run the Xid drill on the stack described by ``state`` (stack.json). Never raises for a miss:
    misses are listed in ``result.problems``. Raises DrillError for bad node/gpu/code."""
    if not 0 <= node < state["nodes"]:
        raise DrillError(f"--node must be 0..{state['nodes'] - 1}, got {node}")
    if not 0 <= gpu < state["gpus"]:
        raise DrillError(f"--gpu must be 0..{state['gpus'] - 1}, got {gpu}")
    alertname, receiver, extra = expected_for_xid(code)
    host = state["hostnames"][node]
    want = {"Hostname": host, **({"gpu": str(gpu)} if alertname != "GpuMissing" else {}), **extra}
    urls = state["urls"]
    token = Path(state["token_file"]).read_text().strip()
    admin = AdminClient(urls["nodes"][node].removesuffix("/metrics"), token)
    say = progress or (lambda msg: None)

    res = DrillResult("xid", {"kind": "xid", "gpu": gpu, "code": code}, alertname, receiver, host)
    t0 = time.time()
    res.injected_at = t0
    fault = admin.inject({"kind": "xid", "gpu": gpu, "code": code})
    res.fault["id"] = fault["id"]
    say(f"injected Xid {code} ({xidcat.message(code)}) on {host} GPU {gpu}: fault {fault['id']}")

    def firing():
        alerts = requests.get(f"{urls['prometheus']}/api/v1/alerts", timeout=3).json()["data"]["alerts"]
        return any(a["labels"].get("alertname") == alertname and a["state"] == "firing"
                   and _label_match(a["labels"], want) for a in alerts)

    def notified(status: str):
        def check():
            pages = requests.get(f"{urls['pager']}/api/pages", params={"alertname": alertname, "limit": 200},
                                 timeout=3).json()["pages"]
            for p in reversed(pages):  # oldest first: the first matching notification is the page
                if p["received_at"] < t0:
                    continue
                for a in p["alerts"]:
                    if a["labels"]["alertname"] == alertname and a["status"] == status and _label_match(a["labels"], want):
                        return p, a
            return None
        return check

    deadline = t0 + deadline_s
    if _poll(firing, deadline):
        res.firing_s = time.time() - t0
        say(f"{alertname} firing in Prometheus after {res.firing_s:.1f}s")
    got = _poll(notified("firing"), deadline)
    if got:
        page, alert = got
        res.paged_s = page["received_at"] - t0
        res.receiver = page["channel"]
        res.runbook_url = alert["annotations"].get("runbook_url")
        say(f"notification on '{page['channel']}' after {res.paged_s:.1f}s")
    admin.clear(fault["id"])
    res.cleared_s = time.time() - t0
    say(f"fault {fault['id']} cleared after {res.cleared_s:.1f}s; waiting for resolution")
    if res.paged_s is not None:
        got = _poll(notified("resolved"), time.time() + resolve_deadline_s, 1.0)
        if got:
            res.resolved_s = got[0]["received_at"] - t0
    if res.firing_s is None:
        res.problems.append(f"{alertname} did not fire in Prometheus within {deadline_s:.0f}s")
    if res.paged_s is None:
        res.problems.append(f"no {alertname} notification reached the pager within {deadline_s:.0f}s")
    elif res.receiver != receiver:
        res.problems.append(f"{alertname} reached receiver '{res.receiver}', expected '{receiver}'")
    if res.paged_s is not None and res.resolved_s is None:
        res.problems.append(f"no resolved notification within {resolve_deadline_s:.0f}s of clearing the fault")
    return res


def format_timeline(res: DrillResult) -> str:
    """Human timeline of a drill with per-hop latencies."""
    def t(v):
        return f"{v:7.1f}s" if v is not None else "      - "

    def hop(a, b):
        return f"(+{b - a:.1f}s)" if a is not None and b is not None else ""

    lines = [
        f"drill {res.drill}: {res.fault} on {res.hostname}; expecting {res.expected_alert} -> {res.expected_receiver}",
        f"  {t(0.0)}  injected   fault {res.fault.get('id', '?')}",
        f"  {t(res.firing_s)}  firing     {res.expected_alert} in Prometheus {hop(0.0, res.firing_s)}",
        f"  {t(res.paged_s)}  paged      receiver {res.receiver or '-'} {hop(res.firing_s, res.paged_s)}",
        f"  {t(res.cleared_s)}  cleared",
        f"  {t(res.resolved_s)}  resolved   {hop(res.cleared_s, res.resolved_s)}",
        f"  fault-to-page: {res.paged_s:.1f}s" if res.paged_s is not None else "  fault-to-page: not paged",
        f"  runbook: {res.runbook_url or '-'}",
        "  result: PASS" if res.ok else "  result: FAIL\n" + "\n".join(f"    - {p}" for p in res.problems),
    ]
    return "\n".join(lines)
