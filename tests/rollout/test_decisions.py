"""Human decisions on a rollout (pause, resume, promote) over the controller's fakes and a simulated clock.

An operator's command is simulated by :class:`Operator`: a fake clock whose ``sleep`` runs the
decisions scheduled for that (fake) time, as ``gpuobs rollout pause`` would write them into the
database while the controller waits.
"""

from __future__ import annotations

import json

import pytest

from gpuobs.cli import run as cli
from gpuobs.rollout import decisions
from gpuobs.rollout.controller import OPERATOR_PROMOTE
from gpuobs.rollout.model import ABORTED, ROLLED_BACK, SUCCEEDED, UsageError
from gpuobs.rollout.store import RolloutStore, RunLock
from tests.fakes.rollout import HOSTS, T0, FakeClock, rig, spec

H0, H1, H2 = HOSTS


class Operator(FakeClock):
    """A fake clock that runs ``(t, fn)`` actions once its time reaches ``t``."""

    def __init__(self):
        super().__init__()
        self.actions: list[tuple[float, object]] = []

    def at(self, t: float, fn) -> None:
        self.actions.append((t, fn))
        self.actions.sort(key=lambda a: a[0])

    def sleep(self, s: float) -> None:
        super().sleep(s)
        while self.actions and self.actions[0][0] <= self.t:
            self.actions.pop(0)[1]()


def setup(tmp_path, script):
    clock = Operator()
    r = rig(tmp_path, script, clock=clock)
    rid = r.controller.create(spec()).id
    return r, clock, rid


def kinds(r, rid):
    return [(e["kind"], e["operator"]) for e in r.store.events(rid)]


def test_pause_holds_looks_and_stage_advance_until_resumed(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"], 2: ["PROMOTE"]})
    # stage 1: deployed at T0, window opens T0+5, first look due T0+15; paused at T0+8 for 40 s
    clock.at(T0 + 8, lambda: decisions.pause(r.store, rid, "alice", "checking a customer report"))
    clock.at(T0 + 48, lambda: decisions.resume(r.store, rid, "bob", "customer issue unrelated"))
    rec = r.controller.run(rid)
    assert rec.state == SUCCEEDED
    looks = [a["ts"] - T0 for a in r.store.analyses(rid)]
    assert looks[0] >= 48 and not [t for t in looks if 8 <= t < 48]  # no look while paused
    deploys = [d["ts"] - T0 for d in r.store.deploys(rid)]
    assert deploys[0] == 0 and not [t for t in deploys if 8 <= t < 48]
    assert kinds(r, rid) == [("pause", "alice"), ("held", "alice"), ("resume", "bob")]
    assert any("paused by alice: checking a customer report; holding" in line for line in r.lines)
    assert r.store.get(rid).paused == {}


def test_pause_between_stages_holds_the_advance(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"], 2: ["PROMOTE"]})
    original = r.controller._end_stage

    def end_stage(rec, st, status):  # pause lands right as stage 1 passes, before stage 2 deploys
        original(rec, st, status)
        if st.idx == 0:
            decisions.pause(r.store, rid, "alice", "hold before 2 nodes")
            clock.at(clock.t + 30, lambda: decisions.resume(r.store, rid, "alice"))

    r.controller._end_stage = end_stage
    rec = r.controller.run(rid)
    passed_at = r.store.stage(rid, 0).ended_at
    assert rec.state == SUCCEEDED
    assert r.store.stage(rid, 1).started_at >= passed_at + 30  # stage 2 deployed only after the resume


def test_a_verdict_arriving_while_paused_is_not_acted_on(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["ROLLBACK"]})
    scripted = r.controller.analyzers

    class PausingAnalyzers:  # the operator pauses while look 1 is being computed
        def __call__(self, horizon_s, interval_s):
            one = scripted(horizon_s, interval_s)

            class One:
                def analyze(self, start, end, state):
                    if not r.store.events(rid):
                        decisions.pause(r.store, rid, "alice", "let me look first")
                        clock.at(clock.t + 20, lambda: decisions.resume(r.store, rid, "alice"))
                    return one.analyze(start, end, state)
            return One()

    r.controller.analyzers = PausingAnalyzers()
    rec = r.controller.run(rid)
    assert rec.state == ROLLED_BACK  # acted on only after the resume, at the next look
    ev = r.store.events(rid)
    assert [e["kind"] for e in ev] == ["pause", "not-acted", "held", "resume"]
    assert ev[1]["reason"] == "look 1 verdict ROLLBACK not acted on: paused"
    analyses = r.store.analyses(rid)
    assert [a["verdict"] for a in analyses] == ["ROLLBACK", "ROLLBACK"]
    rollback = [d for d in r.store.deploys(rid) if d["purpose"] == "rollback"]
    assert rollback and rollback[0]["ts"] >= analyses[0]["ts"] + 20


def test_promote_passes_a_holding_stage_and_is_recorded(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["HOLD"], 2: ["PROMOTE"]})
    clock.at(T0 + 30, lambda: decisions.promote(r.store, rid, "carol", "HOLD is traffic noise; INC-7 needs it"))
    rec = r.controller.run(rid)
    assert rec.state == SUCCEEDED  # without the promote, HOLD to the deadline ends Aborted
    st = r.store.stage(rid, 0)
    assert st.status == "passed" and st.verdict == OPERATOR_PROMOTE and st.ended_at < T0 + 40
    reasons = [t["reason"] for t in r.store.transitions(rid)]
    assert "stage 1 promoted by operator carol: HOLD is traffic noise; INC-7 needs it" in reasons
    assert kinds(r, rid) == [("promote", "carol"), ("promoted", "carol")]
    assert r.store.get(rid).promote_request == {}
    # the gate before the next stage still ran: promote overrides the analysis, not the freeze
    assert [g["stage"] for g in r.store.gates(rid) if g["gate"] == "error-budget"] == [0, 1, 2]


