"""Run failure drills on the running native stack and time every hop.

A drill injects its fault(s), then polls Prometheus (``/api/v1/alerts``) and the pager
(``/api/pages``) until every expected alert is firing and has reached its receiver, clears the
fault, and waits until each expected alert has resolved in Prometheus and the pager has the resolved
notification. Throughout, any alert that *starts* firing during the drill and is neither expected,
nor an allowed (inhibited) consequence, nor claimed by another drill running at the same time on
another node, is a false alert. Alerts already firing before the drill are not counted.

While it waits, a drill reports progress every :data:`PROGRESS_EVERY_S` seconds (time since the
injection, the deadline, and what it is waiting for: :func:`waiting_line`). With
``wait_resolve=False`` (``gpuobs drill --no-wait-resolve``) it stops after clearing the fault: the
resolution is not awaited (nor checked), which on the default profile saves up to the rules' windows
(e.g. ``GpuEccDoubleBitError`` looks back 10 minutes). Expected durations: docs/drills.md.

Each drill is recorded in the run directory's activity file (:mod:`gpuobs.core.activity`) when its
fault is injected and when it ends, so the incident console links the incidents it causes to it.

:func:`run_drill` reads the time and waits only through the ``clock`` and ``sleep`` it is given (the
real ones by default), as the rollout controller does, so it runs on a simulated clock in tests.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import io
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpuobs.core import activity
from gpuobs.core.errors import Failure
from gpuobs.core.fleet import FleetConfig, shipped_fleet
from gpuobs.core.meta_alerts import is_meta
from gpuobs.drills.catalogue import (
    DRILLS,
    FINAL,
    LANES,
    DrillSpec,
    Expect,
    kernel_log_variant,
    stack_slo_deadline,
)
from gpuobs.promapi.alertmanager import AlertApiError, AlertsClient, PagerClient, UnionAlertsClient
from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.promapi.prometheus import PromClient, PrometheusError
from gpuobs.stack.state import StackState


#: Seconds between two progress lines while a drill waits.
PROGRESS_EVERY_S = 15.0


def waiting_line(name: str, elapsed_s: float, deadline_s: float, pending: list[str], phase: str) -> str:
    """``xid: 45s since injection, waiting for GpuKernelXidCritical to fire (give up at 60s)``.

    ``phase`` is ``fire`` or ``resolve``; the resolve line says how to skip that wait."""
    what = ", ".join(pending) or "the last checks"
    hint = " (gpuobs drill --no-wait-resolve skips this wait)" if phase == "resolve" else ""
    return f"{name}: {elapsed_s:.0f}s since injection, waiting for {what} (give up at {deadline_s:.0f}s){hint}"


class DrillError(Failure):
    """A drill cannot run (unknown name, too few nodes, no stack); exit code 2."""


class Claims:
    """Thread-safe registry of what concurrently running drills expect or allow: (alertname, host|None).

    A finished drill's claims linger for the alerts that became active while it ran: an inhibited
    consequence such as the DCGM path's GpuXidCritical (its Xid count window is 5 minutes) keeps
    firing after the kernel-log page has resolved and the drill has ended, and it is still that
    drill's alert, not a false alert of a drill running on another node."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_drill: dict[str, set[tuple[str, str | None]]] = {}
        self._ended: dict[str, tuple[float, set[tuple[str, str | None]]]] = {}

    def add(self, drill: str, entries: set[tuple[str, str | None]]) -> None:
        with self._lock:
            self._by_drill[drill] = entries
            self._ended.pop(drill, None)

    def remove(self, drill: str, at: float | None = None) -> None:
        """End ``drill``'s claims at ``at`` (epoch s, default now); alerts active before then stay its own."""
        with self._lock:
            entries = self._by_drill.pop(drill, None)
            if entries is not None:
                self._ended[drill] = (time.time() if at is None else at, entries)

    def allows(self, alertname: str, host: str | None, exclude: str, active_at: float | None = None) -> bool:
        """Whether a drill other than ``exclude`` owns ``alertname`` on ``host``: a running drill, or one
        that ended after the alert became active (``active_at``, epoch s)."""
        def match(e):
            return (alertname, None) in e or (alertname, host) in e
        with self._lock:
            if any(match(e) for d, e in self._by_drill.items() if d != exclude):
                return True
            return active_at is not None and any(
                match(e) and active_at <= ended for d, (ended, e) in self._ended.items() if d != exclude)


@dataclass
class AlertOutcome:
    """What happened to one expected alert; times in seconds since injection."""

    alertname: str
    expected_receiver: str
    fired_s: float | None = None
    paged_s: float | None = None
    receiver: str | None = None
    resolved_s: float | None = None
    runbook_url: str | None = None


