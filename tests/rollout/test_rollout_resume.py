"""``kill -9`` of a real controller process mid-stage, then ``resume``: no finished stage is redeployed.

The fleet is three real node servers (gpuobs.exporter.server.NodeServer) in this process; each
records the deploy calls its admin API receives. The controller runs in a child process
(tests/fakes/rollout_child.py) through the real admin client and file_sd relabelling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.render import write_targets

REPO = Path(__file__).resolve().parents[2]
TOKEN = "resume-test-token"


@pytest.fixture
def fleet_run(tmp_path):
    """Three node servers and a run directory describing them; yields (run, {hostname: [deployed versions]})."""
    servers, calls = [], {}
    for i in range(3):
        node = Node(NodeConfig(index=i, gpus=1, seed=3))
        calls[node.hostname] = []
        real = node.deploy
        node.deploy = lambda v, real=real, log=calls[node.hostname]: (log.append(v), real(v))[1]
        srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node))
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
    hosts = [s.node.hostname for s in servers]
    ports = [s.server_address[1] for s in servers]
    (tmp_path / "admin-token").write_text(TOKEN)
    (tmp_path / "stack.json").write_text(json.dumps({
        "run_dir": str(tmp_path), "nodes": 3, "training_nodes": 0, "hostnames": hosts,
        "token_file": str(tmp_path / "admin-token"), "components": {"exporter": {"pid": 1, "argv": ["x"]}},
        "urls": {"prometheus": "http://127.0.0.1:9", "alertmanager": "http://127.0.0.1:9", "pager": "http://127.0.0.1:9",
                 "nodes": [f"http://127.0.0.1:{p}/metrics" for p in ports]}}))
    write_targets(tmp_path, "dcgm", [(h, p, {}) for h, p in zip(hosts, ports)])
    write_targets(tmp_path, "vllm", [(h, p, {"env": "test"}) for h, p in zip(hosts, ports)])
    yield tmp_path, calls
    for s in servers:
        s.shutdown()
        s.server_close()


def _child(run: Path, mode: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.fakes.rollout_child", str(run), mode], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def test_kill_9_mid_stage_and_resume_continues_without_redeploying(fleet_run):
    run, calls = fleet_run
    proc = _child(run, "start", run / "start.log")
    store = RolloutStore(run / "rollout.sqlite")
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:  # wait until stage 2 has been looked at twice
            rec = store.latest()
            st = store.stage(rec.id, 1) if rec else None
            if st is not None and st.status == "analysing" and st.looks >= 2:
                break
            assert proc.poll() is None, (run / "start.log").read_text()
            time.sleep(0.05)
        else:
            pytest.fail("stage 2 never reached: " + (run / "start.log").read_text())
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    rec = store.latest()
    assert (rec.state, rec.stage) == ("Canary", 1)
    assert calls == {"gpu-node-00": ["1.5.0"], "gpu-node-01": ["1.5.0"], "gpu-node-02": []}
    lock = RunLock(run)
    assert lock.acquire(), "the killed controller's lock must be free"
    lock.release()
    looks_before = store.stage(rec.id, 1).looks

    done = _child(run, "resume", run / "resume.log")
    assert done.wait(30) == 0, (run / "resume.log").read_text()
    assert "final Succeeded" in (run / "resume.log").read_text()
    rec = store.get(rec.id)
    assert rec.state == "Succeeded"
    assert calls == {"gpu-node-00": ["1.5.0"], "gpu-node-01": ["1.5.0"], "gpu-node-02": ["1.5.0"]}
    assert [(d["hostname"], d["version"], d["purpose"]) for d in store.deploys(rec.id)] == [
        ("gpu-node-00", "1.5.0", "stage 1"), ("gpu-node-01", "1.5.0", "stage 2"), ("gpu-node-02", "1.5.0", "stage 3")]
    assert store.stage(rec.id, 1).looks == looks_before + 1  # resumed the same stage, one more look
    assert [t["to_state"] for t in store.transitions(rec.id)] == [
        "Pending", "CompatChecked", "Canary", "Canary", "Promoting", "Succeeded"]
    # labels restored exactly as they were (the extra label kept, no track left behind)
    groups = json.loads((run / "prometheus" / "targets" / "vllm-nodes.json").read_text())
    assert [g["labels"] for g in groups] == [{"node": h, "Hostname": h, "env": "test"} for h in calls]
