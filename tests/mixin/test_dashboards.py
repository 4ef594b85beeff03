"""Structure of the Grafana dashboards (grafana/dashboards/*.json), checked without Grafana.

The committed JSON is what gpuobs/mixin/dashboards.py writes; every file parses, has a schemaVersion and a
uid; panel ids are unique; every datasource is a provisioned uid or the ``${datasource}`` variable;
every panel has a unit; every template variable is used by a panel; every alert's ``dashboard_url``
(prometheus/rules/*.yml) names an existing dashboard uid and panel id; every query parses (promtool)
and selects only metrics our exporter emits or our recording rules record.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess

import pytest
import yaml

from gpuobs.cli import run as cli_run
from tests.fakes.dashboards import (
    DASHBOARD_DIR,
    ROOT,
    RULES_DIR,
    all_panels,
    emitted_labels,
    exporter_inventory,
    load_dashboards,
    panel_targets,
    parse_label_values,
    promql_refs,
    recording_rule_names,
    variable_query,
    variables,
)

DASHBOARDS = load_dashboards()
DATASOURCES = yaml.safe_load((ROOT / "grafana/provisioning/datasources/datasources.yml").read_text())["datasources"]
PROVISIONED = {d["uid"]: d["type"] for d in DATASOURCES}
#: Metrics a panel may select that neither the exporter nor a recording rule produces, and who does.
OTHER_PRODUCERS = {"up": "Prometheus, per scrape target"}
EXPECTED = {"fleet.json": "gpuobs-fleet", "serving.json": "gpuobs-serving", "memory.json": "gpuobs-memory",
            "training.json": "gpuobs-training", "release.json": "gpuobs-release"}
URL = re.compile(r"^https?://[^/]+/d/(?P<uid>[^/?]+)(?:/(?P<slug>[^?]+))?(?:\?viewPanel=(?P<panel>\d+))?$")


def load_generator():
    return importlib.import_module("gpuobs.mixin.dashboards")


def by_uid() -> dict[str, dict]:
    return {d["uid"]: d for d in DASHBOARDS.values()}


def substituted(expr: str) -> str:
    """Grafana's variables replaced the way the query would reach Prometheus (values irrelevant here)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s").replace("$__range", "5m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def alert_dashboard_urls() -> list[tuple[str, str]]:
    out = []
    for path in sorted(RULES_DIR.glob("*.yml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            for rule in group.get("rules", []):
                url = rule.get("annotations", {}).get("dashboard_url")
                if url:
                    out.append((rule["alert"], url))
    return out


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


# ---- generated == committed -----------------------------------------------------------------------------
def test_committed_json_is_exactly_what_the_generator_writes():
    rendered = load_generator().render_all()
    assert sorted(rendered) == sorted(p.name for p in DASHBOARD_DIR.glob("*.json"))
    stale = [name for name, text in rendered.items() if (DASHBOARD_DIR / name).read_text() != text]
    assert stale == [], f"run `gpuobs rules dashboards`: {stale} differ from the generator's output"


def test_generator_check_mode_reports_a_stale_file(tmp_path, capsys):
    assert cli_run(["rules", "dashboards", "--out", str(tmp_path)]) == 0
    assert cli_run(["rules", "dashboards", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "fleet.json").write_text("{}\n")
    assert cli_run(["rules", "dashboards", "--out", str(tmp_path), "--check"]) == 1
    assert "fleet.json" in capsys.readouterr().err


# ---- per dashboard --------------------------------------------------------------------------------------
def test_every_dashboard_is_valid_json_with_uid_title_and_schema_version():
    assert {name: d["uid"] for name, d in DASHBOARDS.items()} == EXPECTED
    for name in DASHBOARDS:
        d = json.loads((DASHBOARD_DIR / name).read_text())
        assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36, name
        assert d["title"] and d["id"] is None and d["panels"], name
        assert "gpuobs" in d["tags"], name
    assert len({d["title"] for d in DASHBOARDS.values()}) == len(DASHBOARDS)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_are_unique_positive_integers(name):
    ids = [p["id"] for p in all_panels(DASHBOARDS[name])]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_datasource_is_provisioned_or_the_datasource_variable(name):
    d = DASHBOARDS[name]
    ds_vars = {v["name"]: v for v in variables(d) if v["type"] == "datasource"}
    assert set(ds_vars) == {"datasource"}
    var = ds_vars["datasource"]
    assert var["query"] == "prometheus" and PROVISIONED[var["current"]["value"]] == "prometheus"

    def refs(node, where):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if ds is not None:
                yield where, ds
            for k, v in node.items():
                yield from refs(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from refs(v, f"{where}[{i}]")

    seen = 0
    for where, ds in refs({"panels": d["panels"], "templating": d["templating"],
                           "annotations": d["annotations"]}, name):
        assert isinstance(ds, dict), f"{where}: datasource must be an object with a uid, got {ds!r}"
        uid = ds["uid"]
        if ds.get("type") == "grafana":
            assert uid == "-- Grafana --", where  # the built-in annotations & alerts query
            continue
        seen += 1
        assert uid == "${datasource}" or uid in PROVISIONED, f"{where}: uid {uid!r} is not provisioned"
        assert ds["type"] == "prometheus", where
    assert seen > 0
    # every panel and every query names its datasource (no reliance on the default)
    for p, t in panel_targets(d):
        assert p["datasource"]["uid"] == "${datasource}" and t["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_a_unit(name):
    for p in all_panels(DASHBOARDS[name]):
        if p["type"] == "row":
            continue
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert isinstance(unit, str) and unit.strip(), f"{name} panel {p['id']} {p['title']!r} has no unit"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_template_variable_is_used_by_a_panel(name):
    d = DASHBOARDS[name]
    names = [v["name"] for v in variables(d)]
    assert "datasource" in names
    panels_text = json.dumps(d["panels"])
    for var in names:
        used = re.search(r"\$\{?" + re.escape(var) + r"\b\}?|\[\[" + re.escape(var) + r"\]\]", panels_text)
        assert used, f"{name}: variable ${var} is used by no panel"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_query_variables_are_label_values_of_emitted_metrics(name, inventory):
    emitted = emitted_labels(inventory)
    for v in variables(DASHBOARDS[name]):
        if v["type"] != "query":
            continue
        assert v["datasource"]["uid"] == "${datasource}"
        sel_text, label = parse_label_values(variable_query(v))
        assert v["name"] == label, "a variable is named after the label it lists (Hostname, gpu, model_name)"
        (sel,) = promql_refs(substituted(sel_text)).selectors
        assert label in emitted[sel.name], f"{name}: ${v['name']}: {sel.name} has no label {label}"
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_targets_have_unique_ref_ids_and_select_known_metrics(name, inventory):
    emitted = emitted_labels(inventory)
    recorded = recording_rule_names()
    d = DASHBOARDS[name]
    for p in all_panels(d):
        refs = [t["refId"] for t in p.get("targets", [])]
        assert refs and len(refs) == len(set(refs)), f"{name} panel {p['id']}"
    exprs = [t["expr"] for _p, t in panel_targets(d)]
    exprs += [a["expr"] for a in d["annotations"]["list"] if "expr" in a]
    for expr in exprs:
        for metric in promql_refs(substituted(expr)).metrics():
            assert metric in emitted or metric in recorded or metric in OTHER_PRODUCERS, \
                f"{name}: {metric} is neither emitted nor recorded ({expr!r})"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_fit_the_grid_without_overlap(name):
    cells: dict[tuple[int, int], int] = {}
    for p in all_panels(DASHBOARDS[name]):
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["id"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{name}: panels {cells[(x, y)]} and {p['id']} overlap"
                cells[(x, y)] = p["id"]


def test_every_query_parses_with_promtool(tmp_path):
    assert shutil.which("promtool"), "promtool is required (make test installs it: scripts/ensure-binaries.sh)"
    rules = []
    for name, d in DASHBOARDS.items():
        exprs = [(f"{p['id']}{t['refId']}", t["expr"]) for p, t in panel_targets(d)]
        exprs += [(f"annotation{i}", a["expr"]) for i, a in enumerate(d["annotations"]["list"]) if "expr" in a]
        rules += [{"record": f"dashboard:{name.removesuffix('.json')}:{ref}", "expr": substituted(e)}
                  for ref, e in exprs]
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(rules)} rules found" in r.stdout


# ---- alert links ----------------------------------------------------------------------------------------
def test_alert_dashboard_urls_name_existing_dashboards_and_panels():
    links = alert_dashboard_urls()
    assert len(links) >= 10
    dash = by_uid()
    for alert, url in links:
        m = URL.match(url)
        assert m, f"{alert}: malformed dashboard_url {url!r}"
        assert m["uid"] in dash, f"{alert}: no dashboard with uid {m['uid']!r}"
        d = dash[m["uid"]]
        if m["slug"]:
            assert m["slug"] == slug(d["title"]), f"{alert}: slug {m['slug']!r} vs title {d['title']!r}"
        if m["panel"]:
            ids = {p["id"] for p in all_panels(d)}
            assert int(m["panel"]) in ids, f"{alert}: {m['uid']} has no panel {m['panel']}"


def test_linked_panels_show_what_their_alerts_are_about():
    """The panel an alert links to charts the alert's own signal."""
    dash = by_uid()

    def panel(uid, pid):
        return next(p for p in all_panels(dash[uid]) if p["id"] == pid)

    def exprs(uid, pid):
        return " ".join(t["expr"] for t in panel(uid, pid)["targets"])

    expectations = {("gpuobs-fleet", 1): ["DCGM_FI_DRIVER_VERSION"],  # GpuDriverSkew
                    ("gpuobs-fleet", 6): ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gpu:dcgm_throttled_time:ratio_rate2m"],
                    ("gpuobs-fleet", 7): ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                                          "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"],
                    ("gpuobs-serving", 7): ["slo:burn_rate:ratio_rate"],  # ServingErrorBudgetBurn
                    ("gpuobs-serving", 8): ["vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"],
                    ("gpuobs-memory", 2): ["gpu:pytorch_cuda_fragmentation:bytes",
                                           "gpu:pytorch_cuda_fragmentation:deriv10m"],
                    ("gpuobs-training", 1): ["training_mfu_ratio", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE"],
                    ("gpuobs-training", 2): ["rank:training_step_duration_seconds:mean5m"]}
    linked = {(URL.match(u)["uid"], int(URL.match(u)["panel"])) for _a, u in alert_dashboard_urls()
              if URL.match(u)["panel"]}
    assert linked <= set(expectations), linked - set(expectations)
    for (uid, pid), metrics in expectations.items():
        for m in metrics:
            assert m in exprs(uid, pid), f"{uid} panel {pid} should chart {m}"


# ---- content the issue asks for -------------------------------------------------------------------------
def test_fleet_dashboard_covers_missing_gpus_xid_and_the_utilisation_lie():
    fleet = by_uid()["gpuobs-fleet"]
    text = {p["id"]: " ".join(t["expr"] for t in p["targets"]) for p in all_panels(fleet)}
    # the enhanced expected-GPU count, or on a stock exporter the GPUs seen within the last hour
    assert any("gpuobs_node_expected_gpus" in e and "count by (node)" in e
               and "last_over_time(DCGM_FI_DEV_GPU_TEMP" in e for e in text.values())
    assert any("count by (err_code) (DCGM_FI_DEV_XID_ERRORS" in e for e in text.values())  # stock Xid gauge
    assert any("DCGM_EXP_XID_ERRORS_COUNT" in e and "by (xid)" in e for e in text.values())
    lie = [p for p in all_panels(fleet) if "DCGM_FI_DEV_GPU_UTIL" in text[p["id"]]
           and "DCGM_FI_PROF_SM_ACTIVE" in text[p["id"]]]
    assert lie and lie[0]["fieldConfig"]["defaults"]["unit"] == "percentunit" and "lie" in lie[0]["title"]


def test_serving_dashboard_has_quantiles_budget_and_every_burn_window():
    serving = by_uid()["gpuobs-serving"]
    text = " ".join(t["expr"] for _p, t in panel_targets(serving))
    for h in ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
              "vllm:e2e_request_latency_seconds_bucket"):
        assert f"histogram_quantile(0.99, sum by (le) (rate({h}" in text
    recorded = recording_rule_names()
    windows = {r.removeprefix("slo:burn_rate:ratio_rate") for r in recorded if r.startswith("slo:burn_rate:")}
    assert windows and all(f"slo:burn_rate:ratio_rate{w}{{" in text for w in windows)
    assert "slo:error_budget_remaining:ratio" in text and "model_name:vllm_goodput_requests:rate5m" in text


def test_release_dashboard_compares_tracks_and_annotates_stages():
    release = by_uid()["gpuobs-release"]
    for p, t in panel_targets(release):
        if "gpuobs_feature_flag_enabled" in t["expr"]:  # where each flag is on: every serving node, not a track
            assert t["expr"].startswith("sum by (flag) (") and "track" not in t["expr"], p["title"]
            continue
        assert 'track=~"canary|baseline"' in t["expr"] and "track" in t["legendFormat"] + t["expr"], p["title"]
    (stages,) = [a for a in release["annotations"]["list"] if a.get("name") == "Rollout stages"]
    assert stages["expr"] == "changes((count by (version) (gpuobs_engine_build_info))[1m:15s]) > 0"
    assert set(stages["tagKeys"].split(",")) == {"version"}
    text = " ".join(t["expr"] for _p, t in panel_targets(release))
    for metric in ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                   "vllm:e2e_request_latency_seconds_bucket", 'finished_reason="error"',
                   "DCGM_FI_DEV_POWER_USAGE", "vllm:kv_cache_usage_perc", "DCGM_FI_PROF_SM_ACTIVE"):
        assert metric in text, metric


@pytest.fixture(scope="module")
def inventory():
    return exporter_inventory()


def test_dashboards_group_by_the_identity_label_never_by_hostname():
    for name, d in DASHBOARDS.items():
        text = json.dumps({"panels": d["panels"], "templating": d["templating"]})
        assert "Hostname" not in text, f"{name}: groups or filters by dcgm-exporter's Hostname"
    names = {v["name"] for d in DASHBOARDS.values() for v in variables(d)}
    assert "node" in names


def test_dashboards_follow_the_fleet_configs_identity_and_selectors():
    from gpuobs.mixin.dashboards import render_all
    from gpuobs.core.fleet import parse_fleet

    cfg = parse_fleet({"identity_label": "k8s_node", "selectors": {"dcgm": 'job="gpu-telemetry"'}})
    fleet = json.loads(render_all(cfg)["fleet.json"])
    assert {v["name"] for v in variables(fleet)} >= {"k8s_node", "gpu"}
    exprs = [t["expr"] for _p, t in panel_targets(fleet)]
    assert any('up{job="gpu-telemetry", k8s_node=~"$k8s_node"}' in e for e in exprs)
    assert not any("$node" in e or "by (node" in e for e in exprs)


def test_queries_over_recording_rules_do_not_select_scrape_labels():
    """Recording rules keep only the GPU's identity labels (node, gpu, UUID, ...): a panel that selects
    a recorded series by job (the DCGM selector) would show no data."""
    recorded = recording_rule_names()
    for name, d in DASHBOARDS.items():
        for p, t in panel_targets(d):
            for m in re.finditer(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", t["expr"]):
                if m.group(1) in recorded:
                    assert "job" not in m.group(2), f"{name} panel {p['id']}: {m.group(0)}"
