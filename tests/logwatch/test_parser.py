"""Table tests of the kernel-log parser on the driver's real formats, and a fuzz test.

Formats: NVIDIA/open-gpu-kernel-modules 595.45.04 (kernel_rc.c krcReportXid / _krcLogUuidOnce,
osinit.c, osapi.c, gpu.c Xid 154, nvswitch common_nvswitch.h / intr_nvswitch.h / error_nvswitch.c);
older-driver shapes (no ``PCI:``; ``pid='<unknown>'``) as seen in published kernel logs.
"""

from __future__ import annotations

import random

import pytest

from gpuobs.logwatch import parser as P

U = "GPU-3a1c5e2b-9f0d-4c1e-8b7a-6d5e4f3a2b1c"

TABLE = [
    # (line, kind, pci_bus_id, code, extra fields)
    ("[ 1234.567890] NVRM: Xid (PCI:0000:2b:00): 48, pid=2345, name=python3, "
     "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
     P.XID, "00000000:2B:00.0", 48, {"pid": 2345, "process": "python3"}),
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",  # no process context (current driver)
     P.XID, "00000000:2B:00.0", 79, {"pid": None, "process": None, "message": "GPU has fallen off the bus."}),
    ("[ 77.1] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",  # R525-R550
     P.XID, "00000000:3B:00.0", 79, {"pid": None, "process": None, "message": "GPU has fallen off the bus."}),
    ("[ 12.0] NVRM: Xid (0000:03:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0): Out Of Range Address",  # old, no PCI:
     P.XID, "00000000:03:00.0", 13, {"pid": None}),
    ("NVRM: Xid (PCI:0000:9a:00 GPU-I:05): 43, pid=881, name=vllm, Ch 00000008",  # MIG GPU instance
     P.XID, "00000000:9A:00.0", 43, {"gpu_instance": 5, "compute_instance": None, "process": "vllm"}),
    ("NVRM: Xid (PCI:0000:9a:00 GPU-I:01 GPU-CI:02): 31, pid=77, name=a.out, Ch 0000000a, intr 00000000. MMU Fault",
     P.XID, "00000000:9A:00.0", 31, {"gpu_instance": 1, "compute_instance": 2}),
    ("Dec  1 15:00:00 gpu-node-03 kernel: [ 99.1] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed "
     "from 0x0 (None) to 0x1 (GPU Reset Required)", P.XID, "00000000:18:00.0", 154, {"recovery_action": 1}),
    ("NVRM: Xid (PCI:0000:18:00): 154, pid=1, name=x, GPU recovery action changed from 0x1 (GPU Reset Required) "
     "to 0x2 (Node Reboot Required)", P.XID, "00000000:18:00.0", 154, {"recovery_action": 2}),
    ("NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
     P.XID, "00000000:18:00.0", 154, {"recovery_action": 4}),
    ("NVRM: Xid (PCI:0000:18:00): 94, pid=5, name=t, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     P.XID, "00000000:18:00.0", 94, {}),
    ("NVRM: Xid (PCI:0000:18:00): 119, pid=5, name=t, Timeout after 6s of waiting for RPC response from GPU1 GSP! "
     "Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).", P.XID, "00000000:18:00.0", 119, {}),
    ("NVRM: Xid (PCI:0000:18:00): 13, ", P.XID, "00000000:18:00.0", 13, {"message": ""}),  # empty pMsg
    ("2026-12-01T15:00:00.123456+00:00 gpu-node-01 kernel: NVRM: GPU at PCI:0000:2b:00: " + U,
     P.GPU_UUID, "00000000:2B:00.0", 0, {"uuid": U}),
    ("[ 5.5] NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.", P.FALLEN_OFF_BUS, "00000000:2B:00.0", 0, {}),
    ("nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
     P.SXID, "00000000:8A:00.0", 12028, {"device": "nvidia-nvswitch3", "fatal": False}),
    ("[ 8.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
     P.SXID, "00000000:05:00.0", 20034, {"fatal": True}),
    ("nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 12028, Severity 0 Engine instance 32 Sub-engine instance 00",
     P.SXID, "00000000:8A:00.0", 12028, {"fatal": None}),  # detail line: not an event
    ("nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 12028, Data {0x00000000, 0x00000000, 0x00000000, 0x00000000, "
     "0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}", P.SXID, "00000000:8A:00.0", 12028, {"fatal": None}),
    ("[    0.5] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  595.45.04", P.IGNORED, "", 0, {}),
    ("[    3.1] usb 1-1: new high-speed USB device number 2 using xhci_hcd", P.IGNORED, "", 0, {}),
    ("NVRM: Xid (PCI:0000:2b:00): seventy-nine", P.UNPARSED, "", 0, {}),
    ("NVRM: Xid (PCI:0000:2b", P.UNPARSED, "", 0, {}),
    ("NVRM: GPU at PCI:0000:2b:00: not-a-uuid", P.UNPARSED, "", 0, {}),
    ("NVRM: GPU 0000:2b:00: GPU has fallen off the bus somehow", P.UNPARSED, "", 0, {}),
    ("nvidia-nvswitch3: SXid (PCI:0000:8a", P.UNPARSED, "", 0, {}),
    ("NVRM: something about an Xid we do not know", P.UNPARSED, "", 0, {}),
]


