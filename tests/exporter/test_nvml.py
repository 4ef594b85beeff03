"""NVML source against a fake ``pynvml``: values, units, omissions, Xids, labels, page validity, server."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.core.errors import InputError
from gpuobs.exporter.collectors import dcgm as collmod
from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.exposition import CONTENT_TYPE, render
from gpuobs.exporter.nvml import fields as nvml_fields
from gpuobs.exporter.nvml.check import parse_page
from gpuobs.exporter.nvml.serve import main_nvml, make_server
from gpuobs.exporter.nvml.source import NvmlCollector
from gpuobs.exporter.sim import faults
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.reference import xid as xidcat
from tests.conftest import free_port_range
from tests.fakes import pynvml as fake

DCGM_ORDER = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(state: fake.FakeState | None = None, xid_code: int | None = 48, **kw):
    mod, st = fake.make_fake_pynvml(state)
    clock = Clock()
    col = NvmlCollector(mod, hostname="gpu-node-07", clock=clock, **kw)
    if xid_code is not None:
        st.events.append(fake.xid_event(mod, 0, xid_code))
    return col, mod, st, clock


def page(col: NvmlCollector) -> str:
    return render(col.collect())


def by_gpu(text: str, name: str) -> dict[str, tuple[dict[str, str], str]]:
    """gpu index -> (labels, raw value) of metric ``name``."""
    return {labels.get("gpu", ""): (labels, raw) for n, labels, raw in parse_page(text) if n == name}


def value(text: str, name: str, gpu: str) -> str:
    return by_gpu(text, name)[gpu][1]


def test_values_units_and_conversions():
    col, mod, st, _ = make()
    text = page(col)
    assert value(text, "DCGM_FI_DEV_POWER_USAGE", "0") == "351.200000"      # 351200 mW -> W, six decimals
    assert value(text, "DCGM_FI_DEV_POWER_USAGE", "1") == "72.450000"
    assert value(text, "DCGM_FI_DEV_FB_USED", "0") == "40000"               # bytes // MiB
    assert value(text, "DCGM_FI_DEV_FB_RESERVED", "0") == "535"
    assert value(text, "DCGM_FI_DEV_FB_FREE", "0") == str(81_559 - 535 - 40_000 - 1)  # 123456 B used spill
    assert value(text, "DCGM_FI_DEV_FB_USED", "1") == "1"
    assert value(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "0") == str(0x64)   # SW_POWER_CAP|SW_THERMAL|HW_THERMAL
    assert value(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "1") == "1"         # GPU_IDLE
    assert value(text, "DCGM_FI_DEV_THERMAL_VIOLATION", "0") == "2750000123"   # ns, untouched
    assert value(text, "DCGM_FI_DEV_POWER_VIOLATION", "0") == "1500000000"
    assert value(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0") == "123456789"
    assert value(text, "DCGM_FI_DEV_SM_CLOCK", "0") == "1980"
    assert value(text, "DCGM_FI_DEV_SM_CLOCK", "1") == "345"
    assert value(text, "DCGM_FI_DEV_MEM_CLOCK", "0") == "2619"
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", "0") == "87"
    assert value(text, "DCGM_FI_DEV_MEM_COPY_UTIL", "0") == "41"
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", "1") == "39"
    assert value(text, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0") == "7"
    ecc = {n: value(text, n, "0") for n in ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")}
    assert ecc == {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "3", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "0",
                   "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "12", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "1"}
    assert value(text, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "0") == "2"
    assert value(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "0") == "1"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "0") == "0"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1") == "1"
    # NVLink: 4 active links on GPU 0 -> CRC_FLIT 1+2+3+4, REPLAY 2 per link; GPU 1 has none.
    assert value(text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "0") == "10"
    assert value(text, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "0") == "8"
    assert "1" not in by_gpu(text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    assert value(text, "gpuobs_node_expected_gpus", "") == "2"
    assert value(text, "gpuobs_exporter_collector_success", "") == "1"


def test_not_supported_fields_are_omitted_per_gpu_and_prof_never_invented():
    col, *_ = make()
    text = page(col)
    assert value(text, "DCGM_FI_DEV_MEMORY_TEMP", "0") == "55"
    assert "1" not in by_gpu(text, "DCGM_FI_DEV_MEMORY_TEMP")        # GPU 1 raised NotSupported
    assert set(by_gpu(text, "DCGM_FI_DEV_ENC_UTIL")) == {"0"}         # GPU 1 has no encoder
    assert set(by_gpu(text, "DCGM_FI_DEV_GPU_TEMP")) == {"0", "1"}
    assert "DCGM_FI_PROF_" not in text
    assert "gpuobs_exporter_collector_errors_total" not in text       # not-supported is not an error


def test_field_value_not_supported_return_code_is_omitted_too():
    col, *_ = make(fake.FakeState(mem_temp_raises=False))
    text = page(col)
    assert set(by_gpu(text, "DCGM_FI_DEV_MEMORY_TEMP")) == {"0"}
    assert value(text, "gpuobs_exporter_collector_success", "") == "1"


def test_xid_last_value_never_resets_and_window_count_slides():
    col, mod, st, clock = make(xid_code=48)
    text = page(col)
    labels, raw = by_gpu(text, "DCGM_FI_DEV_XID_ERRORS")["0"]
    assert raw == "48" and labels["err_code"] == "48" and labels["err_msg"] == xidcat.message(48)
    assert not labels["err_msg"].startswith("Xid 48 (not in")        # the catalogue knows Xid 48
    labels1, raw1 = by_gpu(text, "DCGM_FI_DEV_XID_ERRORS")["1"]
    assert (raw1, labels1["err_code"], labels1["err_msg"]) == ("0", "0", "No Error")
    counts = [(lb, raw) for n, lb, raw in parse_page(text) if n == "DCGM_EXP_XID_ERRORS_COUNT"]
    assert [(lb["gpu"], lb["xid"], lb["window_size_in_ms"], raw) for lb, raw in counts] == [("0", "48", "300000", "1")]
    assert list(counts[0][0])[-2:] == ["window_size_in_ms", "xid"]

    clock.t += 100
    st.events.append(fake.xid_event(mod, 0, 48))
    assert col.poll_events() == 1                                     # the server's poller thread path
    clock.t += 250                                                    # first 48 is 350 s old, second 250 s
    text = page(col)
    assert [raw for n, lb, raw in parse_page(text) if n == "DCGM_EXP_XID_ERRORS_COUNT"] == ["1"]
    clock.t += 60                                                     # both out of the 300 s window
    text = page(col)
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in text
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", "0") == "48"         # last Xid stays

    st.events.append(fake.xid_event(mod, 0, 79))
    text = page(col)
    labels, raw = by_gpu(text, "DCGM_FI_DEV_XID_ERRORS")["0"]
    assert raw == "79" and labels["err_msg"] == xidcat.message(79)


def test_label_order_help_and_type_match_the_simulated_collector():
    col, *_ = make()
    nvml_text = page(col)
    sim_node = Node(NodeConfig(index=7, gpus=2, seed=1))
    for gpu in (0, 1):  # the simulated exporter prints an Xid series only after an Xid (dcgm-exporter 4.4+)
        sim_node.inject(faults.validate({"kind": "xid", "gpu": gpu, "code": 13}, 2))
    sim_text = render(DcgmCollector(sim_node, profile="recommended").collect())
    nvml_first = {n: list(lb) for n, lb, _ in reversed(parse_page(nvml_text))}
    sim_first = {n: list(lb) for n, lb, _ in reversed(parse_page(sim_text))}
    assert nvml_first["DCGM_FI_DEV_GPU_TEMP"] == sim_first["DCGM_FI_DEV_GPU_TEMP"] == DCGM_ORDER
    assert nvml_first["DCGM_FI_DEV_XID_ERRORS"] == sim_first["DCGM_FI_DEV_XID_ERRORS"] == DCGM_ORDER + [
        "err_code", "err_msg"]
    labels = by_gpu(nvml_text, "DCGM_FI_DEV_GPU_TEMP")["0"][0]
    assert labels == {"gpu": "0", "UUID": "GPU-0a1b2c3d-0000-4000-8000-000000000001",
                      "pci_bus_id": "00000000:18:00.0", "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
                      "Hostname": "gpu-node-07", "DCGM_FI_DRIVER_VERSION": "550.54.15"}
    meta = re.compile(r"^# (HELP|TYPE) (\S+) (.*)$", re.M)
    nvml_meta = {(k, n): v for k, n, v in meta.findall(nvml_text)}
    sim_meta = {(k, n): v for k, n, v in meta.findall(sim_text)}
    shared = set(nvml_meta) & set(sim_meta)
    assert len(shared) >= 20
    assert {k: nvml_meta[k] for k in shared} == {k: sim_meta[k] for k in shared}


def test_field_table_matches_the_simulated_contract():
    sim = {name: (typ, integer, hlp) for name, typ, integer, hlp, *_ in collmod.DCGM_FIELDS}
    mine = {name: (typ, integer, hlp) for name, typ, integer, hlp in nvml_fields.FIELDS}
    assert {n: sim[n] for n in mine if n in sim} == {n: mine[n] for n in mine if n in sim}
    missing = {n for n in sim if n not in mine}
    assert {n for n in missing if not n.startswith("DCGM_FI_PROF_")} == set(nvml_fields.OMITTED)
    assert not [n for n in mine if n.startswith("DCGM_FI_PROF_")]


def test_hostname_label_case_is_configurable():
    col, *_ = make(hostname_label="hostname")
    text = page(col)
    assert 'hostname="gpu-node-07"' in text and "Hostname=" not in text


def test_page_parses_with_prometheus_client():
    col, *_ = make()
    fams = {f.name: f for f in text_string_to_metric_families(page(col))}
    assert fams["DCGM_FI_DEV_GPU_TEMP"].type == "gauge" and len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 2
    assert fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert fams["DCGM_FI_DEV_POWER_USAGE"].samples[0].value == pytest.approx(351.2)


#: promtool lint messages that come from dcgm-exporter's own names (kept for compatibility).
NAMING_LINT = re.compile(r"^(\S+) (counter metrics should have \"_total\" suffix"
                         r"|label names should be written in 'snake_case' not 'camelCase'"
                         r"|metric names should be written in 'snake_case' not 'camelCase'"
                         r"|metric name should not include type 'counter')$")


def promtool_check(text: str) -> tuple[int, list[str]]:
    """Exit code and output lines of ``promtool check metrics`` fed ``text``."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (make test installs it: scripts/ensure-binaries.sh)"
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return res.returncode, [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]


