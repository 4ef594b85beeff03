"""Exporter profiles against the real contract: the stock page serves exactly dcgm-exporter's default
counters (checked against tests/data/dcgm-exporter-4.5.3-4.8.2-default-counters.csv, read from
NVIDIA/dcgm-exporter at that tag), helm exactly the chart's ConfigMap, recommended exactly stock +
deploy/dcgm-exporter/recommended.csv (whose Helm values snippet carries the same list)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim import faults, profiles
from gpuobs.exporter.sim.mig import parse_mig_spec
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.reference.dcgm_exporter import CountersError, parse_counters

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "tests" / "data" / "dcgm-exporter-4.5.3-4.8.2-default-counters.csv"
RECOMMENDED = REPO / "deploy" / "dcgm-exporter" / "recommended.csv"
VALUES = REPO / "deploy" / "dcgm-exporter" / "values-recommended.yaml"
#: The fields the enhanced rule paths read, canonical names (issue 10 item 1; docs/real-fleet.md, step 2).
EXTRAS = {
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge"), ("DCGM_FI_DEV_POWER_VIOLATION", "counter"),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter"), ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"), ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter"),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter"), ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter"), ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge"),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge"), ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge"), ("DCGM_EXP_XID_ERRORS_COUNT", "gauge"),
}


def upstream_fields() -> set[tuple[str, str, str]]:
    """(field, type, help) of every uncommented line of the upstream default counters file."""
    rows = set()
    for line in UPSTREAM.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, mtype, help_text = (part.strip() for part in line.split(",", 2))
            rows.add((name, mtype, help_text))
    return rows


def served_page(node: Node, **kw) -> str:
    """The page exactly as the exporter's HTTP server serves it (server self-metrics included)."""
    srv = NodeServer(("127.0.0.1", 0), node, "t", DcgmCollector(node, **kw))
    try:
        return srv.metrics_page().decode()
    finally:
        srv.server_close()


def page_fields(text: str) -> set[tuple[str, str, str]]:
    """(name, type, help) of the page's DCGM families, plus (label field, "label", "") for label fields on every series."""
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    out = {(n, types[n], helps[n]) for n in types if n.startswith("DCGM_")}
    series = [s for f in text_string_to_metric_families(text) if f.name.startswith("DCGM_") for s in f.samples]
    label_fields = {k for k in series[0].labels if k.startswith("DCGM_FI_")}
    assert all(label_fields <= set(s.labels) for s in series)
    return out | {(k, "label", "") for k in label_fields}


def names(fields: set[tuple[str, ...]]) -> set[tuple[str, str]]:
    return {(f[0], f[1]) for f in fields}


@pytest.fixture
def node_after_xid() -> Node:
    """A serving node whose GPU 1 had an Xid: every field the profile has is on the page."""
    node = Node(NodeConfig(index=1, gpus=2, seed=3))
    node.inject(faults.validate({"kind": "xid", "gpu": 1, "code": 48}, 2))
    return node


def test_the_reference_list_is_the_26_default_fields():
    fields = upstream_fields()
    assert len(fields) == 26 and ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version") in fields


def test_stock_page_serves_exactly_the_default_counters_and_nothing_of_gpuobs(node_after_xid):
    text = served_page(node_after_xid)  # stock is the default
    expected = {(n, t, h if t != "label" else "") for n, t, h in upstream_fields()}
    assert page_fields(text) == expected
    # Nothing else on the page: no gpuobs_* (expected GPUs, self-metrics), no pytorch_*, no DCGM_EXP_*.
    assert set(re.findall(r"^# TYPE (\S+) ", text, re.M)) == {n for n, t, _ in upstream_fields() if t != "label"}


def test_helm_page_is_the_charts_configmap(node_after_xid):
    text = served_page(node_after_xid, profile="helm")
    stock = {(n, t) for n, t, _ in upstream_fields()}
    assert names(page_fields(text)) == stock - {("DCGM_FI_DRIVER_VERSION", "label"), ("DCGM_FI_DEV_FB_RESERVED", "gauge")}
    assert "DCGM_FI_DRIVER_VERSION" not in text and "gpuobs_" not in text


def test_recommended_page_is_stock_plus_the_shipped_csv_and_gpuobs_extras(node_after_xid):
    text = served_page(node_after_xid, profile="recommended")
    shipped = parse_counters(RECOMMENDED.read_text(), str(RECOMMENDED))
    stock = {(n, t) for n, t, _ in upstream_fields()}
    assert names(page_fields(text)) == stock | EXTRAS == {(c.name, c.type) for c in shipped}
    # The page prints the shipped file's HELP texts; part 1 of the file is upstream's, line for line.
    assert {f for f in page_fields(text) if f[1] != "label"} == {(c.name, c.type, c.help) for c in shipped
                                                                  if not c.is_label}
    assert {(c.name, c.type, c.help) for c in shipped[:26]} == upstream_fields()
    fams = {f.name for f in text_string_to_metric_families(text)}
    assert {"pytorch_cuda_memory_allocated_bytes", "pytorch_cuda_memory_reserved_bytes",
            "pytorch_cuda_memory_inactive_split_bytes", "pytorch_cuda_alloc_retries", "pytorch_cuda_ooms",
            "gpuobs_node_expected_gpus", "gpuobs_exporter_scrapes", "gpuobs_exporter_collect_duration_seconds",
            "gpuobs_exporter_collector_success"} <= fams


