"""rollout status's fleet check: which hosts contradict the recorded end of a rollout."""

from __future__ import annotations

from gpuobs.rollout.drift import drift
from gpuobs.rollout.store import RolloutRecord


def rec(state: str) -> RolloutRecord:
    return RolloutRecord("1.5.0-x", "1.5.0", state, 1, {"hosts": ["a", "b"]})


def test_succeeded_rollout_after_a_restart_is_flagged():
    assert drift(rec("Succeeded"), {"a": "1.5.0", "b": "1.5.0"}.get) == []
    assert drift(rec("Succeeded"), {"a": "1.4.0", "b": "1.5.0"}.get) == ["a runs 1.4.0, not 1.5.0 which this rollout left it on"]


def test_rolled_back_release_still_running_is_flagged_and_unreadable_hosts_named():
    assert drift(rec("RolledBack"), {"a": "1.4.0", "b": "1.4.0"}.get) == []
    assert drift(rec("Rejected"), {"a": "1.5.0", "b": "1.4.0"}.get) == ["a runs 1.5.0, which this rollout ended Rejected"]

    def broken(host):
        raise OSError("connection refused")
    assert drift(rec("Succeeded"), broken)[0] == "a: version unknown (connection refused)"
    assert drift(rec("Canary"), broken) == []  # not ended: nothing to compare
