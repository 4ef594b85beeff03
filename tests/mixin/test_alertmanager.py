"""Alertmanager config checks: amtool validation, routing of every alert with `amtool config routes
test`, and inhibition rules (amtool cannot test inhibition offline, so the rules are parsed and
evaluated here with Alertmanager's matcher semantics: anchored regexes, a missing label equals "")."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "alertmanager" / "alertmanager.yml"


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def alert_rules() -> list[dict]:
    return [rule for rf in sorted((ROOT / "prometheus" / "rules").glob("*.yml"))
            for group in yaml.safe_load(rf.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def expected_receiver(alertname: str, severity: str) -> str:
    if alertname == "Watchdog":
        return "blackhole"  # dead man's switch: never to the pager's page/ticket receivers
    return {"critical": "page", "warning": "ticket"}.get(severity, "blackhole")


def route(labels: list[str], receiver: str) -> subprocess.CompletedProcess:
    return run("amtool", "config", "routes", "test", f"--config.file={CONFIG.relative_to(ROOT)}",
               f"--verify.receivers={receiver}", *labels)


def test_amtool_config_is_valid():
    r = run("amtool", "check-config", str(CONFIG.relative_to(ROOT)))
    assert r.returncode == 0, r.stdout + r.stderr


# Every alert rule (one case per alertname/severity/family), labelled as Prometheus sends it.
RULE_CASES = sorted({(r["alert"], r["labels"]["severity"], r["labels"]["family"]) for r in alert_rules()})


@pytest.mark.parametrize("alertname, severity, family", RULE_CASES,
                         ids=[f"{a}-{s}" for a, s, _ in RULE_CASES])
def test_every_alert_routes_by_severity(alertname, severity, family):
    receiver = expected_receiver(alertname, severity)
    r = route([f"alertname={alertname}", f"severity={severity}", f"family={family}",
               "Hostname=gpu-node-01", "gpu=0"], receiver)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == receiver


def test_every_family_has_a_route_case():
    families = {f for _, _, f in RULE_CASES}
    assert {"xid", "gpu-missing", "ecc", "throttling", "interconnect", "fragmentation", "kv-cache", "slo",
            "training", "driver-skew", "exporter", "meta"} <= families


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=GpuXidCritical", "severity=critical", "Hostname=gpu-node-01", "xid=79"], "page"),
    (["alertname=GpuExporterDown", "severity=critical"], "page"),
    (["alertname=GpuXidWarning", "severity=warning", "xid=13"], "ticket"),
    (["alertname=ServingErrorBudgetBurn", "severity=critical", "slo=ttft", "model_name=m"], "page"),
    (["alertname=ServingErrorBudgetBurn", "severity=warning", "slo=ttft", "model_name=m"], "ticket"),
    # The Watchdog goes to the dead man's switch whatever its severity; info is never routed.
    (["alertname=Watchdog", "severity=info"], "blackhole"),
    (["alertname=Watchdog", "severity=critical"], "blackhole"),
    (["alertname=SomethingInformational", "severity=info"], "blackhole"),
    (["alertname=NoSeverityLabel"], "blackhole"),
])
def test_amtool_routes(labels, receiver):
    r = route(labels, receiver)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == receiver


# --- inhibition -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = re.fullmatch(self.value, v) is not None  # Alertmanager anchors regex matchers
        return hit if self.op == "=~" else not hit


def parse_matcher(text: str) -> Matcher:
    m = re.fullmatch(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|(\S*))\s*', text)
    assert m, f"cannot parse matcher {text!r}"
    value = m.group(3) if m.group(3) is not None else m.group(4)
    return Matcher(m.group(1), m.group(2), value.replace('\\"', '"').replace("\\\\", "\\"))


def contradict(a: Matcher, b: Matcher) -> bool:
    """True when no value of the shared label can satisfy both matchers (decidable cases only)."""
    if a.name != b.name:
        return False
    if a.op != "=" and b.op == "=":
        a, b = b, a
    if a.op != "=":
        return False  # regex vs regex / != vs != : not decided here
    if b.op == "=":
        return a.value != b.value
    if b.op == "!=":
        return a.value == b.value
    hit = re.fullmatch(b.value, a.value) is not None
    return not hit if b.op == "=~" else hit


@dataclass(frozen=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


def inhibit_rules() -> list[InhibitRule]:
    doc = yaml.safe_load(CONFIG.read_text())
    out = []
    for r in doc.get("inhibit_rules", []):
        assert not {"source_match", "target_match", "source_match_re", "target_match_re"} & set(r), \
            "use source_matchers/target_matchers (the old match/match_re keys are deprecated)"
        out.append(InhibitRule(tuple(map(parse_matcher, r["source_matchers"])),
                               tuple(map(parse_matcher, r["target_matchers"])), tuple(r.get("equal", []))))
    return out


def inhibits(source: dict[str, str], target: dict[str, str]) -> bool:
    """Would a firing ``source`` alert mute ``target`` under some inhibit rule?"""
    for rule in inhibit_rules():
        if (all(m.matches(source) for m in rule.source) and all(m.matches(target) for m in rule.target)
                and all(source.get(n, "") == target.get(n, "") for n in rule.equal)):
            return True
    return False


def test_matcher_semantics():
    assert parse_matcher('alertname=~"A|B"').matches({"alertname": "B"})
    assert not parse_matcher('alertname=~"A|B"').matches({"alertname": "AB"})  # anchored
    assert parse_matcher('xid!="79"').matches({})
    assert contradict(parse_matcher('a="x"'), parse_matcher('a!="x"'))
    assert contradict(parse_matcher('a=~"x|y"'), parse_matcher('a="z"'))
    assert not contradict(parse_matcher('a=~"x|y"'), parse_matcher('a="y"'))
    assert not contradict(parse_matcher('a="x"'), parse_matcher('b="y"'))


def test_every_inhibit_rule_has_disjoint_source_and_target_and_an_equal_list():
    rules = inhibit_rules()
    assert rules
    for rule in rules:
        assert rule.equal, f"{rule}: an inhibition without `equal` mutes the whole fleet"
        assert any(contradict(s, t) for s in rule.source for t in rule.target), (
            f"source {rule.source} and target {rule.target} can match the same alert: an alert could "
            "inhibit itself; add a contradicting matcher (e.g. alertname!=...)")


def test_inhibit_rules_never_mute_the_watchdog():
    watchdog = {"alertname": "Watchdog", "severity": "info", "family": "meta"}
    for name, sev in {(r["alert"], r["labels"]["severity"]) for r in alert_rules()}:
        assert not inhibits({"alertname": name, "severity": sev, "Hostname": "", "gpu": ""}, watchdog), name


NODE1 = {"Hostname": "gpu-node-01"}


def gpu(n: int, host: str = "gpu-node-01") -> dict[str, str]:
    return {"Hostname": host, "gpu": str(n), "UUID": f"GPU-{host}-{n}"}


EXPORTER_DOWN = {"alertname": "GpuExporterDown", "severity": "critical", "family": "exporter", **NODE1}
ECC_DBE = {"alertname": "GpuEccDoubleBitError", "severity": "critical", "family": "ecc", **gpu(2)}
GPU_MISSING = {"alertname": "GpuMissing", "severity": "critical", "family": "gpu-missing", **NODE1}


def burn(severity: str, slo: str = "ttft", model: str = "m-a") -> dict[str, str]:
    return {"alertname": "ServingErrorBudgetBurn", "severity": severity, "family": "slo", "slo": slo,
            "model_name": model}


@pytest.mark.parametrize("target", [
    {"alertname": "GpuXidCritical", "severity": "critical", "xid": "48", **gpu(0)},
    {"alertname": "GPUThrottling", "severity": "warning", **gpu(3)},
    {"alertname": "GpuTelemetryStale", "severity": "warning", **gpu(1)},
    {"alertname": "TrainingCollectiveHang", "severity": "critical", "training_job": "j", **NODE1},
    {"alertname": "ServingEngineDown", "severity": "critical", **NODE1},
])
def test_exporter_down_silences_everything_else_on_its_node(target):
    assert inhibits(EXPORTER_DOWN, target)
    assert not inhibits(EXPORTER_DOWN, {**target, "Hostname": "gpu-node-02"})


def test_exporter_down_does_not_silence_itself_elsewhere():
    assert not inhibits(EXPORTER_DOWN, {**EXPORTER_DOWN, "Hostname": "gpu-node-02"})


@pytest.mark.parametrize("target", [
    {"alertname": "GpuXidCritical", "severity": "critical", "xid": "48", **gpu(2)},
    {"alertname": "GpuXidWarning", "severity": "warning", "xid": "63", **gpu(2)},
    {"alertname": "GpuRowRemapPending", "severity": "warning", **gpu(2)},
])
def test_ecc_dbe_silences_its_xids_and_pending_remap_on_the_same_gpu(target):
    assert inhibits(ECC_DBE, target)
    assert not inhibits(ECC_DBE, {**target, **gpu(3)})  # another GPU of the node
    assert not inhibits(ECC_DBE, {**target, **gpu(2, "gpu-node-02")})  # same index, other node


def test_ecc_dbe_does_not_silence_a_remap_failure():
    # A failed remap is the RMA path: it must still page.
    assert not inhibits(ECC_DBE, {"alertname": "GpuRowRemapFailure", "severity": "critical", **gpu(2)})


def test_critical_burn_silences_the_same_slo_ticket_only():
    assert inhibits(burn("critical"), burn("warning"))
    assert not inhibits(burn("critical"), burn("warning", slo="availability"))
    assert not inhibits(burn("critical"), burn("warning", model="m-b"))
    assert not inhibits(burn("warning"), burn("critical"))
    assert not inhibits(burn("critical"), burn("critical", model="m-b"))


def test_gpu_missing_silences_the_serving_engine_down_on_its_node():
    engine_down = {"alertname": "ServingEngineDown", "severity": "critical", "family": "exporter", **NODE1}
    assert inhibits(GPU_MISSING, engine_down)
    assert not inhibits(GPU_MISSING, {**engine_down, "Hostname": "gpu-node-02"})


def test_gpu_missing_silences_its_nodes_tickets_but_not_other_pages():
    assert inhibits(GPU_MISSING, {"alertname": "KVFragmentationRisk", "severity": "warning", **gpu(1)})
    assert not inhibits(GPU_MISSING, {"alertname": "GpuEccDoubleBitError", "severity": "critical", **gpu(1)})
    assert not inhibits(GPU_MISSING, {**GPU_MISSING, "Hostname": "gpu-node-02"})


def test_critical_xid_silences_the_same_gpus_warning_xids():
    crit = {"alertname": "GpuXidCritical", "severity": "critical", "xid": "62", **gpu(0)}
    assert inhibits(crit, {"alertname": "GpuXidWarning", "severity": "warning", "xid": "13", **gpu(0)})
    assert not inhibits(crit, {"alertname": "GpuXidWarning", "severity": "warning", "xid": "13", **gpu(1)})


def test_fragmentation_ticket_silences_the_same_gpus_oom():
    frag = {"alertname": "KVFragmentationRisk", "severity": "warning", **gpu(0)}
    assert inhibits(frag, {"alertname": "GpuFrameworkOom", "severity": "warning", **gpu(0)})
    assert not inhibits(frag, {"alertname": "GpuFrameworkOom", "severity": "warning", **gpu(1)})


def test_engine_down_waits_long_enough_for_its_nodes_exporter_down_to_inhibit_it():
    """Both fire when a node dies, in either order: the engine's first notification must wait longer
    than the worst gap (a scrape interval plus an evaluation interval, plus the inhibitor's own
    group_wait) so GpuExporterDown is active in Alertmanager when the engine's group flushes."""
    import yaml

    from gpuobs.core.durations import parse_duration

    cfg = yaml.safe_load(CONFIG.read_text())
    prom = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())["global"]
    engine = next(r for r in cfg["route"]["routes"] if r.get("matchers") == ['alertname="ServingEngineDown"'])
    assert engine["receiver"] == "page"
    gap = parse_duration(prom["scrape_interval"]) + parse_duration(prom["evaluation_interval"])
    assert parse_duration(engine["group_wait"]) > gap + parse_duration(cfg["route"]["group_wait"])
    r = route(["alertname=ServingEngineDown", "severity=critical", "Hostname=gpu-node-01"], "page")
    assert r.returncode == 0 and r.stdout.strip() == "page", r.stdout + r.stderr
