"""Driver upgrades in the simulator: the driver catalogue (visible), the hidden per-model driver profiles
(latency, Xid rate, health check), the installed vs running driver, and the install-driver node action
on the Node (simulated time) and through POST /admin/node."""

from __future__ import annotations

import dataclasses

import pytest
import requests

from gpuobs.exporter.sim.actions import NodeActionError, NodeStateError
from gpuobs.exporter.sim.behaviour import DriverProfile, driver_profile, load as load_sim, parse_driver_profiles
from gpuobs.exporter.sim.faults import FaultRequest
from gpuobs.exporter.sim.gpu import L40S
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.reference import drivers as drv
from gpuobs.reference.releases import CatalogueError
from tests.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def run(node: Node, seconds: float, step: float = 1.0) -> None:
    for _ in range(int(seconds / step)):
        node.advance(step)


def drained(node: Node) -> Node:
    node.cordon("gpuobs")
    node.drain()
    run(node, 60)
    assert node.status()["drained"]
    return node


# ---- catalogue ----------------------------------------------------------------------------------------
def test_packaged_catalogue():
    cat = drv.load()
    assert cat.default == "550.54.15"
    assert list(cat.drivers) == ["550.54.15", "570.172.08", "570.195.03", "575.57.08"]
    assert cat.get("570.172.08") == drv.Driver("570.172.08", 570, "12.8", "Tue Jul  8 18:31:33 UTC 2025")
    assert {v: d.cuda for v, d in cat.drivers.items()} == {"550.54.15": "12.4", "570.172.08": "12.8",
                                                          "570.195.03": "12.8", "575.57.08": "12.9"}
    with pytest.raises(KeyError, match="unknown driver version '999.1.1'; known: 550.54.15, 570.172.08"):
        cat.get("999.1.1")