def test_helm_values_snippet_mounts_exactly_the_recommended_csv():
    values = yaml.safe_load(VALUES.read_text())
    assert values["customMetrics"] == RECOMMENDED.read_text()
    assert values["serviceMonitor"]["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}]


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_training_metrics_stay_on_training_nodes_in_every_profile(profile):
    training = Node(NodeConfig(index=3, gpus=2, seed=5, role="training"))
    fams = {f.name for f in text_string_to_metric_families(served_page(training, profile=profile))}
    assert {"training_step_duration_seconds", "training_steps", "training_mfu_ratio",
            "nccl_collective_duration_seconds"} <= fams
    serving = {f.name for f in text_string_to_metric_families(served_page(Node(NodeConfig(index=0, gpus=1)),
                                                                           profile=profile))}
    assert not {f for f in serving if f.startswith(("training_", "nccl_"))}


def test_legacy_clock_events_name(node_after_xid):
    legacy = DcgmCollector(node_after_xid, profile=profiles.load("recommended", "legacy"))
    canonical = DcgmCollector(node_after_xid, profile="recommended")
    from gpuobs.exporter.exposition import render

    def values(text: str, name: str) -> list[float]:
        return [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{")]
    lt, ct = render(legacy.collect()), render(canonical.collect())
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in lt and "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in ct
    assert values(lt, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == values(ct, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") != []


def test_stock_mig_instances_lack_util_and_h100_framebuffer():
    node = Node(NodeConfig(index=0, gpus=2, seed=4))
    text = served_page(node, mig=parse_mig_spec("0=1g.10gb", 2))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                 "DCGM_FI_DEV_FB_RESERVED"):
        assert {s.labels["gpu"] for s in fams[name].samples} == {"1"}, name
    assert len([s for s in fams["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples if s.labels["gpu"] == "0"]) == 7


def test_collect_interval_repeats_values_until_dcgm_samples_again():
    node = Node(NodeConfig(index=0, gpus=2, seed=9))
    coll = DcgmCollector(node, collect_interval_s=30.0)
    from gpuobs.exporter.exposition import render
    first = render(coll.collect())
    node.advance(15.0)  # a 15 s scrape later: DCGM has not updated its fields
    assert render(coll.collect()) == first
    node.inject(faults.validate({"kind": "xid", "gpu": 0, "code": 48}, 2))
    assert "DCGM_FI_DEV_XID_ERRORS" not in render(coll.collect())  # the Xid reaches the page at the next sample
    node.advance(15.0)
    second = render(coll.collect())
    assert second != first and 'err_code="48"' in second
    node.inject(faults.validate({"kind": "exporter-restart", "downtime_s": 0}, 2))
    node.advance(1.0)
    assert render(coll.collect()) != second  # a replaced exporter samples afresh, before 30 s have passed
    with pytest.raises(ValueError, match="collect_interval_s"):
        DcgmCollector(node, collect_interval_s=-1)


def test_bad_profiles_are_named():
    with pytest.raises(ValueError, match="stock, helm, recommended"):
        profiles.load("enhanced")
    with pytest.raises(ValueError, match="canonical, legacy"):
        profiles.load("stock", "old")
    odd = profiles.ExporterProfile("custom", tuple(parse_counters("DCGM_FI_DEV_BRAND, label, Device Brand\n"
                                                                  "DCGM_FI_PROF_PIPE_FP64_ACTIVE, gauge, fp64\n")))
    with pytest.raises(ValueError, match="cannot serve DCGM_FI_PROF_PIPE_FP64_ACTIVE, DCGM_FI_DEV_BRAND"):
        DcgmCollector(Node(NodeConfig(index=0, gpus=1)), profile=odd)


@pytest.mark.parametrize("text, message", [
    ("DCGM_FI_DEV_GPU_TEMP, gauge\n", "line 1: expected 3 fields"),
    ("# c\nDCGM_FI_DEV_GPU_TEMP, gage, t\n", "line 2: type 'gage'"),
    ("DCGM_FI_DEV_GPU_TEMP, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\n", "listed twice"),
])
def test_counters_file_errors_name_the_line(text, message):
    with pytest.raises(CountersError, match=message):
        parse_counters(text, "x.csv")


@pytest.mark.parametrize("argv, env, message", [
    (["exporter", "--exporter-profile", "enhanced"], {}, "--exporter-profile (GPUOBS_EXPORTER_PROFILE) must be one of"),
    (["exporter"], {"GPUOBS_EXPORTER_PROFILE": "full"}, "must be one of stock, helm, recommended; got 'full'"),
    (["exporter", "--host-label-mode", "fqdn"], {}, "Hostname, hostname, localhost, pod, none"),
    (["exporter", "--collect-interval", "-5"], {}, "--collect-interval must be >= 0"),
    (["stack", "up", "--scrape-mode", "podmonitor"], {}, "scrape mode must be one of file_sd, servicemonitor"),
])
def test_cli_names_bad_profiles_and_modes(argv, env, message, monkeypatch, capsys, tmp_path):
    from gpuobs.cli import run

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert run([*argv, *(["--run-dir", str(tmp_path / "r")] if argv[0] == "stack" else [])]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_replaced_exporter_starts_its_self_metric_counters_again():
    node = Node(NodeConfig(index=0, gpus=1))
    srv = NodeServer(("127.0.0.1", 0), node, "t", DcgmCollector(node, profile="recommended"))
    try:
        def scrapes() -> float:
            line = next(ln for ln in srv.metrics_page().decode().splitlines()
                        if ln.startswith("gpuobs_exporter_scrapes_total"))
            return float(line.rsplit(" ", 1)[1])
        assert [scrapes(), scrapes()] == [1, 2]
        node.inject(faults.validate({"kind": "exporter-restart", "downtime_s": 0}, 1))
        assert scrapes() == 1
    finally:
        srv.server_close()
