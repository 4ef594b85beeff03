"""The activity file: drills and rollouts recorded by their runners, read and matched by the pager."""

from __future__ import annotations

import math

import pytest

from gpuobs.core import activity
from gpuobs.core.activity import Activity, related

T = 1_800_000_000.0


def test_records_merge_by_kind_and_id_and_bad_lines_are_skipped(tmp_path):
    activity.record(tmp_path, "drill", "xid-1", title="drill xid", nodes=["gpu-node-00"], started_at=T,
                    until=T + 900, detail={"report": "gpuobs report drill xid"})
    with open(activity.path_in(tmp_path), "a") as f:
        f.write('{"kind": "drill", "id": "xid-1", "ended_at": \n')  # a torn line
        f.write('["not", "a", "record"]\n{"kind": "deploy", "id": "x"}\n')
    activity.record(tmp_path, "rollout", "1.6.0-x", nodes=[], started_at=T + 5)
    activity.record(tmp_path, "drill", "xid-1", ended_at=T + 40, detail={"outcome": "PASS"})
    xid, ro = activity.load(activity.path_in(tmp_path))
    assert (xid.kind, xid.id, xid.title, xid.nodes, xid.started_at, xid.ended_at, xid.end) == (
        "drill", "xid-1", "drill xid", ["gpu-node-00"], T, T + 40, T + 40)
    assert xid.detail == {"report": "gpuobs report drill xid", "outcome": "PASS"}
    assert ro.nodes == [] and ro.end == math.inf
    assert activity.load(tmp_path / "missing.jsonl") == []
    with pytest.raises(ValueError, match="kind must be one of drill, rollout"):
        activity.record(tmp_path, "deploy", "x")


def test_related_by_node_and_time():
    drill = Activity("drill", "xid-1", "drill xid", ["gpu-node-01"], T, T + 40)
    other = Activity("drill", "thermal-1", "drill thermal", ["gpu-node-02"], T, T + 40)
    fleet = Activity("drill", "slo-1", "drill slo-burn", [], T, T + 40)
    old = Activity("rollout", "r-old", "rollout 1.5.0", ["gpu-node-01"], T - 9000, T - 5000)
    running = Activity("rollout", "r-now", "rollout 1.6.0", ["gpu-node-01", "gpu-node-02"], T - 60, None)
    died = Activity("drill", "ecc-1", "drill ecc-dbe", ["gpu-node-01"], T - 3000, None, until=T - 2000)
    acts = [drill, other, fleet, old, running, died]
    got = related(acts, ["gpu-node-01"], T + 20, None, now=T + 100)
    assert [(a.id, how) for a, how in got] == [("xid-1", "node gpu-node-01"), ("slo-1", "fleet-wide activity"),
                                               ("r-now", "node gpu-node-01")]
    # an incident opened after the drill ended is not related, beyond the clock-skew tolerance
    assert [a.id for a, _ in related([drill], ["gpu-node-01"], T + 40 + activity.SKEW_S, None)] == ["xid-1"]
    assert related([drill], ["gpu-node-01"], T + 40 + activity.SKEW_S + 1, None) == []
    # a resolved incident from before the drill is not related
    assert related([drill], ["gpu-node-01"], T - 600, T - 300) == []
    # a fleet-wide incident (no node) relates to every overlapping activity
    assert [how for _, how in related([other], [], T + 10, None)] == ["fleet-wide incident"]
    # a rollout notice names its rollout: only that one
    assert [a.id for a, _ in related(acts, [], T + 10, None, labels={"rollout": "r-now"})] == ["r-now"]


def test_two_drills_near_one_incident_only_the_overlapping_one_is_linked():
    """Linking is by each drill's own recorded span, not a fixed 5-minute window (issue 29): the
    ecc-dbe drill ended 2 minutes before the incident opened and the thermal drill started 3 minutes
    after it resolved; only the xid drill running through it is related."""
    before = Activity("drill", "ecc-dbe-1", "drill ecc-dbe", ["gpu-node-01"], T - 300, T - 120)
    during = Activity("drill", "xid-1", "drill xid", ["gpu-node-01"], T - 10, T + 90)
    after = Activity("drill", "thermal-1", "drill thermal", ["gpu-node-01"], T + 240, T + 400)
    got = related([before, during, after], ["gpu-node-01"], T, T + 60, now=T + 1000)
    assert [a.id for a, _ in got] == ["xid-1"]
    # still running: its span is start..now, so an incident opened later (before now) is related
    running = Activity("drill", "kv-1", "drill kv-pressure", ["gpu-node-01"], T - 10, None)
    assert [a.id for a, _ in related([running], ["gpu-node-01"], T + 500, None, now=T + 600)] == ["kv-1"]
    # ... but an incident that resolved before it started is not
    assert related([running], ["gpu-node-01"], T - 200, T - 100, now=T + 600) == []
    # a runner that died before writing ended_at ends at its `until`, not now
    died = Activity("drill", "ecc-2", "drill ecc-dbe", ["gpu-node-01"], T - 3000, None, until=T - 2000)
    assert related([died], ["gpu-node-01"], T, None, now=T + 100) == []


def test_activity_file_is_private_to_its_owner(tmp_path):
    """The run directory holds nothing readable by group or others (issue 12); the record is 0600."""
    import stat

    from gpuobs.core import activity
    activity.record(tmp_path, "drill", "xid", nodes=["gpu-node-00"])
    assert stat.S_IMODE(activity.path_in(tmp_path).stat().st_mode) == 0o600
