"""Live: the compose stack for real, air-gapped (run by ``make test-compose``, scripts/test-compose.sh).

The images are local (``make images``: Debian root filesystems + a wheelhouse; ``pull_policy: never``),
the stack runs under its own Compose project on free loopback ports with the drill profile's rules
(rendered into the test's directory and mounted through GPUOBS_RULES_DIR). Checks, with traffic only
to 127.0.0.1 and the Docker socket:

- every container is healthy and Prometheus scrapes every node container over the internal network;
- the Xid drill pages across containers: the fault is injected in the node-0 container (``docker
  exec``), Prometheus in its container fires GpuXidCritical, Alertmanager (in the pager's namespace)
  delivers it to the pager container, and it resolves after the clear; at the same time the node-down
  drill stops the node-1 container: exactly GpuExporterDown pages, ServingEngineDown is inhibited,
  and the page resolves once the container is started again;
- the backend network is internal as Docker reports it, the node containers are on it only and have
  no default route (``ip route get`` to an off-host address fails in the route lookup: no packet);
- every published port binds 127.0.0.1 only, in Docker's port table and in the host's listening
  sockets;
- ``down --volumes`` leaves no container, network or volume of the project, and no listener.

Skipped unless GPUOBS_COMPOSE_TEST=1 (``make test`` leaves it to ``make test-compose``), and skipped
with the reason where the Docker engine cannot run at all (GPUOBS_COMPOSE_SKIP, set by the script).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests

from gpuobs.drills import runner as drill
from gpuobs.stack import compose
from gpuobs.stack.ports import free_port_range
from gpuobs.stack.render import render_rules

pytestmark = [pytest.mark.live, pytest.mark.compose]

if os.environ.get("GPUOBS_COMPOSE_SKIP"):
    pytest.skip(f"compose stack test skipped: Docker cannot run here: {os.environ['GPUOBS_COMPOSE_SKIP']}",
                allow_module_level=True)
if os.environ.get("GPUOBS_COMPOSE_TEST") != "1":
    pytest.skip("the compose stack test runs with `make test-compose` (Docker engine, images)",
                allow_module_level=True)

LABEL = "com.docker.compose.project"


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"docker {' '.join(args)}: {proc.stderr.strip()}"
    return proc.stdout


def project_objects(project: str) -> dict[str, list[str]]:
    f = f"label={LABEL}={project}"
    return {kind: docker(*cmd, "--filter", f, "--format", "{{.Name}}" if kind != "containers" else "{{.Names}}").split()
            for kind, cmd in (("containers", ("ps", "-a")), ("networks", ("network", "ls")),
                              ("volumes", ("volume", "ls")))}


def loopback_listeners() -> dict[int, set[str]]:
    """Listening TCP sockets of this host: port -> local addresses (hex decoded for IPv4; IPv6 raw)."""
    out: dict[int, set[str]] = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(path).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            addr, port = local.split(":")
            if len(addr) == 8:
                addr = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
            out.setdefault(int(port, 16), set()).add(addr)
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    run = tmp_path_factory.mktemp("compose-run")
    base = free_port_range(3)
    ports = {"GPUOBS_PROMETHEUS_PORT": base, "GPUOBS_ALERTMANAGER_PORT": base + 1, "GPUOBS_PAGER_PORT": base + 2}
    project = f"gpuobs-test-{os.getpid()}"
    rules = run / "rules"
    render_rules(rules, f"http://127.0.0.1:{base + 2}/runbooks", "drill")
    env = {**os.environ, **{k: str(v) for k, v in ports.items()},
           "GPUOBS_RULES_DIR": str(rules), "GPUOBS_FRONT_BRIDGE": f"gpuobs-t{os.getpid() % 10**7}"}
    t0 = time.time()
    state = compose.up(run, project, env, profile="drill")
    state["up_s"] = time.time() - t0
    state["published"] = sorted(ports.values())
    try:
        yield state
    finally:
        if compose.load_state(run):  # a test failed before test_down_leaves_nothing_behind
            compose.down(run, volumes=True)


@pytest.fixture(scope="module")
def drills(stack):
    """xid on node-0 and node-down on node-1, at once (as `make drills` runs its lanes)."""
    claims = drill.Claims()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        state = compose.load_stack_state(Path(stack["run_dir"]))
        futs = {name: pool.submit(drill.run_drill, state, name, claims) for name in ("xid", "node-down")}
        return {name: f.result() for name, f in futs.items()}


def test_every_container_is_healthy_and_every_node_is_scraped(stack):
    for name in stack["components"].values():
        health = docker("inspect", "-f", "{{.State.Health.Status}}", name["container"]).strip()
        assert health == "healthy", name
    prom = stack["urls"]["prometheus"]
    deadline = time.time() + 60
    while time.time() < deadline:
        targets = requests.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        dcgm = sorted((t["labels"]["node"], t["health"]) for t in targets if t["labels"]["job"] == "dcgm")
        if dcgm == [(f"gpu-node-0{i}", "up") for i in range(4)]:
            break
        time.sleep(1)
    assert dcgm == [(f"gpu-node-0{i}", "up") for i in range(4)]
    r = requests.get(f"{prom}/api/v1/query", params={"query": "count(DCGM_FI_DEV_GPU_TEMP)"}, timeout=5).json()
    assert r["data"]["result"][0]["value"][1] == "32"
    # The images are Debian's builds, the versions the native stack runs.
    info = requests.get(f"{prom}/api/v1/status/buildinfo", timeout=5).json()["data"]
    assert info["version"].startswith("2.42.")


def test_xid_fault_in_a_node_container_pages_at_the_pager_container(stack, drills):
    res = drills["xid"]
    assert res.ok, (res.problems, res.unexpected)
    out = res.alerts[0]
    assert (out.alertname, out.receiver) == ("GpuXidCritical", "page")
    assert out.runbook_url.startswith(stack["urls"]["pager"] + "/runbooks/")
    # The page is in the pager container's database, for node-0 (its `node` identity label).
    pages = requests.get(f"{stack['urls']['pager']}/api/pages", params={"limit": 1000}, timeout=5).json()["pages"]
    assert any(a["labels"]["alertname"] == "GpuXidCritical" and a["labels"]["node"] == "gpu-node-00"
               for p in pages for a in p["alerts"])


def test_stopping_a_node_container_pages_once_and_resolves_when_it_starts(stack, drills):
    res = drills["node-down"]
    assert res.ok, (res.problems, res.unexpected)
    assert res.faults[0]["id"] == compose.ComposeAdmin.STOPPED_ID
    assert [(o.alertname, o.receiver) for o in res.alerts] == [("GpuExporterDown", "page")]
    pages = requests.get(f"{stack['urls']['pager']}/api/pages", params={"limit": 1000}, timeout=5).json()["pages"]
    engine_pages = [p for p in pages for a in p["alerts"] if a["labels"]["alertname"] == "ServingEngineDown"]
    assert not engine_pages, "ServingEngineDown should be inhibited by GpuExporterDown"
    # The container is back, healthy.
    deadline = time.time() + 60
    while docker("inspect", "-f", "{{.State.Health.Status}}", stack["containers"][1]).strip() != "healthy":
        assert time.time() < deadline, "node-1 did not become healthy again after docker start"
        time.sleep(1)


def test_backend_is_internal_and_nodes_have_no_route_out(stack, drills):
    project = stack["project"]
    nets = {n["Name"]: n for n in json.loads(docker("network", "inspect", f"{project}_backend", f"{project}_front"))}
    assert nets[f"{project}_backend"]["Internal"] is True
    front = nets[f"{project}_front"]
    assert front["Internal"] is False
    assert front["Options"]["com.docker.network.bridge.enable_ip_masquerade"] == "false"
    for name in stack["containers"]:  # node-1 included: its restart went through the entry point again
        attached = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", name))
        assert list(attached) == [f"{project}_backend"], name
        routes = docker("exec", name, "cat", "/proc/net/route").splitlines()[1:]
        assert routes and not [r for r in routes if r.split()[1] == "00000000"], f"{name} has a default route: {routes}"
        v6 = docker("exec", name, "sh", "-c", "cat /proc/net/ipv6_route 2>/dev/null || true").splitlines()
        assert not [r for r in v6 if r.split()[0] == "0" * 32 and r.split()[1] == "00" and r.split()[9] != "lo"], name
        # A route lookup only: no packet is sent. 192.0.2.1 is TEST-NET-1 (RFC 5737).
        proc = subprocess.run(["docker", "exec", name, "ip", "-4", "route", "get", "192.0.2.1"],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0 and "unreachable" in proc.stderr.lower(), (name, proc.stdout, proc.stderr)


def test_every_published_port_binds_loopback_only(stack):
    published = set()
    for svc, c in stack["components"].items():
        ports = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Ports}}", c["container"])) or {}
        for target, bindings in ports.items():
            for b in bindings or []:
                assert b["HostIp"] == "127.0.0.1", (svc, target, b)
                published.add(int(b["HostPort"]))
    assert published == set(stack["published"])
    listening = loopback_listeners()
    for port in published:
        assert listening.get(port) == {"127.0.0.1"}, (port, listening.get(port))


def test_down_leaves_nothing_behind(stack, drills):
    project = stack["project"]
    assert project_objects(project)["containers"]
    compose.down(Path(stack["run_dir"]), volumes=True)
    assert project_objects(project) == {"containers": [], "networks": [], "volumes": []}
    listening = loopback_listeners()
    assert not [p for p in stack["published"] if p in listening], "a published port still listens after down"
    assert compose.load_state(Path(stack["run_dir"])) is None
