"""Adversarial tests of the remediation controller, its webhook server, its CLI and the simulator's
node actions: bad input, interleavings, crashes at every write, adapters that fail part of the time.
Each test names the defect it once found (fixed) or the property it holds the code to."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import replace

import pytest
import requests

from gpuobs.cli import run as cli_run
from gpuobs.remediate.controller import Controller, parse_time
from gpuobs.remediate.interfaces import ActionError
from gpuobs.remediate.store import RemediationStore
from tests.fakes.remediate_fleet import alert
from tests.remediate.test_controller import CFG, World, iso
from tests.conftest import TOKEN as SIM_TOKEN
from tests.remediate.test_server import TOKEN, _am_payload, server  # noqa: F401 - the fixture

H = {"Authorization": f"Bearer {TOKEN}"}
H_SIM = {"Authorization": f"Bearer {SIM_TOKEN}"}


# ---- the webhook server: bad input never crashes it, never half-writes -------------------------
def test_webhook_bad_bodies_get_one_line_400_and_the_server_survives(server):  # noqa: F811
    url, fleet, _, _ = server
    hook = f"{url}/hook/remediate"
    good = _am_payload(alert("serving-0"))
    cases = [
        (b"\xff\xfe not utf-8", "body"),
        (b"[1, 2", "body"),
        (b"[]", "body"),
        (json.dumps({**good, "alerts": [{**good["alerts"][0], "labels": {"alertname": "X", "node": 3}}]}).encode(),
         "alerts[0].labels"),
        (json.dumps({**good, "alerts": [{**good["alerts"][0], "labels": {"node": "serving-0"}}]}).encode(),
         "alerts[0].labels"),
        (json.dumps({**good, "alerts": [{**good["alerts"][0], "startsAt": 12}]}).encode(), "alerts[0].startsAt"),
        (json.dumps({**good, "alerts": [{**good["alerts"][0], "fingerprint": None}]}).encode(),
         "alerts[0].fingerprint"),
        (json.dumps({**good, "alerts": "many"}).encode(), "alerts"),
        (json.dumps({**good, "alerts": [{**good["alerts"][0], "labels": {"alertname": "X", "node": "\ud800"}}]})
         .encode(), "alerts[0].labels.node"),
    ]
    for body, field in cases:
        r = requests.post(hook, data=body, headers={**H, "Content-Type": "application/json"}, timeout=5)
        assert r.status_code == 400, (body[:60], r.text)
        doc = r.json()
        assert doc.get("field") == field and "\n" not in doc["error"] and "Traceback" not in doc["error"]
    r = requests.post(hook, data=b"x" * (2 * 1024 * 1024), headers=H, timeout=10)
    assert r.status_code == 413
    store = RemediationStore(server[3] / "remediate.sqlite")
    assert store.events() == [] and store.episodes() == []  # nothing half-written
    store.close()
    assert requests.get(f"{url}/health", timeout=5).status_code == 200


def test_webhook_odd_labels_garbage_starts_at_and_no_fingerprint(server):  # noqa: F811
    url, fleet, _, tmp = server
    odd = [alert("", starts_at="yesterday"), alert("x" * 100_000, starts_at="2027-13-45T99:99:99Z"),
           alert('node"with\\quotes\nand newline', starts_at="0001-01-01T00:00:00+01:00"),
           alert("serving-1", alertname="GpuXidCritical", xid=None, starts_at=""),
           {**alert("serving-2", gpu=None), "fingerprint": ""}]
    odd[3]["labels"]["xid"] = "not-a-number"
    odd[4]["labels"]["gpu"] = "-1"
    r = requests.post(f"{url}/hook/remediate", json=_am_payload(*odd), headers=H, timeout=10)
    assert r.status_code == 200, r.text
    out = r.json()["outcomes"]
    assert out.get("no-node") == 1 and sum(out.values()) == 5
    # a re-send is a duplicate, fingerprint or not
    r = requests.post(f"{url}/hook/remediate", json=_am_payload(*odd), headers=H, timeout=10)
    assert r.json()["outcomes"] == {"duplicate": 5}
    for path in ("/api/status", "/metrics", "/api/timeline?node=%ff%fe", "/api/timeline?node="):
        assert requests.get(url + path, timeout=5).status_code == 200


def test_concurrent_webhooks_while_the_loop_ticks_act_once(server):  # noqa: F811
    url, fleet, _, tmp = server
    fleet.fault("serving-1", "GpuXidCritical")
    body = _am_payload(*[alert("serving-1", fp=f"fp-{i}", starts_at="2027-01-15T08:00:00Z") for i in range(50)])
    errors: list = []

    def post():
        try:
            r = requests.post(f"{url}/hook/remediate", json=body, headers=H, timeout=30)
            assert r.status_code == 200
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    deadline = time.time() + 20
    while time.time() < deadline and requests.get(f"{url}/api/status", timeout=5).json()["open"]:
        time.sleep(0.05)
    assert fleet.actions_on("serving-1") == 1
    store = RemediationStore(tmp / "remediate.sqlite")
    assert len(store.episodes()) == 1 and len(store.events()) == 50
    store.close()


def test_thousands_of_alerts_for_unknown_nodes_read_the_inventory_once(tmp_path):
    """Defect: each alert for a node the adapter does not know re-read the whole inventory (one HTTP
    GET per node on the simulator), all under the server's lock: a label change fleet-wide stalled it."""
    w = World(tmp_path, pools={"serving": 8})
    calls = {"n": 0}
    real = w.fleet.nodes

    def counted():
        calls["n"] += 1
        return real()
    w.fleet.nodes = counted
    alerts = [alert(f"ghost-{i}", starts_at=iso(w.clock())) for i in range(2000)]
    t0 = time.monotonic()
    out = w.send(*alerts)
    assert out == {"opened": 2000}
    assert calls["n"] <= 1
    assert time.monotonic() - t0 < 30
    assert w.store.breaker()["open"]  # 2000 nodes nobody knows: the monitoring changed, halt


