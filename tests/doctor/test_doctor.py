"""gpuobs doctor over a fake Prometheus serving realistic label sets (tests/doctor/labelsets.py): per exporter
profile, host-label mode and scrape shape, the families it calls live / degraded / blind, why, the fix, and
the exit code. The same label sets go through real Prometheus in test_fake_vs_prometheus.py."""

from __future__ import annotations

import json

import pytest

from gpuobs.cli import run as cli
from gpuobs.core.errors import InputError
from gpuobs.doctor import render, run
from gpuobs.doctor.fixes import CSV_LINES
from gpuobs.mixin.families import FAMILIES
from gpuobs.promapi.prometheus import PrometheusQueryError, PrometheusUnavailable
from tests.doctor.labelsets import fleet
from tests.fakes.prometheus import FakePrometheus

SM = 'job="nvidia-dcgm-exporter"'
SM_VLLM = 'job="vllm-engine"'

STOCK = {"xid": "degraded", "gpu-missing": "degraded", "ecc": "degraded", "throttling": "degraded",
         "interconnect": "degraded", "collective-hang": "degraded", "training": "live", "memory": "degraded",
         "exporter": "live", "driver-skew": "live", "kv-cache": "live", "slo": "live"}
ALL_LIVE = {f.name: "live" for f in FAMILIES}


def doctor(ts, **kw):
    with FakePrometheus(ts) as prom:
        return run(prom.url, retries=0, **kw)


def statuses(report):
    return {f.name: f.status for f in report.families}


def family(report, name):
    return next(f for f in report.families if f.name == name)


def finding(report, code):
    found = [f for f in report.findings if f.code == code]
    assert found, f"no finding {code}; have {[f.code for f in report.findings]}"
    return found[0]


def codes(report):
    return {f.code for f in report.findings}


