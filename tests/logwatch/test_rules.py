"""gpu-kernel-log.yml is generated from the Xid catalogue; with the DCGM path it gives one page per
incident (the DCGM alerts stand aside in their expressions, the hardware alerts of one GPU share an
Alertmanager group). (promtool tests of the rules run in tests/mixin/test_rules.py with
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
    def codes(name: str) -> set[int]:
        (r,) = [r for r in rules.kernel_log_rules(FleetConfig())["groups"][0]["rules"] if r["alert"] == name]
        assert "for" not in r  # pages at the first evaluation that sees the line, memory codes too
        return set(map(int, r["expr"].split('xid=~"')[1].split('"')[0].split("|")))

    assert codes("GpuKernelXidCritical") == set(xid.critical_codes()) - {79}  # 79 is GpuFallenOffBus
    assert codes("GpuKernelXidWarning") == set(xid.ticket_codes())


NODE1 = {"node": "gpu-node-01"}


def gpu(n: int, host: str = "gpu-node-01", bus: str | None = None) -> dict[str, str]:
    return {"node": host, "gpu": str(n), "UUID": f"GPU-{host}-{n}", "pci_bus_id": bus or f"00000000:{0x18 + n:02X}:00.0"}


FALLEN = {"alertname": "GpuFallenOffBus", "severity": "critical", "family": "gpu-missing", **gpu(6)}


@pytest.mark.parametrize("name", ["GpuXidCritical", "GpuXidWarning"])
def test_the_dcgm_xid_alerts_stand_aside_in_their_own_expression_where_logwatch_reads(name):
    """Which path pages is decided in the rule, not by an Alertmanager inhibition whose source must first
    reach a restarted Alertmanager (promtool cases: prometheus/tests/stock-xid.test.yml)."""
    import yaml

    doc = yaml.safe_load((ROOT / "prometheus" / "rules" / "gpu-xid.yml").read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name]
    assert 'unless on (node)\n  group by (node) (max_over_time(gpuobs_logwatch_source_up{node!=""}[2m]) == 1)' in rule["expr"]
    am = (ROOT / "alertmanager" / "alertmanager.yml").read_text()
    assert "GpuKernelLogWatching" not in am and not any(
        m.name == "alertname" and "GpuKernelLogWatching" in m.value for r in inhibit_rules() for m in r.source)


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


def test_dcgm_hardware_alerts_mute_only_the_ticket_class_kernel_xids_of_the_same_fault():
    """The kernel-log Xid 48 pages first and the DBE joins its group (one incident): muting the Xid once
    the DBE arrives would hide its resolution from the pager. Xid 63's ticket is muted."""
    dbe = {"alertname": "GpuEccDoubleBitError", "severity": "critical", **gpu(3)}
    k48 = {"alertname": "GpuKernelXidCritical", "severity": "critical", "xid": "48", **gpu(3)}
    assert not inhibits(dbe, k48)
    assert inhibits(dbe, {**k48, "alertname": "GpuKernelXidWarning", "severity": "warning", "xid": "63"})
    assert not inhibits(dbe, {**k48, "alertname": "GpuKernelXidWarning", "severity": "warning", "xid": "63", **gpu(4)})
    remap = {"alertname": "GpuRowRemapFailure", "severity": "critical", **gpu(3)}
    assert not inhibits(remap, {**k48, "xid": "64"})


def test_critical_kernel_xid_mutes_warning_kernel_xids_of_the_same_gpu():
    crit = {"alertname": "GpuKernelXidCritical", "severity": "critical", "xid": "48", **gpu(0)}
    warn = {"alertname": "GpuKernelXidWarning", "severity": "warning", "xid": "13", **gpu(0)}
    assert inhibits(crit, warn)
    assert not inhibits(crit, {**warn, **gpu(1)})
    assert not inhibits({**crit, "gpu": ""}, {**warn, "gpu": ""})


@pytest.mark.parametrize("profile", ["default", "drill"])
def test_kernel_log_xid_pages_are_never_held_back(tmp_path, profile):
    """No `for:` on the kernel-log Xid alerts in either stack profile: the page goes out within one
    scrape + evaluation + group_wait of the line (issue 32)."""
    import yaml

    from gpuobs.stack.render import render_rules

    by_file = {p.name: yaml.safe_load(p.read_text()) for p in render_rules(tmp_path, "http://x", profile)}
    kernel = [r for g in by_file["gpu-kernel-log.yml"]["groups"] for r in g["rules"]
              if r.get("alert") in ("GpuKernelXidCritical", "GpuKernelXidWarning", "GpuFallenOffBus")]
    assert len(kernel) == 3 and not any("for" in r for r in kernel)


def test_no_rendered_alert_is_a_state_only_the_watchdog_fires_by_design():
    """Issue 29: an idle stack listed GpuKernelLogWatching (one per node) and Watchdog as firing. The
    watcher being up is gpuobs_logwatch_source_up, read inside the rules, not an alert; the Watchdog is
    the one always-firing alert (family=meta, which every firing view leaves out: gpuobs.core.meta_alerts)."""
    import yaml

    from gpuobs.core.meta_alerts import META_ALERTS, is_meta
    alerts = [r for f in sorted((ROOT / "prometheus" / "rules").glob("*.yml"))
              for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and not [r["alert"] for r in alerts if "Watching" in r["alert"]]
    meta = [r["alert"] for r in alerts if is_meta({"alertname": r["alert"], **r.get("labels", {})})]
    assert meta == sorted(META_ALERTS) == ["Watchdog"]
    constant = [r["alert"] for r in alerts if "{" not in r["expr"] and "(" in r["expr"] and "_" not in r["expr"]]
    assert constant == ["Watchdog"], constant  # vector(1): fires with no input at all
