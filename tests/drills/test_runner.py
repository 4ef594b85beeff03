"""The drill runner over a fake stack and a simulated clock (``run_drill(clock=, sleep=)``; the real
``time`` is barred from the runner, so nothing sleeps): progress lines while it waits,
``--no-wait-resolve`` returning once the fault is cleared, the fault-to-page timeline and the
deadlines in simulated seconds. (The real stack: tests/live/test_stack_drill.py.)"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from gpuobs.drills import runner

HOSTS = ["gpu-node-00", "gpu-node-01", "gpu-node-02", "gpu-node-03"]
HOST = HOSTS[1]  # ecc-dbe runs on serving slot 1
T0 = 1_800_000_000.0


class NoRealClock:
    """Stands in for the runner's ``time`` module: a drill reads and waits only through its clock."""

    def time(self):
        raise AssertionError("the drill read the real clock")

    def sleep(self, s):
        raise AssertionError("the drill slept for real")


class World:
    """Simulated clock plus what Prometheus and the pager show: GpuEccDoubleBitError fires ``fire_after``
    seconds after the injection, pages 5 s later, and resolves ``resolve_after`` seconds after the clear."""

    def __init__(self, fire_after=40.0, resolve_after=50.0, identity_label="node"):
        self.t, self.fire_after, self.resolve_after = T0, fire_after, resolve_after
        self.identity_label, self.session_idents = identity_label, []
        self.injected = self.cleared = None
        self.polls = 0
        self.history_at, self.history_checks = T0, []  # when Prometheus holds the node's first scrapes
        self.sleeps = []

    # the drill's clock and sleep
    def time(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s

    def _labels(self):
        return {"alertname": "GpuEccDoubleBitError", self.identity_label: HOST, "gpu": "3", "severity": "critical"}

    def firing(self):
        if self.injected is None or self.t - self.injected < self.fire_after:
            return False
        return self.cleared is None or self.t - self.cleared < self.resolve_after

    def alerts(self):
        self.polls += 1
        if not self.firing():
            return []
        at = dt.datetime.fromtimestamp(self.injected + self.fire_after, dt.timezone.utc).isoformat()
        return [{"labels": self._labels(), "annotations": {}, "state": "firing", "activeAt": at.replace("+00:00", "Z")}]

    def pages(self, since):
        out = []
        if self.injected is not None and self.t - self.injected >= self.fire_after + 5:
            out.append({"received_at": self.injected + self.fire_after + 5, "channel": "page", "status": "firing",
                        "alerts": [{"status": "firing", "labels": self._labels(),
                                    "annotations": {"runbook_url": "http://127.0.0.1:9097/runbooks/ecc.md#x"}}]})
        if self.cleared is not None and self.t - self.cleared >= self.resolve_after:
            out.append({"received_at": self.cleared + self.resolve_after, "channel": "page", "status": "resolved",
                        "alerts": [{"status": "resolved", "labels": self._labels(), "annotations": {}}]})
        return [p for p in reversed(out) if p["received_at"] >= since]


class Admin:
    def __init__(self, world):
        self.world = world

    def inject(self, body):
        self.world.injected = self.world.t
        return {"id": "n1-f1"}

    def clear(self, fid):
        self.world.cleared = self.world.t


@pytest.fixture
def world(monkeypatch):
    w = World()
    monkeypatch.setattr(runner, "time", NoRealClock())

    class Session:
        def __init__(self, state, ident):
            w.session_idents.append(ident)
            self.admin = [Admin(w) for _ in HOSTS]
            self.alerts, self.pages = w.alerts, w.pages

        def has_history(self, host):
            w.history_checks.append((w.t, host))
            return w.t >= w.history_at

        def bound(self, alertname, labels):
            from gpuobs.drills.bounds import PageBound

            return PageBound(15.0, 5.0, 5.0, 0.0, 5.0)

    monkeypatch.setattr(runner, "_Session", Session)
    return w


STATE = SimpleNamespace(nodes=4, training_nodes=1, hostnames=HOSTS, logwatch=False, profile="drill")


def drill(world, state=STATE, **kw):
    """``ecc-dbe`` on ``world``'s simulated clock."""
    return runner.run_drill(state, "ecc-dbe", clock=world.time, sleep=world.sleep, **kw)


def test_progress_lines_say_how_long_and_what_is_awaited(world):
    lines = []
    res = drill(world, progress=lines.append)
    assert res.ok and res.paged_s == 45.0 and res.resolved and res.resolve_waited
    waiting = [line for line in lines if "since injection, waiting for" in line]
    # fires at 40 s: lines at ~15 s and ~30 s (every PROGRESS_EVERY_S) while nothing had fired yet
    assert waiting[0].startswith("ecc-dbe: 15s since injection, waiting for GpuEccDoubleBitError to fire "
                                 "(give up at 150s)")
    assert any(line.startswith("ecc-dbe: 30s since") for line in waiting)
    resolve = [line for line in waiting if "to resolve" in line]
    assert resolve and all("--no-wait-resolve skips this wait" in line for line in resolve)
    assert res.alerts[0].resolved_s == pytest.approx(res.cleared_s + 50.0, abs=1.5)


def test_no_wait_resolve_returns_once_cleared(world):
    lines = []
    res = drill(world, progress=lines.append, wait_resolve=False)
    assert res.ok and not res.resolve_waited and res.alerts[0].resolved_s is None
    assert world.t - T0 == pytest.approx(res.cleared_s)  # nothing awaited after the clear
    assert "not waiting for the resolution (--no-wait-resolve)" in lines[-1]
    assert not [line for line in lines if "to resolve" in line]
    text = runner.format_timeline(res)
    assert "not awaited (--no-wait-resolve)" in text and "result: PASS" in text
    assert "skipped" in runner.format_table([res])
    assert res.to_dict()["resolve_waited"] is False


def test_waiting_line():
    assert runner.waiting_line("xid", 44.6, 60.0, ["GpuKernelXidCritical to reach 'page'"], "fire") == \
        "xid: 45s since injection, waiting for GpuKernelXidCritical to reach 'page' (give up at 60s)"


def test_docs_give_times_for_every_drill():
    from pathlib import Path

    from gpuobs.drills.catalogue import DRILLS

    text = (Path(__file__).resolve().parents[2] / "docs" / "drills.md").read_text()
    measured, expected = text.split("## Fault to page, measured")[1].split("## Expected times")
    for name in DRILLS:
        for table in (measured, expected):
            assert any(line.startswith(f"| {name} ") for line in table.splitlines()), (name, table[:80])


def test_the_drill_is_recorded_for_the_incident_console(world, tmp_path):
    from gpuobs.core import activity

    state = SimpleNamespace(**vars(STATE), run_dir=str(tmp_path))
    res = drill(world, state, wait_resolve=False)
    (act,) = activity.load(activity.path_in(tmp_path))
    assert (act.kind, act.id, act.title, act.nodes) == ("drill", f"ecc-dbe-{int(T0)}", "drill ecc-dbe", [HOST])
    assert act.started_at == res.injected_at and act.ended_at == pytest.approx(res.injected_at + res.cleared_s)
    assert act.until > act.ended_at and act.detail["outcome"] == "PASS"
    assert act.detail["report"] == f"gpuobs report drill ecc-dbe --run-dir {tmp_path}"


def test_a_drill_injects_only_once_prometheus_holds_the_nodes_history(world):
    """Stock GPUThrottling compares a GPU with its own last hour: a fault injected before the node's
    first scrapes would be its whole history, and the drill would miss (make drills, power-brake)."""
    world.history_at = T0 + 12
    res = drill(world, wait_resolve=False)
    assert world.injected == T0 + 12 and res.ok, res.problems
    assert {h for _t, h in world.history_checks} == {HOSTS[1]}


def test_a_node_without_history_is_injected_after_the_wait_and_said(world):
    world.history_at = float("inf")
    lines = []
    drill(world, progress=lines.append, wait_resolve=False)
    assert world.injected == T0 + runner.HISTORY_WAIT_S
    assert any("fewer than 3 scrapes" in line and "injecting anyway" in line for line in lines), lines


def test_fault_to_page_timeline_in_simulated_seconds(world):
    """Fires 40 s after the injection, pages 5 s later, resolves 50 s after the clear: the result says
    exactly that in simulated seconds, every wait was the runner's 1 s poll on the given clock."""
    res = drill(world)
    a = res.alerts[0]
    assert (res.injected_at, a.fired_s, a.paged_s, res.cleared_s, a.resolved_s) == (T0, 40.0, 45.0, 45.0, 95.0)
    assert (a.receiver, a.runbook_url) == ("page", "http://127.0.0.1:9097/runbooks/ecc.md#x")
    assert res.ok and res.firing_s == 40.0 and res.paged_s == 45.0 and res.resolved
    assert set(world.sleeps) == {1.0} and world.t - T0 == sum(world.sleeps) == 95.0
    assert "fault-to-page: 45.0s" in runner.format_timeline(res)


@pytest.mark.parametrize("profile, deadline_s", [("drill", 150.0), ("default", 900.0)])
def test_fire_deadline_expires_in_simulated_time(world, profile, deadline_s):
    """An alert that never fires: the drill gives up at the fire deadline (stretched 6x on the default
    profile), clears the fault then and reports the miss; the resolve phase has nothing to wait for."""
    world.fire_after = float("inf")
    lines = []
    res = drill(world, SimpleNamespace(**{**vars(STATE), "profile": profile}), progress=lines.append)
    assert res.cleared_s == deadline_s and world.cleared == T0 + deadline_s
    assert res.alerts[0].fired_s is None and res.alerts[0].paged_s is None and not res.ok
    assert res.problems == ["GpuEccDoubleBitError did not fire", "GpuEccDoubleBitError did not reach the pager"]
    waiting = [line for line in lines if "since injection, waiting for" in line]
    assert waiting[-1].endswith(f"waiting for GpuEccDoubleBitError to fire (give up at {deadline_s:.0f}s)")
    assert world.t - T0 == deadline_s  # nothing awaited after the clear: no alert was paged


def test_the_drill_names_its_node_by_the_fleet_config_identity_label(world):
    """The node's alerts are matched (and its history read) by the fleet config's identity label: on a
    fleet labelled k8s_node an alert labelled k8s_node pages the drill; by default (node) it does not
    count as this node's alert."""
    from gpuobs.core.fleet import parse_fleet

    world.identity_label = "k8s_node"
    res = drill(world, fleet=parse_fleet({"identity_label": "k8s_node"}), wait_resolve=False)
    assert res.ok and res.paged_s == 45.0 and world.session_idents == ["k8s_node"]
    other = World(identity_label="k8s_node")
    other.session_idents = world.session_idents
    world.__dict__.update(other.__dict__)
    res = drill(world, wait_resolve=False)
    assert not res.ok and world.session_idents[-1] == "node"


def test_the_timeline_and_table_give_the_pages_bound(world):
    res = drill(world)
    assert res.bound_s == 15.0 and res.bound == "15s (5+5+0+5)"
    assert "  bound: 15s (5+5+0+5) = scrape + evaluation + for + group_wait" in runner.format_timeline(res)
    table = runner.format_table([res])
    assert "bound s" in table.splitlines()[0] and "  15.0  " in table.splitlines()[2]


def test_group_wait_follows_the_shipped_route_tree():
    """Alertmanager's routing (first matching child, group_wait inherited) on alertmanager/alertmanager.yml."""
    from pathlib import Path

    import yaml

    from gpuobs.drills.bounds import group_wait

    route = yaml.safe_load((Path(__file__).resolve().parents[2] / "alertmanager" / "alertmanager.yml").read_text())["route"]
    assert group_wait(route, {"alertname": "GpuKernelXidCritical", "severity": "critical", "family": "xid"}) == 5.0
    assert group_wait(route, {"alertname": "ServingEngineDown", "severity": "critical", "family": "exporter"}) == 30.0
    assert group_wait({"routes": [{"matchers": ['a="b"'], "group_wait": "1m"}]}, {"a": "c"}) == 30.0  # the default

# ---- slo-burn: its fire deadline on the default profile follows from the burn-rate rules ----------------------
def test_slo_fire_deadline_from_the_burn_rate_windows():
    """30d period, 99.9 %: the 1h/5m x14.4 pair pages when the 1h error ratio passes 1.44 %: +3 % errors
    take 1h x 1.44 / 3 = 28.8 min; +15 % and 60 s to the pager: 34m08s, under the 1h turnover (after
    which that pair can no longer start to hold). The drill profile's 1d period: 2m/30s, 57.6 s. A
    smaller burn pages only through the 6h/30m x6 pair, capped at its 6h turnover; one under every page
    threshold never pages."""
    from gpuobs.drills.catalogue import SLO_PAGE_LATENCY_S, slo_fire_deadline

    d = slo_fire_deadline(0.03, 0.999, 30 * 86400)
    assert (d.long_s, d.short_s, d.factor) == (3600, 300, 14.4)
    assert d.time_to_page_s == pytest.approx(1728.0) and d.deadline_s == 2048.0
    assert d.deadline_s < 35 * 60 and d.deadline_s <= d.long_s + SLO_PAGE_LATENCY_S
    assert "28m48s" in d.explain() and "34m08s" in d.explain()
    fast = slo_fire_deadline(0.03, 0.999, 86400)
    assert (fast.long_s, fast.short_s) == (120, 30) and fast.time_to_page_s == pytest.approx(57.6)
    slow = slo_fire_deadline(0.01, 0.999, 30 * 86400)  # under 1.44 %: only the 6h/30m x6 pair (0.6 %) pages
    assert (slow.long_s, slow.factor) == (21600, 6.0) and slow.time_to_page_s == pytest.approx(12960.0)
    assert slow.deadline_s == 14964  # 12960 x 1.15 + 60
    edge = slo_fire_deadline(0.0065, 0.999, 30 * 86400)  # 6h x 0.6/0.65 = 5.5h; +15 % would pass 6h: capped
    assert edge.deadline_s == 21600 + SLO_PAGE_LATENCY_S
    with pytest.raises(ValueError, match="never page"):
        slo_fire_deadline(0.005, 0.999, 30 * 86400)


def test_the_slo_burn_release_adds_what_the_drill_assumes():
    from gpuobs.drills.catalogue import DRILLS
    from gpuobs.exporter.sim.behaviour import load

    spec = DRILLS["slo-burn"]
    assert load().profile(spec.deploy).error_rate_delta == spec.slo_burn[1]


class SloWorld(World):
    """ServingErrorBudgetBurn (availability, critical) fires ``fire_after`` s after the deploy."""

    def _labels(self):
        return {"alertname": "ServingErrorBudgetBurn", "slo": "availability", "severity": "critical"}


class DeployAdmin(Admin):
    def deploy(self, version):
        if version == "1.6.1":
            self.world.injected = self.world.t
        else:
            self.world.cleared = self.world.t
        return {"previous": "1.6.0"}


@pytest.fixture
def slo_world(world, monkeypatch):
    w = SloWorld()
    w.__dict__.update({k: v for k, v in world.__dict__.items() if k not in w.__dict__})
    orig = runner._Session

    class Session(orig):
        def __init__(self, state, ident):
            super().__init__(state, ident)
            self.admin = [DeployAdmin(w) for _ in HOSTS]
            self.alerts, self.pages = w.alerts, w.pages
    monkeypatch.setattr(runner, "_Session", Session)
    return w


@pytest.mark.parametrize("profile, deadline_s", [("drill", 240.0), ("default", 2048.0)])
def test_slo_burn_gives_up_at_the_deadline_the_rules_give(slo_world, profile, deadline_s):
    """A page that never comes: on the drill profile the catalogue's 240 s; on the default profile the
    deadline derived from the 30d rules (34m08s, not 240 s x 6 = 24 min, before the ~29 min page),
    said before the injection."""
    slo_world.fire_after = float("inf")
    lines = []
    res = runner.run_drill(SimpleNamespace(**{**vars(STATE), "profile": profile}), "slo-burn", progress=lines.append,
                           clock=slo_world.time, sleep=slo_world.sleep, wait_resolve=False)
    assert res.cleared_s == deadline_s and not res.ok
    said = [line for line in lines if "fire deadline" in line]
    if profile == "default":
        assert said == [f"slo-burn: fire deadline 2048s on the default profile: {said[0].split(': ', 2)[2]}"]
        assert "1.44%" in said[0] and "28m48s" in said[0]
    else:
        assert said == []


def test_slo_burn_on_the_default_profile_passes_with_the_page_at_29_minutes(slo_world):
    """What a `make up` stack does (the page ~29 min after the deploy): the drill waits for it and passes."""
    slo_world.fire_after = 29 * 60.0
    res = runner.run_drill(SimpleNamespace(**{**vars(STATE), "profile": "default"}), "slo-burn",
                           clock=slo_world.time, sleep=slo_world.sleep, wait_resolve=False)
    assert res.ok, (res.problems, res.unexpected)
    assert res.alerts[0].fired_s == 29 * 60.0 and res.alerts[0].paged_s == 29 * 60.0 + 5


def test_group_wait_follows_alertmanagers_routing_rules():
    """continue: true, legacy match/match_re and bare or comma-joined matcher strings (Alertmanager 0.25)."""
    from gpuobs.drills.bounds import group_wait

    page = {"alertname": "GpuKernelXidCritical", "severity": "critical", "family": "xid"}
    audit = {"matchers": ['severity=~".+"'], "group_wait": "10m", "continue": True}
    assert group_wait({"group_wait": "5s", "routes": [audit, {"matchers": ['severity="critical"']}]}, page) == 5.0
    assert group_wait({"group_wait": "5s", "routes": [{"match": {"severity": "warning"}, "group_wait": "10m"},
                                                      {"match_re": {"family": "x.d"}, "group_wait": "7s"}]}, page) == 7.0
    assert group_wait({"routes": [{"matchers": ['severity=critical,family="xid"'], "group_wait": "55s"}]}, page) == 55.0
    assert group_wait({"routes": [{"matchers": ['{alertname!~"Watch.*", severity="critical"}'], "group_wait": "9s"}]},
                      page) == 9.0


def test_page_bound_never_raises_on_configs_it_cannot_read(monkeypatch):
    from gpuobs.drills import bounds

    class Resp:
        def __init__(self, doc):
            self.doc = doc

        def json(self):
            return self.doc

    def fake(prom_yaml, am_yaml, groups):
        def get(url, params=None, timeout=None):
            if url.endswith("/status/config"):
                return Resp({"data": {"yaml": prom_yaml}})
            if url.endswith("/rules"):
                return Resp({"data": {"groups": groups}})
            return Resp({"config": {"original": am_yaml}})
        monkeypatch.setattr(bounds.requests, "get", get)

    rules = [{"rules": [{"name": "X", "duration": 0, "labels": {}}]}]
    for prom, am, groups in [("global: {scrape_interval: 500ms}", "route: {}", rules),
                             ("global: {}", "route: {group_wait: 500ms}", rules),
                             ("global: {}", "receivers: []", rules), ("", "", rules),
                             ("global: {}", "route: {routes: [{matchers: ['a=~\"(\"']}]}", rules),
                             ("global: {}", "route: {}", [{}])]:
        fake(prom, am, groups)
        assert bounds.page_bound("http://p", "http://a", "X", {}) is None, (prom, am, groups)
    fake("global: {scrape_interval: 15s, evaluation_interval: 15s}", "route: {group_wait: 5s}", rules)
    assert bounds.page_bound("http://p", "http://a", "X", {}).seconds == 35.0


def _two_alert_result() -> runner.DrillResult:
    """An ecc-dbe-like result: the second alert (a ticket) fired at 3.0 s, the first paged at 73 s."""
    return runner.DrillResult(
        "ecc-dbe", "gpu-node-01", "drill", faults=[{"kind": "ecc_dbe", "gpu": 0}],
        alerts=[runner.AlertOutcome("GpuEccDoubleBitError", "page", fired_s=70.0, paged_s=73.0, receiver="page",
                                    resolved_s=140.0),
                runner.AlertOutcome("GpuRowRemapPending", "ticket", fired_s=3.0, paged_s=8.0, receiver="ticket",
                                    resolved_s=130.0)],
        injected_at=T0, cleared_s=80.0)


def test_timeline_lines_are_in_time_order_whichever_alert_they_belong_to():
    """Issue 29: the 3.0 s line was printed after the 73 s ones (lines were grouped per alert)."""
    text = runner.format_timeline(_two_alert_result())
    times = [float(line.split("s ", 1)[0]) for line in text.splitlines()
             if line.startswith("  ") and line.strip()[:1].isdigit()]
    assert times == sorted(times) and times[:3] == [0.0, 3.0, 8.0], text
    assert "{" not in text and "'kind'" not in text  # no Python repr of the faults
    assert "  faults: ecc_dbe gpu=0" in text


def test_a_ticket_says_ticketed_and_fault_to_ticket():
    text = runner.format_timeline(_two_alert_result())
    assert "ticketed  GpuRowRemapPending -> ticket (expected ticket)" in text
    assert "paged     GpuEccDoubleBitError -> page" in text
    assert "paged     GpuRowRemapPending" not in text
    assert "  fault-to-page: 73.0s" in text and "  fault-to-ticket: 8.0s" in text
    only_ticket = runner.DrillResult("xid", "gpu-node-01", "drill", alerts=[
        runner.AlertOutcome("GpuKernelXidWarning", "ticket", fired_s=2.0, paged_s=6.0, receiver="ticket")])
    text = runner.format_timeline(only_ticket)
    assert "fault-to-ticket: 6.0s" in text and "fault-to-page" not in text


def test_the_vmalert_outage_drill_runs_on_the_ha_topology_only(world):
    """catalogue DrillSpec.topology: on a single stack (no vmalert) it is refused up front, not failed."""
    with pytest.raises(runner.DrillError, match="ha topology only"):
        runner.run_drill(STATE, "vmalert-outage", clock=world.time, sleep=world.sleep)
    from gpuobs.drills.catalogue import DRILLS, FINAL

    spec = DRILLS["vmalert-outage"]
    assert "vmalert-outage" in FINAL and spec.outage == "vmalert" and spec.topology == "ha"
    assert [e.alertname for e in spec.outage_expect] == ["FleetRulesBlind"]
