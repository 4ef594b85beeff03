"""Rule placement (gpuobs.mixin.placement): fleet-wide vs node-local from the PromQL syntax tree, on
hand-written expressions and on the shipped rule files (both profiles), and the split files load in
promtool (shards) and vmalert -dryRun (fleet)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from gpuobs.mixin.placement import FLEET, SHARD, PlacementError, classify, for_metricsql, place
from gpuobs.mixin.profile import PROFILES, profile_rules


@pytest.mark.parametrize("expr", [
    'max by (node, gpu) (rate(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{node!=""}[10m])) > 0',
    "sum without (gpu) (DCGM_FI_DEV_POWER_USAGE)",  # keeps node
    "up{job='dcgm'} == 0",
    "count by (job, instance) (DCGM_FI_DEV_GPU_TEMP{node=''})",  # one target's own series
    "x unless on (node, pci_bus_id) y",
    "x and ignoring (gpu) y",
    "vector(1)",
    "histogram_quantile(0.99, sum by (node, le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
    "x > on () 3",  # a scalar side: no vector match
])
def test_node_local_expressions_go_to_the_shards(expr):
    v = classify(expr, "node")
    assert (v.placement, v.reason) == (SHARD, "")


@pytest.mark.parametrize("expr, why", [
    ("count by (modelName) (count by (modelName, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP))",
     "count by (modelName)"),
    ("sum without (node, instance) (rate(vllm:request_success_total[5m]))", "sum without (node, instance)"),
    ("sum(rate(x[5m]))", "sum(...) without by/without"),
    ("topk(3, DCGM_FI_DEV_GPU_TEMP)", "topk(...)"),
    ("x / on (training_job) group_left y", "vector match on (training_job)"),
    ("x / ignoring (node, instance) y", "vector match ignoring (node, instance)"),
    ("max_over_time(sum by (model_name) (x)[10m:1m])", "sum by (model_name)"),
])
def test_aggregating_away_the_identity_makes_a_rule_fleet_wide(expr, why):
    v = classify(expr, "node")
    assert v.placement == FLEET and why in v.reason


def test_a_bad_expression_is_an_error_naming_the_rule():
    text = "groups:\n- name: g\n  rules:\n  - alert: Broken\n    expr: sum by (node (x)\n"
    with pytest.raises(PlacementError, match=r"f\.yml: group 'g': Broken: PromQL does not parse"):
        place({"f.yml": text}, "node")


def test_dependencies_and_constants_follow_the_fleet_rules():
    text = yaml.safe_dump({"groups": [{"name": "g", "interval": "1m", "rules": [
        {"record": "pool:x:sum", "expr": "sum by (pool) (x)"},
        {"record": "pool:objective", "expr": "vector(0.99)"},
        {"alert": "PoolLow", "expr": "pool:x:sum < 3"},
        {"alert": "NodeHot", "expr": "max by (node) (t) > 90"},
    ]}, {"name": "meta", "rules": [{"alert": "Watchdog", "expr": "vector(1)"}]}]})
    p = place({"r.yml": text}, "node")
    assert p.names(FLEET) == ["pool:x:sum", "pool:objective", "PoolLow"]
    assert p.names(SHARD) == ["NodeHot", "Watchdog"]
    fleet = yaml.safe_load(p.fleet["r.yml"])["groups"]
    shard = yaml.safe_load(p.shard["r.yml"])["groups"]
    assert [(g["name"], g.get("interval")) for g in fleet] == [("g", "1m")]  # interval kept in both halves
    assert [(g["name"], g.get("interval")) for g in shard] == [("g", "1m"), ("meta", None)]


@pytest.mark.parametrize("profile", PROFILES)
def test_shipped_rules_split_where_the_design_needs_them(profile):
    p = place(profile_rules("http://127.0.0.1:9097", profile), "node")
    fleet, shard = set(p.names(FLEET)), set(p.names(SHARD))
    # Fleet-wide: driver skew across a pool, SLO burn across serving nodes, training-job medians.
    assert {"GpuDriverSkew", "ServingErrorBudgetBurn", "TrainingStraggler", "training_job:training_mfu:avg",
            "slo:error_budget_remaining:ratio", "slo:objective:ratio"} <= fleet
    # Node-local: every Xid, hardware and health page and the per-node serving recordings.
    assert {"GpuXidCritical", "GpuKernelXidCritical", "GpuExporterDown", "GpuEccDoubleBitError", "ServingEngineDown",
            "TrainingCollectiveHang", "Watchdog", "node:vllm_request_errors:ratio_rate5m",
            "GpuTelemetryWithoutIdentity"} <= shard
    assert not fleet & shard
    # Every rule is placed exactly once.
    total = sum(len(g["rules"]) for t in profile_rules("http://127.0.0.1:9097", profile).values()
                for g in yaml.safe_load(t)["groups"])
    assert len(p.rules) == total == len(p.names(FLEET)) + len(p.names(SHARD))
    assert all(r.reason for r in p.rules if r.placement == FLEET)


def test_split_files_load_in_promtool_and_vmalert(tmp_path):
    p = place(profile_rules("http://127.0.0.1:9097", "drill"), "node")
    for where, files in (("shard", p.shard), ("fleet", p.fleet)):
        (tmp_path / where).mkdir()
        for name, text in files.items():
            (tmp_path / where / name).write_text(text)
    shard_files = sorted(str(f) for f in (tmp_path / "shard").glob("*.yml"))
    res = subprocess.run([shutil.which("promtool") or "promtool", "check", "rules", *shard_files],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    vmalert = shutil.which("vmalert")
    assert vmalert, "vmalert missing: `make binaries` installs Debian's victoria-metrics"
    res = subprocess.run([vmalert, "-dryRun", f"-rule={tmp_path / 'fleet'}/*.yml", "-rule.validateTemplates"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    # A broken file makes vmalert fail, so the check above can fail.
    (tmp_path / "fleet" / "bad.yml").write_text("groups:\n- name: b\n  rules:\n  - record: x\n    expr: sum(\n")
    res = subprocess.run([vmalert, "-dryRun", f"-rule={tmp_path / 'fleet'}/*.yml"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0


def test_fleet_rules_count_counters_as_promql_does_on_victoriametrics():
    """MetricsQL's increase/rate count a young series from zero (rollupDelta); the fleet half uses
    increase_prometheus, which starts at the window's first sample as PromQL does."""
    assert for_metricsql('sum by (m) (rate(x_bucket{le="2.5", j=~"a|.*b.*"}[5m]))') == (
        'sum by (m) ((increase_prometheus(x_bucket{le="2.5", j=~"a|.*b.*"}[5m]) / 300))')
    assert for_metricsql("increase(y[1h]) / rate(z[3d])") == (
        "increase_prometheus(y[1h]) / (increase_prometheus(z[3d]) / 259200)")
    assert for_metricsql("irate(x[5m]) + rate(x[5m:1m])") == "irate(x[5m]) + rate(x[5m:1m])"  # left as written
    p = place(profile_rules("http://127.0.0.1:9097", "drill"), "node")
    fleet_text, shard_text = "".join(p.fleet.values()), "".join(p.shard.values())
    assert "increase_prometheus(" in fleet_text
    assert not re.search(r"\b(rate|increase)\((?![^()]*:)", fleet_text), "a fleet rule still uses MetricsQL's rate/increase"
    assert "increase_prometheus" not in shard_text  # the shards run PromQL as written


def test_placement_follows_the_fleet_config_identity_label():
    """On a fleet whose identity label is k8s_node, keeping k8s_node is node-local and keeping only node is
    not (the hashmod key is the fleet config's identity label)."""
    assert classify("sum by (k8s_node, gpu) (DCGM_FI_DEV_GPU_UTIL)", "k8s_node").placement == SHARD
    assert classify("sum by (node, gpu) (DCGM_FI_DEV_GPU_UTIL)", "k8s_node").placement == FLEET
    assert classify("sum by (node, gpu) (DCGM_FI_DEV_GPU_UTIL)", "node").placement == SHARD
    assert classify("sum by (instance) (up)", "k8s_node").placement == SHARD
