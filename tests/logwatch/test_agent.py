"""The agent: counts and labels on /metrics, persistence across restarts (in-process and a real
process killed with SIGKILL mid-stream), bad input from the user."""

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
import requests
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.logwatch import state as S
from gpuobs.logwatch.agent import Agent, LogwatchServer
from gpuobs.logwatch.identity import GpuId, GpuMap, MapError, load_map_file, load_nvml
from gpuobs.logwatch.sources import FileSource
from gpuobs.stack.ports import free_port_range

U0 = "GPU-11111111-2222-3333-4444-555555555555"
U1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
X48 = "[ 10.0] NVRM: Xid (PCI:0000:18:00): 48, pid=1234, name=python3, Double Bit ECC Error."


def samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def scrape(agent: Agent) -> dict[str, list]:
    return samples(generate_latest(agent.registry()).decode())


def make(tmp_path: Path, lines: list[str], gpu_map: GpuMap | None = None, clock=lambda: 1000.0) -> tuple[Agent, Path]:
    log = tmp_path / "kern.log"
    with open(log, "a") as fh:
        fh.write("".join(line + "\n" for line in lines))
    a = Agent(FileSource(log), tmp_path / "state.json", "gpu-node-01", gpu_map=gpu_map, clock=clock)
    a.start()
    return a, log


def test_counts_and_dcgm_labels(tmp_path):
    gm = GpuMap(file_map={"00000000:18:00.0": GpuId("0", U0), "00000000:2A:00.0": GpuId("1", "")})
    lines = [f"[ 9.0] NVRM: GPU at PCI:0000:2a:00: {U1}", X48, X48, X48,
             "[ 11.0] NVRM: Xid (PCI:0000:2a:00 GPU-I:03): 43, pid=7, name=vllm, Ch 00000008",
             "[ 12.0] NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus.",
             "[ 12.0] NVRM: GPU 0000:2a:00.0: GPU has fallen off the bus.",
             "[ 13.0] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
             "nvidia-nvswitch1: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
             "nvidia-nvswitch1: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 32 Sub-engine instance 00",
             "NVRM: Xid (PCI:0000:18:00): garbage", "unrelated kernel line"]
    a, _ = make(tmp_path, lines, gm)
    assert a.poll_once() == len(lines)
    m = scrape(a)
    ev = {(s.labels["pci_bus_id"], s.labels["xid"], s.labels["GPU_I_ID"]): s for s in m["gpuobs_xid_events_total"]}
    s48 = ev[("00000000:18:00.0", "48", "")]
    assert s48.value == 3
    assert s48.labels == {"Hostname": "gpu-node-01", "gpu": "0", "UUID": U0, "pci_bus_id": "00000000:18:00.0",
                          "GPU_I_ID": "", "xid": "48", "xid_severity": "critical", "xid_action": "WORKFLOW_XID_48"}
    s43 = ev[("00000000:2A:00.0", "43", "3")]
    assert s43.labels["UUID"] == U1 and s43.labels["gpu"] == "1"  # UUID from the log line, index from the file
    assert ev[("00000000:18:00.0", "154", "")].labels["xid_severity"] == "warning"
    ts = {(s.labels["pci_bus_id"], s.labels["xid"]): s.value for s in m["gpuobs_xid_last_event_timestamp_seconds"]}
    assert ts[("00000000:18:00.0", "48")] == 1000.0
    fallen = {s.labels["pci_bus_id"]: s.value for s in m["gpuobs_gpu_fallen_off_bus"]}
    assert fallen == {"00000000:18:00.0": 0, "00000000:2A:00.0": 1}
    (ra,) = m["gpuobs_gpu_recovery_action"]
    assert ra.value == 1 and ra.labels["action"] == "GPU Reset Required" and ra.labels["gpu"] == "0"
    (sx,) = m["gpuobs_sxid_events_total"]  # the detail line is not a second event
    assert sx.value == 1 and sx.labels["sxid"] == "12028" and sx.labels["sxid_fatal"] == "non-fatal"
    assert m["gpuobs_logwatch_unparsed_lines_total"][0].value == 1
    assert m["gpuobs_logwatch_lines_total"][0].value == len(lines)
    assert m["gpuobs_logwatch_source_up"][0].value == 1


def test_restart_in_process_and_crash_before_save_lose_and_duplicate_nothing(tmp_path, monkeypatch):
    a, log = make(tmp_path, [X48, X48])
    a.poll_once()
    with open(log, "a") as fh:
        fh.write(X48 + "\n")
    b = Agent(FileSource(log), tmp_path / "state.json", "gpu-node-01")  # restart
    b.start()
    b.poll_once()
    assert b.counts.xid[("00000000:18:00.0", "", 48)][0] == 3
    # Crash after counting in memory but before the state reached disk: the batch is read again.
    with open(log, "a") as fh:
        fh.write(X48 + "\n" + X48 + "\n")

    def boom(*args, **kw):
        raise OSError("disk full")
    monkeypatch.setattr(S, "save", boom)
    with pytest.raises(OSError):
        b.poll_once()
    monkeypatch.undo()
    c = Agent(FileSource(log), tmp_path / "state.json", "gpu-node-01")
    c.start()
    c.poll_once()
    assert c.counts.xid[("00000000:18:00.0", "", 48)][0] == 5
    assert c.counts.lines == 5


