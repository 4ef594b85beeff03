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
               "node=gpu-node-01", "gpu=0"], receiver)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == receiver


def test_every_family_has_a_route_case():
    families = {f for _, _, f in RULE_CASES}
    assert {"xid", "gpu-missing", "ecc", "throttling", "interconnect", "fragmentation", "kv-cache", "slo",
            "training", "driver-skew", "exporter", "meta"} <= families


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=GpuXidCritical", "severity=critical", "node=gpu-node-01", "xid=79"], "page"),
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
        assert not inhibits({"alertname": name, "severity": sev, "node": "", "gpu": ""}, watchdog), name
        assert not inhibits({"alertname": name, "severity": sev, "node": "gpu-node-01", "gpu": "0"}, watchdog), name


NODE1 = {"node": "gpu-node-01"}


def gpu(n: int, host: str = "gpu-node-01") -> dict[str, str]:
    return {"node": host, "gpu": str(n), "UUID": f"GPU-{host}-{n}"}


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
    assert not inhibits(EXPORTER_DOWN, {**target, "node": "gpu-node-02"})


def test_exporter_down_does_not_silence_itself_elsewhere():
    assert not inhibits(EXPORTER_DOWN, {**EXPORTER_DOWN, "node": "gpu-node-02"})


@pytest.mark.parametrize("target", [
    {"alertname": "GpuXidWarning", "severity": "warning", "xid": "63", **gpu(2)},
    {"alertname": "GpuKernelXidWarning", "severity": "warning", "xid": "63", **gpu(2)},
    {"alertname": "GpuRowRemapPending", "severity": "warning", **gpu(2)},
])
def test_ecc_dbe_silences_its_ticket_class_xids_and_pending_remap_on_the_same_gpu(target):
    assert inhibits(ECC_DBE, target)
    assert not inhibits(ECC_DBE, {**target, **gpu(3)})  # another GPU of the node
    assert not inhibits(ECC_DBE, {**target, **gpu(2, "gpu-node-02")})  # same index, other node


@pytest.mark.parametrize("target", [
    {"alertname": "GpuXidCritical", "severity": "critical", "family": "xid", "xid": "48", **gpu(2)},
    {"alertname": "GpuKernelXidCritical", "severity": "critical", "family": "xid", "xid": "48", **gpu(2)},
])
def test_ecc_dbe_does_not_mute_the_xid_48_of_its_own_group(target):
    """The Xid 48 page may go out before the DBE arrives: muting it afterwards would hide its resolution
    from the pager (an incident that never closes). Both are in one group (one incident) instead."""
    assert not inhibits(ECC_DBE, target)


def hardware_route() -> dict:
    route = yaml.safe_load(CONFIG.read_text())["route"]
    return next(r for r in route["routes"] if any("family" in m for m in r.get("matchers", [])))


@pytest.mark.parametrize("alerts", [
    # Xid 48 (kernel log or DCGM) and the DBE and row-remap failure of the same fault
    [{"alertname": "GpuKernelXidCritical", "family": "xid", "xid": "48"}, {"alertname": "GpuEccDoubleBitError", "family": "ecc"},
     {"alertname": "GpuXidCritical", "family": "xid", "xid": "48"}, {"alertname": "GpuRowRemapFailure", "family": "ecc"}],
    # Xid 79: the GPU off the bus and missing from DCGM's page
    [{"alertname": "GpuFallenOffBus", "family": "gpu-missing"}, {"alertname": "GpuMissing", "family": "gpu-missing"}],
])
def test_one_gpus_hardware_alerts_join_one_group_whatever_fires_first(alerts):
    """amtool names the route each alert takes; the route's group_by (node, gpu) puts them in one group."""
    hw = hardware_route()
    assert hw["group_by"] == [IDENTITY, "gpu"]
    for a in alerts:
        labels = [f"{k}={v}" for k, v in {**a, "severity": "critical", **gpu(2)}.items()]
        r = run("amtool", "config", "routes", "test", f"--config.file={CONFIG.relative_to(ROOT)}", "--tree", *labels)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "family" in r.stdout and "page" in r.stdout, r.stdout


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
    assert not inhibits(GPU_MISSING, {**engine_down, "node": "gpu-node-02"})


def test_gpu_missing_silences_its_nodes_tickets_but_not_other_pages():
    assert inhibits(GPU_MISSING, {"alertname": "KVFragmentationRisk", "severity": "warning", **gpu(1)})
    assert not inhibits(GPU_MISSING, {"alertname": "GpuEccDoubleBitError", "severity": "critical", **gpu(1)})
    assert not inhibits(GPU_MISSING, {**GPU_MISSING, "node": "gpu-node-02"})


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
    r = route(["alertname=ServingEngineDown", "severity=critical", "node=gpu-node-01"], "page")
    assert r.returncode == 0 and r.stdout.strip() == "page", r.stdout + r.stderr