def test_promtool_check_metrics_only_naming_warnings():
    col, *_ = make()
    rc, lines = promtool_check(page(col))
    assert rc in (0, 3), lines                                   # 1 = parse error, 3 = lint problems only
    assert not [ln for ln in lines if "parsing error" in ln or "error while linting" in ln], lines
    unexpected = [ln for ln in lines if not NAMING_LINT.match(ln)]
    assert unexpected == [], unexpected
    assert all(NAMING_LINT.match(ln).group(1).startswith("DCGM_") for ln in lines)  # never our gpuobs_* names
    print("promtool lint warnings:", *sorted(set(lines)), sep="\n  ")


def test_promtool_reports_a_broken_page_as_a_parse_error():
    rc, lines = promtool_check('DCGM_FI_DEV_GPU_TEMP{gpu="0" 1\n')   # guards the check above
    assert rc == 1 and any("parsing error" in ln for ln in lines)


def test_other_errors_are_counted_and_do_not_break_the_page():
    col, mod, st, _ = make()
    st.fail[("nvmlDeviceGetPowerUsage", 1)] = fake.NVMLError_Unknown()
    st.fail[("nvmlDeviceGetTotalEccErrors", 0)] = fake.NVMLError_NoPermission()
    text = page(col)
    assert set(by_gpu(text, "DCGM_FI_DEV_POWER_USAGE")) == {"0"}
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", "1") == "39"
    assert value(text, "gpuobs_exporter_collector_success", "") == "0"
    errs = {(lb["gpu"], lb["nvml_call"]): raw for n, lb, raw in parse_page(text)
            if n == "gpuobs_exporter_collector_errors_total"}
    assert errs == {("1", "nvmlDeviceGetPowerUsage"): "1", ("0", "nvmlDeviceGetTotalEccErrors"): "4"}
    st.fail.clear()
    text = page(col)
    assert value(text, "gpuobs_exporter_collector_success", "") == "1"   # per scrape; the counter stays
    assert 'nvml_call="nvmlDeviceGetPowerUsage"' in text


