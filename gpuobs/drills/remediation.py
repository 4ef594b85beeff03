"""Remediation drills: prove end to end, on a running stack whose controller enforces, that a fault is
quarantined, drained, fixed, verified and returned, and that the interlocks hold.

Drills (run in this order by :func:`run_all`; each leaves the fleet as it found it):

* ``remediate-xid``: Xid 48 on GPU 0 of a serving node: one page, quarantine, drain, GPU reset,
  verification, return; no error-budget page (traffic left the node before the reset).
* ``manual-override``: the same fault on the training node; a person uncordons it mid-remediation: the
  controller stops, takes no action and holds the node (the drill then releases it).
* ``remediate-kill``: the same fault on the training node; the controller is killed with SIGKILL while
  the node drains (its checkpoint) and started again: it resumes, cordons once, resets once, and a
  re-sent alert opens no new episode.

The single-node drills use one serving node and the training node, so that with the default caps (3
quarantines per pool per hour) the five drills fit in one hour: serving has remediate-xid,
remediate-fragmentation and the storm's one quarantine; training the other two.
* ``remediate-fragmentation``: allocator fragmentation on GPU 4: the engine is restarted before the
  framework OOMs (``GpuFrameworkOom`` never fires).
* ``xid-storm``: Xid 79 on 5 nodes within a minute: no more than the pool cap quarantined, the fleet
  breaker trips, exactly one ``RemediationHalted`` page; the drill then hands the nodes back by hand
  (hold, uncordon, release) and closes the breaker.

Times are from the injection: to the first page in the pager, to the quarantine (the cordon step),
to the action, to the node back in service (uncordon), and the worst share of the pool's nodes the
controller held out at once (polled every second). A drill passes when every check holds; its
problems list says which did not.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

from gpuobs.core.errors import Failure
from gpuobs.core.reach import unreachable
from gpuobs.promapi.alertmanager import AlertApiError, PagerClient
from gpuobs.promapi.exporter_admin import AdminClient, AdminError
from gpuobs.remediate.store import RemediationStore
from gpuobs.stack import supervisor
from gpuobs.stack.state import StackState

DRILLS = ("remediate-xid", "manual-override", "remediate-kill", "remediate-fragmentation", "xid-storm")
XID_PAGES = ("GpuXidCritical", "GpuKernelXidCritical", "GpuEccDoubleBitError")


class RemediationDrillError(Failure):
    """The stack cannot run remediation drills (no controller, not enforcing, too few nodes)."""


@dataclass
class DrillOutcome:
    """One drill: ``times`` in seconds from the injection (None: did not happen), ``checks`` (what was
    verified), ``problems`` (what failed; empty = passed)."""

    name: str
    node: str
    times: dict[str, float | None] = field(default_factory=dict)
    worst_out: str = ""
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "node": self.node, "times": self.times, "worst_out": self.worst_out,
                "checks": self.checks, "problems": self.problems, "passed": self.passed}


class Drills:
    """The drills against the stack ``state`` (its ``remediate`` component must run with ``--mode enforce``)."""

    def __init__(self, state: StackState, say: Callable[[str], None] = print, timeout_s: float = 420.0):
        if not state.urls.remediate:
            raise RemediationDrillError("this stack runs no remediation controller: start it with "
                                        "`gpuobs stack up --remediate enforce`")
        self.state, self.say, self.timeout_s = state, say, timeout_s
        self.url = state.urls.remediate
        token = state.token()
        self.admin = {h: AdminClient(u, token) for h, u in zip(state.hostnames, state.urls.node_bases)}
        self.serving = list(state.serving_hosts)
        others = [h for h in state.hostnames if h not in self.serving]
        if not others or len(self.serving) < 2:
            raise RemediationDrillError("the remediation drills need a training node and at least 2 serving nodes "
                                        "(`make drills-remediation`: 8 nodes, 1 training)")
        self.training = others[0]
        self.pager = PagerClient(state.urls.pager)
        self.db = Path(state.run_dir) / "remediate.sqlite"
        mode = self._status()["mode"]
        if mode != "enforce":
            raise RemediationDrillError(f"the remediation controller runs in {mode} mode; the drills need enforce "
                                        "(`gpuobs stack up --remediate enforce`)")

    # ---- reading ------------------------------------------------------------------------------
    def _status(self) -> dict[str, Any]:
        try:
            r = requests.get(f"{self.url}/api/status", timeout=5)
            r.raise_for_status()
            return r.json()
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise RemediationDrillError(unreachable("remediation controller", self.url, exc)) from None
        except (requests.RequestException, ValueError) as exc:
            raise RemediationDrillError(f"remediation controller at {self.url}: {exc}") from None

    def _timeline(self, node: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/timeline", params={"node": node}, timeout=5)
        r.raise_for_status()
        return r.json()["timeline"]

    def _episodes(self, node: str, since: float) -> list[dict[str, Any]]:
        return [e for e in self._status()["recent"] if e["node"] == node and e["opened_at"] >= since]

    def _pages(self, since: float) -> list[dict[str, Any]]:
        """Notifications the pager received since ``since``, one row per alert in them: ``received_at``,
        ``receiver`` (page | ticket), ``status`` (the notification's), ``alertname``, ``labels``,
        ``annotations``, ``id`` (the notification's)."""
        try:
            notes = [n for n in self.pager.pages(500) if n["received_at"] >= since]
        except AlertApiError:
            return []
        return [{"id": n["id"], "received_at": n["received_at"], "receiver": n.get("channel") or n.get("receiver"),
                 "status": n["status"], "alertname": a["labels"].get("alertname", ""), "labels": a["labels"],
                 "annotations": a.get("annotations") or {}}
                for n in notes for a in n.get("alerts") or []]

    def _cordoned(self) -> list[str]:
        out = []
        for h in self.state.hostnames:
            try:
                if self.admin[h].node_status().get("cordoned"):
                    out.append(h)
            except AdminError:
                pass
        return out

    def _wait(self, what: str, check: Callable[[], Any], t0: float, res: DrillOutcome,
              timeout_s: float | None = None) -> Any:
        """Poll ``check`` every second (tracking the worst cordoned share) until truthy; None on timeout."""
        deadline = time.time() + (timeout_s or self.timeout_s)
        last_say = time.time()
        while time.time() < deadline:
            worst = len(self._cordoned())
            prev = int(res.worst_out.split(" ")[0]) if res.worst_out else 0
            if worst >= prev:
                res.worst_out = f"{worst} of {len(self.state.hostnames)} nodes"
            try:
                value = check()
            except (requests.RequestException, AdminError, KeyError, ValueError):
                value = None
            if value:
                return value
            if time.time() - last_say >= 15:
                self.say(f"{res.name}: {time.time() - t0:.0f}s since injection, waiting for {what}")
                last_say = time.time()
            time.sleep(1.0)
        res.problems.append(f"timed out after {timeout_s or self.timeout_s:.0f}s waiting for {what}")
        return None

    def _step_time(self, node: str, kind: str, t0: float) -> float | None:
        for e in self._timeline(node):
            if e["kind"] == kind and e["ts"] >= t0:
                return round(e["ts"] - t0, 1)
        return None

    def _first_page(self, node: str, names: tuple[str, ...], t0: float) -> float | None:
        hits = [p for p in self._pages(t0) if p["status"] == "firing" and p["alertname"] in names
                and (p.get("labels") or {}).get("node", node) == node]
        return round(min(p["received_at"] for p in hits) - t0, 1) if hits else None

    def _inject(self, node: str, body: dict[str, Any]) -> str:
        return str(self.admin[node].inject(body)["id"])

    def _clear(self, node: str, fault_id: str) -> None:
        try:
            self.admin[node].clear(fault_id)
        except AdminError as exc:
            if exc.status != 404:  # a reset or reboot already removed it
                raise

    def _release(self, node: str) -> None:
        store = RemediationStore(self.db)
        try:
            store.release(node, "drill", "drill cleanup")
        finally:
            store.close()

    def _quiet(self, node: str) -> bool:
        st = self._status()
        return not any(e["node"] == node for e in st["open"]) and node not in st["holds"]

    def _unexpected_pages(self, res: DrillOutcome, t0: float, allowed: tuple[str, ...]) -> None:
        bad = sorted({p["alertname"] for p in self._pages(t0)
                      if p["status"] == "firing" and p["alertname"] not in allowed and p["alertname"] != "Watchdog"})
        if bad:
            res.problems.append(f"unexpected pages or tickets: {', '.join(bad)}")
        else:
            res.checks.append("no other page or ticket")

    # ---- drills -------------------------------------------------------------------------------
    def remediate_xid(self) -> DrillOutcome:
        node = self.serving[0]
        res = DrillOutcome("remediate-xid", node)
        t0 = time.time()
        fid = self._inject(node, {"kind": "xid", "gpu": 0, "code": 48})
        ep = self._wait("the node back in service", lambda: [e for e in self._episodes(node, t0)
                                                             if e["state"] in ("returned", "escalated")], t0, res)
        self._clear(node, fid)
        res.times = {"page": self._first_page(node, XID_PAGES, t0), "quarantine": self._step_time(node, "quarantined", t0),
                     "act": self._step_time(node, "verifying", t0), "back": self._step_time(node, "returned", t0)}
        if ep:
            if ep[0]["state"] != "returned":
                res.problems.append(f"episode ended {ep[0]['state']}: {ep[0]['reason']}")
            kinds = [e["kind"] for e in self._timeline(node) if e["ts"] >= t0]
            order = [k for k in kinds if k in ("quarantined", "draining", "acting", "verifying", "returned")]
            if order[:5] == ["quarantined", "draining", "acting", "verifying", "returned"]:
                res.checks.append("quarantined, drained (no work in flight) before the reset, verified, returned")
            else:
                res.problems.append(f"steps out of order: {order}")
        pages = {p["id"]: p for p in self._pages(t0) if p["status"] == "firing" and p["receiver"] == "page"}
        if len(pages) == 1:
            res.checks.append("one page")
        else:
            res.problems.append(f"{len(pages)} pages: {[p['alertname'] for p in pages.values()]}")
        self._unexpected_pages(res, t0, XID_PAGES + ("GpuXidWarning", "GpuKernelXidWarning", "GpuRowRemapPending"))
        return res

    def manual_override(self) -> DrillOutcome:
        node = self.training
        res = DrillOutcome("manual-override", node)
        t0 = time.time()
        # Another GPU than remediate-xid's: the same GPU's alert may still fire (its look-back), and a
        # firing alert already handled is not a new event.
        fid = self._inject(node, {"kind": "xid", "gpu": 1, "code": 48})
        self._wait("the quarantine", lambda: [e for e in self._episodes(node, t0)
                                               if e["state"] in ("quarantined", "draining")], t0, res)
        self.admin[node].node_action("uncordon", by="human", reason="drill: a person takes over")
        res.times["person"] = round(time.time() - t0, 1)
        ep = self._wait("the controller to stand down", lambda: [e for e in self._episodes(node, t0)
                                                                 if e["state"] == "overridden"], t0, res, 60)
        res.times["quarantine"] = self._step_time(node, "quarantined", t0)
        res.times["stood down"] = self._step_time(node, "overridden", t0)
        time.sleep(10)  # give a wrong controller time to act again
        acts = [e for e in self._timeline(node) if e["ts"] >= t0 and e["kind"] in ("acting", "verifying", "quarantined")]
        st = self.admin[node].node_status()
        if ep and not st.get("cordoned") and not [a for a in acts if a["kind"] != "quarantined"]:
            res.checks.append("no action after the person's uncordon; the node stays uncordoned")
        else:
            res.problems.append(f"controller acted or re-cordoned after the override (cordoned={st.get('cordoned')})")
        if node in self._status()["holds"]:
            res.checks.append("node held until released")
        else:
            res.problems.append("no hold recorded for the overridden node")
        self._clear(node, fid)
        self._release(node)
        return res

    def remediate_kill(self) -> DrillOutcome:
        node = self.training
        res = DrillOutcome("remediate-kill", node)
        run = Path(self.state.run_dir)
        t0 = time.time()
        fid = self._inject(node, {"kind": "xid", "gpu": 2, "code": 48})
        self._wait("the drain", lambda: [e for e in self._episodes(node, t0) if e["state"] == "draining"], t0, res)
        pids = supervisor.find_processes(supervisor.load_state(run), "remediate")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        res.times["killed"] = round(time.time() - t0, 1)
        supervisor.restart(run, "remediate", out=open(os.devnull, "w"))
        res.times["restarted"] = round(time.time() - t0, 1)
        ep = self._wait("the node back in service", lambda: [e for e in self._episodes(node, t0)
                                                             if e["state"] in ("returned", "escalated")], t0, res)
        self._clear(node, fid)
        res.times.update(quarantine=self._step_time(node, "quarantined", t0), act=self._step_time(node, "verifying", t0),
                         back=self._step_time(node, "returned", t0))
        store = RemediationStore(self.db)
        try:
            eps = [e for e in store.episodes() if e.node == node and e.opened_at >= t0]
            steps = store.steps(episode=eps[0].id) if eps else []
        finally:
            store.close()
        cordons = [s for s in steps if s["step"] == "cordon"]
        acts = [s for s in steps if s["step"] == "act"]
        if len(eps) == 1 and len(cordons) == 1 and len(acts) == 1 and ep and ep[0]["state"] == "returned":
            res.checks.append("one episode, one cordon, one reset across the kill; returned")
        else:
            res.problems.append(f"{len(eps)} episodes, {len(cordons)} cordons, {len(acts)} resets after the kill")
        return res

    def remediate_fragmentation(self) -> DrillOutcome:
        node = self.serving[0]
        res = DrillOutcome("remediate-fragmentation", node)
        t0 = time.time()
        fid = self._inject(node, {"kind": "fragmentation", "gpu": 4, "rate_mib_per_min": 1500.0})
        ep = self._wait("the engine restart and return", lambda: [e for e in self._episodes(node, t0)
                                                                   if e["state"] in ("returned", "escalated")], t0, res, 720)
        self._clear(node, fid)
        res.times = {"ticket": self._first_page(node, ("KVFragmentationRisk",), t0),
                     "quarantine": self._step_time(node, "quarantined", t0), "act": self._step_time(node, "verifying", t0),
                     "back": self._step_time(node, "returned", t0)}
        if ep and ep[0]["action"] == "restart-engine" and ep[0]["state"] == "returned":
            res.checks.append("engine restarted after the drain, node returned")
        elif ep:
            res.problems.append(f"episode {ep[0]['action']} ended {ep[0]['state']}: {ep[0]['reason']}")
        oom = [p for p in self._pages(t0) if p["alertname"] == "GpuFrameworkOom"]
        if oom:
            res.problems.append("GpuFrameworkOom fired: the restart came too late")
        else:
            res.checks.append("no framework OOM")
        self._unexpected_pages(res, t0, ("KVFragmentationRisk",))
        return res

    def xid_storm(self, count: int = 5, spread_s: float = 60.0) -> DrillOutcome:
        hosts = self.serving[1:1 + count]
        res = DrillOutcome("xid-storm", ",".join(hosts))
        if len(hosts) < count:
            res.problems.append(f"needs {count + 1} serving nodes, the stack has {len(self.serving)}")
            return res
        t0 = time.time()
        faults = []
        for i, h in enumerate(hosts):
            faults.append((h, self._inject(h, {"kind": "xid", "gpu": 6, "code": 79})))
            if i < len(hosts) - 1:
                time.sleep(spread_s / (count - 1))
        self._wait("the breaker", lambda: self._status()["breaker"]["open"], t0, res, 180)
        res.times["breaker"] = self._step_time("*", "breaker-open", t0)
        time.sleep(30)  # let the pages settle and any wrong action happen
        self._wait("the RemediationHalted page", lambda: self._first_page("", ("RemediationHalted",), t0), t0, res, 60)
        res.times["halted page"] = self._first_page("", ("RemediationHalted",), t0)
        st = self._status()
        out = [e["node"] for e in st["out_of_service"] if e["node"] in hosts]
        cap = 1  # max(1, floor(10% of the serving pool)) on the drill stack's pool sizes
        if len(out) <= cap:
            res.checks.append(f"{len(out)} node(s) quarantined, pool cap {cap}")
        else:
            res.problems.append(f"{len(out)} nodes quarantined ({', '.join(out)}), over the pool cap {cap}")
        halted = list({p["id"]: p for p in self._pages(t0)
                       if p["alertname"] == "RemediationHalted" and p["status"] == "firing"}.values())
        if len(halted) == 1:
            res.checks.append("exactly one RemediationHalted page: " + halted[0]["annotations"].get("description", "")[:80])
        else:
            res.problems.append(f"{len(halted)} RemediationHalted pages")
        store = RemediationStore(self.db)
        try:
            opened = store.breaker()["opened_at"] or 0
            acts = [s for s in store.steps() if s["step"] == "act" and s["ts"] >= opened and s["node"] in hosts]
            res.worst_out = f"{len(out)} of {len(self.state.hostnames)} nodes"
            if acts:
                res.problems.append(f"{len(acts)} action(s) after the breaker opened")
            else:
                res.checks.append("no action after the breaker opened")
            # hand the nodes back as a person would: hold, uncordon, release, close the breaker
            for h, fid in faults:
                self._clear(h, fid)
            for h in out:
                store.hold(h, "drill", "storm cleanup")
            time.sleep(3)
            for h in out:
                self.admin[h].node_action("uncordon", by="human", reason="drill cleanup")
                store.release(h, "drill", "storm cleanup")
            for ep in store.episodes(("pending",)):  # before the close, so no pending episode starts to act
                store.set_state(ep, "cancelled", "the breaker was closed by drill", "human:drill")
            store.close_breaker("drill", "storm drill over")
        finally:
            store.close()
        return res

    def run(self, name: str) -> DrillOutcome:
        fn = {"remediate-xid": self.remediate_xid, "manual-override": self.manual_override,
              "remediate-kill": self.remediate_kill, "remediate-fragmentation": self.remediate_fragmentation,
              "xid-storm": self.xid_storm}[name]
        self.say(f"{name}: starting")
        res = fn()
        # leave the fleet as found: no open episode on the drill's nodes before the next drill
        for node in res.node.split(","):
            self._wait(f"{node} to settle", lambda n=node: self._quiet(n), time.time(), DrillOutcome("settle", node), 300)
        self.say(f"{name}: {'PASS' if res.passed else 'FAIL'} {res.times}")
        return res


def run_all(state: StackState, names: tuple[str, ...] = DRILLS, say: Callable[[str], None] = print) -> list[DrillOutcome]:
    d = Drills(state, say)
    return [d.run(n) for n in names]


def format_table(results: list[DrillOutcome]) -> str:
    """One row per drill: times from the injection, worst capacity out, result and problems."""
    keys = ["page", "ticket", "quarantine", "act", "back", "breaker", "halted page", "killed", "person", "stood down"]
    used = [k for k in keys if any(k in r.times for r in results)]
    head = ["drill", *[f"{k} s" for k in used], "worst out", "result"]
    rows = [[r.name, *["-" if r.times.get(k) is None else f"{r.times[k]:g}" for k in used], r.worst_out or "-",
             "PASS" if r.passed else "FAIL: " + "; ".join(r.problems)] for r in results]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda row: "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