# ---- exporter profiles -----------------------------------------------------------------------------------
def test_stock_exporter_pages_on_stock_paths_and_names_what_is_missing():
    rep = doctor(fleet("stock"))
    assert statuses(rep) == STOCK
    assert rep.exit_code == 0 and rep.blind_paging == []
    xid = family(rep, "xid")
    assert any("DCGM_EXP_XID_ERRORS_COUNT missing (enhanced path) on all 4 DCGM targets" in w for w in xid.why)
    assert any("DCGM_FI_DEV_XID_ERRORS not seen on all 4 DCGM targets" in w and "presumed" in w for w in xid.why)
    hang = family(rep, "collective-hang")
    assert any(w.startswith("DCGM_FI_PROF_SM_ACTIVE missing (enhanced path)") for w in hang.why)
    csv = [f for f in hang.fixes if f.kind == "csv"][0]
    assert csv.text == "DCGM_FI_PROF_SM_ACTIVE, gauge, The ratio of cycles an SM has at least 1 warp assigned."
    assert "etc/default-counters.csv @ 4.5.3-4.8.2" in csv.source
    # NVLink errors: no stock field; PCIe replays keep the family degraded, not blind, and the note says so
    inter = family(rep, "interconnect")
    assert "NVLink degradation is invisible on stock" in inter.note
    assert any("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" in w for w in inter.why)
    # the throttling fix offers the violation counters and field 112 (in no shipped CSV)
    thr = [f for f in family(rep, "throttling").fixes if f.kind == "csv"][0]
    assert thr.text.splitlines() == [CSV_LINES["DCGM_FI_DEV_THERMAL_VIOLATION"], CSV_LINES["DCGM_FI_DEV_POWER_VIOLATION"],
                                     CSV_LINES["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]]
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS: in no shipped CSV" in thr.source
    mem = family(rep, "memory")
    assert "pytorch_cuda_memory_reserved_bytes missing (enhanced path) in every job" in mem.why
    assert "instrument" in {f.kind for f in mem.fixes}  # allocator metrics come from the framework
    assert not codes(rep) & {"dcgm-identity-missing", "dcgm-selector-matches-nothing", "driver-label-missing"}


def test_stock_after_an_xid_needs_no_presumption():
    rep = doctor(fleet("stock", xid={0: 48, 1: 48, 2: 48, 3: 48}))
    assert family(rep, "xid").status == "degraded"
    assert not any("presumed" in w for w in family(rep, "xid").why)


def test_helm_chart_configmap_blinds_driver_skew_only():
    rep = doctor(fleet("helm"))
    assert statuses(rep) == {**STOCK, "driver-skew": "blind"}
    assert rep.exit_code == 0  # driver skew tickets, it does not page
    skew = family(rep, "driver-skew")
    assert any("DCGM_FI_DRIVER_VERSION label missing" in w and "on all 4 DCGM targets" in w for w in skew.why)
    assert [f.text for f in skew.fixes if f.kind == "csv"] == ["DCGM_FI_DRIVER_VERSION, label, Driver Version"]
    assert finding(rep, "driver-label-missing").severity == "warning"


def test_recommended_counters_make_every_family_live():
    rep = doctor(fleet("recommended"))
    assert statuses(rep) == ALL_LIVE
    assert rep.exit_code == 0 and rep.csv_lines() == []
    assert all(not f.why for f in rep.families)


def test_mixed_fleet_is_degraded_where_the_recommended_file_is_missing():
    from tests.doctor.labelsets import fields
    rep = doctor(fleet("recommended", per_node_fields={1: fields("stock"), 2: fields("stock")}))
    hang = family(rep, "collective-hang")
    assert hang.status == "degraded"
    assert any("on 2 of 4 DCGM targets: gpu-node-01, gpu-node-02" in w for w in hang.why)


def test_legacy_clock_throttle_name_still_satisfies_the_enhanced_throttling_path():
    from tests.doctor.labelsets import fields
    legacy = tuple("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" if f == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" else f
                   for f in fields("stock") + ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",))
    rep = doctor(fleet("stock", per_node_fields={i: legacy for i in range(4)}))
    assert family(rep, "throttling").status == "live"


def test_mig_instances_without_gpu_util_and_fb_degrade_the_families_that_read_them():
    rep = doctor(fleet("stock", mig={1: 3}))
    mem = family(rep, "memory")
    assert mem.status == "degraded"
    assert any("DCGM_FI_DEV_FB_USED absent on 3 of 3 MIG instances on all 4 DCGM targets" in w for w in mem.why)
    assert any("DCGM_FI_DEV_GPU_UTIL absent on 3 of 3 MIG instances" in w for w in family(rep, "throttling").why)
    # on the recommended profile the allocator metrics carry memory; SM_ACTIVE carries the hang detection
    rec = doctor(fleet("recommended", mig={1: 3}))
    assert family(rec, "memory").status == "live" and family(rec, "collective-hang").status == "live"


# ---- host label and identity --------------------------------------------------------------------------------
def test_localhost_hostname_everywhere_is_flagged_but_node_keeps_identity():
    rep = doctor(fleet("stock", host="localhost"))
    assert statuses(rep) == STOCK
    f = finding(rep, "hostname-localhost")
    assert f.severity == "warning" and "on all 4 DCGM targets" in f.message and "gpuobs groups by 'node'" in f.message


def test_localhost_hostname_as_identity_merges_nodes():
    rep = doctor(fleet("stock", host="localhost"), identity_label="Hostname")
    assert finding(rep, "hostname-localhost").severity == "error"
    assert finding(rep, "dcgm-identity-not-unique").severity == "error"
    assert family(rep, "gpu-missing").status == "degraded"
    assert any("identity Hostname='localhost' shared with another target" in w for w in family(rep, "xid").why)
    assert any(fx.kind == "identity" for fx in finding(rep, "hostname-localhost").fixes)


def test_pod_name_hostname_is_named_with_the_node_name_fix():
    rep = doctor(fleet("stock", host="pod"))
    f = finding(rep, "hostname-pod-name")
    assert "changes on every exporter rollout" in f.message and "on all 4 DCGM targets" in f.message
    assert "fieldPath: spec.nodeName" in f.fixes[0].text
    assert statuses(rep) == STOCK
    as_ident = doctor(fleet("stock", host="pod"), identity_label="Hostname")
    assert any("exporter pod's name" in w for w in family(as_ident, "exporter").why)
    assert family(as_ident, "exporter").status == "degraded"


def test_lowercase_hostname_and_absent_host_label():
    rep = doctor(fleet("stock", host="hostname"))
    assert finding(rep, "hostname-lowercase").severity == "info"
    assert statuses(rep) == STOCK
    assert finding(doctor(fleet("stock", host="hostname"), identity_label="Hostname"),
                   "hostname-lowercase").severity == "error"
    assert finding(doctor(fleet("stock", host="none")), "hostname-absent").severity == "info"


def test_no_identity_label_degrades_the_pages_and_blinds_only_the_families_that_need_it():
    """Without the identity label the alerts' degraded twins still page, named by the target (issue 32):
    the paging families are degraded, not blind (exit 0); the families whose alerts all read per-node
    recordings (throttling, driver skew) are blind. The identity finding stays an error."""
    rep = doctor(fleet("stock", node_label=False))
    st = statuses(rep)
    assert st["gpu-missing"] == "degraded" and st["kv-cache"] == "degraded"
    assert st["xid"] == "degraded" and st["exporter"] == "degraded"
    assert st["throttling"] == "blind" and st["driver-skew"] == "blind"
    assert rep.exit_code == 0 and rep.blind_paging == []
    f = finding(rep, "dcgm-identity-missing")
    assert f.severity == "error" and "on all 4 DCGM targets" in f.message
    titles = " | ".join(fx.title for fx in f.fixes)
    assert "ServiceMonitor" in titles and "PodMonitor" in titles and "file_sd" in titles
    assert any("identity label 'node' missing or empty on all 4 DCGM targets: its pages name the scrape target "
               "(instance), not the node" == w for w in family(rep, "gpu-missing").why)
    assert any(w.startswith("identity label 'node' missing or empty on all 4 DCGM targets: none of the family's alerts")
               for w in family(rep, "throttling").why)
    assert finding(rep, "vllm-identity-missing").fixes == []  # the snippets are given once
    sm = next(fx for fx in f.fixes if fx.title.startswith("ServiceMonitor"))
    assert "- sourceLabels: [__meta_kubernetes_pod_node_name]\n          targetLabel: node" in sm.text


def test_two_targets_with_one_node_and_a_node_with_two_hostnames():
    ts = fleet("stock", same_node=(0, 1))
    rep = doctor(ts)
    f = finding(rep, "dcgm-identity-not-unique")
    assert "2 DCGM targets share node='gpu-node-00'" in f.message
    assert family(rep, "gpu-missing").status == "degraded"
    # one target serving two Hostname values
    ts = fleet("stock", nodes=2)
    ts.add("DCGM_FI_DEV_GPU_TEMP", {"job": "dcgm", "instance": "10.0.0.11:9400", "node": "gpu-node-00",
                                    "gpu": "5", "Hostname": "gpu-node-00.example.com",
                                    "DCGM_FI_DRIVER_VERSION": "550.54.15"}, 40.0)
    assert "gpu-node-00 (gpu-node-00, gpu-node-00.example.com)" in finding(doctor(ts), "hostname-not-unique-per-node").message


# ---- selectors and scrape shapes ------------------------------------------------------------------------
def test_default_selectors_match_servicemonitor_job_names_like_the_rules():
    """The defaults are the fleet config's (gpuobs.core.fleet), which the shipped rules use: a
    ServiceMonitor's Service-named jobs (nvidia-dcgm-exporter, vllm-engine) match, and what remains
    is the missing node label. (A literal job="dcgm" default reported such a fleet blind, "every rule
    that uses the selector is silent", while the shipped rules were selecting it.)"""
    rep = doctor(fleet("stock", scrape="servicemonitor", node_label=False))
    codes = {f.code for f in rep.findings}
    assert not codes & {"dcgm-selector-matches-nothing", "vllm-selector-matches-nothing"}, codes
    assert "dcgm-identity-missing" in codes
    assert family(rep, "gpu-missing").status == "degraded" and family(rep, "xid").status == "degraded"
    assert family(rep, "throttling").status == "blind" and rep.exit_code == 0


def test_selectors_matching_no_target_are_blind_and_say_which_selector():
    rep = doctor(fleet("stock", scrape="servicemonitor", node_label=False), dcgm_selector='job="dcgm"',
                 vllm_selector='job="vllm"')
    st = statuses(rep)
    assert {n for n, s in st.items() if s == "blind"} == {f.name for f in FAMILIES if f.name != "training"}
    assert rep.exit_code == 1
    f = finding(rep, "dcgm-selector-matches-nothing")
    assert "job(s) nvidia-dcgm-exporter serve DCGM metrics" in f.message
    assert "--dcgm-selector 'job=\"nvidia-dcgm-exporter\"'" in f.fixes[0].text
    assert "--vllm-selector 'job=\"vllm-engine\"'" in finding(rep, "vllm-selector-matches-nothing").fixes[0].text
    assert any("selector {job=\"dcgm\"} matches no target" in w for w in family(rep, "xid").why)


def test_servicemonitor_with_right_selectors_but_no_node_relabelling():
    rep = doctor(fleet("stock", scrape="servicemonitor", node_label=False), dcgm_selector=SM, vllm_selector=SM_VLLM)
    assert family(rep, "gpu-missing").status == "degraded" and rep.exit_code == 0
    assert any("ServiceMonitor" in fx.title for fx in finding(rep, "dcgm-identity-missing").fixes)
    assert "exported_pod" in finding(rep, "exported-workload-labels").message


def test_servicemonitor_with_relabelling_matches_file_sd():
    rep = doctor(fleet("stock", scrape="servicemonitor"), dcgm_selector="{" + SM + "}", vllm_selector=SM_VLLM)
    assert statuses(rep) == STOCK and rep.exit_code == 0


def test_selector_matching_part_of_the_fleet_and_down_targets():
    ts = fleet("stock", down=(2,))
    ts.add("up", {"job": "dcgm-legacy", "instance": "10.0.1.1:9400", "node": "old-01"})
    ts.add("DCGM_FI_DEV_GPU_TEMP", {"job": "dcgm-legacy", "instance": "10.0.1.1:9400", "node": "old-01", "gpu": "0"})
    rep = doctor(ts)
    assert "dcgm-legacy" in finding(rep, "dcgm-selector-partial").message
    assert "job=~\"dcgm|dcgm-legacy\"" in finding(rep, "dcgm-selector-partial").fixes[0].text
    assert "1 of 4 DCGM targets are down" in finding(rep, "dcgm-targets-down").message
    assert family(rep, "xid").status == "degraded"


def test_training_only_fleet_can_skip_serving_families():
    ts = fleet("stock", engines=False)
    rep = doctor(ts)
    assert family(rep, "slo").status == "blind" and rep.exit_code == 1
    assert finding(rep, "no-vllm").severity == "info"
    rep = doctor(ts, skip=["kv-cache,slo"])
    assert family(rep, "slo").status == "skipped" and rep.exit_code == 0
    assert family(rep, "exporter").status == "live"  # no engine anywhere: ServingEngineDown has nothing to watch


def test_vllm_v0_metric_names_are_recognised():
    names = tuple("vllm:gpu_cache_usage_perc" if n == "vllm:kv_cache_usage_perc" else n
                  for n in ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:request_success_total",
                            "vllm:time_to_first_token_seconds_bucket"))
    rep = doctor(fleet("stock", vllm_names=names))
    kv = family(rep, "kv-cache")
    assert kv.status == "blind"
    assert any("vllm:gpu_cache_usage_perc is there instead" in w and "V0" in w for w in kv.why)


# ---- input, transport, output ---------------------------------------------------------------------------
@pytest.mark.parametrize("kw,field", [({"dcgm_selector": "job=dcgm"}, "--dcgm-selector"),
                                      ({"vllm_selector": ""}, "--vllm-selector"),
                                      ({"dcgm_selector": '__name__="up"'}, "--dcgm-selector"),
                                      ({"identity_label": "no-de"}, "--identity-label"),
                                      ({"skip": ["gpu"]}, "--skip")])
def test_bad_input_names_the_flag(kw, field):
    with pytest.raises(InputError) as exc:
        run("http://127.0.0.1:1", **kw)
    assert field in str(exc.value) and exc.value.exit_code == 2


def test_unreachable_prometheus_is_a_failure():
    with FakePrometheus(fleet()) as prom:
        url = prom.url
    with pytest.raises(PrometheusUnavailable) as exc:
        run(url, retries=0, timeout=2)
    assert exc.value.exit_code == 1


def test_rejected_query_is_an_input_error():
    def reject(endpoint, params):
        return 400, {"status": "error", "errorType": "bad_data", "error": "parse error"}
    with pytest.raises(PrometheusQueryError) as exc:
        doctor(reject)
    assert exc.value.exit_code == 2


def test_cli_text_json_and_exit_codes(capsys):
    with FakePrometheus(fleet("stock")) as prom:
        assert cli(["doctor", "--prometheus", prom.url]) == 0
        out = capsys.readouterr().out
        assert "xid" in out and "DEGRADED" in out and "summary:" in out and "(exit 0)" in out
        assert "DCGM_FI_PROF_SM_ACTIVE, gauge, The ratio of cycles an SM has at least 1 warp assigned." in out
        assert cli(["doctor", "--prometheus", prom.url, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert {f["family"]: f["status"] for f in data["families"]} == STOCK
        assert data["exit_code"] == 0 and data["identity_label"] == "node"
        assert cli(["doctor", "--prometheus", prom.url, "--dcgm-selector", "job=dcgm"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gpuobs doctor: error: --dcgm-selector") and "Traceback" not in err
    with FakePrometheus(fleet("stock", node_label=False)) as prom:  # degraded pages, exit 0
        assert cli(["doctor", "--prometheus", prom.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["blind_paging"] == []
        # a selector that matches no target blinds every paging family: exit 1
        assert cli(["doctor", "--prometheus", prom.url, "--json", "--dcgm-selector", 'job="none"']) == 1
        assert "gpu-missing" in json.loads(capsys.readouterr().out)["blind_paging"]
    assert cli(["doctor", "--prometheus", url_of_closed_port(), "--timeout", "2"]) == 1
    assert "cannot reach Prometheus" in capsys.readouterr().err


def url_of_closed_port() -> str:
    with FakePrometheus(fleet()) as prom:
        return prom.url


def test_doctor_sends_only_instant_queries():
    with FakePrometheus(fleet("stock", mig={0: 2})) as prom:
        run(prom.url, retries=0)
        assert {r["endpoint"] for r in prom.requests} == {"query"}
        assert len(prom.requests) == 10


def test_text_report_without_fixes_is_short():
    rep = doctor(fleet("stock"))
    assert "fix:" in render.text(rep) and "fix:" not in render.text(rep, fixes=False)


def test_wrong_vllm_selector_degrades_exporter_family_through_serving_engine_down():
    rep = doctor(fleet("stock", scrape="servicemonitor"), dcgm_selector=SM, vllm_selector='job="vllm"')
    exp = family(rep, "exporter")
    assert exp.status == "degraded"
    assert any("ServingEngineDown cannot fire" in w for w in exp.why)
    assert any("job=\"vllm-engine\"" in fx.text for fx in exp.fixes)
    assert family(rep, "slo").status == "blind" and rep.exit_code == 1


def test_empty_prometheus_is_blind_everywhere_and_says_nothing_is_scraped():
    from tests.fakes.prometheus import SeriesSet
    rep = doctor(SeriesSet())
    assert set(statuses(rep).values()) == {"blind"} and rep.exit_code == 1
    assert "is the exporter scraped at all?" in finding(rep, "dcgm-selector-matches-nothing").message
    assert finding(rep, "no-vllm").severity == "info"


def test_fix_csv_lines_are_well_formed_counters_file_records():
    """Each line parses as dcgm-exporter's counters format (3 comma-separated fields, a known type), names its
    own metric, and every signal of every family with a DCGM field name has one."""
    from gpuobs.doctor.fixes import NOT_IN_ANY_CSV, STOCK_FIELDS
    from tests.doctor.labelsets import RECOMMENDED_EXTRA
    from tests.doctor.labelsets import STOCK_FIELDS as STOCK_METRICS
    for metric, line in CSV_LINES.items():
        name, typ, help_text = (p.strip() for p in line.split(",", 2))
        assert name == metric and typ in ("gauge", "counter", "label") and help_text
    for f in FAMILIES:
        for s in (*f.stock, *f.enhanced):
            if s.metric.startswith("DCGM_"):
                assert s.metric in CSV_LINES, s.metric
    assert STOCK_FIELDS - {"DCGM_FI_DRIVER_VERSION"} <= set(STOCK_METRICS)
    assert NOT_IN_ANY_CSV <= set(RECOMMENDED_EXTRA)
    assert not NOT_IN_ANY_CSV & set(STOCK_METRICS)


def test_fix_csv_lines_match_the_shipped_recommended_file():
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "deploy" / "dcgm-exporter" / "recommended.csv"
    assert path.is_file(), "deploy/dcgm-exporter/recommended.csv is missing"
    shipped = {}
    for raw in path.read_text().splitlines():
        if raw.strip() and not raw.lstrip().startswith("#"):
            name, typ, help_text = (p.strip() for p in raw.split(",", 2))
            shipped[name] = f"{name}, {typ}, {help_text}"
    for metric, line in CSV_LINES.items():
        assert metric in shipped, f"{metric}: doctor asks for it, recommended.csv lacks it"
        assert shipped[metric] == line, metric  # no exception: the windowed Xid count is a gauge in both
    assert CSV_LINES["DCGM_EXP_XID_ERRORS_COUNT"].split(", ")[1] == "gauge"


def test_targets_sharing_an_identity_are_counted_apart():
    rep = doctor(fleet("stock", same_node=(0, 1)))
    gm = family(rep, "gpu-missing")
    assert any("shared with another target on 2 of 4 DCGM targets: gpu-node-00 (10.0.0.11:9400), "
               "gpu-node-00 (10.0.0.12:9400)" in w for w in gm.why), gm.why


def test_docs_example_is_the_current_output_for_the_stock_label_set():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "doctor.md").read_text()
    with FakePrometheus(fleet("stock")) as prom:
        text = render.text(run(prom.url, retries=0)).replace(prom.url, "http://prometheus.monitoring:9090")
    assert text.rstrip("\n") in doc, "docs/doctor.md's stock example is stale: regenerate it"


def test_bad_url_is_an_input_error():
    with pytest.raises(InputError) as exc:
        run("prometheus:9090")
    assert "--prometheus" in str(exc.value) and exc.value.exit_code == 2


def test_host_label_identity_with_two_values_on_one_target_is_not_unique():
    ts = fleet("stock", nodes=2)
    ts.add("DCGM_FI_DEV_GPU_TEMP", {"job": "dcgm", "instance": "10.0.0.11:9400", "node": "gpu-node-00", "gpu": "5",
                                    "Hostname": "nvidia-dcgm-exporter-b9mzt", "DCGM_FI_DRIVER_VERSION": "550.54.15"})
    rep = doctor(ts, identity_label="Hostname")
    xid = family(rep, "xid")
    assert xid.status == "degraded"
    assert any("identity Hostname='gpu-node-00|nvidia-dcgm-exporter-b9mzt' has several values on one target" in w
               for w in xid.why), xid.why
    assert family(doctor(fleet("stock", nodes=2), identity_label="Hostname"), "xid").status == "degraded"
    assert not any("identity" in w for w in family(doctor(fleet("stock", nodes=2), identity_label="Hostname"),
                                                   "xid").why)


def test_cli_fleet_config_gives_selectors_and_identity_label_flags_override_it(tmp_path, capsys):
    """``--fleet FILE``: the selectors and identity label the rules were rendered from; explicit flags win;
    a broken file is one error line, exit 2."""
    fl = tmp_path / "fleet.yaml"
    fl.write_text("identity_label: node\nselectors:\n  dcgm: 'job=\"gpu-metrics\"'\n  vllm: 'job=\"llm\"'\n")
    with FakePrometheus(fleet("stock")) as prom:
        assert cli(["doctor", "--prometheus", prom.url, "--json", "--fleet", str(fl)]) == 1
        data = json.loads(capsys.readouterr().out)
        assert data["selectors"] == {"dcgm": 'job="gpu-metrics"', "vllm": 'job="llm"'}
        assert cli(["doctor", "--prometheus", prom.url, "--json", "--fleet", str(fl),
                    "--dcgm-selector", 'job="dcgm"', "--vllm-selector", 'job="vllm"']) == 0
        assert json.loads(capsys.readouterr().out)["selectors"]["dcgm"] == 'job="dcgm"'
        fl.write_text("selectors:\n  dcgm: [\n")
        assert cli(["doctor", "--prometheus", prom.url, "--fleet", str(fl)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--fleet" in err and "not valid YAML (line 3" in err, err


def test_logwatch_reading_its_source_makes_the_xid_path_live_before_any_xid():
    """A node whose logwatch reads its kernel log has a working Xid path although it has logged no Xid
    yet (gpuobs_xid_events_total appears only with the first one): no "run gpuobs logwatch" fix."""
    rep = doctor(fleet("stock", logwatch=True))
    xid = family(rep, "xid")
    assert xid.status == "live", xid.why
    assert not any("gpuobs logwatch" in f.text for f in xid.fixes)
    assert family(doctor(fleet("stock")), "xid").status == "degraded"


def test_an_exporter_before_3_3_6_is_named_with_what_its_xid_pages_miss():
    rep = doctor(fleet("stock", xid={0: 48, 2: 13}, xid_legacy=True))
    f = finding(rep, "dcgm-exporter-before-3.3.6")
    assert f.severity == "warning" and f.targets == ["gpu-node-00", "gpu-node-02"]
    assert "on 2 of 4 DCGM targets" in f.message and "a repeat of the same code does not" in f.message
    assert not any(x.code == "dcgm-exporter-before-3.3.6" for x in doctor(fleet("stock", xid={0: 48})).findings)