@dataclass
class DrillResult:
    """Timeline and verdict of one drill."""

    drill: str
    hostname: str
    profile: str
    faults: list[dict] = field(default_factory=list)
    alerts: list[AlertOutcome] = field(default_factory=list)
    injected_at: float = 0.0
    cleared_s: float | None = None
    unexpected: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: False when the drill did not wait for the resolution (``--no-wait-resolve``).
    resolve_waited: bool = True
    #: The page's pipeline bound on this stack (gpuobs.drills.bounds): scrape + evaluation + for +
    #: group_wait in seconds, and its parts as text; None when the stack could not be read.
    bound_s: float | None = None
    bound: str = ""
    #: What the drill's incident cost (gpuobs.pager.impact), measured by the pager after the drill:
    #: ``{"incident": id, "line", "totals", "window", "serving", "training", "fleet", "queries"}``,
    #: ``{"error": text}`` when it could not be measured, None when no incident was found.
    impact: dict | None = None
    #: A drill with an outage (DrillSpec.outage): ``{"member", "down_s", "notified_after_s": {alertname:
    #: seconds after the kill}, "episodes": {alertname: firing episodes}, "openings": {alertname:
    #: incident openings}}``; None otherwise.
    outage: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unexpected

    @property
    def firing_s(self) -> float | None:
        times = [a.fired_s for a in self.alerts]
        return max(times) if times and None not in times else None

    @property
    def paged_s(self) -> float | None:
        times = [a.paged_s for a in self.alerts]
        return max(times) if times and None not in times else None

    @property
    def resolved(self) -> bool:
        return bool(self.alerts) and all(a.resolved_s is not None for a in self.alerts)

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc.update(ok=self.ok, firing_s=self.firing_s, paged_s=self.paged_s, resolved=self.resolved)
        return doc


def _parse_ts(text: str) -> float:
    """RFC 3339 with up to nanoseconds (Prometheus activeAt) -> epoch seconds."""
    main, _, frac = text.rstrip("Z").partition(".")
    base = dt.datetime.fromisoformat(main.split("+")[0]).replace(tzinfo=dt.timezone.utc).timestamp()
    digits = "".join(c for c in frac if c.isdigit())
    return base + (float("0." + digits) if digits else 0.0)


def _nodes_for(state: StackState, spec: DrillSpec) -> list[int]:
    n, training = state.nodes, state.training_nodes
    serving = list(range(n - training))
    pool = list(range(n - training, n)) if spec.role == "training" else serving
    if spec.role == "fleet":
        return serving
    if spec.slot >= len(pool):
        raise DrillError(f"drill {spec.name} needs {spec.slot + 1} {spec.role} node(s); the stack has {len(pool)} "
                         f"(start it with more --nodes / --training-nodes)")
    return [pool[spec.slot]]


def _matches(labels: dict, exp: Expect, host: str | None, ident: str) -> bool:
    """Whether an alert's ``labels`` are ``exp``'s on ``host`` (its ``ident`` label: the fleet config's
    identity label) where ``exp`` is scoped to the drill's node."""
    if labels.get("alertname") != exp.alertname:
        return False
    if exp.scoped and host is not None and labels.get(ident) != host:
        return False
    return all(labels.get(k) == v for k, v in exp.labels.items())


def alerts_client(state: StackState):
    """Where the stack's alerts are read: its Prometheus, or, on the HA topology (docs/ha.md), every
    Prometheus replica and vmalert together (VictoriaMetrics, ``urls.prometheus`` there, holds no alerts)."""
    if getattr(state, "topology", "single") == "ha":
        return UnionAlertsClient([u for n, u in state.members.items() if n.startswith("prometheus-") or n == "vmalert"])
    return AlertsClient(state.urls.prometheus)


#: Scrapes of a node's GPUs Prometheus must hold before a drill injects on that node. The stock rules
#: compare a GPU with its own recent past (GPUThrottling: SM clock and power against their 1h maximum),
#: which a fault injected before the first scrapes would hide: on a fresh, loaded stack the power-brake
#: drill's first samples were already braked, so power never "collapsed" and nothing fired (make drills).
HISTORY_SAMPLES = 3
#: How long a drill waits for that history before injecting anyway (it says so).
HISTORY_WAIT_S = 60.0


#: Seconds an outage drill waits after restarting the member before it counts incidents: two group
#: intervals (10 s each, alertmanager/alertmanager.yml) for a stale or restored notification to arrive,
#: plus the pager's replay hold (gpuobs.pager.incidents.REPLAY_HOLD_S, 20 s), plus 5 s.
OUTAGE_SETTLE_S = 45.0


