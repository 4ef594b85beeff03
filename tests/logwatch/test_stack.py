"""Dev-stack wiring without starting anything: drill variants where logwatch runs, the per-node
agent command lines and GPU maps, and the Prometheus job."""

from __future__ import annotations

import yaml

from gpuobs.drills.catalogue import DRILLS, kernel_log_variant, xid_drill
from gpuobs.exporter.sim.gpu import H100_SXM
from gpuobs.exporter.sim.identity import gpu_identity
from gpuobs.logwatch.identity import load_map_file
from gpuobs.stack import supervisor
from gpuobs.stack.render import Ports, render_prometheus


def test_kernel_log_variants_of_the_xid_drills():
    x = kernel_log_variant(DRILLS["xid"])
    assert [(e.alertname, e.receiver, e.labels) for e in x.expect] == [
        ("GpuKernelXidCritical", "page", {"gpu": "0", "xid": "48"})]
    assert "GpuXidCritical" in x.allowed
    assert x.fire_deadline_s == DRILLS["xid"].fire_deadline_s  # no hold for memory codes any more
    gm = kernel_log_variant(DRILLS["gpu-missing"])
    assert [(e.alertname, e.labels) for e in gm.expect] == [("GpuFallenOffBus", {"gpu": "6"})]
    assert {"GpuMissing", "ServingEngineDown"} <= gm.allowed
    ecc = kernel_log_variant(DRILLS["ecc-dbe"])
    assert [e.alertname for e in ecc.expect] == ["GpuEccDoubleBitError"]
    assert {"GpuKernelXidCritical", "GpuKernelXidWarning"} <= ecc.allowed
    assert kernel_log_variant(DRILLS["thermal"]) == DRILLS["thermal"]
    assert kernel_log_variant(x) == x  # idempotent
    assert kernel_log_variant(xid_drill(13)).expect[0].alertname == "GpuKernelXidWarning"


def test_logwatch_specs_and_gpu_maps(tmp_path):
    cfg = supervisor.StackConfig(run_dir=tmp_path, nodes=2, gpus=4, seed=3, ports=Ports(logwatch_base=0))
    nodes = [("gpu-node-00", 19450), ("gpu-node-01", 19451)]
    specs, checks, urls = supervisor._logwatch_specs(cfg, tmp_path, nodes)
    assert list(specs) == list(checks) == ["logwatch-0", "logwatch-1"] and len(urls) == 2
    argv = specs["logwatch-1"]
    assert "logwatch" in argv
    assert "--source" in argv and argv[argv.index("--source") + 1] == "sim"
    assert argv[argv.index("--url") + 1] == "http://127.0.0.1:19451"
    assert argv[argv.index("--hostname") + 1] == "gpu-node-01"
    gmap = load_map_file(tmp_path / "logwatch" / "gpu-node-01-gpus.csv")
    ident = gpu_identity(3, 1, 2, H100_SXM.name)
    assert gmap[ident.pci_bus_id].gpu == "2" and gmap[ident.pci_bus_id].uuid == ident.uuid
    targets = yaml.safe_load((tmp_path / "prometheus" / "targets" / "logwatch-nodes.json").read_text())
    assert [t["labels"] for t in targets] == [{"node": "gpu-node-00"}, {"node": "gpu-node-01"}]
    assert [t["targets"][0] for t in targets] == [u.removeprefix("http://").removesuffix("/metrics") for u in urls]


def test_prometheus_config_scrapes_logwatch(tmp_path):
    path = render_prometheus(tmp_path, Ports(), [("gpu-node-00", 9400)], [], "http://127.0.0.1:9097")
    jobs = {sc["job_name"]: sc for sc in yaml.safe_load(path.read_text())["scrape_configs"]}
    assert jobs["logwatch"]["file_sd_configs"][0]["files"] == [str(tmp_path / "prometheus" / "targets" / "logwatch-*.json")]
