"""One simulated GPU node: its GPUs, a seeded load profile, active faults and a kernel log.

Time is simulated: :meth:`Node.advance` moves the node ``dt`` seconds forward, so tests drive the
physics without sleeping; the fleet runner calls it from a ticker thread with wall-clock deltas.
All public methods are thread-safe (one lock per node) so scrapes, admin calls and ticks can
interleave.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
from dataclasses import dataclass, field

from gpuobs.exporter import xid as xidcat
from gpuobs.exporter.faults import FaultRequest
from gpuobs.exporter.gpu import H100_SXM, GpuModel, GpuState
from gpuobs.exporter.identity import gpu_identity, hostname

#: dcgm-exporter's default Xid counting window (``--xid-count-window-size``), milliseconds.
DEFAULT_XID_WINDOW_MS = 300_000


@dataclass
class Fault:
    """An active fault on a node: id (``f-<n>``), the validated request, sim time injected."""

    id: str
    request: FaultRequest
    injected_at: float
    last_fired: float = field(default=-math.inf)

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.request.kind, "gpu": self.request.gpu,
                "params": dict(self.request.params), "injected_at": self.injected_at}


@dataclass(frozen=True)
class NodeConfig:
    """Static configuration of a node: index, GPU count, seed, naming and driver version."""

    index: int
    gpus: int = 8
    seed: int = 1
    host_prefix: str = "gpu-node"
    driver_version: str = "550.54.15"
    model: GpuModel = H100_SXM
    xid_window_ms: int = DEFAULT_XID_WINDOW_MS
    start_time: float = 0.0


class Node:
    """A simulated node. ``gpus`` lists GpuState in index order, present or not."""

    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.hostname = hostname(cfg.host_prefix, cfg.index)
        self.driver_version = cfg.driver_version
        self.now = cfg.start_time
        self.lock = threading.RLock()
        self._rng = random.Random(f"{cfg.seed}:{cfg.index}")
        self._phase = self._rng.uniform(0, 2 * math.pi)
        self._base = self._rng.uniform(0.55, 0.75)
        self._noise = [0.0] * cfg.gpus
        self.gpus = [GpuState(gpu_identity(cfg.seed, cfg.index, i, cfg.model.name), cfg.model)
                     for i in range(cfg.gpus)]
        self._fb_base = [self._rng.uniform(60000, 70000) for _ in range(cfg.gpus)]
        self.faults: dict[str, Fault] = {}
        self._ids = itertools.count(1)
        self.kernel_log: list[str] = []
        self.down = False
        # Settle the thermal state so a fresh node does not start cold.
        for _ in range(120):
            self.advance(1.0)

    # ---- time ---------------------------------------------------------------------------
    def load(self, gpu: int) -> float:
        """Demanded load (0..1) of GPU ``gpu`` now: node diurnal wave + per-GPU AR(1) noise."""
        wave = 0.12 * math.sin(2 * math.pi * self.now / 900.0 + self._phase)
        return min(1.0, max(0.0, self._base + wave + self._noise[gpu]))

    def advance(self, dt: float) -> None:
        """Move the node ``dt`` seconds (> 0) forward: fire repeating faults, then physics."""
        if dt <= 0:
            return
        with self.lock:
            self.now += dt
            for i in range(len(self.gpus)):
                self._noise[i] = 0.9 * self._noise[i] + self._rng.gauss(0, 0.02) * math.sqrt(dt)
            for f in list(self.faults.values()):
                rep = f.request.params.get("repeat_s", 0)
                if f.request.kind == "xid" and rep and self.now - f.last_fired >= rep:
                    self._fire_xid(f)
            window_s = self.cfg.xid_window_ms / 1000.0
            for i, g in enumerate(self.gpus):
                g.advance(dt, self.load(i), self._fb_base[i])
                g.prune_xids(self.now, window_s)

    # ---- faults -------------------------------------------------------------------------
    def inject(self, req: FaultRequest) -> Fault:
        """Apply a validated fault request and return the active Fault (with its new id)."""
        with self.lock:
            f = Fault(f"f-{next(self._ids)}", req, self.now)
            self.faults[f.id] = f
            if req.kind == "xid":
                self._fire_xid(f)
            self._recompute_effects()
            return f

    def clear(self, fault_id: str) -> Fault | None:
        """Remove a fault by id; returns it, or None if no such fault is active."""
        with self.lock:
            f = self.faults.pop(fault_id, None)
            if f is not None:
                self._recompute_effects()
            return f

    def list_faults(self) -> list[dict]:
        """Active faults as JSON-ready dicts, oldest first."""
        with self.lock:
            return [f.to_json() for f in self.faults.values()]

    def _fire_xid(self, f: Fault) -> None:
        code = int(f.request.params["code"])
        g = self.gpus[f.request.gpu]
        msg = xidcat.message(code)
        g.record_xid(self.now, code, msg, self.cfg.xid_window_ms / 1000.0)
        f.last_fired = self.now
        pid = 1000 + self._rng.randrange(60000)
        # Format of the kernel's NVRM Xid line (dmesg): "NVRM: Xid (PCI:dddd:bb:dd): code, pid=..., name=..., msg".
        self.kernel_log.append(
            f"[{self.now:12.6f}] NVRM: Xid (PCI:{g.ident.short_pci}): {code}, pid={pid}, name=python3, {msg}.")
        if code == 79:
            g.present = False

    def _recompute_effects(self) -> None:
        """Derive every GPU's fault-driven state from the set of active faults (single source)."""
        self.down = any(f.request.kind == "down" for f in self.faults.values())
        for i, g in enumerate(self.gpus):
            mine = [f for f in self.faults.values() if f.request.gpu == i]
            g.cooling_factor = max([float(f.request.params["cooling_factor"])
                                    for f in mine if f.request.kind == "thermal"], default=1.0)
            # Xid 79 removes the GPU until the fault is cleared (node rebooted / GPU recovered).
            g.present = not any(f.request.kind == "xid" and f.request.params["code"] == 79 for f in mine)