def test_lost_gpu_vanishes_but_expected_gpus_stays():
    col, mod, st, _ = make()
    st.fail[("nvmlDeviceGetClockInfo", 1)] = fake.NVMLError_GpuIsLost()
    text = page(col)
    assert set(by_gpu(text, "DCGM_FI_DEV_GPU_TEMP")) == {"0"}
    assert set(by_gpu(text, "DCGM_FI_DEV_XID_ERRORS")) == {"0"}
    assert value(text, "gpuobs_node_expected_gpus", "") == "2"


def test_old_binding_names_and_memory_v1_fallback():
    mod, st = fake.make_fake_pynvml()
    del mod.nvmlDeviceGetCurrentClocksEventReasons, mod.nvmlMemory_v2, mod.nvmlDeviceGetRemappedRows
    col = NvmlCollector(mod, hostname="h")
    text = page(col)
    assert value(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "0") == str(0x64)   # ThrottleReasons name
    assert value(text, "DCGM_FI_DEV_FB_USED", "0") == str(40_000 + 535)       # v1 used includes reserved
    assert "DCGM_FI_DEV_FB_RESERVED" not in text
    assert "REMAPPED_ROWS" not in text
    assert value(text, "gpuobs_exporter_collector_success", "") == "1"


def test_close_frees_events_and_shuts_nvml_down():
    col, mod, st, _ = make()
    col.close()
    col.close()
    assert st.shutdowns == 1
    with pytest.raises(RuntimeError):
        col.collect()