# --- identity: grouping and inhibition never match an empty or shared host label -----------------

IDENTITY = "node"


def test_config_is_the_render_of_the_shipped_fleet_config():
    from gpuobs.mixin.alertmanager import render_alertmanager
    from gpuobs.core.fleet import load_fleet

    assert CONFIG.read_text() == render_alertmanager(load_fleet(ROOT / "prometheus" / "fleet.yaml"))


def test_route_groups_by_alertname_and_the_identity_label():
    route = yaml.safe_load(CONFIG.read_text())["route"]
    assert route["group_by"] == ["alertname", IDENTITY]
    assert "Hostname" not in CONFIG.read_text().split("inhibit_rules:")[1].split("receivers:")[0]


def test_every_identity_inhibition_requires_a_non_empty_identity_on_both_sides():
    guard = Matcher(IDENTITY, "=~", ".+")
    keyed = [r for r in inhibit_rules() if IDENTITY in r.equal]
    assert len(keyed) >= 6
    for rule in keyed:
        assert guard in rule.source and guard in rule.target, rule


#: dcgm-exporter host-label modes (docs/real-fleet.md, step 3) as they reach Alertmanager on an alert's labels when a
#: rule keeps them: the node name, the exporter pod's name, "localhost" (4.0-4.5.3 with -r), lowercase
#: `hostname` (master after #655), none (-n).
HOST_MODES = {
    "node-name": lambda n: {"Hostname": n},
    "pod-name": lambda n: {"Hostname": "nvidia-dcgm-exporter-7x2kq"},
    "localhost": lambda n: {"Hostname": "localhost"},
    "lowercase": lambda n: {"hostname": "localhost"},
    "empty": lambda n: {"Hostname": ""},
    "absent": lambda n: {},
}


def _gpu_alert(name: str, severity: str, node: str | None, mode: str, gpu_idx: str = "0", **extra) -> dict[str, str]:
    labels = {"alertname": name, "severity": severity, "gpu": gpu_idx, **HOST_MODES[mode](node or ""), **extra}
    if node is not None:
        labels[IDENTITY] = node
    return labels


@pytest.mark.parametrize("mode", sorted(HOST_MODES))
def test_a_fault_on_one_node_never_silences_another_nodes_page(mode):
    """The issue's reproduction: a DBE on node 1 must not inhibit node 2's Xid page (same GPU index), nor
    node 1's exporter-down or GPU-missing alert node 2's, whatever host label the exporters print."""
    pairs = [
        (_gpu_alert("GpuEccDoubleBitError", "critical", "k8s-gpu-1", mode),
         _gpu_alert("GpuXidWarning", "warning", "k8s-gpu-2", mode, xid="63")),
        (_gpu_alert("GpuXidCritical", "critical", "k8s-gpu-1", mode, xid="79"),
         _gpu_alert("GpuEccDoubleBitError", "critical", "k8s-gpu-2", mode)),
        ({"alertname": "GpuExporterDown", "severity": "critical", IDENTITY: "k8s-gpu-1", **HOST_MODES[mode]("k8s-gpu-1")},
         _gpu_alert("GpuXidCritical", "critical", "k8s-gpu-2", mode, xid="48")),
        ({"alertname": "GpuMissing", "severity": "critical", IDENTITY: "k8s-gpu-1"},
         {"alertname": "ServingEngineDown", "severity": "critical", IDENTITY: "k8s-gpu-2"}),
    ]
    for source, target in pairs:
        assert not inhibits(source, target), (source, target)
        # ... while on the same node the inhibition still works.
        assert inhibits(source, {**target, IDENTITY: source[IDENTITY]}), (source, target)


@pytest.mark.parametrize("mode", sorted(HOST_MODES))
def test_alerts_without_the_identity_never_inhibit_each_other(mode):
    """Two alerts that both lack the identity (a rule or scrape config without it) match nothing."""
    source = _gpu_alert("GpuEccDoubleBitError", "critical", None, mode)
    target = _gpu_alert("GpuXidCritical", "critical", None, mode, xid="48")
    assert not inhibits(source, target)
    assert not inhibits({"alertname": "GpuExporterDown", "severity": "critical", **HOST_MODES[mode]("x")},
                        {"alertname": "ServingEngineDown", "severity": "critical", **HOST_MODES[mode]("y")})


# --- the same cases on a real Alertmanager --------------------------------------------------------

