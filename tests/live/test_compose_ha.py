"""Live: the Compose profile ``ha`` for real (run by ``make test-compose``, scripts/test-compose.sh).

``gpuobs compose up --topology ha`` under its own Compose project on free loopback ports, with the
drill profile's rules: the node containers and the pager, 2 Prometheus shards x 2 replicas, a 3-member
Alertmanager cluster, VictoriaMetrics and vmalert (not the single Prometheus and Alertmanager). Checks:

- each shard's replicas scrape their share of the nodes (every node on exactly one shard, both shards
  some), all up;
- VictoriaMetrics holds one copy of every series (nodes x GPUs ``DCGM_FI_DEV_GPU_TEMP`` series, no
  ``shard``/``replica`` label, at most one sample per 5 s scrape interval: the replicas' copies deduplicated);
- every Alertmanager member sees 3 peers;
- Xid 48 injected in the node-0 container is stored by the pager exactly once, as one page;
- ``down --volumes`` leaves no container, network or volume of the project.

The members publish no port (only VictoriaMetrics and the pager do): they are read with ``docker exec
<container> wget``. Skipped unless GPUOBS_COMPOSE_TEST=1, or with the reason where Docker cannot run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests

from gpuobs.stack import compose
from gpuobs.stack.ports import free_port_range

pytestmark = [pytest.mark.live, pytest.mark.compose]

if os.environ.get("GPUOBS_COMPOSE_SKIP"):
    pytest.skip(f"compose stack test skipped: Docker cannot run here: {os.environ['GPUOBS_COMPOSE_SKIP']}",
                allow_module_level=True)
if os.environ.get("GPUOBS_COMPOSE_TEST") != "1":
    pytest.skip("the compose stack test runs with `make test-compose` (Docker engine, images)",
                allow_module_level=True)

LABEL = "com.docker.compose.project"
NODES = [f"gpu-node-0{i}" for i in range(4)]


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"docker {' '.join(args)}: {proc.stderr.strip()}"
    return proc.stdout


def get_in(container: str, url: str) -> dict:
    """GET ``url`` inside ``container`` (its own loopback) with the image's wget; the JSON reply."""
    return json.loads(docker("exec", container, "wget", "-q", "-O", "-", url))