class _Session:
    """HTTP access to the stack for one drill."""

    def episodes(self, since: float) -> dict[str, int]:
        """Alertname -> distinct firing ``startsAt`` in the pager's notifications received since ``since``."""
        starts: dict[str, set[str]] = {}
        for p in self.pages(since):
            for a in p["alerts"]:
                if a["status"] == "firing":
                    starts.setdefault(a["labels"]["alertname"], set()).add(a["startsAt"])
        return {k: len(v) for k, v in starts.items()}

    def openings(self, since: float) -> dict[str, int]:
        """Alertname -> how often an incident holding it was opened or re-opened since ``since`` (the
        pager's incident timelines, gpuobs.pager.incidents)."""
        out: dict[str, int] = {}
        for inc in self._pager.incidents(limit=1000):
            doc = self._pager.incident(inc["id"])
            n = sum(e["kind"] in ("opened", "reopened") and e["at"] >= since for e in doc["timeline"])
            for an in {a["labels"]["alertname"] for a in doc["alerts"]}:
                out[an] = out.get(an, 0) + n
        return out

    def __init__(self, state: StackState, ident: str):
        self.urls, self.ident = state.urls, ident
        self.members: dict[str, str] = dict(getattr(state, "members", {}) or {})
        self._alerts, self._pager = alerts_client(state), PagerClient(self.urls.pager)
        if state.mode == "compose":  # node admin APIs are inside the containers
            from gpuobs.stack.compose import ComposeAdmin

            self.admin = [ComposeAdmin(c) for c in state.containers]
            return
        token = state.token()
        self.admin = [AdminClient(u, token) for u in self.urls.node_bases]

    def bound(self, alertname: str, labels: dict[str, str]):
        """:func:`gpuobs.drills.bounds.page_bound` on this stack (a Prometheus replica on the HA topology)."""
        from gpuobs.drills.bounds import page_bound

        prom = next((u for n, u in sorted(self.members.items()) if n.startswith("prometheus-")), self.urls.prometheus)
        return page_bound(prom, self.urls.alertmanager, alertname, labels)

    def has_history(self, host: str) -> bool:
        """Whether Prometheus holds :data:`HISTORY_SAMPLES` scrapes of every GPU of ``host`` in the last 5 min."""
        expr = (f'min(count_over_time(DCGM_FI_DEV_GPU_TEMP{{{self.ident}="{host}"}}[5m])) '
                f">= {HISTORY_SAMPLES}")
        try:
            return not PromClient(self.urls.prometheus).query(expr).empty
        except PrometheusError:
            return False

    def alerts(self) -> list[dict]:
        return self._alerts.alerts()

    def pages(self, since: float) -> list[dict]:
        pages = self._pager.pages(limit=1000)
        return [p for p in reversed(pages) if p["received_at"] >= since]  # oldest first

    def impact(self, alertnames: set[str], host: str, since: float) -> dict | None:
        """The impact (gpuobs.pager.impact) of the newest incident of one of ``alertnames`` on ``host``
        opened at or after ``since``, measured by the pager now; ``{"error": ...}`` when it cannot be
        measured, None when there is no such incident."""
        try:
            incs = [i for i in self._pager.incidents() if set(i["alertnames"]) & alertnames
                    and host in i["nodes"] and i["opened_at"] >= since]
            if not incs:
                return None
            inc = max(incs, key=lambda i: i["opened_at"])
            return {"incident": inc["id"], **self._pager.measure_impact(inc["id"])}
        except AlertApiError as exc:
            return {"error": str(exc)}


def run_drill(state: StackState, name: str, claims: Claims | None = None, progress=None,
              spec: DrillSpec | None = None, wait_resolve: bool = True,
              clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
              fleet: FleetConfig | None = None) -> DrillResult:
    """Run drill ``name`` (or the given ``spec``) on the stack described by ``state`` (stack.json).
    Misses, wrong receivers, false alerts and missing resolutions are reported in the result, never
    raised. ``progress(line)`` gets the events and, every :data:`PROGRESS_EVERY_S` while waiting, a
    :func:`waiting_line`. ``wait_resolve=False``: return once the fault is cleared (resolution
    neither awaited nor checked; ``resolve_waited`` is False). ``clock()`` (epoch seconds) and
    ``sleep(seconds)`` are every time read and every wait of the drill (default the real ones; the
    tests run it on a simulated clock); the result's times are seconds since the injection. ``fleet``:
    the fleet config the stack's rules were rendered from (default: the shipped one), whose identity
    label names the drill's node in alerts and series. Raises DrillError for an unknown drill or a
    stack too small for it."""
    if spec is None:
        if name not in DRILLS:
            raise DrillError(f"unknown drill {name!r}; drills: {', '.join(DRILLS)}")
        spec = DRILLS[name]
    topology = getattr(state, "topology", "single") or "single"
    if spec.topology not in (None, topology):
        raise DrillError(f"drill {name!r} runs on the {spec.topology} topology only; this stack is {topology} "
                         f"(`gpuobs stack up --topology {spec.topology}`, `make drills-ha`)")
    if state.logwatch:  # the nodes run logwatch: kernel-log alerts page, DCGM's are inhibited
        spec = kernel_log_variant(spec)
    drill = _Drill(state, name, spec, claims or Claims(), progress or (lambda msg: None), clock, sleep,
                   (fleet or shipped_fleet()).identity_label)
    res = drill.res
    drill.read_bound()
    drill.wait_for_history()
    drill.fire_phase()
    if not wait_resolve:
        drill.say(f"{name}: cleared after {res.cleared_s:.1f}s; not waiting for the resolution (--no-wait-resolve)")
        res.resolve_waited = False
    else:
        drill.say(f"{name}: cleared after {res.cleared_s:.1f}s, waiting for resolution")
        drill.poll(clock() + spec.resolve_deadline_s * drill.scale, drill.resolved, drill.pending_resolve, "resolve")
    drill.claims.remove(name, at=clock())
    drill.judge_allowed()
    _finish_problems(res, wait_resolve)
    res.impact = drill.impact()
    _note(state, res, drill.say, drill.nodes, ended_at=clock(),
          outcome="PASS" if res.ok else "FAIL: " + "; ".join([*res.problems, *res.unexpected])[:300])
    return res