@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    """A real Alertmanager (0.25) on 127.0.0.1 with the repository's config; its webhooks point at a
    closed port (nothing is delivered: only inhibition state is read). Stopped after the module."""
    import shutil
    import time

    import requests

    from gpuobs.stack.ports import free_port_range

    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")  # Debian's name first
    if not binary:
        pytest.fail("alertmanager is required (make binaries installs it)")
    tmp = tmp_path_factory.mktemp("am")
    port = free_port_range(2)
    cfg = yaml.safe_load(CONFIG.read_text())
    for r in cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = f"http://127.0.0.1:{port + 1}/hook"
    (tmp / "am.yml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([binary, f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                             f"--web.external-url=http://127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("alertmanager did not become ready")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _inhibited_after_posting(url: str, alerts: list[dict[str, str]]) -> dict[str, list[str]]:
    """POST ``alerts`` (firing) and return ``{alertname@node: inhibitedBy}`` as Alertmanager reports them."""
    import time

    import requests

    tag = f"t{time.monotonic_ns()}"  # keep each case's alerts apart from earlier cases'
    body = [{"labels": {**a, "case": tag}, "annotations": {},
             "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))} for a in alerts]
    r = requests.post(f"{url}/api/v2/alerts", json=body, timeout=5)
    assert r.status_code == 200, r.text
    got = requests.get(f"{url}/api/v2/alerts", params={"filter": f'case="{tag}"'}, timeout=5).json()
    assert len(got) == len(alerts), got
    return {f"{a['labels']['alertname']}@{a['labels'].get(IDENTITY, '')}": a["status"]["inhibitedBy"] for a in got}


@pytest.mark.parametrize("mode", ["localhost", "empty", "absent", "pod-name"])
def test_real_alertmanager_dbe_on_node1_does_not_inhibit_node2s_xid_page(alertmanager, mode):
    state = _inhibited_after_posting(alertmanager, [
        _gpu_alert("GpuEccDoubleBitError", "critical", "k8s-gpu-1", mode),
        _gpu_alert("GpuXidCritical", "critical", "k8s-gpu-2", mode, xid="48"),
        _gpu_alert("GpuXidWarning", "warning", "k8s-gpu-1", mode, xid="63"),
    ])
    assert state["GpuXidCritical@k8s-gpu-2"] == []          # another node: pages
    assert state["GpuXidWarning@k8s-gpu-1"] != []           # same GPU: inhibited by the DBE
    assert state["GpuEccDoubleBitError@k8s-gpu-1"] == []


def test_real_alertmanager_alerts_without_identity_inhibit_nothing(alertmanager):
    state = _inhibited_after_posting(alertmanager, [
        _gpu_alert("GpuEccDoubleBitError", "critical", None, "localhost"),
        _gpu_alert("GpuXidCritical", "critical", None, "localhost", xid="48"),
    ])
    assert state == {"GpuEccDoubleBitError@": [], "GpuXidCritical@": []}


def test_real_alertmanager_one_gpus_fault_is_one_group_whatever_fires_first(alertmanager):
    """Issue 32: Xid 48 (kernel log, first) with the DBE that follows, and Xid 79 with its GPU missing,
    are one page each: the Xid's and the DBE's alerts share one aggregation group on the page receiver
    (the pager keys an incident on (channel, groupKey)); Xid 63's ticket and GpuMissing are inhibited."""
    import time

    import requests

    tag = f"t{time.monotonic_ns()}"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))

    def post(*alerts: dict[str, str]) -> None:
        body = [{"labels": {**a, "case": tag}, "annotations": {}, "startsAt": now} for a in alerts]
        assert requests.post(f"{alertmanager}/api/v2/alerts", json=body, timeout=5).status_code == 200

    node = {IDENTITY: "k8s-gpu-1"}
    post({"alertname": "GpuKernelXidCritical", "severity": "critical", "family": "xid", "xid": "48", "gpu": "2", **node})
    time.sleep(1)  # the DBE arrives later (DCGM's collect interval)
    post({"alertname": "GpuEccDoubleBitError", "severity": "critical", "family": "ecc", "gpu": "2", **node},
         {"alertname": "GpuKernelXidWarning", "severity": "warning", "family": "xid", "xid": "63", "gpu": "2", **node},
         {"alertname": "GpuFallenOffBus", "severity": "critical", "family": "gpu-missing", "gpu": "6",
          "pci_bus_id": "00000000:BA:00.0", **node},
         {"alertname": "GpuMissing", "severity": "critical", "family": "gpu-missing", **node})
    groups = requests.get(f"{alertmanager}/api/v2/alerts/groups", params={"filter": f'case="{tag}"'}, timeout=5).json()
    active = sorted((g["receiver"]["name"], names) for g in groups
                    if (names := sorted(a["labels"]["alertname"] for a in g["alerts"] if not a["status"]["inhibitedBy"])))
    assert active == [("page", ["GpuEccDoubleBitError", "GpuKernelXidCritical"]), ("page", ["GpuFallenOffBus"])], groups
