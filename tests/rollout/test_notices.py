"""Rollout notices: which terminal states raise one, and what the alert says (a short ticket with a
runbook link; the assumptions stay in the report)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuobs.pager import runbooks
from gpuobs.rollout.notices import MAX_DESCRIPTION_LINES, alertnames, notice, send
from gpuobs.rollout.store import RolloutRecord, StageRecord
from gpuobs.stack.ports import free_port_range
from tests.mixin.test_rules import RUNBOOK_PARTS, markdown_anchors, runbook_section

ROOT = Path(__file__).resolve().parents[2]
BASE = "https://runbooks.example"
ASSUMPTION = ("node-to-node variation from 2 baseline and 1 canary instance(s) (1 df) pooled with the assumed "
              "node_spread 1.5% (4 df, 80% of the weight); a canary instance that differs from the baseline by more "
              "than the assumed spread can be rolled back (more baseline instances let the data decide)")
DECIDING = [{"metric": "ttft", "test": "location", "classification": "High", "effect": 0.298,
             "interval": [0.006, 0.673], "scale": "relative"},
            {"metric": "ttft", "test": "p99", "classification": "High", "effect": 0.41,
             "interval": [0.05, 0.9], "scale": "relative"}]


def rec(state: str, reason: str = "canary analysis ROLLBACK in stage 1/3: ttft: High (+29.8% [+0.6%, +67.3%])",
        stage: int = 0) -> RolloutRecord:
    return RolloutRecord("1.6.0-20261201T160000Z", "1.6.0", state, stage,
                         {"hosts": ["gpu-node-00", "gpu-node-01", "gpu-node-02"], "stages": [1, 2, 3]}, reason)


def stage1(deciding=DECIDING) -> StageRecord:
    return StageRecord(0, "canary", ["gpu-node-00"], "failed", 1_800_000_000.0, verdict="ROLLBACK",
                       verdict_doc={"verdict": "ROLLBACK", "deciding": deciding,
                                    "assumptions": [f"ttft, itl: {ASSUMPTION}"]})


def test_only_rolled_back_rejected_and_aborted_raise_a_notice():
    assert notice(rec("Succeeded"), ".run", BASE) is None and notice(rec("Canary"), ".run", BASE) is None
    names = {s: notice(rec(s), ".run", BASE, now=1_800_000_000)["labels"]["alertname"]
             for s in ("RolledBack", "Rejected", "Aborted")}
    assert names == {"RolledBack": "RolloutRolledBack", "Rejected": "RolloutRejected", "Aborted": "RolloutAborted"}


def test_rolled_back_ticket_is_short_names_the_deciding_test_and_links_its_runbook():
    a = notice(rec("RolledBack"), "/tmp/run", BASE, now=1_800_000_000, stage=stage1())
    assert a["labels"] == {"alertname": "RolloutRolledBack", "severity": "warning",
                           "rollout": "1.6.0-20261201T160000Z", "version": "1.6.0"}
    lines = a["annotations"]["description"].splitlines()
    assert lines == [
        "Rollout 1.6.0-20261201T160000Z of 1.6.0 ended RolledBack in stage 1/3 (1 of 3 serving node(s)).",
        "Deciding: ttft: High (+29.8% [+0.6%, +67.3%]) (+1 more test(s), see the report)",
        "Report: gpuobs rollout status --run-dir /tmp/run --id 1.6.0-20261201T160000Z (the HTML report: the commands in the report annotation)"]
    assert a["annotations"]["runbook_url"] == f"{BASE}/runbooks/rollout.md#rolloutrolledback"
    assert "gpuobs report rollout --run-dir /tmp/run" in a["annotations"]["report"]
    assert (a["startsAt"], a["endsAt"]) == ("2027-01-15T08:00:00.000Z", "2027-01-15T09:00:00.000Z")
    # the assumption is the report's, never the ticket's
    assert not any("node_spread" in str(v) for v in a["annotations"].values())


@pytest.mark.parametrize("state,reason,stage", [
    ("RolledBack", "SLO-burn page firing during stage 1/3: ServingErrorBudgetBurn{slo=ttft}", stage1()),
    ("Rejected", "compatibility gate: " + "; ".join(f"gpu-node-0{i}: INCOMPATIBLE (toolkit-min-driver)" * 9
                                                    for i in range(3)), None),
    ("Aborted", "inconclusive: HOLD at the stage 1/3 deadline (900s): ttft: Inconclusive (+1.0% [-5.0%, +8.0%]); "
                "PROMOTE is out of reach within the horizon: " + "x" * 400, stage1([])),
])
def test_every_ticket_has_at_most_five_short_lines_and_a_runbook_url(state, reason, stage):
    a = notice(rec(state, reason, 0 if stage else -1), ".run", BASE, stage=stage)
    lines = a["annotations"]["description"].splitlines()
    assert len(lines) <= MAX_DESCRIPTION_LINES and all(len(line) <= 200 for line in lines)
    assert lines[1].startswith("Why: ") and "Deciding" not in a["annotations"]["description"]
    assert lines[-1].startswith("Report: gpuobs rollout status --run-dir .run --id ")
    assert ("in stage 1/3" in lines[0]) == (stage is not None)
    assert a["annotations"]["runbook_url"].startswith(f"{BASE}/runbooks/rollout.md#rollout")


def test_a_flag_ticket_names_the_flag_group_and_its_own_runbook_section():
    a = notice(rec("RolledBack"), ".run", BASE, flag="spec_decode", stage=stage1(DECIDING[:1]))
    assert a["labels"]["alertname"] == "FlagRolloutRolledBack" and a["labels"]["flag"] == "spec_decode"
    assert a["annotations"]["runbook_url"] == f"{BASE}/runbooks/rollout.md#flagrolloutrolledback"
    assert "gpuobs flag status --run-dir .run" in a["annotations"]["description"]
    assert "Deciding: ttft: High (+29.8% [+0.6%, +67.3%])" in a["annotations"]["description"].splitlines()


def test_every_notice_runbook_url_lands_on_a_section_with_every_part():
    """The notices are not rules, so tests/mixin/test_rules.py does not see them: the same checks here
    (markdown anchor, rendered anchor, Meaning/Impact/Diagnosis/Mitigation/Escalation)."""
    text = (ROOT / "runbooks" / "rollout.md").read_text()
    rendered = runbooks.anchors(runbooks.page("rollout.md", text))
    names = alertnames() + alertnames(flag=True) + alertnames(group="upgrade")
    assert len(names) == 9
    for name in names:
        state = name.removeprefix("Flag").removeprefix("Rollout").removeprefix("DriverUpgrade")
        group = "upgrade" if name.startswith("DriverUpgrade") else "rollout"
        url = notice(rec(state), ".run", BASE, flag="f" if name.startswith("Flag") else None,
                     group=group)["annotations"]["runbook_url"]
        assert url == f"{BASE}/runbooks/rollout.md#{name.lower()}"
        anchor = url.split("#", 1)[1]
        assert anchor in markdown_anchors(text) and anchor in rendered, f"{name}: no heading for #{anchor}"
        section = runbook_section(text, name)
        for part in RUNBOOK_PARTS:
            assert f"**{part}" in section, f"runbooks/rollout.md '## {name}' lacks a {part} section"
        cmd = "flag" if name.startswith("Flag") else group
        assert f"gpuobs {cmd} status" in section  # how to confirm, with the command group's own status


def test_unreachable_alertmanager_is_a_warning_not_a_crash():
    line = send(f"http://127.0.0.1:{free_port_range(1)}", rec("Rejected"), ".run", BASE)
    assert line.startswith("warning: the RolloutRejected notice could not be sent")
    assert send("http://127.0.0.1:1", rec("Succeeded"), ".run", BASE) is None
