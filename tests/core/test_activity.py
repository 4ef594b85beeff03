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
    # an incident opened after the drill ended, within LINGER_S, is still related; later it is not
    assert [a.id for a, _ in related([drill], ["gpu-node-01"], T + 40 + 200, None)] == ["xid-1"]
    assert related([drill], ["gpu-node-01"], T + 40 + activity.LINGER_S + 1, None) == []
    # a resolved incident from before the drill is not related
    assert related([drill], ["gpu-node-01"], T - 600, T - 300) == []
    # a fleet-wide incident (no node) relates to every overlapping activity
    assert [how for _, how in related([other], [], T + 10, None)] == ["fleet-wide incident"]
    # a rollout notice names its rollout: only that one
    assert [a.id for a, _ in related(acts, [], T + 10, None, labels={"rollout": "r-now"})] == ["r-now"]


def test_activity_file_is_private_to_its_owner(tmp_path):
    """The run directory holds nothing readable by group or others (issue 12); the record is 0600."""
    import stat

    from gpuobs.core import activity
    activity.record(tmp_path, "drill", "xid", nodes=["gpu-node-00"])
    assert stat.S_IMODE(activity.path_in(tmp_path).stat().st_mode) == 0o600