class _Drill:
    """One run of a drill: its spec, node(s), stack session and result so far.

    Every time read and wait goes through ``clock`` (epoch seconds) and ``sleep`` (seconds); the
    result's times are seconds since :attr:`t0`, the injection (epoch s, set by :meth:`fire_phase`).
    ``scale`` stretches the deadlines on the default profile. Constructing it registers the drill's
    expected and allowed alerts in ``claims``; raises DrillError for a stack too small for ``spec``."""

    def __init__(self, state: StackState, name: str, spec: DrillSpec, claims: Claims, say: Callable[[str], None],
                 clock: Callable[[], float], sleep: Callable[[float], None], ident: str):
        self.state, self.name, self.spec, self.claims, self.say = state, name, spec, claims, say
        self.ident = ident  # the fleet config's identity label
        self.clock, self.sleep = clock, sleep
        idx = _nodes_for(state, spec)
        self.idx, self.nodes = idx, [state.hostnames[i] for i in idx]
        self.host = state.hostnames[idx[0]] if spec.role != "fleet" else None
        # The default profile keeps production `for:` durations (up to 10 min) and windows (the 1h SLO
        # window): its deadlines stretch accordingly.
        self.scale = 1.0 if state.profile == "drill" else 6.0
        #: Seconds from the injection to giving up on the expected alerts. An SLO-burn drill's on the
        #: default profile follows from the burn-rate rules (catalogue.slo_fire_deadline), said at injection.
        self.fire_deadline_s = spec.fire_deadline_s * self.scale
        self.deadline_why = ""
        slo = stack_slo_deadline(spec, state.profile) if state.profile != "drill" else None
        if slo is not None:
            self.fire_deadline_s, self.deadline_why = slo.deadline_s, slo.explain()
        self.session = _Session(state, ident)
        host = self.host
        mine = {(e.alertname, host if e.scoped else None) for e in (*spec.expect, *spec.outage_expect)}
        mine |= {(a, host) for a in spec.allowed}
        claims.add(name, mine)
        self.res = DrillResult(name, host or "fleet", state.profile)
        self.res.alerts = [AlertOutcome(e.alertname, e.receiver) for e in spec.expect]
        self.seen_unexpected: set[str] = set()
        #: (channel, groupKey) -> allowed alerts notified in that group; the groups of the expected alerts
        self.allowed_paged: dict[tuple[str, str], set[str]] = {}
        self.expected_groups: set[tuple[str, str]] = set()
        self.t0 = 0.0
        self.previous: dict[int, str] = {}  # node index -> version before a deploy fault
        self.injected: list[tuple[int, str]] = []  # (node index, fault id)

    def impact(self) -> dict | None:
        """What the drill's incident cost, measured by the pager now (:meth:`_Session.impact`); None for a
        fleet-wide drill, one that notified nothing, or on a simulated clock."""
        if self.host is None or all(a.paged_s is None for a in self.res.alerts) or self.clock is not time.time:
            return None
        return self.session.impact({a.alertname for a in self.res.alerts}, self.host, self.t0 - 5.0)

    def read_bound(self) -> None:
        """Note the first expected alert's pipeline bound on this stack (:mod:`gpuobs.drills.bounds`)."""
        exp = self.spec.expect[0]
        b = self.session.bound(exp.alertname, exp.labels)
        if b is not None:
            self.res.bound_s, self.res.bound = b.seconds, b.text()

    def wait_for_history(self) -> None:
        """Wait up to :data:`HISTORY_WAIT_S` for Prometheus to hold the node's first scrapes (polled
        every second); past that, say so and go on. Nothing for a fleet-wide drill."""
        if self.host is None:
            return
        waited = self.clock()
        while not self.session.has_history(self.host) and self.clock() - waited < HISTORY_WAIT_S:
            self.sleep(1.0)
        if self.clock() - waited >= HISTORY_WAIT_S:
            self.say(f"{self.name}: {self.host} has fewer than {HISTORY_SAMPLES} scrapes of its GPUs after "
                     f"{HISTORY_WAIT_S:.0f}s; injecting anyway")

    def fire_phase(self) -> None:
        """Inject the fault(s) (``t0`` = now), poll until every expected alert fired and paged or the
        fire deadline passed, then clear the fault(s), also when anything raised (``cleared_s``)."""
        if self.deadline_why:
            self.say(f"{self.name}: fire deadline {self.fire_deadline_s:.0f}s on the {self.state.profile} profile: "
                     f"{self.deadline_why}")
        self.t0 = self.res.injected_at = self.clock()
        try:
            self.inject()
            notified = self.poll(self.t0 + self.fire_deadline_s, self.fired_and_paged, self.pending_fire, "fire")
            if self.spec.outage and notified:
                self.outage()
            elif self.spec.outage:
                self.res.problems.append(f"{self.spec.outage} not stopped: the expected alerts never notified")
        finally:
            self.clear()

    def outage(self) -> None:
        """Kill the spec's ``outage`` member (SIGKILL, a crash), keep it down ``outage_s`` while polling
        (false alerts; when ``outage_expect`` notifies), restart it with its recorded argv
        (:func:`gpuobs.stack.supervisor.restart`), then wait until the expected alerts' incidents have
        had two group intervals and the pager's replay hold to change (:data:`OUTAGE_SETTLE_S`) and
        record as problems: an outage alert that never notified, an expected alert notified in a
        second firing episode (a new ``startsAt``), an incident re-opened."""
        import os
        import signal

        from gpuobs.stack import supervisor

        spec, res, name = self.spec, self.res, self.spec.outage
        pids = supervisor.find_processes(self.state, name)
        if not pids:
            res.problems.append(f"{name} is not running: no outage")
            return
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        down_at = self.clock()
        self.say(f"{self.name}: killed {name} (pid {', '.join(map(str, pids))}) at {down_at - self.t0:.1f}s")
        seen: dict[str, float] = {}

        def outage_notified(_alerts: list[dict], pages: list[dict]) -> bool:
            for exp in spec.outage_expect:
                if exp.alertname not in seen and any(
                        a["status"] == "firing" and _matches(a["labels"], exp, None, self.ident)
                        and p["channel"] == exp.receiver for p in pages for a in p["alerts"]):
                    seen[exp.alertname] = self.clock() - down_at
                    self.say(f"{self.name}: {exp.alertname} reached '{exp.receiver}' {seen[exp.alertname]:.1f}s "
                             f"after {name} went down")
            return False  # keep the member down for the whole outage

        self.poll(down_at + spec.outage_s, outage_notified, lambda: [f"{name} back"], "outage")
        supervisor.restart(Path(self.state.run_dir), name, out=io.StringIO(), timeout_s=60)
        self.say(f"{self.name}: restarted {name} after {self.clock() - down_at:.1f}s down")
        self.poll(self.clock() + OUTAGE_SETTLE_S, outage_notified, lambda: ["incidents to settle"], "outage")
        res.outage = {"member": name, "down_s": spec.outage_s, "notified_after_s": seen}
        for exp in spec.outage_expect:
            if exp.alertname not in seen:
                res.problems.append(f"{exp.alertname} never reached '{exp.receiver}' while {name} was down")
        episodes, openings = self.session.episodes(self.t0 - 5.0), self.session.openings(self.t0 - 5.0)
        for exp in spec.expect:
            key = exp.alertname
            res.outage.setdefault("episodes", {})[key] = episodes.get(key, 0)
            res.outage.setdefault("openings", {})[key] = openings.get(key, 0)
            if episodes.get(key, 0) != 1 or openings.get(key, 0) != 1:
                res.problems.append(f"{key} across the {name} outage: {episodes.get(key, 0)} firing episodes, "
                                    f"{openings.get(key, 0)} incident openings (want 1 and 1)")
        self.say(f"{self.name}: across the {name} outage: firing episodes {res.outage['episodes']}, "
                 f"incident openings {res.outage['openings']}")

    def inject(self) -> None:
        """Deploy the spec's release and inject its faults on the drill's node(s); say it and record
        the drill in the activity file."""
        spec, res, admin = self.spec, self.res, self.session.admin
        if spec.deploy:
            for i in self.idx:
                self.previous[i] = admin[i].deploy(spec.deploy)["previous"]
            res.faults.append({"deploy": spec.deploy, "nodes": self.nodes})
        for body in spec.faults:
            f = admin[self.idx[0]].inject(body)
            self.injected.append((self.idx[0], f["id"]))
            res.faults.append({**body, "id": f["id"]})
        self.say(f"{self.name}: injected " + "; ".join(", ".join(f"{k}={v}" for k, v in f.items()) for f in res.faults)
                 + f" on {res.hostname}")
        # until: the latest the drill can end (both deadlines), in case it dies before recording its end
        _note(self.state, res, self.say, self.nodes, started_at=self.t0,
              until=self.t0 + self.fire_deadline_s + spec.resolve_deadline_s * self.scale + 60.0)

    def clear(self) -> None:
        """Clear the injected faults, redeploy the previous versions, note ``cleared_s``."""
        for i, fid in self.injected:
            self.session.admin[i].clear(fid)
        for i, version in self.previous.items():
            self.session.admin[i].deploy(version)
        self.res.cleared_s = self.clock() - self.t0

    def poll(self, until: float, done: Callable[[list[dict], list[dict]], bool], pending: Callable[[], list[str]],
             phase: str) -> bool:
        """Read the alerts and the pages since ``t0`` every second until ``done(alerts, pages)`` or the
        clock reaches ``until`` (epoch s; False then), checking for false alerts each time and saying
        a :func:`waiting_line` every :data:`PROGRESS_EVERY_S`. An unreadable alerts API is retried."""
        said = self.clock()
        while self.clock() < until:
            try:
                alerts, pages = self.session.alerts(), self.session.pages(self.t0)
            except AlertApiError:
                self.sleep(1)
                continue
            self.check_false(alerts, pages)
            if done(alerts, pages):
                return True
            now = self.clock()
            if now - said >= PROGRESS_EVERY_S:
                said = now
                self.say(waiting_line(self.name, now - self.t0, until - self.t0, pending(), phase))
            self.sleep(1.0)
        return False

    def check_false(self, alerts: list[dict], pages: list[dict]) -> None:
        """Record alerts that started firing since ``t0`` and are neither this drill's (expected or
        allowed) nor claimed by another drill (``unexpected``), and allowed alerts that reached the
        pager although they should be inhibited (``problems``)."""
        spec, host, res = self.spec, self.host, self.res
        for a in alerts:
            labels = a["labels"]
            an, ah = labels.get("alertname"), labels.get(self.ident)
            # The Watchdog fires all the time (gpuobs.core.meta_alerts).
            active_at = _parse_ts(a["activeAt"])
            if a["state"] != "firing" or is_meta(labels) or active_at < self.t0 - 1:
                continue
            own = any(e.alertname == an and (not e.scoped or host is None or ah == host)
                      for e in (*spec.expect, *spec.outage_expect))
            allowed = an in spec.allowed and (host is None or ah in (host, None))
            if own or allowed or self.claims.allows(an, ah, self.name, active_at):
                continue
            key = f"{an}{{{self.ident}={ah}}}" if ah else an
            if key not in self.seen_unexpected:
                self.seen_unexpected.add(key)
                res.unexpected.append(key)
                self.say(f"{self.name}: FALSE ALERT {key}")
        for p in pages:
            for a in p["alerts"]:
                an = a["labels"]["alertname"]
                if an in spec.allowed and (host is None or a["labels"].get(self.ident) == host) \
                        and not any(e.alertname == an for e in spec.expect):
                    self.allowed_paged.setdefault((p["channel"], p.get("groupKey", "")), set()).add(an)
                if a["status"] == "firing" and any(_matches(a["labels"], e, host, self.ident) for e in spec.expect):
                    self.expected_groups.add((p["channel"], p.get("groupKey", "")))

    def judge_allowed(self) -> None:
        """An allowed alert (a consequence of the drill's fault) may reach the pager only inside an
        expected alert's Alertmanager group, which is the same incident (e.g. the kernel-log Xid 48 and
        the DBE, grouped by node and GPU); in a group of its own it is a second page."""
        for group, names in sorted(self.allowed_paged.items()):
            if group not in self.expected_groups:
                for an in sorted(names):
                    msg = f"{an} reached the pager ({group[0]}) as an incident of its own"
                    if msg not in self.res.problems:
                        self.res.problems.append(msg)

    def fired_and_paged(self, alerts: list[dict], pages: list[dict]) -> bool:
        """The fire phase's check: note when each expected alert fires and reaches the pager, and when
        the other detection path's alerts fire; True once all of them have."""
        now = self.clock() - self.t0
        name, host, res = self.name, self.host, self.res
        for out, exp in zip(res.alerts, self.spec.expect):
            if out.fired_s is None and any(a["state"] == "firing"
                                           and _matches(a["labels"], exp, host, self.ident) for a in alerts):
                out.fired_s = now
                self.say(f"{name}: {exp.alertname} firing after {now:.1f}s")
            if out.paged_s is None:
                for p in pages:
                    hit = next((a for a in p["alerts"] if a["status"] == "firing"
                                and _matches({**a["labels"]}, exp, host, self.ident)), None)
                    if hit:
                        out.paged_s, out.receiver = p["received_at"] - self.t0, p["channel"]
                        out.runbook_url = hit["annotations"].get("runbook_url")
                        self.say(f"{name}: {exp.alertname} reached '{p['channel']}' after {out.paged_s:.1f}s")
                        break
        return all(o.fired_s is not None and o.paged_s is not None for o in res.alerts)

    def resolved(self, alerts: list[dict], pages: list[dict]) -> bool:
        """The resolve phase's check: note when each paged alert has stopped firing and the pager has
        its resolved notification; True once every paged alert has."""
        now = self.clock() - self.t0
        for out, exp in zip(self.res.alerts, self.spec.expect):
            if out.paged_s is None or out.resolved_s is not None:
                continue
            still = any(a["state"] == "firing" and _matches(a["labels"], exp, self.host, self.ident) for a in alerts)
            got = any(a["status"] == "resolved" and _matches(a["labels"], exp, self.host, self.ident)
                      for p in pages if p["status"] == "resolved" for a in p["alerts"])
            if not still and got:
                out.resolved_s = now
        return all(o.resolved_s is not None or o.paged_s is None for o in self.res.alerts)

    def pending_fire(self) -> list[str]:
        """What the fire phase still waits for, for :func:`waiting_line`."""
        out = [f"{o.alertname} to fire" if o.fired_s is None else f"{o.alertname} to reach '{o.expected_receiver}'"
               for o in self.res.alerts if o.paged_s is None]
        return out

    def pending_resolve(self) -> list[str]:
        """What the resolve phase still waits for."""
        return [f"{o.alertname} to resolve" for o in self.res.alerts
                if o.paged_s is not None and o.resolved_s is None]


