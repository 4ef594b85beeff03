"""Rollout notices: which terminal states raise one, and what the alert says."""

from __future__ import annotations

from gpuobs.rollout.notices import notice, send
from gpuobs.rollout.store import RolloutRecord
from gpuobs.stack.ports import free_port_range


def rec(state: str, reason: str = "canary verdict ROLLBACK: ttft +21 %") -> RolloutRecord:
    return RolloutRecord("1.6.0-20261201T160000Z", "1.6.0", state, 1, {"hosts": ["gpu-node-00", "gpu-node-01"]}, reason)


def test_only_rolled_back_rejected_and_aborted_raise_a_notice():
    assert notice(rec("Succeeded"), ".run") is None and notice(rec("Canary"), ".run") is None
    names = {s: notice(rec(s), ".run", now=1_800_000_000)["labels"]["alertname"]
             for s in ("RolledBack", "Rejected", "Aborted")}
    assert names == {"RolledBack": "RolloutRolledBack", "Rejected": "RolloutRejected", "Aborted": "RolloutAborted"}


def test_notice_carries_verdict_report_and_a_bounded_life():
    a = notice(rec("RolledBack"), "/tmp/run", now=1_800_000_000)
    assert a["labels"] == {"alertname": "RolloutRolledBack", "severity": "warning",
                           "rollout": "1.6.0-20261201T160000Z", "version": "1.6.0"}
    assert a["annotations"]["description"] == ("Rollout 1.6.0-20261201T160000Z of 1.6.0 on 2 serving node(s) ended "
                                               "RolledBack: canary verdict ROLLBACK: ttft +21 %")
    assert "gpuobs report rollout --run-dir /tmp/run" in a["annotations"]["report"]
    assert (a["startsAt"], a["endsAt"]) == ("2027-01-15T08:00:00.000Z", "2027-01-15T09:00:00.000Z")


def test_unreachable_alertmanager_is_a_warning_not_a_crash():
    line = send(f"http://127.0.0.1:{free_port_range(1)}", rec("Rejected"), ".run")
    assert line.startswith("warning: the RolloutRejected notice could not be sent")
    assert send("http://127.0.0.1:1", rec("Succeeded"), ".run") is None