# ---- parse_time never raises ----------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "garbage", "0001-01-01T00:00:00", "0001-01-01T00:00:00+01:00",
                                  "9999-12-31T23:59:59.999999999-23:59", "2027-01-15T08:00:00.Z", "." * 1000,
                                  "2027-01-15T08:00:00.1234567891234567891234Z", None, 12])
def test_parse_time_never_raises(text):
    parse_time(text)  # a number or None, never an exception


# ---- interleavings and crashes --------------------------------------------------------------------
def test_dry_run_never_acts_on_episodes_an_enforcing_run_left_open(tmp_path):
    """Defect: restarted with --mode dry-run (the stack's default), the controller carried on the
    episodes an enforce run had left quarantined/draining/acting: it drained and reset the GPU."""
    w = World(tmp_path, drain_s=5)
    w.fleet.fault("serving-1", "GpuXidCritical")
    w.send(alert("serving-1", starts_at=iso(w.clock())))
    w.run(2)
    assert w.state("serving-1") in ("quarantined", "draining")
    w.store.close()
    w.cfg = replace(CFG, mode="dry-run")
    w.new_controller()
    w.run(600)
    assert w.fleet.actions_on("serving-1") == 0
    assert w.fleet.nodes_["serving-1"].cordoned  # left as it is for a person
    assert any(e["actor"] == "interlock:mode" for e in w.store.timeline("serving-1"))


@pytest.mark.parametrize("crash_state", ["verifying", "returned"])
def test_kill_between_a_steps_outcome_and_the_state_change(tmp_path, monkeypatch, crash_state):
    """Defect: the step's outcome and the episode's new state were two commits. Killed between them:
    after an act, the restarted controller reset the GPU again; after the uncordon, it read its own
    uncordon as a person's and held the node as overridden."""
    w = World(tmp_path)
    w.fleet.fault("serving-1", "GpuXidCritical")
    w.send(alert("serving-1", starts_at=iso(w.clock())))
    real = RemediationStore.set_state

    def killed(self, ep, state, *a, **kw):
        if state == crash_state:
            raise KeyboardInterrupt("kill -9")
        return real(self, ep, state, *a, **kw)
    monkeypatch.setattr(RemediationStore, "set_state", killed)
    with pytest.raises(KeyboardInterrupt):
        w.run(600)
    monkeypatch.setattr(RemediationStore, "set_state", real)
    w.store.close()
    w.new_controller()
    w.run(600)
    assert w.fleet.actions_on("serving-1") == 1
    assert w.state("serving-1") == "returned"
    assert "serving-1" not in w.store.holds()


