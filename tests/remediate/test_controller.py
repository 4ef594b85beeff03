"""The remediation controller's state machine and interlocks, on a simulated clock and an in-memory
fleet (tests/fakes/remediate_fleet.py). Live drills on the stack are in tests/live."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from gpuobs.core.errors import ConfigError
from gpuobs.remediate.config import RemediationConfig, parse_config
from gpuobs.remediate.controller import Controller, parse_time
from gpuobs.remediate.interfaces import ActionError as ActionErrorForTest
from gpuobs.remediate.policy import plan, xid_class
from gpuobs.remediate.store import OUT_STATES, RemediationStore
from tests.fakes.remediate_fleet import Clock, FakeFleet, alert, payload

CFG = RemediationConfig(mode="enforce", settle=10.0, verify_hold=30.0, verify_timeout=300.0, drain_timeout=120.0)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


class World:
    def __init__(self, tmp_path, pools=None, cfg=CFG, **fleet_kw):
        self.clock = Clock()
        self.fleet = FakeFleet(self.clock, pools or {"serving": 8}, **fleet_kw)
        self.db = tmp_path / "remediate.sqlite"
        self.cfg = cfg
        self.new_controller()

    def new_controller(self):
        """A fresh controller process over the same database (a restart)."""
        self.store = RemediationStore(self.db, self.clock)
        self.c = Controller(self.store, self.fleet, self.fleet, self.cfg, "node", self.clock)

    def send(self, *alerts):
        return self.c.ingest(payload(*alerts))

    def run(self, seconds: float, step: float = 1.0, check=None):
        t_end = self.clock() + seconds
        while self.clock() < t_end:
            self.c.tick()
            if check:
                check(self)
            self.clock.advance(step)

    def state(self, node):
        ep = self.store.latest(node)
        return ep.state if ep else None


def test_xid48_quarantine_drain_reset_verify_return(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-2", "GpuXidCritical")
    assert w.send(alert("serving-2", starts_at=iso(w.clock()))) == {"opened": 1}
    w.run(300)
    assert w.state("serving-2") == "returned"
    assert [c[0] for c in w.fleet.calls if c[1] == "serving-2" and c[0] != "drain"] == ["cordon", "act", "uncordon"]
    assert not w.fleet.nodes_["serving-2"].cordoned
    kinds = [e["kind"] for e in w.store.timeline("serving-2")]
    for k in ("pending", "quarantined", "draining", "acting", "verifying", "returned"):
        assert k in kinds
    # verification waited for the alert's look-back (60 s) and the hold (30 s) after the reset
    act_ts = [s["ts"] for s in w.store.steps("serving-2") if s["step"] == "act"][0]
    back_ts = [s["ts"] for s in w.store.steps("serving-2") if s["step"] == "uncordon"][0]
    assert back_ts - act_ts >= 60 + 30


def test_resends_and_duplicates_act_once(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-1", "GpuXidCritical")
    a = alert("serving-1", starts_at=iso(w.clock()))
    for _ in range(5):
        w.send(a)
        w.run(20)
    w.run(300)
    assert w.state("serving-1") == "returned"
    assert w.fleet.actions_on("serving-1") == 1
    outcomes = [e["outcome"] for e in w.store.events("serving-1")]
    assert outcomes.count("opened") == 1


def test_application_xid_takes_no_action(tmp_path):
    w = World(tmp_path)
    assert w.send(alert("serving-0", xid=13, starts_at=iso(w.clock()))) == {"no-action": 1}
    assert w.send(alert("serving-0", alertname="GPUThrottling", xid=None)) == {"no-policy": 1}
    w.run(60)
    assert w.fleet.calls == [] and w.store.latest("serving-0") is None


def test_unresettable_fault_escalates_after_max_attempts(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-3", "GpuRowRemapFailure", "persistent")
    w.send(alert("serving-3", alertname="GpuRowRemapFailure", xid=None, starts_at=iso(w.clock())))
    w.run(900)
    assert w.state("serving-3") == "escalated"
    assert w.fleet.actions_on("serving-3") == CFG.max_attempts
    assert w.fleet.nodes_["serving-3"].cordoned  # stays out for the RMA
    assert w.fleet.actions_on("serving-3", "uncordon") == 0
    # an escalated node counts against the pool cap until a person releases it
    w.fleet.fault("serving-4", "GpuXidCritical")
    w.send(alert("serving-4", starts_at=iso(w.clock())))
    w.run(30)
    assert w.state("serving-4") == "pending"
    assert any(e["actor"] == "interlock:pool-concurrency" for e in w.store.timeline("serving-4"))
    assert w.c.release("serving-3", "alice", "RMA filed")
    w.run(300)
    assert w.state("serving-4") == "returned"


def test_reboot_for_fallen_off_bus(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-5", "GpuFallenOffBus", "reboot")
    w.send(alert("serving-5", alertname="GpuFallenOffBus", xid=None, gpu=6, starts_at=iso(w.clock())))
    w.run(300)
    assert w.state("serving-5") == "returned"
    assert ("act", "serving-5", "reboot") in w.fleet.calls


def test_pool_concurrency_one_node_at_a_time(tmp_path):
    w = World(tmp_path, pools={"serving": 8, "training": 2}, cfg=replace(CFG, breaker_min_nodes=5))
    for n in ("serving-0", "serving-1", "training-0"):
        w.fleet.fault(n, "GpuXidCritical")
        w.send(alert(n, starts_at=iso(w.clock())))

    def check(world):
        out = [e for e in world.store.out_of_service() if e.pool == "serving"]
        assert len(out) <= 1
    w.run(30, check=check)
    # training is a different pool: its own cap
    assert w.state("training-0") in ("draining", "acting", "verifying", "quarantined")
    w.run(600, check=check)
    assert {w.state(n) for n in ("serving-0", "serving-1", "training-0")} == {"returned"}


def test_pool_rate_cap(tmp_path):
    cfg = replace(CFG, rate_min=2, pool_share=0.5, breaker_min_nodes=5)  # concurrency 5 of 10, rate 2 per hour
    w = World(tmp_path, pools={"serving": 10}, cfg=cfg)
    for i in range(3):
        w.fleet.fault(f"serving-{i}", "GpuXidCritical")
        w.send(alert(f"serving-{i}", starts_at=iso(w.clock())))
        w.run(5)
    assert [w.state(f"serving-{i}") for i in range(3)].count("pending") == 1
    held = [e for e in w.store.timeline() if e["actor"] == "interlock:pool-rate"]
    assert held and "cap 2" in held[0]["detail"]
    w.run(3600 + 300, step=5.0)
    assert {w.state(f"serving-{i}") for i in range(3)} == {"returned"}


def test_xid_storm_trips_breaker_once_and_stops_acting(tmp_path):
    w = World(tmp_path, pools={"serving": 8})
    for i in range(5):
        n = f"serving-{i}"
        w.fleet.fault(n, "GpuFallenOffBus", "reboot")
        w.send(alert(n, alertname="GpuFallenOffBus", xid=None, starts_at=iso(w.clock())))
        w.run(10)
    w.run(600)
    assert w.store.breaker()["open"]
    opened = [e for e in w.store.timeline() if e["kind"] == "breaker-open"]
    assert len(opened) == 1 and "fleet-wide event" in opened[0]["detail"]
    out = [e for e in w.store.episodes() if e.state in OUT_STATES]
    assert len(out) <= CFG.pool_cap(8)
    # nothing acted after the breaker opened
    acts_after = [s for s in w.store.steps() if s["step"] == "act" and s["ts"] >= opened[0]["ts"]]
    assert acts_after == []
    assert w.c.close_breaker("alice", "driver rolled back")
    assert not w.store.breaker()["open"]
    assert all(e.state != "pending" for e in w.store.episodes())


def test_kill_mid_action_never_repeats_it(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-1", "GpuXidCritical")
    w.send(alert("serving-1", starts_at=iso(w.clock())))
    w.fleet.crash_on = "reset-gpu"
    with pytest.raises(KeyboardInterrupt):
        w.run(120)
    w.store.close()
    w.new_controller()  # kill -9 and restart: the store is all that is left
    w.send(alert("serving-1", starts_at=iso(w.clock() - 120)))  # Alertmanager re-sends after the restart
    w.run(400)
    assert w.fleet.actions_on("serving-1") == 1
    assert w.state("serving-1") == "returned"
    unknown = [s for s in w.store.steps("serving-1") if s["status"] == "unknown"]
    assert len(unknown) == 1


def test_kill_mid_drain_resumes_without_repeating_cordon_effects(tmp_path):
    w = World(tmp_path, drain_s=60)
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(10)
    assert w.state("serving-0") == "draining"
    w.store.close()
    w.new_controller()
    w.run(400)
    assert w.state("serving-0") == "returned"
    assert w.fleet.actions_on("serving-0") == 1
    assert w.fleet.actions_on("serving-0", "cordon") == 1


def test_manual_uncordon_mid_drain_wins(tmp_path):
    w = World(tmp_path, drain_s=60)
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(10)
    n = w.fleet.nodes_["serving-0"]
    n.cordoned, n.cordoned_by = False, ""  # kubectl uncordon
    w.run(300)
    assert w.state("serving-0") == "overridden"
    assert w.fleet.actions_on("serving-0") == 0 and not n.cordoned
    assert "serving-0" in w.store.holds()
    assert w.send(alert("serving-0", starts_at=iso(w.clock()), fp="new")) == {"held": 1}
    w.run(60)
    assert w.fleet.actions_on("serving-0", "cordon") == 1


def test_human_cordon_is_never_undone(tmp_path):
    w = World(tmp_path)
    n = w.fleet.nodes_["serving-0"]
    n.cordoned, n.cordoned_by = True, "human"
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(300)
    assert w.state("serving-0") == "overridden"
    assert n.cordoned and n.cordoned_by == "human"
    assert w.fleet.actions_on("serving-0") == 0


def test_hold_command_stops_an_episode_and_release_allows_new_ones(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(5)
    w.c.hold("serving-0", "bob", "investigating")
    w.run(300)
    assert w.state("serving-0") == "overridden" and w.fleet.actions_on("serving-0") == 0
    assert w.c.release("serving-0", "bob", "done")
    w.send(alert("serving-0", starts_at=iso(w.clock()), fp="again"))
    w.run(400)
    assert w.state("serving-0") == "returned"


def test_drain_timeout_never_reaches_the_action(tmp_path):
    w = World(tmp_path)
    w.fleet.nodes_["serving-0"].stuck = True
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(600)
    assert w.state("serving-0") == "escalated"
    assert w.fleet.actions_on("serving-0") == 0
    assert "drain timed out" in w.store.latest("serving-0").reason


def test_stale_event_after_return_is_ignored(tmp_path):
    w = World(tmp_path)
    t0 = w.clock()
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(t0)))
    w.run(400)
    assert w.state("serving-0") == "returned"
    w.store.close()
    w.new_controller()
    # a replay of an old alert (another fingerprint, startsAt before the return) after a restart
    assert w.send(alert("serving-0", starts_at=iso(t0 + 5), fp="replayed")) == {"stale": 1}
    w.run(100)
    assert w.fleet.actions_on("serving-0") == 1


def test_canary_node_aborts_its_rollout_first(tmp_path):
    w = World(tmp_path)
    w.fleet.rollouts = {"serving-0": "r-42"}
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(30)
    assert w.state("serving-0") == "pending" and len(w.fleet.aborted) == 1
    assert w.fleet.aborted[0][0] == "r-42"
    w.fleet.rollouts = {}  # the rollout rolled back and released its nodes
    w.run(400)
    assert w.state("serving-0") == "returned" and len(w.fleet.aborted) == 1


@pytest.mark.parametrize("mode", ["dry-run", "observe"])
def test_dry_run_and_observe_never_act(tmp_path, mode):
    w = World(tmp_path, cfg=replace(CFG, mode=mode))
    w.fleet.rollouts = {"serving-1": "r-1"}
    for i in range(2):
        w.fleet.fault(f"serving-{i}", "GpuXidCritical")
        w.send(alert(f"serving-{i}", starts_at=iso(w.clock())))
    w.run(200)
    assert w.fleet.calls == [] and w.fleet.aborted == []
    assert {w.state(f"serving-{i}") for i in range(2)} == {mode if mode == "dry-run" else "observed"}
    if mode == "dry-run":
        assert "would quarantine" in w.store.latest("serving-0").reason


def test_inventory_outage_takes_no_action(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.fleet.fail_inventory = True
    w.run(60)
    assert w.fleet.calls == [] and w.state("serving-0") == "pending"
    w.fleet.fail_inventory = False
    w.run(400)
    assert w.state("serving-0") == "returned"


@pytest.mark.parametrize("seed", range(20))
def test_seeded_storms_respect_caps_and_act_once_per_event(tmp_path, seed):
    """Storms of different sizes and timings, Alertmanager re-sends (also after its own restart: same
    fingerprint and startsAt) and controller restarts: never more out of service than the pool cap,
    never more than one episode per event, never more actions per episode than max_attempts."""
    rng = random.Random(seed)
    size = rng.randint(6, 20)
    w = World(tmp_path, pools={"serving": size, "training": rng.randint(2, 6)})
    caps = {p: CFG.pool_cap(sum(1 for n in w.fleet.nodes_.values() if n.pool == p)) for p in ("serving", "training")}
    hit = rng.sample(sorted(w.fleet.nodes_), rng.randint(2, min(9, size)))
    sent: list[dict] = []
    t0 = w.clock()
    schedule = sorted((rng.uniform(0, 90), n) for n in hit)

    def check(world):
        for pool, cap in caps.items():
            out = [e for e in world.store.out_of_service() if e.pool == pool]
            assert len(out) <= cap, (pool, [e.node for e in out])
    for at, n in schedule:
        while w.clock() < t0 + at:
            w.run(1, check=check)
        kind = rng.choice(["resettable", "reboot", "persistent"])
        name = {"resettable": "GpuXidCritical", "reboot": "GpuFallenOffBus", "persistent": "GpuRowRemapFailure"}[kind]
        w.fleet.fault(n, name, kind)
        a = alert(n, alertname=name, xid=48 if kind == "resettable" else None, starts_at=iso(w.clock()))
        sent.append(a)
        w.send(a)
        if rng.random() < 0.5:
            w.send(*rng.sample(sent, min(3, len(sent))))  # re-sends, in any order
    for _ in range(rng.randint(0, 3)):
        w.run(rng.uniform(5, 200), check=check)
        w.store.close()
        w.new_controller()
        w.send(*sent)  # Alertmanager restarted and re-sends everything it had
    w.run(1800, check=check)
    eps = w.store.episodes()
    fps = [e.fingerprint for e in eps]
    assert len(fps) == len(set(fps))
    for e in eps:
        acts = [s for s in w.store.steps(episode=e.id) if s["step"] == "act"]
        assert len(acts) <= CFG.max_attempts
    breaker_opens = [e for e in w.store.timeline() if e["kind"] == "breaker-open"]
    assert len(breaker_opens) <= 1
    if len(hit) >= CFG.breaker_threshold(len(w.fleet.nodes_)):
        assert len(breaker_opens) == 1


def test_policy_from_the_xid_catalogue():
    assert xid_class(48)[0] == "gpu-reset" and xid_class(79)[0] == "node-reboot"
    assert xid_class(13)[0] == "application" and xid_class(31)[0] == "application"
    assert xid_class(54)[0] == "escalate" and xid_class(99999)[0] == "escalate"
    p = plan("GpuKernelXidCritical", {"xid": "48", "gpu": "3"})
    assert (p.action, p.gpu) == ("reset-gpu", 3) and "catalogue" in p.why
    assert plan("KVFragmentationRisk", {"gpu": "4"}).action == "restart-engine"
    assert plan("GPUThrottling", {}) is None


def test_config_errors_name_the_field():
    assert parse_config({"mode": "enforce", "drain_timeout": "5m"}).drain_timeout == 300
    for doc, field in (({"mode": "yes"}, "remediate.mode"), ({"pool_share": 2}, "remediate.pool_share"),
                       ({"max_attempts": 0}, "remediate.max_attempts"), ({"maxattempts": 3}, "remediate.maxattempts"),
                       ({"rate_window": "soon"}, "remediate.rate_window")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            parse_config(doc)
    assert CFG.pool_cap(8) == 1 and CFG.pool_cap(40) == 4 and CFG.rate_cap(8) == 3
    assert CFG.breaker_threshold(8) == 3 and CFG.breaker_threshold(20) == 6


def test_parse_time_handles_alertmanager_nanoseconds():
    assert parse_time("2027-01-15T08:00:00.123456789Z") == pytest.approx(1_800_000_000.123456, abs=1e-5)
    assert parse_time("garbage") is None and parse_time("") is None


class _FakeAM:
    def __init__(self):
        self.posts: list[list[dict]] = []

    def post_alerts(self, alerts):
        self.posts.append(alerts)


def test_notices_page_once_per_breaker_and_ticket_per_escalation(tmp_path):
    from gpuobs.remediate.notices import Notifier

    w = World(tmp_path)
    am = _FakeAM()
    n = Notifier([], "http://127.0.0.1:9097", resend_s=60, ttl_s=300, clock=w.clock)
    n.clients = [am]
    w.c.notifier = n
    w.fleet.fault("serving-3", "GpuRowRemapFailure", "persistent")
    w.send(alert("serving-3", alertname="GpuRowRemapFailure", xid=None, starts_at=iso(w.clock())))
    w.run(900)
    tickets = [a for post in am.posts for a in post if a["labels"]["alertname"] == "RemediationEscalated"]
    assert tickets and {a["labels"]["node"] for a in tickets} == {"serving-3"}
    assert len({a["startsAt"] for a in tickets}) == 1  # re-posts are the same alert
    assert tickets[0]["annotations"]["runbook_url"].endswith("/runbooks/remediation.md#remediationescalated")
    for i in range(4):
        w.fleet.fault(f"serving-{i + 4}", "GpuFallenOffBus", "reboot")
        w.send(alert(f"serving-{i + 4}", alertname="GpuFallenOffBus", xid=None, starts_at=iso(w.clock())))
    w.run(300)
    halted = [a for post in am.posts for a in post if a["labels"]["alertname"] == "RemediationHalted"]
    assert halted and len({a["startsAt"] for a in halted}) == 1
    assert "fleet-wide event" in halted[0]["annotations"]["description"]
    w.c.close_breaker("alice", "fixed")
    w.c.release("serving-3", "alice", "RMA")
    am.posts.clear()
    w.run(5)
    ended = {a["labels"]["alertname"]: a for post in am.posts for a in post}
    assert set(ended) == {"RemediationHalted", "RemediationEscalated"}
    assert all(parse_time(a["endsAt"]) <= w.clock() for a in ended.values())


def test_closed_breaker_is_not_retripped_by_the_same_events(tmp_path):
    w = World(tmp_path)
    for i in range(4):
        w.fleet.fault(f"serving-{i}", "GpuFallenOffBus", "reboot")
        w.send(alert(f"serving-{i}", alertname="GpuFallenOffBus", xid=None, starts_at=iso(w.clock())))
    w.run(10)
    assert w.store.breaker()["open"]
    w.c.close_breaker("alice", "fixed")
    w.run(10)
    assert not w.store.breaker()["open"]
    for i in range(4, 7):  # a new storm after the close trips it again
        w.fleet.fault(f"serving-{i}", "GpuFallenOffBus", "reboot")
        w.send(alert(f"serving-{i}", alertname="GpuFallenOffBus", xid=None, starts_at=iso(w.clock())))
    w.run(5)
    assert w.store.breaker()["open"]


def test_the_alertmanager_route_matches_exactly_what_the_policy_acts_on():
    from gpuobs.mixin.alertmanager import REMEDIATED_ALERTS
    from gpuobs.remediate.policy import remediated_alertnames

    assert sorted(REMEDIATED_ALERTS) == remediated_alertnames()


def test_a_rollout_that_claims_the_node_after_the_quarantine_holds_the_action(tmp_path):
    w = World(tmp_path, drain_s=30)
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(10)
    assert w.state("serving-0") == "draining"
    w.fleet.rollouts = {"serving-0": "r-7"}
    w.run(120)
    assert w.fleet.actions_on("serving-0") == 0 and w.state("serving-0") == "acting"
    assert any(e["actor"] == "interlock:rollout" for e in w.store.timeline("serving-0"))
    w.fleet.rollouts = {}
    w.run(300)
    assert w.state("serving-0") == "returned" and w.fleet.actions_on("serving-0") == 1


def test_state_moves_are_compare_and_swap(tmp_path):
    """A tick that read an episode before a person's CLI moved it cannot move it back."""
    w = World(tmp_path)
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    stale = w.store.active("serving-0")  # pending, as a tick would have read it
    other = RemediationStore(w.db, w.clock)  # the CLI's connection
    other.set_state(other.episode(stale.id), "cancelled", "breaker closed by alice", "human:alice")
    after = w.store.set_state(stale, "quarantined", "cordoned (no new work)")
    assert after.state == "cancelled"
    assert [e["kind"] for e in w.store.timeline("serving-0")].count("quarantined") == 0
    other.close()


def test_pending_episode_for_an_unknown_node_expires(tmp_path):
    w = World(tmp_path)
    w.send(alert("ghost-1", starts_at=iso(w.clock())))
    w.run(CFG.verify_timeout + 5, step=5.0)
    assert w.state("ghost-1") == "cancelled" and w.fleet.calls == []
    assert "not in the adapter's node list" in w.store.latest("ghost-1").reason


def test_failed_cordons_back_off(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-0", "GpuXidCritical")
    real = w.fleet.cordon

    def refuse(node, reason):
        w.fleet.calls.append(("cordon", node, reason))
        raise ActionErrorForTest(f"{node}: HTTP 503")
    w.fleet.cordon = refuse
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(120)
    tries = w.fleet.actions_on("serving-0", "cordon")
    assert 5 <= tries <= 9, tries  # 2, 4, 8, 16, 32, 60 s apart, not 120 calls
    w.fleet.cordon = real
    w.run(400)
    assert w.state("serving-0") == "returned"
