"""Rule checks with the real promtool: unit tests for every rule, annotations, runbook anchors, generated Xid rules.

Alertmanager routing and inhibition are in test_alertmanager.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from gpuobs.core.fleet import FleetConfig
from gpuobs.mixin.render import rule_texts
from gpuobs.reference import xid

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_unit_tests_pass():
    tests = sorted(p.name for p in (ROOT / "prometheus" / "tests").glob("*.test.yml"))
    assert tests, "no promtool tests found"
    r = run("promtool", "test", "rules", *tests, cwd=ROOT / "prometheus" / "tests")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(tests)


#: Alerts with no Grafana panel to link: the meta alert, scrape/telemetry health, interconnect, Xid and
#: GPU-missing alerts (their runbooks start from the node, not from a dashboard).
ALERTS_WITHOUT_DASHBOARD = {
    "Watchdog", "GpuExporterDown", "ServingEngineDown", "GpuTelemetryStale", "GpuTelemetryWithoutIdentity",
    "GpuNvlinkErrors", "GpuPcieReplays", "GpuXidCritical", "GpuXidWarning", "GpuMissing",
    # kernel-log alerts (gpu-kernel-log.yml): the runbook starts from the node's log lines
    "GpuKernelXidCritical", "GpuKernelXidWarning", "GpuKernelXidRepeated",
    "GpuFallenOffBus", "GpuNvSwitchSXidFatal",
}


def rule_files() -> list[Path]:
    return sorted((ROOT / "prometheus" / "rules").glob("*.yml"))


def all_rules() -> list[tuple[Path, dict]]:
    return [(rf, rule) for rf in rule_files() for group in yaml.safe_load(rf.read_text())["groups"]
            for rule in group["rules"]]


def promtool_test_files() -> list[Path]:
    return sorted((ROOT / "prometheus" / "tests").glob("*.test.yml"))


def github_slug(heading: str) -> str:
    """GitHub's heading anchor: link text kept, lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def markdown_anchors(text: str) -> set[str]:
    """Anchors of a Markdown file's ATX headings (outside code fences), deduplicated like GitHub (-1, -2)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence = None
    for line in text.splitlines():
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0]
            elif m.group(1)[0] == fence:
                fence = None
            continue
        if fence is not None:
            continue
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_github_slug():
    assert github_slug("GpuXidCritical") == "gpuxidcritical"
    assert github_slug("Paging codes (GpuXidCritical)") == "paging-codes-gpuxidcritical"
    assert github_slug("`nvidia-smi` and [DCGM](https://example.com) checks!") == "nvidia-smi-and-dcgm-checks"
    assert markdown_anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_every_rule_file_has_its_promtool_test_file():
    for rf in rule_files():
        t = ROOT / "prometheus" / "tests" / f"{rf.stem}.test.yml"
        assert t.is_file(), f"{rf.name} has no prometheus/tests/{t.name}"
        assert f"../rules/{rf.name}" in yaml.safe_load(t.read_text())["rule_files"]


def test_every_alert_has_a_promtool_test_and_required_annotations():
    fired, quiet = set(), set()
    for t in promtool_test_files():
        for case in yaml.safe_load(t.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
                    for exp in check["exp_alerts"]:
                        assert "exp_annotations" in exp, f"{t.name}: {check['alertname']} at {check['eval_time']}: give exp_annotations"
                else:
                    quiet.add(check["alertname"])
    alerts = [(rf, rule) for rf, rule in all_rules() if "alert" in rule]
    assert alerts
    for rf, rule in alerts:
        name = rule["alert"]
        assert name in fired, f"{name} has no promtool test that makes it fire"
        assert name in quiet or name == "Watchdog", f"{name} has no promtool test where it stays quiet"
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        ann = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(ann), name
        assert ann["runbook_url"].endswith(f"#{name.lower()}")
        runbook, anchor = ann["runbook_url"].split("/runbooks/", 1)[1].split("#", 1)
        path = ROOT / "runbooks" / runbook
        assert path.is_file(), f"{name}: runbooks/{runbook} missing"
        assert anchor in markdown_anchors(path.read_text()), f"{name}: runbooks/{runbook} has no heading for #{anchor}"
        assert "dashboard_url" in ann or name in ALERTS_WITHOUT_DASHBOARD, \
            f"{name} has no dashboard_url (add one, or add it to ALERTS_WITHOUT_DASHBOARD)"
    assert ALERTS_WITHOUT_DASHBOARD <= {rule["alert"] for _, rule in alerts}, "stale ALERTS_WITHOUT_DASHBOARD entry"


RUNBOOK_PARTS = ("Meaning", "Impact", "Diagnosis", "Mitigation", "Escalation")


def runbook_section(text: str, heading: str) -> str:
    """The text under ``## <heading>`` up to the next heading of level 1 or 2."""
    m = re.search(rf"^##\s+{re.escape(heading)}\s*$(.*?)(?=^#{{1,2}}\s|\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def test_every_alert_runbook_section_has_all_parts():
    for _, rule in all_rules():
        if "alert" not in rule:
            continue
        runbook = rule["annotations"]["runbook_url"].split("/runbooks/", 1)[1].split("#", 1)[0]
        section = runbook_section((ROOT / "runbooks" / runbook).read_text(), rule["alert"])
        assert section, f"runbooks/{runbook} has no '## {rule['alert']}' heading"
        for part in RUNBOOK_PARTS:
            assert re.search(rf"(\*\*{part}\b|^#{{3,6}}\s+{part}\b)", section, re.M), \
                f"runbooks/{runbook} '## {rule['alert']}' lacks a {part} section"


def test_runbook_links_resolve():
    """Relative links between runbooks point at existing files and headings."""
    docs = {p.name: p.read_text() for p in (ROOT / "runbooks").glob("*.md")}
    assert {"README.md", "postmortem-template.md", "xid.md", "fragmentation.md", "collective-hang.md",
            "driver-skew.md"} <= set(docs)
    for name, text in docs.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # absolute URL
            file, _, anchor = target.partition("#")
            file = file or name
            assert file in docs, f"runbooks/{name} links to missing {file}"
            if anchor:
                assert anchor in markdown_anchors(docs[file]), f"runbooks/{name} links to {file}#{anchor}: no such heading"


def test_every_recording_rule_has_a_promql_expr_test():
    exprs = [check["expr"] for t in promtool_test_files() for case in yaml.safe_load(t.read_text())["tests"]
             for check in case.get("promql_expr_test", [])]
    records = {rule["record"] for _, rule in all_rules() if "record" in rule}
    assert records
    for name in sorted(records):
        pattern = re.compile(r"(?<![\w:])" + re.escape(name) + r"(?![\w:])")
        assert any(pattern.search(e) for e in exprs), f"recording rule {name} has no promql_expr_test"


def test_promtool_check_config_and_rules():
    r = run("promtool", "check", "config", "prometheus/prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("promtool", "check", "rules", *map(str, sorted((ROOT / "prometheus" / "rules").glob("*.yml"))))
    assert r.returncode == 0, r.stdout + r.stderr


def test_xid_rules_file_is_generated_from_the_catalogue():
    assert (ROOT / "prometheus" / "rules" / "gpu-xid.yml").read_text() == rule_texts(FleetConfig())["prometheus/rules/gpu-xid.yml"]
    crit = xid.critical_codes()
    assert 48 in crit and 79 in crit and 13 not in crit
    assert {13, 31, 43, 45, 63, 68, 92, 94} <= set(xid.ticket_codes())
    assert not set(crit) & set(xid.ticket_codes())
    doc = yaml.safe_load(rule_texts(FleetConfig())["prometheus/rules/gpu-xid.yml"])
    for rule in doc["groups"][0]["rules"]:
        expr = rule["expr"]
        codes = crit if rule["alert"] == "GpuXidCritical" else xid.ticket_codes()
        # never "last Xid gauge > 0" (pages forever) nor changes() on it (never fires: one series per code);
        # the stock path is a (GPU, err_code) series absent in the hour before the last 5 minutes
        assert not re.search(r"DCGM_FI_DEV_XID_ERRORS\{[^}]*\}\s*>", expr)
        assert "changes(DCGM_FI_DEV_XID_ERRORS" not in expr
        dcgm = [c for c in codes if c != 79]  # 79 never reaches DCGM (DCGM #162); GpuMissing pages for it
        assert "[1h] offset 5m" in expr and 'err_code=~"' + "|".join(map(str, dcgm)) + '"' in expr
        # the enhanced DCGM_EXP_XID_ERRORS_COUNT path leaves 79 out too
        assert f'DCGM_EXP_XID_ERRORS_COUNT{{job=~"dcgm|.*dcgm-exporter.*", node!="", xid=~"{"|".join(map(str, dcgm))}"}}' in expr


def test_every_alert_belongs_to_exactly_one_family():
    from gpuobs.mixin.families import FAMILIES

    alerts = [rule["alert"] for _, rule in all_rules() if "alert" in rule]
    owners = {a: [f.name for f in FAMILIES if a in f.alerts] for a in alerts}
    assert {a: o for a, o in owners.items() if len(o) != 1} == {}
    assert {a for f in FAMILIES for a in f.alerts} == set(alerts)