def test_breaker_close_during_a_tick_does_not_revive_cancelled_episodes(tmp_path):
    """Defect: a tick iterated the episodes it read at its start; a breaker close (another process)
    that cancelled a pending episode meanwhile was overwritten: the episode was cordoned anyway."""
    w = World(tmp_path, pools={"serving": 20}, drain_s=60)  # pool cap 2
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(3)
    assert w.state("serving-0") == "draining"
    w.store.open_breaker("test", ["a", "b", "c"])
    w.send(alert("serving-5", starts_at=iso(w.clock())))
    w.run(2)
    assert w.state("serving-5") == "pending"
    other = Controller(RemediationStore(w.db, w.clock), None, None, CFG, "node", w.clock)
    real_drain = w.fleet.drain

    def drain_while_a_person_closes(node):  # serving-0's drain runs first in the tick
        other.close_breaker("alice", "fixed")
        return real_drain(node)
    w.fleet.drain = drain_while_a_person_closes
    w.c.tick()
    w.fleet.drain = real_drain
    assert w.state("serving-5") == "cancelled"
    assert not w.fleet.nodes_["serving-5"].cordoned


def test_pool_is_read_at_quarantine_not_frozen_at_ingest(tmp_path):
    """Defect: an alert received while the inventory was down got pool "unknown" for good, and the
    pool caps (concurrency and rate) of its real pool never counted it."""
    w = World(tmp_path, pools={"serving": 8}, drain_s=600)  # pool cap 1
    w.fleet.fail_inventory = True
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.fleet.fail_inventory = False
    w.send(alert("serving-1", starts_at=iso(w.clock())))
    w.run(20)
    out = [e.node for e in w.store.out_of_service()]
    assert len(out) == 1, out
    assert {e.pool for e in w.store.episodes()} == {"serving"}


def test_more_than_500_open_episodes_do_not_starve_the_rest(tmp_path):
    """Defect: the tick read at most 500 open episodes (oldest first): 500 held ones (nodes the
    adapter does not know, which wait for ever) starved every later episode."""
    w = World(tmp_path, pools={"serving": 8}, cfg=replace(CFG, breaker_min_nodes=10_000))
    w.send(*[alert(f"ghost-{i}", starts_at=iso(w.clock())) for i in range(501)])
    w.fleet.fault("serving-2", "GpuXidCritical")
    w.send(alert("serving-2", starts_at=iso(w.clock())))
    w.run(300, step=5.0)
    assert w.state("serving-2") == "returned"


def test_failed_cordons_do_not_use_up_the_pools_rate(tmp_path):
    """Defect: every failed cordon (a flaky API, retried each tick) counted as a quarantine started:
    three seconds of errors on one node blocked the whole pool for an hour."""
    w = World(tmp_path, pools={"serving": 8})
    real = w.fleet.cordon
    w.fleet.cordon = lambda node, reason: (_ for _ in ()).throw(ActionError(f"{node}: API says 500"))
    w.fleet.fault("serving-0", "GpuXidCritical")
    w.send(alert("serving-0", starts_at=iso(w.clock())))
    w.run(10)
    w.fleet.cordon = real
    w.run(300)
    assert w.state("serving-0") == "returned"
    assert not any(e["actor"] == "interlock:pool-rate" for e in w.store.timeline())


def test_adapter_failing_some_calls_never_skips_a_step_or_repeats_the_action(tmp_path):
    import random
    rng = random.Random(7)
    w = World(tmp_path, pools={"serving": 8})
    for name in ("view", "drain", "health_check", "firing", "uncordon", "rollout_holds"):
        real = getattr(w.fleet, name)

        def flaky(*a, _real=real, _name=name, **kw):
            if rng.random() < 0.3:
                raise ActionError(f"{_name}: transient")
            return _real(*a, **kw)
        setattr(w.fleet, name, flaky)
    w.fleet.fault("serving-4", "GpuXidCritical")
    w.send(alert("serving-4", starts_at=iso(w.clock())))
    w.run(1200)
    assert w.state("serving-4") == "returned"
    assert w.fleet.actions_on("serving-4") == 1