def _note(state: StackState, res: DrillResult, say, nodes: list[str], **when: Any) -> None:
    """Record the drill in the run directory's activity file; a failure to write is said, not raised."""
    run_dir = getattr(state, "run_dir", None)
    if not run_dir:
        return
    outcome = when.pop("outcome", None)
    detail = {"report": f"gpuobs report drill {res.drill} --run-dir {run_dir}", "faults": res.faults}
    if outcome:
        detail["outcome"] = outcome
    try:
        activity.record(run_dir, "drill", f"{res.drill}-{int(res.injected_at)}", title=f"drill {res.drill}",
                        nodes=nodes, detail=detail, **when)
    except OSError as exc:
        say(f"{res.drill}: warning: could not record the drill in {activity.path_in(run_dir)}: {exc}")


def _finish_problems(res: DrillResult, wait_resolve: bool) -> None:
    """Turn misses into ``res.problems``."""
    for out in res.alerts:
        if out.fired_s is None:
            res.problems.append(f"{out.alertname} did not fire")
        if out.paged_s is None:
            res.problems.append(f"{out.alertname} did not reach the pager")
        elif out.receiver != out.expected_receiver:
            res.problems.append(f"{out.alertname} reached '{out.receiver}', expected '{out.expected_receiver}'")
        if wait_resolve and out.paged_s is not None and out.resolved_s is None:
            res.problems.append(f"{out.alertname} did not resolve after the fault was cleared")


