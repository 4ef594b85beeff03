"""``kill -9`` of a real controller process mid-stage, then ``resume``: nothing done is done twice.

The fleet is three real node servers (gpuobs.exporter.server.NodeServer) in this process. For a
release rollout each records the deploy calls its admin API receives; for a flag rollout each
evaluates the run directory's flagd file through OpenFeature (gpuobs.flags.evaluate) and records
every change of the flag it sees. The controller runs in a child process
(tests/fakes/rollout_child.py) through the real adapters and file_sd relabelling.
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
TOKEN = "resume-test-token"
FLAG = "spec_decode"


def _fleet(run: Path, flag: bool):
    """Three node servers and a run directory describing them. Yields {hostname: log}: the deployed
    versions (release) or the observed flag states, starting off (flag)."""
    ev = None
    if flag:
        ff = FlagFile(run / "flags.json")
        ff.ensure(["spec_decode", "kv_policy_v2"])
        ev = FlagEvaluator(ff.path, poll_ms=20)
    servers, logs = [], {}
    for i in range(3):
        node = Node(NodeConfig(index=i, gpus=1, seed=3))
        log = logs[node.hostname] = [False] if flag else []
        if flag:
            def source(name, host, log=log):
                v = ev.enabled(name, host)
                if name == FLAG and v != log[-1]:
                    log.append(v)
                return v
            node.flag_source = source
        else:
            real = node.deploy
            node.deploy = lambda v, real=real, log=log: (log.append(v), real(v))[1]
        srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node))
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
    hosts = [s.node.hostname for s in servers]
    ports = [s.server_address[1] for s in servers]
    (run / "admin-token").write_text(TOKEN)
    (run / "stack.json").write_text(json.dumps({
        "run_dir": str(run), "nodes": 3, "training_nodes": 0, "hostnames": hosts,
        "token_file": str(run / "admin-token"), "components": {"exporter": {"pid": 1, "argv": ["x"]}},
        "urls": {"prometheus": "http://127.0.0.1:9", "alertmanager": "http://127.0.0.1:9", "pager": "http://127.0.0.1:9",
                 "nodes": [f"http://127.0.0.1:{p}/metrics" for p in ports]}}))
    write_targets(run, "dcgm", [(h, p, {}) for h, p in zip(hosts, ports)])
    write_targets(run, "vllm", [(h, p, {"env": "test"}) for h, p in zip(hosts, ports)])
    try:
        yield logs
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
        if ev is not None:
            ev.close()


@pytest.fixture
def fleet_run(tmp_path):
    """Release rollout fleet: yields (run, {hostname: [deployed versions]})."""
    for logs in _fleet(tmp_path, flag=False):
        yield tmp_path, logs


@pytest.fixture
def flag_run(tmp_path):
    """Flag rollout fleet: yields (run, {hostname: [observed flag states]})."""
    for logs in _fleet(tmp_path, flag=True):
        yield tmp_path, logs


def _child(run: Path, mode: str, kind: str) -> subprocess.Popen:
    log = run / f"{mode}.log"
    return subprocess.Popen([sys.executable, "-m", "tests.fakes.rollout_child", str(run), mode, kind], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _kill_in_stage_2(run: Path, kind: str, db: str) -> tuple[RolloutStore, object]:
    """Start a controller, SIGKILL it once stage 2 has been looked at twice; return (store, record)."""
    proc = _child(run, "start", kind)
    store = None
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline:
            if store is None and (run / db).exists():
                store = RolloutStore(run / db)
            rec = store.latest() if store else None
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
    lock = RunLock(run, db.replace(".sqlite", ".lock"))
    assert lock.acquire(), "the killed controller's lock must be free"
    lock.release()
    return store, rec


def _resume(run: Path, kind: str) -> None:
    done = _child(run, "resume", kind)
    assert done.wait(40) == 0, (run / "resume.log").read_text()
    assert "final Succeeded" in (run / "resume.log").read_text()


def _labels_restored(run: Path, hosts) -> None:
    """Labels restored exactly as they were (the extra label kept, no track left behind)."""
    groups = json.loads((run / "prometheus" / "targets" / "vllm-nodes.json").read_text())
    assert [g["labels"] for g in groups] == [{"node": h, "Hostname": h, "env": "test"} for h in hosts]


def test_kill_9_mid_stage_and_resume_continues_without_redeploying(fleet_run):
    run, calls = fleet_run
    store, rec = _kill_in_stage_2(run, "release", "rollout.sqlite")
    assert calls == {"gpu-node-00": ["1.5.0"], "gpu-node-01": ["1.5.0"], "gpu-node-02": []}
    looks_before = store.stage(rec.id, 1).looks

    _resume(run, "release")
    rec = store.get(rec.id)
    assert rec.state == "Succeeded"
    assert calls == {"gpu-node-00": ["1.5.0"], "gpu-node-01": ["1.5.0"], "gpu-node-02": ["1.5.0"]}
    assert [(d["hostname"], d["version"], d["purpose"]) for d in store.deploys(rec.id)] == [
        ("gpu-node-00", "1.5.0", "stage 1"), ("gpu-node-01", "1.5.0", "stage 2"), ("gpu-node-02", "1.5.0", "stage 3")]
    assert store.stage(rec.id, 1).looks == looks_before + 1  # resumed the same stage, one more look
    assert [t["to_state"] for t in store.transitions(rec.id)] == [
        "Pending", "CompatChecked", "Canary", "Canary", "Promoting", "Succeeded"]
    _labels_restored(run, calls)


def test_kill_9_mid_stage_and_resume_flips_no_flag_twice(flag_run):
    run, seen = flag_run
    store, rec = _kill_in_stage_2(run, "flag", "flag.sqlite")
    assert FlagFile(run / "flags.json").hosts(FLAG) == ["gpu-node-00", "gpu-node-01"]

    _resume(run, "flag")
    rec = store.get(rec.id)
    assert rec.state == "Succeeded" and rec.id.startswith("spec_decode-")
    assert [(d["hostname"], d["version"], d["purpose"]) for d in store.deploys(rec.id)] == [
        ("gpu-node-00", "spec_decode=on", "stage 1"), ("gpu-node-01", "spec_decode=on", "stage 2"),
        ("gpu-node-02", "spec_decode=on", "stage 3")]
    assert seen == dict.fromkeys(seen, [False, True])  # every engine saw exactly one flip, off -> on
    _labels_restored(run, seen)
