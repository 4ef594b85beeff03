"""Rule and config checks with the real promtool and amtool, and the generated Xid rules."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpuobs.exporter import xid
from gpuobs.rulegen import render_xid_rules

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_unit_tests_pass():
    tests = sorted(p.name for p in (ROOT / "prometheus" / "tests").glob("*.test.yml"))
    assert tests, "no promtool tests found"
    r = run("promtool", "test", "rules", *tests, cwd=ROOT / "prometheus" / "tests")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(tests)


def test_every_alert_has_a_promtool_test_and_required_annotations():
    tested = set()
    for t in (ROOT / "prometheus" / "tests").glob("*.test.yml"):
        for case in yaml.safe_load(t.read_text())["tests"]:
            tested |= {a["alertname"] for a in case.get("alert_rule_test", []) if a.get("exp_alerts")}
    for rf in (ROOT / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(rf.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                assert rule["alert"] in tested, f"{rule['alert']} has no promtool test that makes it fire"
                assert rule["labels"]["severity"] in ("critical", "warning", "info")
                ann = rule["annotations"]
                assert {"summary", "description", "runbook_url"} <= set(ann), rule["alert"]
                assert ann["runbook_url"].endswith(f"#{rule['alert'].lower()}")
                runbook = ann["runbook_url"].split("/runbooks/", 1)[1].split("#")[0]
                assert (ROOT / "runbooks" / runbook).is_file(), f"{rule['alert']}: runbooks/{runbook} missing"


def test_promtool_check_config_and_rules():
    r = run("promtool", "check", "config", "prometheus/prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("promtool", "check", "rules", *map(str, sorted((ROOT / "prometheus" / "rules").glob("*.yml"))))
    assert r.returncode == 0, r.stdout + r.stderr


def test_xid_rules_file_is_generated_from_the_catalogue():
    assert (ROOT / "prometheus" / "rules" / "gpu-xid.yml").read_text() == render_xid_rules()
    crit = xid.critical_codes()
    assert 48 in crit and 79 in crit and 13 not in crit
    assert {13, 31, 43, 45, 63, 68, 92, 94} <= set(xid.ticket_codes())
    assert not set(crit) & set(xid.ticket_codes())
    doc = yaml.safe_load(render_xid_rules())
    expr = doc["groups"][0]["rules"][0]["expr"]
    assert "DCGM_FI_DEV_XID_ERRORS" not in expr  # never "last Xid gauge > 0"
    assert f'xid=~"{"|".join(map(str, crit))}"' in expr


def test_amtool_config_is_valid():
    r = run("amtool", "check-config", "alertmanager/alertmanager.yml")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=GpuXidCritical", "severity=critical", "Hostname=gpu-node-01"], "page"),
    (["alertname=GpuExporterDown", "severity=critical"], "page"),
    (["alertname=GpuXidWarning", "severity=warning"], "ticket"),
    (["alertname=Watchdog", "severity=info"], "blackhole"),
])
def test_amtool_routes(labels, receiver):
    r = run("amtool", "config", "routes", "test", "--config.file=alertmanager/alertmanager.yml",
            f"--verify.receivers={receiver}", *labels)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == receiver