def until(what: str, fn, timeout_s: float):
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (AssertionError, ValueError, KeyError, requests.RequestException) as exc:
            last = exc
        time.sleep(2)
    raise AssertionError(f"{what} not within {timeout_s:.0f} s; last: {last!r}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    run = tmp_path_factory.mktemp("compose-ha-run")
    base = free_port_range(4)
    ports = {"GPUOBS_PROMETHEUS_PORT": base, "GPUOBS_ALERTMANAGER_PORT": base + 1, "GPUOBS_PAGER_PORT": base + 2,
             "GPUOBS_VICTORIA_METRICS_PORT": base + 3}
    project = f"gpuobs-ha-test-{os.getpid()}"
    env = {**os.environ, **{k: str(v) for k, v in ports.items()},
           "GPUOBS_FRONT_BRIDGE": f"gpuobs-h{os.getpid() % 10**7}"}
    t0 = time.time()
    state = compose.up(run, project, env, profile="drill", topology="ha", wait_s=240)
    state["up_s"] = time.time() - t0
    print(f"compose ha profile up in {state['up_s']:.0f} s")
    try:
        yield state
    finally:
        if compose.load_state(run):
            compose.down(run, volumes=True)


def c(stack, svc: str) -> str:
    return stack["components"][svc]["container"]


def test_only_the_ha_pipeline_runs(stack):
    assert stack["topology"] == "ha"
    running = set(stack["components"])
    assert {"prometheus", "alertmanager"}.isdisjoint(running)
    assert {"victoria-metrics", "vmalert", "pager", *(f"alertmanager-{i}" for i in range(3)),
            *(f"prometheus-s{s}-r{r}" for s in range(2) for r in range(2))} <= running
    for svc in running:
        assert docker("inspect", "-f", "{{.State.Health.Status}}", c(stack, svc)).strip() == "healthy", svc


def test_each_shard_scrapes_its_share_of_the_nodes(stack):
    def shards():
        seen = {}
        for s in range(2):
            per_replica = []
            for r in range(2):
                doc = get_in(c(stack, f"prometheus-s{s}-r{r}"), "http://127.0.0.1:9090/api/v1/targets?state=active")
                ts = [t for t in doc["data"]["activeTargets"] if t["labels"]["job"] == "dcgm"]
                assert ts and all(t["health"] == "up" for t in ts), (s, r, ts)
                per_replica.append(sorted(t["labels"]["node"] for t in ts))
            assert per_replica[0] == per_replica[1], (s, per_replica)  # the twins scrape the same nodes
            seen[s] = per_replica[0]
        return seen
    seen = until("both shards scraping their nodes", shards, 90)
    assert sorted(seen[0] + seen[1]) == NODES and seen[0] and seen[1], seen


def test_victoria_metrics_holds_one_deduplicated_copy(stack):
    vm = stack["urls"]["prometheus"]

    def q(expr):
        return requests.get(f"{vm}/api/v1/query", params={"query": expr}, timeout=5).json()["data"]["result"]
    until("VictoriaMetrics holding every GPU's series", lambda: q("count(DCGM_FI_DEV_GPU_TEMP)")
          and q("count(DCGM_FI_DEV_GPU_TEMP)")[0]["value"][1] == "32", 90)
    assert not q('count({__name__=~"DCGM_FI_DEV_GPU_TEMP|up", replica=~".+"})')
    assert not q('count({__name__=~"DCGM_FI_DEV_GPU_TEMP|up", shard=~".+"})')
    # Two replicas write every sample; 1 min at a 5 s scrape interval keeps at most 13 per series.
    time.sleep(30)
    most = float(q("max(count_over_time(DCGM_FI_DEV_GPU_TEMP[1m]))")[0]["value"][1])
    assert 2 <= most <= 13, most


def test_the_alertmanager_cluster_has_three_peers(stack):
    def peers():
        out = {}
        for i in range(3):
            st = get_in(c(stack, f"alertmanager-{i}"), "http://127.0.0.1:9093/api/v2/status")["cluster"]
            out[i] = (len(st.get("peers") or []), st["status"])
        return out if all(v == (3, "ready") for v in out.values()) else None
    until("every Alertmanager seeing 3 peers", peers, 60)


def test_an_xid_pages_exactly_once_through_the_cluster(stack):
    pager = stack["urls"]["pager"]
    admin = compose.ComposeAdmin(stack["containers"][0])
    t0 = time.time()
    fault = admin.inject({"kind": "xid", "gpu": 0, "code": 48})

    def xid_pages():
        pages = requests.get(f"{pager}/api/pages", params={"limit": 1000}, timeout=5).json()["pages"]
        return [p for p in pages if any(a["labels"]["alertname"] == "GpuXidCritical" and a["status"] == "firing"
                                        and a["labels"].get("node") == "gpu-node-00" for a in p["alerts"])]
    first = until("the Xid page", xid_pages, 150)
    paged_s = time.time() - t0
    # Give every other member its turn (position x peer timeout 3 s) and the replicas' copies time to arrive.
    time.sleep(30)
    pages = xid_pages()
    admin.clear(fault["id"])
    print(f"Xid page after {paged_s:.0f} s; notifications carrying it: {len(pages)}; "
          f"pager health: {requests.get(f'{pager}/health', timeout=5).json()}")
    assert first[-1]["receiver"] == "page"
    # One page: one Alertmanager group (one pager incident), one firing episode of the alert, and no
    # notification stored twice (4 replicas x 3 members send copies; the cluster's log must dedupe them).
    # A later notification of the same group may only add alerts (another symptom of the same Xid).
    assert len({p["groupKey"] for p in pages}) == 1, pages
    xid = [a for p in pages for a in p["alerts"] if a["labels"]["alertname"] == "GpuXidCritical"]
    assert len({a["startsAt"] for a in xid}) == 1 and len({a["fingerprint"] for a in xid}) == 1, xid
    states = [frozenset((a["fingerprint"], a["status"]) for a in p["alerts"]) for p in pages]
    assert len(states) == len(set(states)), pages
    assert all("shard" not in a["labels"] and "replica" not in a["labels"] for a in xid)


def test_down_leaves_nothing_behind(stack):
    project = stack["project"]
    f = f"label={LABEL}={project}"
    assert docker("ps", "-a", "--filter", f, "--format", "{{.Names}}").split()
    compose.down(Path(stack["run_dir"]), volumes=True)
    assert docker("ps", "-a", "--filter", f, "--format", "{{.Names}}").split() == []
    assert docker("network", "ls", "--filter", f, "--format", "{{.Name}}").split() == []
    assert docker("volume", "ls", "--filter", f, "--format", "{{.Name}}").split() == []
