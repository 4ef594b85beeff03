"""Live: the native stack with the real Prometheus and Alertmanager, the Xid drill end to end."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from gpuobs.stack import drill, supervisor
from gpuobs.stack.render import Ports
from tests.conftest import free_port_range

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = free_port_range(8)
    ports = Ports(prometheus=base, alertmanager=base + 1, pager=base + 2, node_base=base + 3)
    run = tmp_path_factory.mktemp("run")
    cfg = supervisor.StackConfig(run_dir=run, nodes=3, gpus=4, ports=ports, timeout_s=90)
    out = io.StringIO()
    state = supervisor.up(cfg, out=out)
    yield state
    supervisor.down(run, out=out)
    for comp in state["components"].values():
        assert not supervisor.alive(comp["pid"], comp["argv"]), f"{comp['argv'][0]} still running after down"


def test_stack_up_reports_every_target_and_serves_dcgm_metrics(stack):
    prom = stack["urls"]["prometheus"]
    targets = requests.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    dcgm = sorted((t["labels"]["node"], t["health"]) for t in targets if t["labels"]["job"] == "dcgm")
    assert dcgm == [("gpu-node-00", "up"), ("gpu-node-01", "up"), ("gpu-node-02", "up")]
    r = requests.get(f"{prom}/api/v1/query", params={"query": "count(DCGM_FI_DEV_GPU_TEMP)"}, timeout=5).json()
    assert r["data"]["result"][0]["value"][1] == "12"
    rows = supervisor.status(Path(stack["run_dir"]))
    assert {r["component"]: r["healthy"] for r in rows} == {
        "exporter": True, "pager": True, "alertmanager": True, "prometheus": True}


def test_second_up_in_same_run_dir_is_refused(stack):
    cfg = supervisor.StackConfig(run_dir=Path(stack["run_dir"]), ports=Ports(**stack["ports"]))
    with pytest.raises(supervisor.StackError) as exc:
        supervisor.up(cfg, out=io.StringIO())
    assert exc.value.exit_code == 2 and "already running" in str(exc.value)


def test_xid_drill_pages_with_runbook_and_resolves(stack):
    res = drill.run_xid(stack, code=48, node=1, gpu=2, deadline_s=60, resolve_deadline_s=180)
    assert res.ok, res.problems
    assert res.receiver == "page"
    assert 0 < res.firing_s <= res.paged_s < 60
    assert res.resolved_s > res.cleared_s
    pager = stack["urls"]["pager"]
    pages = requests.get(f"{pager}/api/pages", params={"alertname": "GpuXidCritical"}, timeout=5).json()["pages"]
    firing = [p for p in pages if p["status"] == "firing"]
    assert len(firing) == 1 and firing[0]["channel"] == "page"
    alert = firing[0]["alerts"][0]
    labels = alert["labels"]
    assert (labels["Hostname"], labels["gpu"], labels["xid"], labels["severity"]) == ("gpu-node-01", "2", "48", "critical")
    assert labels["UUID"].startswith("GPU-") and labels["modelName"] == "NVIDIA H100 80GB HBM3"
    runbook = alert["annotations"]["runbook_url"]
    assert runbook == f"{pager}/runbooks/xid.md#gpuxidcritical"
    assert "## GpuXidCritical" in requests.get(runbook.split("#")[0], timeout=5).text
    # Only the injected GPU paged: no other alert reached the pager during the drill.
    others = {a["labels"]["alertname"] for p in requests.get(f"{pager}/api/pages", timeout=5).json()["pages"]
              for a in p["alerts"]} - {"GpuXidCritical"}
    assert others == set()


def test_cli_fault_round_trip_against_live_stack(stack):
    env = dict(os.environ, GPUOBS_RUN_DIR=stack["run_dir"])
    gpuobs = [sys.executable, "-m", "gpuobs"]
    r = subprocess.run(gpuobs + ["fault", "inject", "--node", "2", "--gpu", "3", "thermal"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    fid = r.stdout.split()[1].rstrip(":")
    r = subprocess.run(gpuobs + ["fault", "list"], env=env, capture_output=True, text=True, timeout=30)
    assert f"node 2  {fid}" in r.stdout and "thermal" in r.stdout
    r = subprocess.run(gpuobs + ["fault", "inject", "--node", "2", "--gpu", "9", "xid", "--code", "48"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "0..3" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(gpuobs + ["fault", "clear", "--node", "2", fid], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and f"cleared {fid}" in r.stdout
