"""gpu-kernel-log.yml is generated from the Xid catalogue; its Alertmanager inhibitions give one page
per incident with the DCGM path. (promtool tests of the rules run in tests/mixin/test_rules.py with
every other rule file; inhibition semantics are evaluated with that module's Alertmanager matcher model.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuobs.cli import run as cli_run
from gpuobs.mixin import kernel_log_rules as rules
from gpuobs.core.fleet import FleetConfig
from gpuobs.reference import xid
from tests.mixin.test_alertmanager import inhibit_rules, inhibits

ROOT = Path(__file__).resolve().parents[2]


def test_rule_file_is_generated_and_check_mode_works(tmp_path, capsys):
    path = ROOT / "prometheus" / "rules" / "gpu-kernel-log.yml"
    assert path.read_text() == rules.render(FleetConfig())
    assert cli_run(["rules", "kernel-log", "--check", str(path)]) == 0
    stale = tmp_path / "old.yml"
    stale.write_text(rules.render(FleetConfig()).replace(">= 3", ">= 2"))
    assert cli_run(["rules", "kernel-log", "--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_code_lists_come_from_the_catalogue():
    def codes(name: str) -> dict[str | None, set[int]]:
        out: dict[str | None, set[int]] = {}
        for r in rules.kernel_log_rules(FleetConfig())["groups"][0]["rules"]:
            if r["alert"] == name:
                regex = r["expr"].split('xid=~"')[1].split('"')[0]
                out[r.get("for")] = set(map(int, regex.split("|")))
        return out

    crit = codes("GpuKernelXidCritical")
    assert set.union(*crit.values()) == set(xid.critical_codes()) - {79}  # 79 is GpuFallenOffBus
    assert crit["1m"] == {48, 64, 95} and 62 in crit[None]  # only memory codes wait for DCGM's counters
    warn = codes("GpuKernelXidWarning")
    assert set.union(*warn.values()) == set(xid.ticket_codes())
    assert warn["1m"] == {63, 94}


NODE1 = {"node": "gpu-node-01"}
WATCHING = {"alertname": "GpuKernelLogWatching", "severity": "info", "family": "xid", **NODE1}


def gpu(n: int, host: str = "gpu-node-01", bus: str | None = None) -> dict[str, str]:
    return {"node": host, "gpu": str(n), "UUID": f"GPU-{host}-{n}", "pci_bus_id": bus or f"00000000:{0x18 + n:02X}:00.0"}


FALLEN = {"alertname": "GpuFallenOffBus", "severity": "critical", "family": "gpu-missing", **gpu(6)}


@pytest.mark.parametrize("name", ["GpuXidCritical", "GpuXidWarning"])
def test_watching_node_mutes_dcgm_xid_alerts_there_only(name):
    target = {"alertname": name, "severity": "critical", "xid": "48", **gpu(0)}
    assert inhibits(WATCHING, target)
    assert not inhibits(WATCHING, {**target, **gpu(0, "gpu-node-02")})
    # an empty host label is never a match (design §4.6)
    assert not inhibits({**WATCHING, "node": ""}, {**target, "node": ""})
    # the kernel-log alerts themselves are not muted by it
    assert not inhibits(WATCHING, {**target, "alertname": "GpuKernelXidCritical"})


def test_fallen_off_bus_mutes_gpu_missing_engine_and_that_gpus_alerts():
    assert inhibits(FALLEN, {"alertname": "GpuMissing", "severity": "critical", **NODE1})
    assert inhibits(FALLEN, {"alertname": "ServingEngineDown", "severity": "critical", **NODE1})
    assert inhibits(FALLEN, {"alertname": "GpuKernelXidCritical", "severity": "critical", "xid": "48", **gpu(6)})
    assert not inhibits(FALLEN, {"alertname": "GpuKernelXidCritical", "severity": "critical", "xid": "48", **gpu(5)})
    assert not inhibits(FALLEN, {"alertname": "GpuMissing", "severity": "critical", "node": "gpu-node-02"})
    assert not inhibits(FALLEN, {**FALLEN, **gpu(6, "gpu-node-02")})  # another node's GPU off the bus pages
    # identical HGX boards share bus ids: with no host label, one node's GPU never mutes another's
    assert not inhibits({**FALLEN, "node": ""},
                        {"alertname": "GpuKernelXidCritical", "severity": "critical", "xid": "48", **gpu(6, "")})


def test_dcgm_hardware_alerts_mute_the_kernel_log_xid_of_the_same_fault():
    dbe = {"alertname": "GpuEccDoubleBitError", "severity": "critical", **gpu(3)}
    k48 = {"alertname": "GpuKernelXidCritical", "severity": "critical", "xid": "48", **gpu(3)}
    assert inhibits(dbe, k48)
    assert inhibits(dbe, {**k48, "alertname": "GpuKernelXidWarning", "xid": "63"})
    assert not inhibits(dbe, {**k48, "alertname": "GpuKernelXidRepeated"})  # repeats page again
    assert not inhibits(dbe, {**k48, **gpu(4)})
    remap = {"alertname": "GpuRowRemapFailure", "severity": "critical", **gpu(3)}
    assert inhibits(remap, {**k48, "xid": "64"}) and not inhibits(remap, k48)


def test_critical_kernel_xid_mutes_warning_kernel_xids_of_the_same_gpu():
    crit = {"alertname": "GpuKernelXidCritical", "severity": "critical", "xid": "48", **gpu(0)}
    warn = {"alertname": "GpuKernelXidWarning", "severity": "warning", "xid": "13", **gpu(0)}
    assert inhibits(crit, warn)
    assert not inhibits(crit, {**warn, **gpu(1)})
    assert not inhibits({**crit, "pci_bus_id": ""}, {**warn, "pci_bus_id": ""})


def test_new_inhibitions_are_disjoint():
    names = {"GpuKernelLogWatching", "GpuFallenOffBus", "GpuKernelXidCritical", "GpuRowRemapFailure"}
    assert sum(any(m.name == "alertname" and m.value in names for m in r.source) for r in inhibit_rules()) >= 5


@pytest.mark.parametrize("profile", ["default", "drill"])
def test_held_kernel_log_page_never_outlasts_the_dcgm_alert_that_inhibits_it(tmp_path, profile):
    """The memory codes' kernel-log alert is inhibited by GpuEccDoubleBitError only while that fires:
    its "recent" span must end before the DBE alert's window does, in both stack profiles (the drill
    profile shortens windows; it must shorten the span too), or a late second page goes out."""
    import re

    import yaml

    from gpuobs.core.durations import parse_duration
    from gpuobs.stack.render import render_rules

    by_file = {p.name: yaml.safe_load(p.read_text()) for p in render_rules(tmp_path, "http://x", profile)}
    rules_ = [r for doc in by_file.values() for g in doc["groups"] for r in g["rules"]]
    dbe = next(r for r in rules_ if r.get("alert") == "GpuEccDoubleBitError")
    window = parse_duration(re.search(r"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL(?:\{[^}]*\})?\[([0-9a-z]+)\]", dbe["expr"]).group(1))
    held = next(r for r in rules_ if r.get("alert") == "GpuKernelXidCritical" and "for" in r)
    recent = int(re.search(r"gpuobs_xid_last_event_timestamp_seconds\) < ([0-9]+)", held["expr"]).group(1))
    assert recent + 30 <= window, (profile, recent, window)  # 30 s: scrape + evaluation slack
    assert parse_duration(held["for"]) < recent