@pytest.mark.parametrize("line,kind,bus,code,extra", TABLE, ids=[f"{i:02d}-{t[1]}" for i, t in enumerate(TABLE)])
def test_formats(line, kind, bus, code, extra):
    ev = P.Parser().parse(line)
    assert ev.kind == kind
    if kind in (P.IGNORED, P.UNPARSED):
        return
    assert ev.pci_bus_id == bus
    assert ev.code == code
    for k, v in extra.items():
        assert getattr(ev, k) == v, k


def test_probe_time_fallen_off_bus_spans_three_lines():
    """osapi.c prints the probe-time message over three lines; the bus id is on the first."""
    p = P.Parser()
    lines = ["[ 3.0] NVRM: The NVIDIA GPU 0000:2b:00.0",
             "[ 3.0] NVRM: (PCI ID: 10de:2330) installed in this system has",
             "[ 3.0] NVRM: fallen off the bus and is not responding to commands."]
    kinds = [p.parse(line) for line in lines]
    assert [e.kind for e in kinds] == [P.IGNORED, P.IGNORED, P.FALLEN_OFF_BUS]
    assert kinds[2].pci_bus_id == "00000000:2B:00.0"
    # Without the first line the third cannot be attributed: counted as unparsed, not guessed.
    assert P.Parser().parse(lines[2]).kind == P.UNPARSED


def test_sim_lines_parse_to_the_right_gpu():
    """The simulated node's lines (gpuobs.exporter.sim.node) use the driver formats above."""
    from gpuobs.exporter.sim.faults import FaultRequest
    from gpuobs.exporter.sim.node import Node, NodeConfig

    node = Node(NodeConfig(index=0, gpus=4))
    node.inject(FaultRequest("xid", 1, {"code": 48, "repeat_s": 0.0}))
    node.inject(FaultRequest("xid", 2, {"code": 79, "repeat_s": 0.0}))
    p = P.Parser()
    evs = [p.parse(line) for line in node.kernel_log]
    assert [e.kind for e in evs] == [P.GPU_UUID, P.XID, P.GPU_UUID, P.XID, P.FALLEN_OFF_BUS]
    assert evs[0].uuid == node.gpus[1].ident.uuid and evs[1].pci_bus_id == node.gpus[1].ident.pci_bus_id
    assert (evs[1].code, evs[3].code) == (48, 79)
    assert evs[4].pci_bus_id == node.gpus[2].ident.pci_bus_id


def test_bus_id_normalisation():
    assert P.dcgm_bus_id("0000:2b:00") == "00000000:2B:00.0"
    assert P.dcgm_bus_id("00000000:2B:00.0") == "00000000:2B:00.0"
    assert P.dcgm_bus_id("0001:c1:00.1") == "00000001:C1:00.1"
    with pytest.raises(ValueError):
        P.dcgm_bus_id("2b:00")


def test_fuzz_random_and_truncated_lines_never_crash():
    """Random bytes, random marker soup and every prefix of every real line: parse() never raises,
    and a truncated Xid/SXid/UUID line is either still a valid event or counted as unparsed."""
    rng = random.Random(11)
    p = P.Parser()
    alphabet = "NVRM: Xid (PCI:0123456789abcdef),.= pid name GPU-IC SXid fallen off the bus\x00\xff\u2603'<>[]"
    for _ in range(20000):
        n = rng.randrange(0, 200)
        line = "".join(rng.choice(alphabet) for _ in range(n))
        assert p.parse(line).kind in (P.IGNORED, P.UNPARSED, P.XID, P.SXID, P.GPU_UUID, P.FALLEN_OFF_BUS)
    for _ in range(2000):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        p.parse(raw.decode("utf-8", "replace"))
    for line, kind, *_ in TABLE:
        if kind not in (P.XID, P.GPU_UUID, P.SXID):
            continue
        marker = line.index("NVRM: ") if "NVRM: " in line else line.index("SXid")
        for cut in range(marker + 1, len(line)):
            ev = p.parse(line[:cut])
            assert ev.kind in (kind, P.UNPARSED, P.IGNORED), (line[:cut], ev)
            # Cut before the code's comma (Xid/SXid) or inside the UUID: never an event.
            whole = line.index(",", line.index("): ")) if kind != P.GPU_UUID else len(line)
            if cut < whole:
                assert ev.kind in (P.UNPARSED, P.IGNORED), (line[:cut], ev)