def test_promote_lifts_a_pause_and_ends_the_bake(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"], 2: ["PROMOTE"]})
    r.controller.store.update(rid, spec={**r.store.get(rid).spec, "bake_s": 600.0})
    clock.at(T0 + 45, lambda: decisions.pause(r.store, rid, "alice", "watch the bake"))
    clock.at(T0 + 80, lambda: decisions.promote(r.store, rid, "alice", "bake looks fine"))
    rec = r.controller.run(rid)
    assert rec.state == SUCCEEDED and rec.reason.endswith("(bake ended early by an operator's promote)")
    assert r.clock.t < T0 + 90 and r.store.get(rid).paused == {}
    assert [k for k, _ in kinds(r, rid)] == ["pause", "held", "promote", "promoted"]


def test_a_promote_for_a_stage_that_already_passed_is_not_applied_to_the_next(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"], 2: ["HOLD"]})
    decisions.promote(r.store, rid, "dave", "go")  # recorded for stage 0 of the rollout (-1: not started)
    rec = r.controller.run(rid)
    assert rec.state == ABORTED  # stage 2's HOLD ran to its deadline: the stale promote did not pass it
    assert [k for k, _ in kinds(r, rid)] == ["promote", "not-acted"]


def test_a_promote_arriving_as_its_stage_passes_is_not_carried_over(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"], 2: ["HOLD"]})
    original = r.controller._end_stage

    def end_stage(rec, st, status):  # the operator promotes stage 1 just as the analysis passes it
        original(rec, st, status)
        if st.idx == 0:
            decisions.promote(r.store, rid, "erin", "go")

    r.controller._end_stage = end_stage
    rec = r.controller.run(rid)
    assert rec.state == ABORTED  # stage 2 was analysed to its deadline, not promoted by the stale request
    ev = r.store.events(rid)
    assert [(e["kind"], e["stage"]) for e in ev] == [("promote", 0), ("not-acted", 0)]
    assert ev[1]["reason"] == "stage 1 had already passed"


def test_abort_still_works_while_paused(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"]})
    clock.at(T0 + 8, lambda: decisions.pause(r.store, rid, "alice", "wait"))
    clock.at(T0 + 30, lambda: r.store.update(rid, abort_reason="bad build"))
    rec = r.controller.run(rid)
    assert rec.state == ABORTED and rec.reason == "aborted by operator: bad build"
    assert r.fleet.versions[H0] == "1.4.0"


def test_decisions_refuse_bad_requests(tmp_path):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"]})
    with pytest.raises(UsageError, match="--reason"):
        decisions.pause(r.store, rid, "alice", "  ")
    with pytest.raises(UsageError, match="--operator"):
        decisions.promote(r.store, rid, "", "x")
    with pytest.raises(UsageError, match="is not paused"):
        decisions.resume(r.store, rid, "alice")
    decisions.pause(r.store, rid, "alice", "x")
    with pytest.raises(UsageError, match="already paused by alice"):
        decisions.pause(r.store, rid, "bob", "y")
    decisions.promote(r.store, rid, "bob", "go")
    with pytest.raises(UsageError, match="already pending"):
        decisions.promote(r.store, rid, "carol", "go")
    r.controller.abort(rid, "stop")
    with pytest.raises(UsageError, match="already ended Aborted"):
        decisions.resume(r.store, rid, "alice")
    with pytest.raises(KeyError):
        decisions.pause(r.store, "nope", "alice", "x")


def test_old_database_gets_the_new_columns(tmp_path):
    import sqlite3

    db = sqlite3.connect(tmp_path / "rollout.sqlite")
    db.execute("CREATE TABLE rollouts (id TEXT PRIMARY KEY, version TEXT NOT NULL, state TEXT NOT NULL, "
               "stage INTEGER NOT NULL DEFAULT -1, spec TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', "
               "target TEXT NOT NULL DEFAULT '', abort_reason TEXT NOT NULL DEFAULT '', "
               "trace TEXT NOT NULL DEFAULT '{}', pages_at_start TEXT NOT NULL DEFAULT '[]', "
               "created_at REAL NOT NULL, updated_at REAL NOT NULL)")
    db.execute("INSERT INTO rollouts (id, version, state, spec, created_at, updated_at) "
               "VALUES ('r1', '1.5.0', 'Canary', '{}', 1, 1)")
    db.commit()
    db.close()
    store = RolloutStore(tmp_path / "rollout.sqlite")
    assert store.get("r1").paused == {} and decisions.pause(store, "r1", "alice", "x").paused["operator"] == "alice"
    store.close()


def test_cli_pause_promote_resume_and_status(tmp_path, capsys):
    r, clock, rid = setup(tmp_path, {1: ["PROMOTE"]})
    r.store.close()
    base = ["--run-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:  # --reason is required (argparse: usage error, exit 2)
        cli(["rollout", "pause", *base])
    assert exc.value.code == 2 and "--reason" in capsys.readouterr().err
    assert cli(["rollout", "pause", *base, "--reason", "customer report", "--operator", "alice"]) == 0
    out = capsys.readouterr().out
    assert f"rollout {rid}: pause requested by alice: customer report" in out and "`gpuobs rollout resume`" in out
    assert cli(["rollout", "pause", *base, "--reason", "again", "--operator", "bob"]) == 2
    assert "already paused by alice" in capsys.readouterr().err
    assert cli(["rollout", "status", *base]) == 0
    out = capsys.readouterr().out
    assert "PAUSED by alice at " in out and ": customer report (`gpuobs rollout resume` or `promote`)" in out
    assert "decision " in out and ": pause by alice: customer report" in out
    lock = RunLock(tmp_path)
    assert lock.acquire()  # a controller is running: resume only lifts the pause
    try:
        assert cli(["rollout", "resume", *base, "--operator", "bob"]) == 0
        out = capsys.readouterr().out
        assert "resumed by bob (paused by alice: customer report)" in out and "running controller continues" in out
        assert cli(["rollout", "promote", *base, "--reason", "looks good", "--operator", "carol"]) == 0
        assert "acts on it at its next wait" in capsys.readouterr().out
    finally:
        lock.release()
    assert cli(["rollout", "status", *base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(e["kind"], e["operator"]) for e in doc["events"]] == [("pause", "alice"), ("resume", "bob"),
                                                                   ("promote", "carol")]
    assert doc["promote_request"]["operator"] == "carol" and doc["paused"] == {}
    from gpuobs.reports.rollout import write_rollout_report

    html = write_rollout_report(doc, tmp_path / "reports", now=T0 + 60).read_text()
    assert "operator pause" in html and "operator promote" in html and "looks good" in html


def test_rollout_is_recorded_for_the_incident_console(tmp_path):
    import argparse

    from gpuobs.cli.decide import RELEASE, note
    from gpuobs.core import activity

    r, clock, rid = setup(tmp_path, {1: ["ROLLBACK"]})
    args = argparse.Namespace(run_dir=str(tmp_path))
    note(args, RELEASE, r.store, rid)  # as `gpuobs rollout start` does before driving it
    (act,) = activity.load(activity.path_in(tmp_path))
    assert (act.kind, act.id, act.nodes, act.started_at, act.ended_at) == ("rollout", rid, list(HOSTS), T0, None)
    rec = r.controller.run(rid)
    note(args, RELEASE, r.store, rid)  # and after
    (act,) = activity.load(activity.path_in(tmp_path))
    assert act.ended_at == r.store.transitions(rid)[-1]["ts"] and act.detail["outcome"].startswith(rec.state)


def test_stores_opened_at_once_on_a_new_file_all_open(tmp_path):
    """A controller starting while `rollout status` (or a test) opens the same new database: each
    open sets up under SQLite's write lock and retries a busy set-up, so none fails with "duplicate
    column name" or "database is locked"."""
    import threading

    for attempt in range(15):
        path, errors, barrier = tmp_path / f"r{attempt}.sqlite", [], threading.Barrier(4)

        def open_store(path=path, errors=errors, barrier=barrier):
            barrier.wait()
            try:
                RolloutStore(path).close()
            except Exception as err:  # noqa: BLE001 - collected and asserted below
                errors.append(err)
        threads = [threading.Thread(target=open_store) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        store = RolloutStore(path)
        assert {"paused", "promote_request"} <= {r[1] for r in store.db.execute("PRAGMA table_info(rollouts)")}
        store.close()
