"""``kill -9`` of a real flag controller process mid-stage, then ``resume``: no node is flipped twice.

Three real node servers in this process evaluate the run directory's flagd file through OpenFeature
(gpuobs.flags.evaluate); the controller runs in a child process (tests/fakes/flag_rollout_child.py)
with the real flag adapter. Each node records every change of the flag it evaluates.
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
from gpuobs.flags.evaluate import FlagEvaluator
from gpuobs.flags.flagd import FlagFile
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.render import write_targets

REPO = Path(__file__).resolve().parents[2]
TOKEN = "flag-resume-token"
FLAG = "spec_decode"


@pytest.fixture
def flag_run(tmp_path):
    """Three node servers evaluating <run>/flags.json; yields (run, {hostname: [observed flag states]})."""
    ff = FlagFile(tmp_path / "flags.json")
    ff.ensure(["spec_decode", "kv_policy_v2"])
    ev = FlagEvaluator(ff.path, poll_ms=20)
    servers, seen = [], {}
    for i in range(3):
        node = Node(NodeConfig(index=i, gpus=1, seed=3))
        log = seen[node.hostname] = [False]

        def source(flag, host, log=log):
            v = ev.enabled(flag, host)
            if flag == FLAG and v != log[-1]:
                log.append(v)
            return v
        node.flag_source = source
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
    yield tmp_path, seen
    for s in servers:
        s.shutdown()
        s.server_close()
    ev.close()


def _child(run: Path, mode: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.fakes.flag_rollout_child", str(run), mode], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def test_kill_9_mid_stage_and_resume_flips_no_node_twice(flag_run):
    run, seen = flag_run
    proc = _child(run, "start", run / "start.log")
    store = RolloutStore(run / "flag.sqlite")
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline:  # wait until stage 2 has been looked at twice
            rec = store.latest() if (run / "flag.sqlite").exists() else None
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
    assert FlagFile(run / "flags.json").hosts(FLAG) == ["gpu-node-00", "gpu-node-01"]
    lock = RunLock(run, "flag.lock")
    assert lock.acquire(), "the killed controller's lock must be free"
    lock.release()

    done = _child(run, "resume", run / "resume.log")
    assert done.wait(40) == 0, (run / "resume.log").read_text()
    assert "final Succeeded" in (run / "resume.log").read_text()
    rec = store.get(rec.id)
    assert rec.state == "Succeeded" and rec.id.startswith("spec_decode-")
    assert [(d["hostname"], d["version"], d["purpose"]) for d in store.deploys(rec.id)] == [
        ("gpu-node-00", "spec_decode=on", "stage 1"), ("gpu-node-01", "spec_decode=on", "stage 2"),
        ("gpu-node-02", "spec_decode=on", "stage 3")]
    assert seen == dict.fromkeys(seen, [False, True])  # every engine saw exactly one flip, off -> on
    groups = json.loads((run / "prometheus" / "targets" / "vllm-nodes.json").read_text())
    assert [g["labels"] for g in groups] == [{"node": h, "Hostname": h, "env": "test"} for h in seen]