def run_all(state: StackState, progress=None, wait_resolve: bool = True) -> list[DrillResult]:
    """Every drill: the lanes in parallel (one node each), then the fleet-wide drills alone.
    ``wait_resolve=False``: no drill waits for its resolution (the next one in a lane may then see
    the previous one's alert still firing on the same node; it is not counted as false, being
    older than the drill)."""
    claims = Claims()
    for lane in LANES:  # fail fast if the stack is too small
        for name in lane:
            _nodes_for(state, DRILLS[name])
    results: dict[str, DrillResult] = {}

    def lane_runner(lane: tuple[str, ...]) -> None:
        for name in lane:
            results[name] = run_drill(state, name, claims, progress, wait_resolve=wait_resolve)

    with concurrent.futures.ThreadPoolExecutor(len(LANES)) as pool:
        for fut in [pool.submit(lane_runner, lane) for lane in LANES]:
            fut.result()
    topology = getattr(state, "topology", "single") or "single"
    final = tuple(n for n in FINAL if DRILLS[n].topology in (None, topology))
    for name in final:
        results[name] = run_drill(state, name, claims, progress, wait_resolve=wait_resolve)
    return [results[n] for lane in (*LANES, final) for n in lane]


def _t(v: float | None) -> str:
    return f"{v:6.1f}" if v is not None else "     -"