@pytest.mark.parametrize("text, fragment", [
    ("drivers: [", "cannot read it as YAML"),
    ("default: x\n", "needs a non-empty 'drivers' mapping"),
    ('drivers: {"570": {cuda: "12.8"}}', "driver '570': the version must look like 570.172.08"),
    ('drivers: {"570.172.08": "12.8"}', "driver 570.172.08: must be a mapping"),
    ('drivers: {"570.172.08": {cuda: "12.8", url: x}}', "unknown field 'url'"),
    ('drivers: {"570.172.08": {}}', "field 'cuda' must be a CUDA version string"),
    ('drivers: {"570.172.08": {cuda: "cu128"}}', "field 'cuda' must be a CUDA version string"),
    ('drivers: {"570.172.08": {cuda: "13.0"}}', "field 'cuda' must be the highest CUDA it supports per "
                                                "cuda_driver_min.csv, 12.8; got '13.0'"),
    ('drivers: {"570.172.08": {cuda: "12.8", build: 5}}', "field 'build' must be a string"),
    ('default: "550.54.15"\ndrivers: {"570.172.08": {cuda: "12.8"}}', "field 'default' '550.54.15' is not in drivers"),
])
def test_catalogue_errors_name_the_field(tmp_path, text, fragment):
    path = tmp_path / "drivers.yaml"
    path.write_text(text)
    with pytest.raises(drv.DriverCatalogueError) as err:
        drv.load(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


# ---- hidden profiles ----------------------------------------------------------------------------------
def test_driver_profiles_per_model():
    assert driver_profile("570.195.03", "NVIDIA L40S").ttft_multiplier == 1.08
    assert driver_profile("570.195.03", "NVIDIA H100 80GB HBM3") == DriverProfile()
    assert driver_profile("575.57.08", "NVIDIA L40S").diag_fails
    assert not driver_profile("575.57.08", "NVIDIA H100 80GB HBM3").diag_fails
    assert driver_profile("570.172.08", "NVIDIA L40S") == DriverProfile() == driver_profile("1.2.3", "x")
    star = parse_driver_profiles({"600.1.1": {"*": {"xid_per_hour": 2}, "NVIDIA L40S": {}}})
    assert driver_profile("600.1.1", "NVIDIA H100 80GB HBM3", star).xid_per_hour == 2
    assert driver_profile("600.1.1", "NVIDIA L40S", star) == DriverProfile()  # the model's own entry wins


@pytest.mark.parametrize("doc, fragment", [
    ({"570.1.1": {"*": {"ttft": 1}}}, "unknown field 'ttft'"),
    ({"570.1.1": {"*": {"diag_fails": "yes"}}}, "field 'diag_fails' must be true or false"),
    ({"570.1.1": {"*": {"xid_code": 0}}}, "field 'xid_code' must be an Xid code"),
    ({"570.1.1": {"*": {"xid_per_hour": -1}}}, "field 'xid_per_hour' must be between 0"),
    ({"570.1.1": ["*"]}, "must map GPU model names"),
])
def test_driver_profile_errors(doc, fragment):
    with pytest.raises(CatalogueError, match=fragment):
        parse_driver_profiles(doc)


def test_regressing_driver_scales_ttft_and_itl_on_l40s_only():
    l40s, h100 = Node(NodeConfig(index=0, gpus=1, seed=3, model=L40S)), Node(NodeConfig(index=1, gpus=1, seed=3))
    before = (l40s.profile, h100.profile)
    for node in (l40s, h100):
        node.inject(FaultRequest("driver", None, {"version": "570.195.03"}))
    assert l40s.profile.ttft_multiplier == pytest.approx(before[0].ttft_multiplier * 1.08)
    assert l40s.profile.itl_multiplier == pytest.approx(before[0].itl_multiplier * 1.08)
    assert h100.profile == before[1]
    # ...and the engine's TTFT follows: mean TTFT of fresh engines on each driver.
    def mean_ttft(version: str) -> float:
        n = Node(NodeConfig(index=0, gpus=1, seed=3, model=L40S, driver_version=version))
        n.restart_engine()
        run(n, 600)
        return n.engine.ttft.sum / n.engine.ttft.count
    assert mean_ttft("570.195.03") / mean_ttft("550.54.15") == pytest.approx(1.08, abs=0.04)


def test_xid_rate_emits_xids_with_kernel_log_lines():
    sim = load_sim()
    sim = dataclasses.replace(sim, driver_profiles={"570.172.08": {"NVIDIA L40S": DriverProfile(xid_per_hour=360.0,
                                                                                              xid_code=13)}})
    node = Node(NodeConfig(index=0, gpus=4, seed=5, model=L40S), sim)
    run(node, 600)
    assert not any("Xid" in ln for ln in node.kernel_log)  # not on the old driver
    drained(node).install_driver("570.172.08", 0)
    lines0 = len(node.kernel_log)
    run(node, 3600, step=5)
    xids = [ln for ln in node.kernel_log[lines0:] if "NVRM: Xid" in ln]
    assert 280 <= len(xids) <= 440  # Poisson, mean 360
    assert all("): 13, pid=" in ln for ln in xids)
    assert any(g.last_xid and g.last_xid.code == 13 for g in node.gpus)


def test_diag_fails_on_l40s_with_575_and_passes_elsewhere():
    l40s = Node(NodeConfig(index=0, gpus=2, seed=3, model=L40S, driver_version="575.57.08"))
    h100 = Node(NodeConfig(index=1, gpus=2, seed=3, driver_version="575.57.08"))
    d = l40s.diag()
    assert not d["passed"] and d["failures"][0].startswith("driver 575.57.08: health check failed on NVIDIA L40S (")
    assert h100.diag() == {"passed": True, "failures": []}
    assert Node(NodeConfig(index=0, gpus=2, seed=3, model=L40S)).diag()["passed"]


# ---- installed vs running driver ------------------------------------------------------------------------
def test_driver_fault_overrides_the_installed_driver_until_cleared():
    node = drained(Node(NodeConfig(index=0, gpus=1, seed=3)))
    node.install_driver("570.172.08", 0)
    f = node.inject(FaultRequest("driver", None, {"version": "535.104.05"}))
    assert node.driver_version == "535.104.05" and node.installed_driver == "570.172.08"
    node.clear(f.id)
    assert node.driver_version == "570.172.08"


# ---- install-driver on the node -------------------------------------------------------------------------
def test_install_driver_requires_cordoned_and_drained():
    node = Node(NodeConfig(index=0, gpus=1, seed=3))
    with pytest.raises(NodeStateError, match="is not cordoned"):
        node.install_driver("570.172.08")
    node.cordon("gpuobs")
    with pytest.raises(NodeStateError, match=r"is not drained \([0-9.]+ requests in flight\)"):
        node.install_driver("570.172.08")
    training = Node(NodeConfig(index=1, gpus=1, seed=3, role="training"))
    training.cordon("gpuobs")
    with pytest.raises(NodeStateError, match="training rank is still running"):
        training.install_driver("570.172.08")
    training.drain()
    with pytest.raises(NodeStateError, match="still writing its checkpoint"):
        training.install_driver("570.172.08")
    run(training, 40)
    assert training.install_driver("570.172.08", 5)["changed"]
    with pytest.raises(NodeActionError, match="must be one of 550.54.15, 570.172.08, 570.195.03, 575.57.08"):
        node.install_driver("580.95.05")


def test_install_driver_reloads_then_runs_the_new_driver():
    node = drained(Node(NodeConfig(index=0, gpus=2, seed=3)))
    node.inject(FaultRequest("xid", 1, {"code": 48, "repeat_s": 0.0}))
    boot, gen, finished = node.boot_id, node.engine_generation, sum(node.engine.finished.values())
    assert finished > 0
    st = node.install_driver("570.172.08", 20)
    assert st["changed"] and st["previous"] == "550.54.15" and st["down"] and st["reloading_driver"]
    assert st["driver_target"] == "570.172.08" and st["reload_remaining_s"] == 20
    assert node.exporter_unavailable and node.engine_down
    with pytest.raises(NodeStateError, match="reloading its driver"):
        node.diag()
    with pytest.raises(NodeStateError, match="reloading its driver"):
        node.install_driver("570.172.08")
    run(node, 19)
    assert node.status()["down"] and node.status()["driver_version"] == "550.54.15"
    run(node, 2)
    st = node.status()
    assert not st["down"] and not st["reloading_driver"] and not st["rebooting"]
    assert st["driver_version"] == st["installed_driver"] == "570.172.08" and st["driver_target"] == ""
    assert st["cordoned_by"] == "gpuobs" and st["boot_id"] == boot  # a reload is not a reboot
    assert st["engine_generation"] == gen + 1 and sum(node.engine.finished.values()) == 0  # counters restarted
    assert node.list_faults() == [] and node.gpus[1].last_xid is None  # the GPUs were reset
    assert node.kernel_log[-1].endswith("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.172.08  "
                                        "Tue Jul  8 18:31:33 UTC 2025")
    assert node.diag()["passed"]
    again = node.install_driver("570.172.08")
    assert again["changed"] is False and not again["down"] and again["engine_generation"] == gen + 1
    node.uncordon("gpuobs")
    assert node.install_driver("570.172.08")["changed"] is False  # idempotent without any precondition


def test_reboot_during_reload_completes_the_install():
    node = drained(Node(NodeConfig(index=0, gpus=1, seed=3)))
    node.install_driver("575.57.08", 60)
    node.reboot(5)
    run(node, 6)
    st = node.status()
    assert not st["down"] and st["installed_driver"] == "575.57.08" and not st["reloading_driver"]
    assert node.kernel_log == [node.kernel_log[0]] and "Kernel Module  575.57.08" in node.kernel_log[0]


def test_install_driver_refused_with_a_gpu_off_the_bus_or_down():
    node = drained(Node(NodeConfig(index=0, gpus=2, seed=3)))
    node.inject(FaultRequest("xid", 0, {"code": 79, "repeat_s": 0.0}))
    with pytest.raises(NodeStateError, match="fell off the bus"):
        node.install_driver("570.172.08")
    other = drained(Node(NodeConfig(index=1, gpus=1, seed=3)))
    other.inject(FaultRequest("down", None, {}))
    with pytest.raises(NodeStateError, match="is down"):
        other.install_driver("570.172.08")


# ---- over the admin API ---------------------------------------------------------------------------------
def act(url: str, body):
    return requests.post(f"{url}/admin/node", json=body, headers=AUTH, timeout=5)


@pytest.mark.parametrize("body, field, fragment", [
    ({"action": "install-driver"}, "version", "field 'version' is required for action 'install-driver' (one of "
                                              "550.54.15, 570.172.08, 570.195.03, 575.57.08)"),
    ({"action": "install-driver", "version": "580.95.05"}, "version",
     "field 'version' must be one of 550.54.15, 570.172.08, 570.195.03, 575.57.08; got '580.95.05'"),
    ({"action": "install-driver", "version": 570}, "version", "got 570"),
    ({"action": "install-driver", "version": "570.172.08", "reload_s": -1}, "reload_s",
     "field 'reload_s' must be between 0 and 3600 seconds"),
    ({"action": "install-driver", "version": "570.172.08", "reload_s": "20"}, "reload_s", "must be a number"),
    ({"action": "install-driver", "version": "570.172.08", "gpu": 0}, "gpu",
     "allowed fields: action, reload_s, version"),
    ({"action": "reboot", "version": "570.172.08"}, "version", "unknown field 'version' for action 'reboot'"),
])
def test_install_driver_validation_is_400_naming_the_field(node_server, body, field, fragment):
    url, _node = node_server
    r = act(url, body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and fragment in r.json()["error"], r.json()


def test_install_driver_over_the_admin_api(node_server):
    url, node = node_server
    st = requests.get(f"{url}/admin/node", headers=AUTH, timeout=5).json()
    assert st["driver_version"] == "550.54.15" and st["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert st["drained"] is False and st["cordoned_by"] == "" and st["draining"] is False and st["down"] is False
    r = act(url, {"action": "install-driver", "version": "570.172.08"})
    assert r.status_code == 409 and "not cordoned" in r.json()["error"]
    act(url, {"action": "cordon", "by": "gpuobs"})
    r = act(url, {"action": "install-driver", "version": "570.172.08"})
    assert r.status_code == 409 and "not drained" in r.json()["error"]
    with node.lock:
        run(node, 60)
    r = act(url, {"action": "install-driver", "version": "570.172.08", "reload_s": 10})
    assert r.status_code == 200 and r.json()["changed"] and r.json()["down"] and "570.172.08" in r.json()["detail"]
    with pytest.raises(requests.ConnectionError):  # the node is down during the reload: no page
        requests.get(f"{url}/metrics", timeout=5)
    with node.lock:
        run(node, 11)
    page = requests.get(f"{url}/metrics", timeout=5).text
    assert 'DCGM_FI_DRIVER_VERSION="570.172.08"' in page and "550.54.15" not in page
    log = requests.get(f"{url}/admin/kernel-log", headers=AUTH, timeout=5).text
    assert "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.172.08" in log
    r = act(url, {"action": "install-driver", "version": "570.172.08"})
    assert r.status_code == 200 and r.json()["changed"] is False and r.json()["driver_version"] == "570.172.08"
