"""``gpuobs rules render``: the repository's rule files, Alertmanager config and dashboards are the output
for the shipped fleet config (a drift fails), every fleet-config variant renders rules promtool accepts,
and a bad fleet config is an input error naming the field."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuobs.cli import run as cli_run
from gpuobs.core.fleet import (
    PATH_FAMILIES,
    FleetConfig,
    FleetConfigError,
    load_fleet,
    parse_fleet,
)
from gpuobs.mixin.render import render_all, rule_texts

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_fleet_config_is_the_default():
    assert load_fleet(ROOT / "prometheus" / "fleet.yaml") == FleetConfig()


def test_repository_files_are_the_render_of_the_shipped_fleet_config():
    rendered = render_all(load_fleet(ROOT / "prometheus" / "fleet.yaml"))
    assert {"prometheus/rules/gpu-xid.yml", "prometheus/rules/slo.yml", "alertmanager/alertmanager.yml",
            "grafana/dashboards/fleet.json"} <= set(rendered)
    # every rendered rule file is in the repository (other generators may add files, e.g. logwatch's)
    assert {Path(k).name for k in rendered if k.startswith("prometheus/rules/")} <= \
        set(p.name for p in (ROOT / "prometheus" / "rules").glob("*.yml"))
    stale = [rel for rel, text in rendered.items() if (ROOT / rel).read_text() != text]
    assert stale == [], f"run `gpuobs rules render` (make rules): {stale}"


def test_check_mode_reports_drift_and_render_writes_into_out(tmp_path, capsys):
    assert cli_run(["rules", "render", "--out", str(tmp_path)]) == 0
    assert cli_run(["rules", "render", "--out", str(tmp_path), "--check"]) == 0
    rules = tmp_path / "prometheus" / "rules" / "gpu-health.yml"
    rules.write_text(rules.read_text().replace('node!=""', 'Hostname!=""'))
    assert cli_run(["rules", "render", "--out", str(tmp_path), "--check"]) == 1
    assert "prometheus/rules/gpu-health.yml" in capsys.readouterr().err


def _texts(cfg: FleetConfig) -> dict[str, str]:
    return rule_texts(cfg)


def test_every_rule_reads_series_with_a_non_empty_identity():
    """No selector of a DCGM, vLLM or gpuobs metric lacks `node!=""` (GpuTelemetryWithoutIdentity and the
    alerts' degraded twins alone read the series WITHOUT it), and no rule groups or joins on Hostname."""
    for name, text in _texts(FleetConfig()).items():
        for rule in (r for g in yaml.safe_load(text)["groups"] for r in g["rules"]):
            expr = rule["expr"]
            assert "Hostname" not in expr, (name, rule.get("alert") or rule.get("record"))
            if rule.get("alert") == "GpuTelemetryWithoutIdentity":
                continue
            degraded = '"identity_source", "instance", "", "")' in expr
            for m in re.finditer(r"\b(DCGM_[A-Z_]+|vllm:[a-z_:]+|gpuobs_[a-z_]+|pytorch_[a-z_]+|up)\{([^}]*)\}", expr):
                # the degraded twin (gpu_rules.degrade) reads the series WITHOUT the identity, per target
                assert 'node!=""' in m.group(2) or (degraded and 'node="", instance!=""' in m.group(2)), \
                    (name, m.group(0))


@pytest.mark.parametrize("paths", ["both", "stock", "enhanced"])
@pytest.mark.parametrize("kernel_log", [False, True])
def test_every_fleet_config_variant_renders_rules_promtool_accepts(tmp_path, paths, kernel_log):
    cfg = parse_fleet({"identity_label": "k8s_node",
                       "selectors": {"dcgm": 'job="gpu-operator/nvidia-dcgm-exporter"', "vllm": 'service=~"llm-.*"'},
                       "paths": {f: paths for f in PATH_FAMILIES}, "xid_kernel_log": kernel_log,
                       "gpu": {"slowdown_temp_c": 84}})
    files = []
    for rel, text in _texts(cfg).items():
        exprs = " ".join(r["expr"] for g in yaml.safe_load(text)["groups"] for r in g["rules"])
        if rel.endswith("slo.yml"):
            continue  # fleet-wide per model: no identity, no selectors
        assert 'k8s_node!=""' in exprs, rel
        assert not re.search(r"\bnode\b", exprs.replace("k8s_node", "")), rel  # the default label is gone
        path = tmp_path / Path(rel).name
        path.write_text(text)
        files.append(str(path))
    r = subprocess.run(["promtool", "check", "rules", *files], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    xid_doc = yaml.safe_load(_texts(cfg)["prometheus/rules/gpu-xid.yml"])
    xid_text = " ".join(r["expr"] for g in xid_doc["groups"] for r in g["rules"])
    assert ("gpuobs_xid_last_event_timestamp_seconds" in xid_text) == kernel_log
    assert ("DCGM_EXP_XID_ERRORS_COUNT" in xid_text) == (paths != "stock")
    assert ("offset 5m" in xid_text) == (paths != "enhanced")


@pytest.mark.parametrize("doc, field", [
    ([1, 2], "fleet config"),
    ({"identity_label": "Hostname"}, "identity_label"),
    ({"identity_label": "not a label"}, "identity_label"),
    ({"selectors": {"dcgm": 'job="dcgm'}}, "selectors.dcgm"),
    ({"selectors": {"dcgm": ""}}, "selectors.dcgm"),
    ({"selectors": {"loki": 'job="x"'}}, "selectors"),
    ({"paths": {"xid": "sometimes"}}, "paths.xid"),
    ({"paths": {"nvlink": "stock"}}, "paths.nvlink"),
    ({"xid_kernel_log": "yes"}, "xid_kernel_log"),
    ({"gpu": {"slowdown_temp_c": 500}}, "gpu.slowdown_temp_c"),
    ({"identity": "node"}, "unknown field"),
    ({"selectors": ""}, "selectors"),                      # falsy values of the wrong type are not defaults
    ({"selectors": False}, "selectors"),
    ({"paths": []}, "paths"),
    ({"gpu": 0}, "gpu"),
    ({"selectors": {"dcgm": '__name__="up"'}}, "selectors.dcgm"),
    ({"selectors": {"dcgm": '} or vector(1) or {a="b"'}}, "selectors.dcgm"),
    ({"runbook_base": "http://"}, "runbook_base"),         # no host
    ({"runbook_base": "http://x y"}, "runbook_base"),
    ({"runbook_base": "https://example.com/a#frag"}, "runbook_base"),
    ({"runbook_base": "https://example.com/?q=1"}, "runbook_base"),
    ({"runbook_base": "http://x/{{ $labels.node }}"}, "runbook_base"),
    ({"runbook_base": "http://["}, "runbook_base"),
    ({"runbook_base": "ftp://x"}, "runbook_base"),
    ({"dashboard_base": "grafana.example"}, "dashboard_base"),
])
def test_bad_fleet_config_names_the_field(doc, field):
    with pytest.raises(FleetConfigError, match=re.escape(field)):
        parse_fleet(doc)


def test_bad_fleet_file_is_a_usage_error_without_traceback(tmp_path, capsys):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("identity_label: [\n")
    assert cli_run(["rules", "render", "--fleet", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_the_family_contract_matches_the_rules():
    """gpuobs.mixin.families (what `gpuobs doctor` judges) names exactly the signals the rules read: every
    stock and enhanced signal of a family appears in one of its alerts' expressions (directly or through
    a recording rule of the same file), and a family blind on stock has no stock signal."""
    from gpuobs.mixin.families import FAMILIES

    texts = {}
    for rel, text in render_all(FleetConfig()).items():
        if rel.startswith("prometheus/rules/"):
            groups = yaml.safe_load(text)["groups"]
            records: dict[str, str] = {}
            for g in groups:
                for r in g["rules"]:
                    if "record" in r:
                        records[r["record"]] = records.get(r["record"], "") + " " + r["expr"]
            for g in groups:
                for r in g["rules"]:
                    if "alert" in r:
                        expr = r["expr"]
                        for name, rec in records.items():
                            if name in expr:
                                expr += " " + rec
                        texts[r["alert"]] = texts.get(r["alert"], "") + " " + expr
    for fam in FAMILIES:
        exprs = " ".join(texts[a] for a in fam.alerts)
        for sig in fam.stock + fam.enhanced:
            if sig.metric == "up":
                assert "up{" in exprs, fam.name
            else:
                assert sig.metric in exprs, f"{fam.name}: {sig.metric} is in the contract but no rule reads it"
        assert not (fam.blind_on_stock and fam.stock), fam.name


def test_kernel_log_xid_path_pages_once_with_the_gpus_identity(tmp_path):
    """xid_kernel_log: true adds gpuobs logwatch's kernel-log Xids (every event, Xid 79 included) to the Xid
    alerts; on a node where logwatch reads the kernel log the DCGM paths stand aside, so an Xid both see
    pages once, and the alert carries the GPU's UUID/PCI/model from its last DCGM series (a GPU that fell
    off the bus has none now)."""
    cfg = parse_fleet({"xid_kernel_log": True})
    (tmp_path / "gpu-xid.yml").write_text(rule_texts(cfg)["prometheus/rules/gpu-xid.yml"])
    dcgm = 'job="dcgm",instance="{n}:9400",node="{n}",gpu="{g}",UUID="GPU-{n}-{g}",pci_bus_id="00000000:1{g}:00.0",modelName="NVIDIA H100 80GB HBM3",Hostname="localhost"'
    lw = 'job="logwatch",instance="{n}:9500",node="{n}",gpu="{g}",UUID="GPU-{n}-{g}",pci_bus_id="00000000:1{g}:00.0",GPU_I_ID="",xid="{x}",xid_severity="critical",Hostname="{n}"'

    def ann(n, g, x):
        return {"summary": "A GPU reported an Xid whose NVIDIA action is reset the GPU, reboot the node or RMA.",
                "description": f"GPU {g} (GPU-{n}-{g}, PCI 00000000:1{g}:00.0) on node {n} reported Xid {x} in the last "
                               "few minutes. Grep the node's kernel log for 'NVRM: Xid (PCI:' and follow the runbook for this code.",
                "runbook_url": "http://127.0.0.1:9097/runbooks/xid.md#gpuxidcritical"}

    def labels(n, g, x):
        return {"severity": "critical", "family": "xid", "node": n, "gpu": g, "UUID": f"GPU-{n}-{g}",
                "pci_bus_id": f"00000000:1{g}:00.0", "modelName": "NVIDIA H100 80GB HBM3", "xid": x}

    series = [
        # n1 runs logwatch. GPU 0: Xid 48 in the kernel log and on the DCGM gauge at 2m.
        ("gpuobs_logwatch_source_up", 'job="logwatch",instance="n1:9500",node="n1"', "1x30"),
        ("DCGM_FI_DEV_GPU_TEMP", dcgm.format(n="n1", g="0"), "60x30"),
        ("DCGM_FI_DEV_XID_ERRORS", dcgm.format(n="n1", g="0") + ',err_code="48",err_msg="DBE"', "_x4 48x26"),
        ("gpuobs_xid_last_event_timestamp_seconds", lw.format(n="n1", g="0", x="48"), "_x4 120x26"),
        # GPU 3: falls off the bus at 2m (DCGM cannot report Xid 79; the kernel log can).
        ("DCGM_FI_DEV_GPU_TEMP", dcgm.format(n="n1", g="3"), "60x3 stale"),
        ("gpuobs_xid_last_event_timestamp_seconds", lw.format(n="n1", g="3", x="79"), "_x4 120x26"),
        # n2 has no logwatch: its DCGM stock path pages.
        ("DCGM_FI_DEV_GPU_TEMP", dcgm.format(n="n2", g="1"), "60x30"),
        ("DCGM_FI_DEV_XID_ERRORS", dcgm.format(n="n2", g="1") + ',err_code="48",err_msg="DBE"', "_x4 48x26"),
    ]
    test = {"rule_files": ["gpu-xid.yml"], "evaluation_interval": "30s", "tests": [{
        "interval": "30s",
        "input_series": [{"series": f"{m}{{{lbl}}}", "values": v} for m, lbl, v in series],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "GpuXidCritical", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "GpuXidCritical", "exp_alerts": [
                {"exp_labels": labels("n1", "0", "48"), "exp_annotations": ann("n1", "0", "48")},
                {"exp_labels": labels("n1", "3", "79"), "exp_annotations": ann("n1", "3", "79")},
                {"exp_labels": labels("n2", "1", "48"), "exp_annotations": ann("n2", "1", "48")}]},
            # the kernel-log events are older than 5 minutes at 8m; n2's stock alert resolved at 7m
            {"eval_time": "8m", "alertname": "GpuXidCritical", "exp_alerts": []},
        ]}]}
    (tmp_path / "kernel.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", "kernel.test.yml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


#: Literals of the default fleet config that a render for another config must not contain: the identity
#: label as a matcher, a by/on/without list member, an Alertmanager equal/group_by entry or a template
#: variable; the default selectors; the default runbook base.
_DEFAULT_LITERALS = (
    re.compile(r'\bnode(!=|=~|!~|=)"'),                      # a matcher on node
    re.compile(r"\b(by|on|without|ignoring) \(([^)]*\b)?node\b"),  # grouping / joining on node
    re.compile(r"\$labels\.node\b"),                         # alert templates
    re.compile(r"\{\{\s*node\s*\}\}|\$node\b"),               # dashboard legends and variables
    re.compile(r"(equal|group_by):\s*\[[^\]]*\bnode\b"),      # Alertmanager (flow style)
    re.compile(r"^\s*-\s*node\s*$", re.M),                   # Alertmanager (block style list item)
    re.compile(re.escape('job=~"dcgm|.*dcgm-exporter.*"')),
    re.compile(re.escape('job=~"vllm|.*vllm.*"')),
    re.compile(re.escape("http://127.0.0.1:9097/runbooks")),
    re.compile(re.escape("http://127.0.0.1:3000/d/")),
)


def test_a_non_default_fleet_config_reaches_every_generated_file():
    """Every generated file (all rule files, alertmanager.yml, dashboards) is rendered from the fleet
    config: with another identity label, selectors and runbook base, no default literal is left, and
    each rule file and Alertmanager's config uses the new identity label."""
    cfg = parse_fleet({"identity_label": "k8s_node",
                       "selectors": {"dcgm": 'job="gpu-operator/nvidia-dcgm-exporter"', "vllm": 'service=~"llm-.*"'},
                       "runbook_base": "https://runbooks.example", "dashboard_base": "https://grafana.example"})
    rendered = render_all(cfg)
    rule_files = {p.name for p in (ROOT / "prometheus" / "rules").glob("*.yml")}
    assert {Path(k).name for k in rendered if k.startswith("prometheus/rules/")} == rule_files
    left = {}
    for rel, text in rendered.items():
        hits = [pat.pattern for pat in _DEFAULT_LITERALS if pat.search(text)]
        if hits:
            left[rel] = hits
    assert left == {}, "default fleet-config literals in a non-default render"
    for rel, text in rendered.items():
        if rel.startswith("prometheus/rules/") and not rel.endswith("slo.yml"):  # slo: per model, no identity
            assert "k8s_node" in text, rel
        if rel.startswith("prometheus/rules/"):
            assert "https://runbooks.example/runbooks/" in text, rel
    assert "k8s_node" in rendered["alertmanager/alertmanager.yml"]


def test_fleet_selectors_take_braces_and_defaults_come_from_the_type():
    cfg = parse_fleet({"selectors": {"dcgm": '{job="a", namespace=~"gpu-.*"}'},
                       "runbook_base": "https://runbooks.example/base/"})
    assert cfg.dcgm_selector == 'job="a", namespace=~"gpu-.*"'
    assert cfg.runbook_base == "https://runbooks.example/base"
    assert parse_fleet({}) == parse_fleet(None) == FleetConfig()


def test_a_field_error_in_a_fleet_file_names_the_file(tmp_path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("selectors:\n  vllm: 'job=vllm'\n")
    with pytest.raises(FleetConfigError, match=r"^--fleet .*fleet\.yaml: selectors\.vllm: "):
        load_fleet(bad)
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(FleetConfigError, match="not a UTF-8 text file"):
        load_fleet(bad, "--fleet (or GPUOBS_FLEET_CONFIG)")


@pytest.mark.parametrize("make_out", ["file", "dir_in_place_of_a_folder"])
def test_render_into_a_place_that_cannot_take_it_writes_nothing(tmp_path, capsys, make_out):
    out = tmp_path / "out"
    if make_out == "file":
        out.write_text("x")
    else:
        out.mkdir()
        (out / "alertmanager").write_text("a file where a folder goes")
    assert cli_run(["rules", "render", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "nothing was written" in err and "Traceback" not in err
    if make_out != "file":
        assert sorted(p.name for p in out.iterdir()) == ["alertmanager"]


def test_the_families_blind_without_identity_are_those_without_degraded_twins():
    """families.identity_join (doctor: blind without the identity label) holds exactly for the families
    none of whose alerts has a degraded twin (gpu_rules.degrade); fleet-wide ones (the SLOs) read none."""
    from gpuobs.mixin.families import FAMILIES

    twin: dict[str, bool] = {}
    for text in _texts(FleetConfig()).values():
        for r in (r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r):
            twin[r["alert"]] = twin.get(r["alert"], False) or '"identity_source", "instance"' in r["expr"]
    for fam in FAMILIES:
        if fam.fleet_wide:
            assert not fam.identity_join and not any(twin.get(a, False) for a in fam.alerts), fam.name
            continue
        assert fam.identity_join == (not any(twin[a] for a in fam.alerts)), fam.name


@pytest.mark.parametrize("label", ["instance", "job", "gpu", "xid"])
def test_an_identity_label_the_rules_use_for_something_else_is_refused(label):
    """instance names the target of the degraded alerts (gpu_rules.FALLBACK_IDENTITY): as the identity every
    degraded twin would read `instance="", instance!=""` and never fire (attack review)."""
    with pytest.raises(FleetConfigError, match=f"identity_label: '{label}' already means something else"):
        parse_fleet({"identity_label": label})