def delivery(receiver: str | None) -> tuple[str, str]:
    """``(verb, hop)`` naming how an alert reached its receiver: ``("ticketed", "fault-to-ticket")`` for the
    ticket receiver, else ``("paged", "fault-to-page")``. ``receiver``: the one it reached, else the
    expected one."""
    return ("ticketed", "fault-to-ticket") if receiver == "ticket" else ("paged", "fault-to-page")


def format_faults(faults: list[dict]) -> str:
    """The faults as text, one ``kind key=value ...`` per fault (admin-API bodies), ``; ``-separated;
    ``none`` for none (a deploy-only drill)."""
    parts = []
    for f in faults:
        rest = " ".join(f"{k}={v}" for k, v in f.items() if k != "kind")
        parts.append(f"{f.get('kind', '?')} {rest}".strip())
    return "; ".join(parts) or "none"


def format_timeline(res: DrillResult) -> str:
    """Human timeline of one drill with per-hop latencies.

    Event lines (injected, firing, paged or ticketed, cleared, resolved; seconds since injection) are in
    time order, whichever alert they belong to; events that did not happen (``-``) follow, in the
    order above. An alert that reached the ticket receiver says ``ticketed`` and counts toward
    ``fault-to-ticket``; ``fault-to-page``/``fault-to-ticket`` is the latest such delivery."""
    events: list[tuple[float | None, int, str]] = [(0.0, 0, "injected")]

    def add(t: float | None, text: str) -> None:
        events.append((t, len(events), text))
    for a in res.alerts:
        verb, _ = delivery(a.receiver or a.expected_receiver)
        hop = f"(+{a.paged_s - a.fired_s:.1f}s)" if a.fired_s is not None and a.paged_s is not None else ""
        add(a.fired_s, f"{'firing':<9} {a.alertname} in Prometheus")
        add(a.paged_s, f"{verb:<9} {a.alertname} -> {a.receiver or '-'} (expected {a.expected_receiver}) {hop}".rstrip())
    add(res.cleared_s, "cleared")
    for a in res.alerts:
        if res.resolve_waited:
            add(a.resolved_s, f"{'resolved':<9} {a.alertname}")
        else:
            add(None, f"{'resolved':<9} {a.alertname}: not awaited (--no-wait-resolve)")
    events.sort(key=lambda e: (e[0] is None, e[0] if e[0] is not None else 0.0, e[1]))
    lines = [f"drill {res.drill} on {res.hostname} (profile {res.profile})", f"  faults: {format_faults(res.faults)}"]
    lines += [f"  {_t(t)}s  {text}" for t, _, text in events]
    for a in res.alerts:
        lines.append(f"  runbook {a.alertname}: {a.runbook_url or '-'}")
    if res.impact:
        lines.append(f"  impact (incident #{res.impact['incident']}): {res.impact['line']}" if "line" in res.impact
                     else f"  impact: not measured ({res.impact.get('error')})")
    by_hop: dict[str, list[float | None]] = {}
    for a in res.alerts:
        by_hop.setdefault(delivery(a.receiver or a.expected_receiver)[1], []).append(a.paged_s)
    for hop in ("fault-to-page", "fault-to-ticket"):
        if hop in by_hop:
            times = by_hop[hop]
            lines.append(f"  {hop}: {max(times):.1f}s" if None not in times
                         else f"  {hop}: not {'ticketed' if hop == 'fault-to-ticket' else 'paged'}")
    if not res.alerts:
        lines.append("  fault-to-page: no alert expected")
    if res.bound:
        lines.append(f"  bound: {res.bound} = scrape + evaluation + for + group_wait (docs/drills.md)")
    lines.append(f"  false alerts: {', '.join(res.unexpected) or 'none'}")
    lines.append("  result: PASS" if res.ok else "  result: FAIL\n" + "\n".join(f"    - {p}" for p in res.problems))
    return "\n".join(lines)


