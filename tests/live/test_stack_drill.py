"""Live: the native stack with the real Prometheus and Alertmanager binaries.

One stack (drill profile: shortened `for:` and windows, see gpuobs/stack/render.py) serves the whole
module. Three drills run at once on different nodes, as `make drills` runs its lanes: the Xid drill
(issue 2's end-to-end page), node-down (exactly one page, not one per GPU), and the scrape-and-alert
check (a thermal fault fires GPUThrottling, a fragmentation fault fires KVFragmentationRisk, and no
other GPU of the fleet fires either over the same window).
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from gpuobs.drills import runner as drill
from gpuobs.drills.catalogue import DrillSpec, Expect
from gpuobs.stack import supervisor
from gpuobs.stack.render import Ports
from tests.conftest import live_stack

pytestmark = pytest.mark.live

SCRAPE_AND_ALERT = DrillSpec(
    "scrape-and-alert", "serving", 2,
    (Expect("GPUThrottling", "ticket", labels={"gpu": "1"}), Expect("KVFragmentationRisk", "ticket", labels={"gpu": "4"})),
    ({"kind": "thermal", "gpu": 1, "cooling_factor": 3.0}, {"kind": "fragmentation", "gpu": 4, "rate_mib_per_min": 1500.0}),
    allowed=frozenset({"GpuFrameworkOom"}), fire_deadline_s=240)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # logwatch off: this module proves the DCGM Xid path; tests/logwatch/test_live.py the kernel-log path.
    # Today's drill rules read enhanced fields (Xid counts, expected GPUs, SM_ACTIVE, ...): recommended profile.
    yield from live_stack(tmp_path_factory, "run", nodes=4, gpus=8, training_nodes=1, profile="drill", timeout_s=120,
                          logwatch=False, exporter_profile="recommended")


@pytest.fixture(scope="module")
def drills(stack):
    """The three drills, run concurrently; returns {name: DrillResult} plus the start time."""
    claims = drill.Claims()
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futs = {
            "xid": pool.submit(drill.run_drill, stack, "xid", claims),
            "node-down": pool.submit(drill.run_drill, stack, "node-down", claims),
            "scrape-and-alert": pool.submit(drill.run_drill, stack, "scrape-and-alert", claims, None, SCRAPE_AND_ALERT),
        }
        results = {name: f.result() for name, f in futs.items()}
    return results, t0


def test_stack_up_reports_every_target_and_serves_dcgm_metrics(stack):
    prom = stack.urls.prometheus
    targets = requests.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    dcgm = sorted((t["labels"]["node"], t["health"]) for t in targets if t["labels"]["job"] == "dcgm")
    assert dcgm == [(f"gpu-node-0{i}", "up") for i in range(4)]
    vllm = sorted(t["labels"]["node"] for t in targets if t["labels"]["job"] == "vllm")
    assert vllm == ["gpu-node-00", "gpu-node-01", "gpu-node-02"]  # the training node has no engine
    r = requests.get(f"{prom}/api/v1/query", params={"query": "count(DCGM_FI_DEV_GPU_TEMP)"}, timeout=5).json()
    assert r["data"]["result"][0]["value"][1] == "32"
    rows = supervisor.status(Path(stack.run_dir))
    assert {r["component"]: r["healthy"] for r in rows} == {
        "exporter": True, "pager": True, "alertmanager": True, "prometheus": True}


def test_second_up_in_same_run_dir_is_refused(stack):
    cfg = supervisor.StackConfig(run_dir=Path(stack.run_dir), ports=Ports(**stack.ports))
    with pytest.raises(supervisor.StackError) as exc:
        supervisor.up(cfg, out=io.StringIO())
    assert exc.value.exit_code == 2 and "already running" in str(exc.value)


def test_xid_drill_pages_with_runbook_and_resolves(stack, drills):
    res = drills[0]["xid"]
    assert res.ok, (res.problems, res.unexpected)
    out = res.alerts[0]
    assert out.receiver == "page" and 0 < out.fired_s <= out.paged_s < 60
    assert out.resolved_s > res.cleared_s
    pager = stack.urls.pager
    pages = requests.get(f"{pager}/api/pages", params={"alertname": "GpuXidCritical"}, timeout=5).json()["pages"]
    firing = [p for p in pages if p["status"] == "firing"]
    assert len(firing) == 1 and firing[0]["channel"] == "page"
    labels = firing[0]["alerts"][0]["labels"]
    assert (labels["node"], labels["gpu"], labels["xid"], labels["severity"]) == ("gpu-node-00", "0", "48", "critical")
    assert labels["UUID"].startswith("GPU-") and labels["modelName"] == "NVIDIA H100 80GB HBM3"
    runbook = firing[0]["alerts"][0]["annotations"]["runbook_url"]
    assert runbook == f"{pager}/runbooks/xid.md#gpuxidcritical"
    assert '<h2 id="gpuxidcritical">GpuXidCritical</h2>' in requests.get(runbook.split("#")[0], timeout=5).text  # rendered, anchored


def test_node_down_produces_exactly_one_page(stack, drills):
    results, t0 = drills
    res = results["node-down"]
    assert res.ok, (res.problems, res.unexpected)
    pages = requests.get(f"{stack.urls.pager}/api/pages", params={"limit": 1000}, timeout=5).json()["pages"]
    node1 = [p for p in pages if p["channel"] == "page" and p["status"] == "firing" and p["received_at"] >= t0
             and any(a["labels"].get("node") == "gpu-node-01" for a in p["alerts"])]
    assert len(node1) == 1, node1
    assert [a["labels"]["alertname"] for a in node1[0]["alerts"]] == ["GpuExporterDown"]
    # Its serving engine went down with it, but the rule leaves a node whose DCGM exporter is down too to
    # GpuExporterDown (an Alertmanager inhibition alone races when both fire after the same `for:`). It may
    # be pending for one evaluation when the engine's scrape fails before the exporter's; it never fires.
    r = requests.get(f"{stack.urls.prometheus}/api/v1/query",
                     params={"query": 'max_over_time(ALERTS{alertname="ServingEngineDown",alertstate="firing",node="gpu-node-01"}[15m])'},
                     timeout=5).json()["data"]["result"]
    assert r == []


def test_thermal_and_fragmentation_fire_only_on_the_faulted_gpus(stack, drills):
    res = drills[0]["scrape-and-alert"]
    assert res.ok, (res.problems, res.unexpected)
    r = requests.get(f"{stack.urls.prometheus}/api/v1/query", params={
        "query": 'max_over_time(ALERTS{alertname=~"GPUThrottling|KVFragmentationRisk",alertstate="firing"}[15m])'},
        timeout=5).json()["data"]["result"]
    fired = sorted((x["metric"]["alertname"], x["metric"]["node"], x["metric"]["gpu"]) for x in r)
    assert fired == [("GPUThrottling", "gpu-node-02", "1"), ("KVFragmentationRisk", "gpu-node-02", "4")]


def test_cli_fault_round_trip_against_live_stack(stack):
    env = dict(os.environ, GPUOBS_RUN_DIR=stack.run_dir)
    gpuobs = [sys.executable, "-m", "gpuobs"]
    r = subprocess.run(gpuobs + ["fault", "inject", "--node", "2", "--gpu", "3", "pcie-replay"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    fid = r.stdout.split()[1].rstrip(":")
    r = subprocess.run(gpuobs + ["fault", "list"], env=env, capture_output=True, text=True, timeout=30)
    assert f"node 2  {fid}" in r.stdout and "pcie-replay" in r.stdout
    r = subprocess.run(gpuobs + ["fault", "inject", "--node", "2", "--gpu", "9", "xid", "--code", "48"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "0..7" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(gpuobs + ["fault", "clear", "--node", "2", fid], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and f"cleared {fid}" in r.stdout


def test_run_directory_is_private(stack):
    """Issue 12: the run dir is 0700 and nothing in it is readable by group or others (tokens, pages,
    stack.json, logs, Prometheus and Alertmanager data)."""
    import stat

    run = Path(stack.run_dir)
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    exposed = [str(p) for p in run.rglob("*") if not p.is_symlink() and p.exists() and p.stat().st_mode & 0o077]
    assert exposed == []