def test_new_boot_clears_fallen_and_recovery_but_keeps_counters(tmp_path):
    a, _ = make(tmp_path, ["NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."])
    a.poll_once()
    assert a.counts.fallen
    from gpuobs.logwatch.sources import Batch
    a.source.read_batch = lambda n=0: Batch(new_boot=True)
    a.poll_once()
    assert not a.counts.fallen and a.counts.xid[("00000000:18:00.0", "", 79)][0] == 1


def test_state_file_errors_name_the_problem(tmp_path):
    p = tmp_path / "state.json"
    p.write_text("{not json")
    with pytest.raises(S.StateError, match="damaged state file"):
        S.load(p, "file")
    S.save(p, "kmsg", {"boot_id": "b", "seq": 1}, S.Counts())
    with pytest.raises(S.StateError, match="written for source 'kmsg', not 'file'"):
        S.load(p, "file")


def test_gpu_map_file_and_nvml(tmp_path):
    f = tmp_path / "map.csv"
    f.write_text(f"index, pci.bus_id, uuid\n0, 00000000:18:00.0, {U0}\n1, 00000000:2A:00.0, {U1}\n")
    assert load_map_file(f)["00000000:2A:00.0"] == GpuId("1", U1)
    f.write_text(f"x, 00000000:18:00.0, {U0}\n")
    with pytest.raises(MapError, match="field 'index'"):
        load_map_file(f)
    f.write_text("0, 18:00, GPU-1\n")
    with pytest.raises(MapError, match="field 'pci.bus_id'"):
        load_map_file(f)

    class FakeNvml:
        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlDeviceGetCount(self): return 1
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetUUID(self, h): return U0
        def nvmlDeviceGetPciInfo(self, h):
            return type("Pci", (), {"busId": b"00000000:18:00.0"})()
    nv = load_nvml(FakeNvml())
    assert nv == {"00000000:18:00.0": GpuId("0", U0)}
    gm = GpuMap(nvml=nv, file_map={"00000000:18:00.0": GpuId("5", U1)})
    assert gm.resolve("00000000:18:00.0", {}) == GpuId("0", U0)  # NVML wins over the file


def test_http_server_serves_metrics_and_health_on_loopback(tmp_path):
    a, _ = make(tmp_path, [X48])
    a.poll_once()
    srv = LogwatchServer(("127.0.0.1", 0), a)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        m = samples(requests.get(f"{base}/metrics", timeout=5).text)
        assert m["gpuobs_xid_events_total"][0].value == 1
        assert requests.get(f"{base}/health", timeout=5).json()["source_up"] is True
        assert requests.get(f"{base}/nope", timeout=5).status_code == 404
    finally:
        srv.shutdown()
        srv.server_close()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuobs", "logwatch", *args]


def test_cli_bad_input_exits_2_without_traceback(tmp_path, capsys):
    from gpuobs.cli import build_parser

    st = tmp_path / "s.json"
    st.write_text("[]")
    for argv, msg in ((["--source", "file", "--state-file", str(st)], "needs --path"),
                      (["--source", "sim", "--state-file", str(st)], "needs --url"),
                      (["--source", "file", "--path", str(tmp_path / "k"), "--state-file", str(st)], "damaged state file"),
                      (["--source", "file", "--path", "x", "--state-file", str(st), "--port", "70000"], "--port")):
        try:
            args = build_parser().parse_args(["logwatch", *argv])
            code = args.func(args)
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2, err
        assert msg in err and "Traceback" not in err


def test_process_killed_mid_stream_restarts_without_loss_or_duplicates(tmp_path):
    """A real `gpuobs logwatch` process, SIGKILLed while lines keep arriving, restarted on the same
    state file: the count on /metrics equals the lines written, exactly."""
    log, st = tmp_path / "kern.log", tmp_path / "state.json"
    log.write_text("")
    port = free_port_range(1)
    argv = _cli("--source", "file", "--path", str(log), "--state-file", str(st), "--port", str(port),
                "--hostname", "gpu-node-01", "--no-nvml", "--interval", "0.05")
    url = f"http://127.0.0.1:{port}/metrics"

    def count() -> float | None:
        try:
            m = samples(requests.get(url, timeout=1).text)
        except requests.RequestException:
            return None
        return sum(s.value for s in m.get("gpuobs_xid_events_total", []))

    def wait_for(n: int, proc) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            if count() == n:
                return
            time.sleep(0.05)
        raise AssertionError(f"count stayed at {count()}, expected {n}")

    written = 0
    p1 = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        with open(log, "a") as fh:
            for _ in range(5):
                fh.write(X48 + "\n")
                written += 1
        wait_for(written, p1)
        with open(log, "a") as fh:  # keep writing while the agent dies
            for i in range(200):
                fh.write(X48 + "\n")
                written += 1
                if i == 100:
                    fh.flush()
                    os.kill(p1.pid, signal.SIGKILL)
        p1.wait(timeout=10)
    finally:
        if p1.poll() is None:
            p1.kill()
            p1.wait()
    p2 = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(written, p2)
        assert json.loads(st.read_text())["lines"] == written
    finally:
        p2.send_signal(signal.SIGTERM)
        p2.wait(timeout=10)
    assert p2.returncode == 0