def format_table(results: list[DrillResult]) -> str:
    """One row per drill: expected alerts, fired, fault-to-firing, fault-to-notified (paged or ticketed,
    whichever its receivers are), false alerts, resolved."""
    head = f"{'drill':<16} {'expected alerts':<34} {'fired':<5} {'to firing s':>11} {'to notify s':>11} {'bound s':>7}  " \
           f"{'unexpected alerts':<24} {'resolved':<8} result"
    rows = [head, "-" * len(head)]
    for r in results:
        exp = ",".join(f"{a.alertname}->{a.expected_receiver}" for a in r.alerts)
        rows.append(f"{r.drill:<16} {exp[:34]:<34} {'y' if r.firing_s is not None else 'n':<5} "
                    f"{_t(r.firing_s):>11} {_t(r.paged_s):>11} {_t(r.bound_s):>7}  {(','.join(r.unexpected) or 'none')[:24]:<24} "
                    f"{('y' if r.resolved else 'n') if r.resolve_waited else 'skipped':<8} "
                    f"{'PASS' if r.ok else 'FAIL'}")
    rows.append("to notify: fault to the page, or to the ticket for a ticket-severity alert")
    rows.append("bound: scrape + evaluation + for: + group_wait on this stack, for a condition true at the fault's "
                "first sample; windowed conditions (rates, GPU gone 2m, SLO burn) add their window (docs/drills.md)")
    return "\n".join(rows)