# ---- NVML unusable -> clear message, exit 2 -------------------------------------------------------
def test_main_nvml_library_not_found_returns_2():
    mod, st = fake.make_fake_pynvml(fake.FakeState(init_error=fake.NVMLError_LibraryNotFound()))
    with pytest.raises(InputError) as ei:  # exit code 2 through gpuobs.cli
        main_nvml("127.0.0.1", 0, "Hostname", nvml_module=mod)
    err = str(ei.value)
    assert ei.value.exit_code == 2 and len(err.splitlines()) == 1 and "libnvidia-ml" in err and "driver" in err


def test_main_nvml_driver_not_loaded_and_zero_gpus_return_2():
    mod, _ = fake.make_fake_pynvml(fake.FakeState(init_error=fake.NVMLError_DriverNotLoaded()))
    with pytest.raises(InputError) as ei:
        main_nvml("127.0.0.1", 0, "Hostname", nvml_module=mod)
    assert "driver is not loaded" in str(ei.value)
    mod, st = fake.make_fake_pynvml(fake.FakeState(gpus=[]))
    with pytest.raises(InputError) as ei:
        main_nvml("127.0.0.1", 0, "Hostname", nvml_module=mod)
    assert "no GPU" in str(ei.value)
    assert st.shutdowns == 1


def test_main_nvml_without_nvidia_ml_py_returns_2(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)           # import pynvml -> ImportError
    with pytest.raises(InputError) as ei:
        main_nvml("127.0.0.1", 0, "Hostname")
    assert "nvidia-ml-py is not installed" in str(ei.value)


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


@pytest.fixture
def served():
    col, mod, st, clock = make()
    srv = make_server("127.0.0.1", 0, col)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv, st
    srv.shutdown()
    srv.server_close()


def test_server_metrics_health_and_a_failing_collect(served, monkeypatch):
    base, srv, st = served
    code, ctype, body = get(base + "/metrics")
    assert code == 200 and ctype == CONTENT_TYPE
    assert "DCGM_FI_DEV_GPU_TEMP{" in body and "gpuobs_exporter_scrapes_total" in body
    code, _, body = get(base + "/health")
    assert code == 200 and json.loads(body)["gpus"] == 2
    real = srv.collector.collect
    monkeypatch.setattr(srv.collector, "collect", lambda: (_ for _ in ()).throw(RuntimeError("nvml wedged")))
    code, _, body = get(base + "/metrics")
    assert code == 500 and "nvml wedged" in body
    monkeypatch.setattr(srv.collector, "collect", real)
    code, _, body = get(base + "/metrics")
    assert code == 200 and value(body, "gpuobs_exporter_scrapes_total", "") == "3"
    assert get(base + "/nope")[0] == 404


def test_concurrent_scrapes_are_safe(served):
    base, srv, st = served
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: get(base + "/metrics"), range(64)))
    assert all(code == 200 for code, _, _ in results)
    assert all(len(by_gpu(body, "DCGM_FI_DEV_GPU_TEMP")) == 2 for _, _, body in results)
    assert srv.scrapes == 64


def test_main_nvml_serves_until_stopped():
    mod, st = fake.make_fake_pynvml()
    port = free_port_range(1)
    stop = threading.Event()
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(main_nvml("127.0.0.1", port, "Hostname", mod, stop)))
    t.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            code, _, body = get(f"http://127.0.0.1:{port}/metrics")
            break
        except OSError:
            assert time.monotonic() < deadline, "exporter did not come up"
            time.sleep(0.05)
    assert code == 200 and "DCGM_FI_DEV_POWER_USAGE" in body
    stop.set()
    t.join(10)
    assert result == [0] and st.shutdowns == 1
