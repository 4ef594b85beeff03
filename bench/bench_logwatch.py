"""logwatch parser benchmark (issue 11): lines per second and CPU per 10k lines, next to a plain ``re``.

Run ``python bench/bench_logwatch.py [--mib 1] [--rounds 5]`` (part of ``make bench``, a few seconds).
Two 1 MiB kernel-log bursts, built from the driver's real line formats (see gpuobs/logwatch/parser.py):

* ``incident``: every line is an NVRM/SXid line (an Xid storm: Xid 13/31/43/48/79/154, MIG
  attribution, UUID and fallen-off-the-bus lines, NVSwitch SXid event and detail lines);
* ``mixed``: one line in ten is such a line, the rest ordinary kernel chatter.

Per burst, the median over ``--rounds`` of the CPU time (``time.process_time``) of:

* ``re baseline``: one compiled ``re`` search per line for ``NVRM: Xid (PCI:bb): code,`` (what a
  grep-like counter does; it extracts only bus and code and knows no other format);
* ``gpuobs parser``: :class:`gpuobs.logwatch.parser.Parser` on every line (all formats, all fields);
* ``agent end to end``: a file source read in 1 MiB chunks, parse, count, and the atomic state
  write after each batch (what the agent spends per burst, without HTTP).

Goal (issue 11): a 1 MB burst costs under 1 % of a core-second per 1,000 lines (10 ms CPU per
1,000 lines). Numbers only; no test asserts a timing.
"""

from __future__ import annotations

import argparse
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuobs.logwatch.agent import Agent  # noqa: E402
from gpuobs.logwatch.parser import Parser  # noqa: E402
from gpuobs.logwatch.sources import FileSource  # noqa: E402

BASELINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:]+)\): (\d+),")

NVRM = [
    "NVRM: Xid (PCI:0000:{b}:00): 13, pid={p}, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address",
    "NVRM: Xid (PCI:0000:{b}:00): 31, pid={p}, name=vllm, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_3c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "NVRM: Xid (PCI:0000:{b}:00 GPU-I:0{i}): 43, pid={p}, name=torchrun, Ch 00000010",
    "NVRM: Xid (PCI:0000:{b}:00 GPU-I:0{i} GPU-CI:01): 13, pid={p}, name=a.out, Graphics Exception: ESR 0x50e730=0x10d 0x50e734=0x0",
    "NVRM: Xid (PCI:0000:{b}:00): 48, pid={p}, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
    "NVRM: Xid (PCI:0000:{b}:00): 79, GPU has fallen off the bus.",
    "NVRM: GPU 0000:{b}:00.0: GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{b}:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    "NVRM: GPU at PCI:0000:{b}:00: GPU-3a1c5e2b-9f0d-4c1e-8b7a-6d5e4f3a2b{p4}",
    "nvidia-nvswitch{i}: SXid (PCI:0000:0{i}:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
    "nvidia-nvswitch{i}: SXid (PCI:0000:0{i}:00.0): 12028, Severity 0 Engine instance 32 Sub-engine instance 00",
]
OTHER = [
    "eth0: Link is Up - 100Gbps Full Duplex, Flow Control: None",
    "audit: type=1400 audit({t}:{p}): apparmor=\"DENIED\" operation=\"open\" profile=\"snap.lxd\" name=\"/proc/{p}/mounts\"",
    "nvme nvme0: I/O 123 QID 4 timeout, completion polled",
    "IPv6: ADDRCONF(NETDEV_CHANGE): cali{p}: link becomes ready",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "mlx5_core 0000:{b}:00.0: mlx5_fw_tracer_handle_traces:742:(pid {p}): FW tracer: page fault",
]


def burst(nbytes: int, nvrm_share: float, seed: int = 11) -> list[str]:
    """Kernel-log lines (dmesg form, with timestamps) totalling about ``nbytes`` bytes."""
    rng = random.Random(seed)
    lines, size, t = [], 0, 1000.0
    while size < nbytes:
        t += rng.random() * 0.01
        tmpl = rng.choice(NVRM) if rng.random() < nvrm_share else rng.choice(OTHER)
        line = f"[{t:12.6f}] " + tmpl.format(b=rng.choice(("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")),
                                               p=rng.randrange(1000, 60000), i=rng.randrange(1, 7),
                                               t=int(t), p4=f"{rng.randrange(100):02d}")
        lines.append(line)
        size += len(line) + 1
    return lines


def cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def run_baseline(lines: list[str]) -> None:
    search = BASELINE.search
    for line in lines:
        m = search(line)
        if m:
            m.group(1), int(m.group(2))


def run_parser(lines: list[str]) -> None:
    parse = Parser().parse
    for line in lines:
        parse(line)


def run_agent(path: Path, workdir: Path) -> None:
    state = workdir / "state.json"
    state.unlink(missing_ok=True)
    a = Agent(FileSource(path), state, "bench-node", clock=lambda: 0.0)
    a.start()
    while a.poll_once():
        pass
    a.source.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=1.0, help="burst size in MiB (default 1)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per measurement; the median is reported")
    args = ap.parse_args(argv)
    if args.mib <= 0 or args.rounds < 1:
        ap.error("--mib must be > 0 and --rounds >= 1")
    print(f"logwatch parser benchmark: {args.mib:g} MiB bursts, median of {args.rounds} rounds, "
          f"Python {platform.python_version()} on {platform.machine()}")
    print()
    print("| burst | lines | NVRM/SXid share | path | lines/s | CPU ms per 10k lines | CPU ms per 1k lines |")
    print("|---|---:|---:|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-logwatch-") as tmp:
        work = Path(tmp)
        for name, share in (("incident", 1.0), ("mixed", 0.1)):
            lines = burst(int(args.mib * 1024 * 1024), share)
            path = work / f"{name}.log"
            path.write_text("".join(line + "\n" for line in lines))
            for label, fn in (("re baseline", lambda: run_baseline(lines)),
                              ("gpuobs parser", lambda: run_parser(lines)),
                              ("agent end to end", lambda: run_agent(path, work))):
                secs = statistics.median(cpu(fn) for _ in range(args.rounds))
                rate = len(lines) / secs if secs > 0 else float("inf")
                print(f"| {name} | {len(lines)} | {share:.0%} | {label} | {rate:,.0f} | "
                      f"{secs / len(lines) * 1e7:.2f} | {secs / len(lines) * 1e6:.3f} |")
    print()
    print("Goal: < 10 ms CPU per 1,000 lines (1 % of a core-second) for a 1 MB burst, agent end to end.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