def test_prometheus_down_during_verification_never_returns_the_node(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-3", "GpuXidCritical")
    w.send(alert("serving-3", starts_at=iso(w.clock())))
    w.run(20)

    def down(node, alertname, gpu=None):
        raise ActionError("Prometheus: connection refused")
    w.fleet.firing = down
    w.run(3000)
    assert w.fleet.actions_on("serving-3", "uncordon") == 0
    assert w.fleet.nodes_["serving-3"].cordoned


def test_view_that_flips_between_ticks_never_undoes_a_cordon(tmp_path):
    w = World(tmp_path)
    real = w.fleet.view
    flip = {"n": 0}

    def flapping(node):
        flip["n"] += 1
        v = real(node)
        return replace(v, cordoned=not v.cordoned) if flip["n"] % 7 == 0 else v
    w.fleet.view = flapping
    w.fleet.nodes_["serving-6"].cordoned, w.fleet.nodes_["serving-6"].cordoned_by = True, "human"
    w.fleet.fault("serving-6", "GpuXidCritical")
    w.send(alert("serving-6", starts_at=iso(w.clock())))
    w.run(600)
    assert w.fleet.actions_on("serving-6") == 0 and w.fleet.nodes_["serving-6"].cordoned


def test_clock_going_backwards_never_acts_twice(tmp_path):
    w = World(tmp_path)
    w.fleet.fault("serving-2", "GpuXidCritical")
    w.send(alert("serving-2", starts_at=iso(w.clock())))
    w.run(25)
    w.clock.advance(-3600)
    w.run(600)
    w.clock.advance(7200)
    w.run(600)
    assert w.fleet.actions_on("serving-2") == 1
    assert w.state("serving-2") == "returned"


def test_hold_release_hold_interleaved_with_ticks(tmp_path):
    w = World(tmp_path, drain_s=30)
    w.fleet.fault("serving-1", "GpuXidCritical")
    w.send(alert("serving-1", starts_at=iso(w.clock())))
    w.run(3)
    cli = RemediationStore(w.db, w.clock)  # the CLI's own connection
    cli.hold("serving-1", "alice", "mine")
    cli.release("serving-1", "alice", "oops")
    w.run(2)  # the hold was gone before any tick saw it: the episode goes on
    cli.hold("serving-1", "bob", "really mine")
    w.run(600)
    assert w.state("serving-1") == "overridden"
    assert w.fleet.actions_on("serving-1") == 0
    # a re-send of the same alert after the release changes nothing
    cli.release("serving-1", "bob", "done")
    w.send(alert("serving-1", starts_at="2027-01-15T08:00:00Z"))
    w.run(60)
    assert w.fleet.actions_on("serving-1") == 0
    cli.close()


def test_escalated_node_is_not_acted_on_again_until_released(tmp_path):
    """Defect: a node escalated by a drain timeout (no action taken) was cordoned, drained and reset
    by the next alert while its RemediationEscalated ticket was still open."""
    w = World(tmp_path)
    w.fleet.nodes_["serving-2"].stuck = True
    w.fleet.fault("serving-2", "GpuXidCritical")
    w.send(alert("serving-2", starts_at=iso(w.clock())))
    w.run(300)
    assert w.state("serving-2") == "escalated"
    w.fleet.nodes_["serving-2"].stuck = False
    w.fleet.fault("serving-2", "GpuEccDoubleBitError")
    w.send(alert("serving-2", alertname="GpuEccDoubleBitError", xid=None, starts_at=iso(w.clock())))
    w.run(600)
    assert w.fleet.actions_on("serving-2") == 0
    assert w.c.release("serving-2", "alice", "fixed the PDB")
    w.send(alert("serving-2", alertname="GpuEccDoubleBitError", xid=None, starts_at=iso(w.clock()), fp="new"))
    w.run(600)
    assert w.state("serving-2") == "returned"


def test_breaker_page_is_posted_while_the_inventory_is_down(tmp_path):
    """Defect: a tick returned before syncing notices when the node inventory failed, so a fleet-wide
    event that also broke the node API never paged (RemediationHalted)."""
    w = World(tmp_path, pools={"serving": 8})
    synced = []

    class Notifier:
        def sync(self, store, label):
            synced.append(store.breaker()["open"])
    w.c.notifier = Notifier()
    w.fleet.fail_inventory = True
    w.send(*[alert(f"serving-{i}", starts_at=iso(w.clock())) for i in range(4)])
    assert w.store.breaker()["open"]
    w.run(3)
    assert synced and synced[-1] is True


# ---- two controllers, the CLI on a bad database ---------------------------------------------------
def test_a_second_serve_on_the_same_database_is_refused(tmp_path, capsys):
    """Defect: two `remediate serve` on one database both advanced the same episodes (two resets)."""
    from gpuobs.rollout.store import RunLock

    lock = RunLock(tmp_path, "remediate.sqlite.lock")  # what a running `serve` holds
    assert lock.acquire()
    try:
        rc = cli_run(["remediate", "serve", "--run-dir", str(tmp_path), "--no-auth"])
        assert rc == 2
        err = capsys.readouterr().err
        assert "another" in err and "remediate.sqlite.lock" in err and "Traceback" not in err
    finally:
        lock.release()


def test_cli_on_a_corrupt_or_unwritable_database_is_one_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "remediate.sqlite"
    bad.write_bytes(b"not a database" * 100)
    for argv in (["status"], ["hold", "n1"], ["release", "n1"], ["breaker", "close"]):
        assert cli_run(["remediate", *argv, "--db", str(bad)]) == 2, argv
        err = capsys.readouterr().err
        assert str(bad) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    bad.unlink()
    RemediationStore(bad).close()

    def readonly(*a, **kw):
        raise sqlite3.OperationalError("attempt to write a readonly database")
    for meth in ("hold", "release", "close_breaker"):
        monkeypatch.setattr(RemediationStore, meth, readonly)
    RemediationStore(bad).open_breaker("x", [])
    for argv in (["hold", "n1"], ["release", "n1"], ["breaker", "close"]):
        assert cli_run(["remediate", *argv, "--db", str(bad)]) == 2, argv
        err = capsys.readouterr().err
        assert "readonly" in err and str(bad) in err and "Traceback" not in err, err


def test_config_yaml_bad_values_name_the_field(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    for text, field in (("max_attempts: 3.5\n", "remediate.max_attempts"), ("settle: -1\n", "remediate.settle"),
                        ("drain_timeout: 1e400\n", "remediate.drain_timeout"),
                        ("pool_share: .nan\n", "remediate.pool_share"), ("[1, 2]\n", "remediate"),
                        ("? [a]\n: 1\n", "not valid YAML"), ("verify_hold: true\n", "remediate.verify_hold"),
                        ("bogus: 1\n", "remediate.bogus"), ("breaker_min_nodes: 0\n", "remediate.breaker_min_nodes")):
        cfg.write_text(text)
        assert cli_run(["remediate", "serve", "--run-dir", str(tmp_path), "--config", str(cfg), "--no-auth"]) == 2
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err, (text, err)


def test_kill_before_the_uncordon_reached_the_node_resumes_it(tmp_path, monkeypatch):
    w = World(tmp_path)
    w.fleet.fault("serving-1", "GpuXidCritical")
    w.send(alert("serving-1", starts_at=iso(w.clock())))
    real = w.fleet.uncordon

    def killed(node):
        raise KeyboardInterrupt("kill -9 before the call")
    w.fleet.uncordon = killed
    with pytest.raises(KeyboardInterrupt):
        w.run(600)
    w.fleet.uncordon = real
    w.store.close()
    w.new_controller()
    w.run(120)
    assert w.state("serving-1") == "returned" and not w.fleet.nodes_["serving-1"].cordoned
    assert "serving-1" not in w.store.holds()
    assert [s["status"] for s in w.store.steps("serving-1") if s["step"] == "uncordon"] == ["unknown", "done"]


def test_alerts_without_the_node_label_do_not_count_as_a_node_for_the_breaker(tmp_path):
    """Defect: firing alerts without the identity label were counted as one more node ("")."""
    w = World(tmp_path, pools={"serving": 8})
    w.send(alert("", starts_at=iso(w.clock())), alert("serving-0", starts_at=iso(w.clock())),
           alert("serving-1", starts_at=iso(w.clock())))
    assert not w.store.breaker()["open"]


def test_a_firing_alert_delivered_after_its_resolution_is_stale(tmp_path):
    """Defect: Alertmanager's retried firing notification arriving after the resolved one opened an
    episode (cordon, drain, reset) for a fault already gone."""
    w = World(tmp_path)
    a = alert("serving-3", starts_at=iso(w.clock()))
    assert w.send({**a, "status": "resolved"}) == {"resolved": 1}
    assert w.send(a) == {"stale": 1}
    w.run(120)
    assert w.fleet.calls == []


def test_promql_selector_escapes_newlines_and_quotes():
    """Defect: a node label with a newline made an invalid PromQL string (an error for ever, not a match)."""
    from gpuobs.remediate.adapters.prom import PromSignals

    class Prom:
        expr = ""

        def query(self, expr):
            Prom.expr = expr

            class Empty:
                empty = True
            return Empty()
    PromSignals(Prom(), "Hostname").firing('a"b\\c\nd', "GpuXidCritical")
    assert 'Hostname="a\\"b\\\\c\\nd"' in Prom.expr and "\n" not in Prom.expr


# ---- the simulator's /admin/node ------------------------------------------------------------------
def test_concurrent_node_actions_never_500_and_leave_a_consistent_node(node_server):
    from gpuobs.exporter.sim.faults import FaultRequest

    url, node = node_server
    node.inject(FaultRequest("xid", 0, {"code": 48, "repeat_s": 0.0}))
    bodies = [{"action": "reset-gpu", "gpu": 0}, {"action": "reboot", "downtime_s": 5}, {"action": "diag"},
              {"action": "cordon", "by": "gpuobs"}, {"action": "uncordon", "by": "gpuobs"}, {"action": "drain"},
              {"action": "restart-engine"}, {"action": "reset-gpu", "gpu": len(node.gpus)},
              {"action": "diag", "gpu": -1}, {"action": "reboot", "downtime_s": 0}]
    codes: list[int] = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            node.advance(0.5)

    def worker(i):
        s = requests.Session()
        for j in range(30):
            r = s.post(f"{url}/admin/node", json=bodies[(i + j) % len(bodies)], headers=H_SIM, timeout=10)
            codes.append(r.status_code)
    t = threading.Thread(target=ticker)
    t.start()
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    stop.set()
    t.join(10)
    assert set(codes) <= {200, 400, 409}, sorted(set(codes))
    node.advance(10)
    st = requests.get(f"{url}/admin/node", headers=H_SIM, timeout=5).json()
    assert not st["rebooting"] and not st["down"]
    r = requests.post(f"{url}/admin/node", json={"action": "uncordon", "by": "human"}, headers=H_SIM, timeout=5)
    assert r.status_code == 200 and not r.json()["cordoned"] and not r.json()["draining"]


def test_actions_on_a_down_node(node_server):
    from gpuobs.exporter.sim.faults import FaultRequest

    url, node = node_server
    node.inject(FaultRequest("down", None, {}))
    post = lambda body: requests.post(f"{url}/admin/node", json=body, headers=H_SIM, timeout=5)  # noqa: E731
    for body in ({"action": "reset-gpu", "gpu": 0}, {"action": "diag"}, {"action": "restart-engine"}):
        r = post(body)
        assert r.status_code == 409 and "down" in r.json()["error"], (body, r.text)
    assert post({"action": "cordon", "by": "gpuobs"}).status_code == 200  # the admin API stays up
    assert post({"action": "reboot", "downtime_s": 0}).status_code == 200  # and a reboot brings it back
    assert post({"action": "diag"}).status_code == 200
