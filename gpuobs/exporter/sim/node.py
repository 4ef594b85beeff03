"""One simulated GPU node: its GPUs, a seeded load profile, its role (serving engine or training
shard), active faults, the deployed release and a kernel log.

Time is simulated: :meth:`Node.advance` moves the node ``dt`` seconds forward, so tests drive the
physics without sleeping; the fleet runner calls it from a ticker thread with wall-clock deltas.
All public methods are thread-safe (one lock per node) so scrapes, admin calls and ticks interleave.
Fault effects are derived in one place, :meth:`Node._recompute_effects`, from the active faults.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import uuid
from dataclasses import dataclass, field

from gpuobs.exporter.sim.behaviour import Profile, combine
from gpuobs.exporter.sim.behaviour import SimCatalogue as Catalogue
from gpuobs.exporter.sim.behaviour import load as load_releases
from gpuobs.exporter.sim.engine import Engine, EngineConfig
from gpuobs.exporter.sim.faults import FaultRequest
from gpuobs.exporter.sim.gpu import H100_SXM, MIB, GpuModel, GpuState
from gpuobs.exporter.sim.identity import exporter_pod_name, gpu_identity, hostname
from gpuobs.exporter.sim.training import TrainingShard
from gpuobs.reference import xid as xidcat

#: dcgm-exporter's default Xid counting window (``--xid-count-window-size``), milliseconds.
DEFAULT_XID_WINDOW_MS = 300_000
ROLES = ("serving", "training")


@dataclass
class Fault:
    """An active fault on a node: id (``f-<n>``), the validated request, sim time injected."""

    id: str
    request: FaultRequest
    injected_at: float
    last_fired: float = field(default=-math.inf)

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.request.kind, "gpu": self.request.gpu,
                "params": dict(self.request.params), "injected_at": self.injected_at}


@dataclass(frozen=True)
class NodeConfig:
    """Static configuration of a node: index, GPU count, seed, role, naming, driver, workload."""

    index: int
    gpus: int = 8
    seed: int = 1
    role: str = "serving"
    host_prefix: str = "gpu-node"
    driver_version: str = "550.54.15"
    model: GpuModel = H100_SXM
    xid_window_ms: int = DEFAULT_XID_WINDOW_MS
    start_time: float = 0.0
    engine: EngineConfig = EngineConfig()
    training_job: str = "llama3-70b-pretrain"


class Node:
    """A simulated node. ``gpus`` lists GpuState in index order, present or not."""

    def __init__(self, cfg: NodeConfig, releases: Catalogue | None = None):
        if cfg.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {cfg.role!r}")
        self.cfg = cfg
        self.hostname = hostname(cfg.host_prefix, cfg.index)
        self.driver_version = cfg.driver_version
        self.releases = releases or load_releases()
        self.version = self.releases.default
        #: ``(flag, hostname) -> bool``, e.g. :meth:`gpuobs.flags.evaluate.FlagEvaluator.enabled`; None:
        #: every flag off. Evaluated each tick; :attr:`flags` holds the last answers (catalogue flags only).
        self.flag_source = None
        self.flags: dict[str, bool] = dict.fromkeys(self.releases.flags, False)
        self.now = cfg.start_time
        self.lock = threading.RLock()
        self._rng = random.Random(f"{cfg.seed}:{cfg.index}")
        self._phase = self._rng.uniform(0, 2 * math.pi)
        self._base = self._rng.uniform(0.55, 0.75)
        self._noise = [0.0] * cfg.gpus
        self.gpus = [GpuState(gpu_identity(cfg.seed, cfg.index, i, cfg.model.name), cfg.model)
                     for i in range(cfg.gpus)]
        for g in self.gpus:
            g.alloc.base_allocated = g.alloc.allocated = self._rng.uniform(60000, 70000) * MIB
            g.alloc.gap = g.alloc.base_gap
        self.engine = Engine(cfg.engine, self._rng.randrange(2**32)) if cfg.role == "serving" else None
        self.training = (TrainingShard(cfg.training_job, [cfg.index * cfg.gpus + i for i in range(cfg.gpus)],
                                       self._rng.randrange(2**32)) if cfg.role == "training" else None)
        self.faults: dict[str, Fault] = {}
        self._ids = itertools.count(1)
        self.kernel_log: list[str] = []
        # A new id per node start: the simulated host "rebooted" and its kernel log starts again
        # (/proc/sys/kernel/random/boot_id on a real host). Served as X-Boot-Id with the log.
        self.boot_id = str(uuid.uuid4())
        self._uuid_logged: set[int] = set()
        self.down = False
        #: How many times the node's dcgm-exporter pod was replaced (its pod name changes each time).
        self.exporter_generation = 0
        self._exporter_back_at = -math.inf  # sim time a replaced exporter pod answers again
        self.kv_factor = 1.0
        self.hung = False
        self.slowdowns = [1.0] * cfg.gpus
        self._recompute_effects()
        for _ in range(120):  # settle thermals so a fresh node does not start cold
            self.advance(1.0)

    # ---- time ---------------------------------------------------------------------------
    def load(self, gpu: int) -> float:
        """Demanded load (0..1) of GPU ``gpu`` now.

        Serving: the node's diurnal wave (15 min period, +-0.12) plus per-GPU AR(1) noise.
        Training: ~0.93 busy with the same noise (synchronous steps keep GPUs saturated).
        """
        if self.cfg.role == "training":
            return min(1.0, max(0.0, 0.93 + self._noise[gpu] * 0.3))
        wave = 0.12 * math.sin(2 * math.pi * self.now / 900.0 + self._phase)
        return min(1.0, max(0.0, self._base + wave + self._noise[gpu]))

    def advance(self, dt: float) -> None:
        """Move the node ``dt`` seconds (> 0) forward: repeating faults, GPU physics, engine/training."""
        if dt <= 0:
            return
        with self.lock:
            self.now += dt
            for i in range(len(self.gpus)):
                self._noise[i] = 0.9 * self._noise[i] + self._rng.gauss(0, 0.02) * math.sqrt(dt)
            for f in list(self.faults.values()):
                rep = f.request.params.get("repeat_s", 0)
                if rep and self.now - f.last_fired >= rep:
                    self._fire(f)
            window_s = self.cfg.xid_window_ms / 1000.0
            for i, g in enumerate(self.gpus):
                g.advance(dt, self.load(i), self._rng)
                g.prune_xids(self.now, window_s)
            present = [g for g in self.gpus if g.present]
            clock = min((g.effective_clock_factor for g in present), default=1.0)
            if self.engine is not None and not self.engine_down:
                rate_scale = sum(self.load(i) for i in range(len(self.gpus))) / len(self.gpus) / self._base
                self.refresh_flags()
                self.engine.advance(dt, rate_scale, clock, self.kv_factor, self.profile)
            if self.training is not None:
                self.training.advance(dt, [g.effective_clock_factor for g in self.gpus], self.slowdowns,
                                      self.hung or len(present) < len(self.gpus))

    @property
    def engine_down(self) -> bool:
        """The engine process is gone: the node is down, or a GPU of its tensor-parallel group fell off
        the bus (the engine crashes; the load balancer's health check stops routing traffic to it)."""
        return self.down or any(not g.present for g in self.gpus)

    @property
    def exporter_unavailable(self) -> bool:
        """The DCGM page does not answer: the node is down, or its exporter pod is being replaced."""
        return self.down or self.now < self._exporter_back_at

    @property
    def exporter_pod(self) -> str:
        """Name of the node's dcgm-exporter pod, ``nvidia-dcgm-exporter-<5 chars>`` (new after each replacement)."""
        return exporter_pod_name(self.cfg.seed, self.cfg.index, self.exporter_generation)

    @property
    def profile(self) -> Profile:
        """The engine's hidden behaviour now: the release's profile combined with each flag's that is on."""
        return combine(self.releases.profile(self.version),
                       *(self.releases.flag_profile(f) for f, on in self.flags.items() if on))

    def refresh_flags(self) -> dict[str, bool]:
        """Evaluate every catalogue flag for this node through :attr:`flag_source`; returns a copy."""
        with self.lock:
            if self.flag_source is not None:
                self.flags = {f: bool(self.flag_source(f, self.hostname)) for f in self.flags}
            return dict(self.flags)

    @property
    def release(self):
        """The deployed :class:`~gpuobs.reference.releases.Release`."""
        return self.releases.get(self.version)

    # ---- deploy -------------------------------------------------------------------------
    def deploy(self, version: str) -> str:
        """Switch the engine to ``version``; returns the previous one. KeyError for unknown versions."""
        with self.lock:
            self.releases.get(version)
            previous, self.version = self.version, version
            self._recompute_effects()
            return previous

    # ---- faults -------------------------------------------------------------------------
    def inject(self, req: FaultRequest) -> Fault:
        """Apply a validated fault request and return the active Fault (with its new id, unique in the
        fleet: ``n<node index>-f<n>``, so ids from different nodes never collide in logs and drills)."""
        with self.lock:
            f = Fault(f"n{self.cfg.index}-f{next(self._ids)}", req, self.now)
            self.faults[f.id] = f
            self._fire(f)
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
            return [f.to_dict() for f in self.faults.values()]

    def _xid(self, gpu: int, code: int) -> None:
        """Record one Xid: the kernel log always gets it; DCGM's Xid fields only when DCGM can see it.

        Xid 79 (fallen off the bus) never reaches DCGM: the GPU is gone before DCGM's event watch can
        read it (NVIDIA/DCGM issue #162), and after recovery (GPU reset / reboot, which restarts the
        host engine) DCGM's Xid state starts empty. So 79 is in the kernel log only, never on
        DCGM_FI_DEV_XID_ERRORS or DCGM_EXP_XID_ERRORS_COUNT, as on a real node.
        """
        g = self.gpus[gpu]
        msg = xidcat.message(code)
        if code not in xidcat.DCGM_UNREPORTABLE_XIDS:
            g.record_xid(self.now, code, msg, self.cfg.xid_window_ms / 1000.0)
        self._kernel_xid_lines(gpu, code, msg)

    def _kernel_xid_lines(self, gpu: int, code: int, msg: str) -> None:
        """Append the driver's kernel-log lines for one Xid, dmesg-style (``[seconds] NVRM: ...``).

        Formats from NVIDIA/open-gpu-kernel-modules 595.45.04: ``kernel_rc.c`` krcReportXid
        (``NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s``; without pid/name when there is
        no process context, as for Xid 79) preceded, once per GPU, by _krcLogUuidOnce's
        ``NVRM: GPU at PCI:%04x:%02x:%02x: GPU-<uuid>``; Xid 79 is followed by ``osinit.c``'s
        NV_DEV_PRINTF ``NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen off the bus.``. Hex is lower case.
        """
        g = self.gpus[gpu]
        stamp = f"[{self.now:12.6f}]"
        bus = g.ident.short_pci.lower()
        if gpu not in self._uuid_logged:
            self._uuid_logged.add(gpu)
            self.kernel_log.append(f"{stamp} NVRM: GPU at PCI:{bus}: {g.ident.uuid}")
        if code == 79:
            self.kernel_log.append(f"{stamp} NVRM: Xid (PCI:{bus}): 79, GPU has fallen off the bus.")
            self.kernel_log.append(f"{stamp} NVRM: GPU {g.ident.pci_bus_id[4:].lower()}: GPU has fallen off the bus.")
            return
        pid = 1000 + self._rng.randrange(60000)
        self.kernel_log.append(f"{stamp} NVRM: Xid (PCI:{bus}): {code}, pid={pid}, name=python3, {msg}.")

    def _fire(self, f: Fault) -> None:
        """One-shot effects of a fault (at injection and at each ``repeat_s``): Xids, ECC counts."""
        req, f.last_fired = f.request, self.now
        if req.kind == "xid":
            self._xid(req.gpu, int(req.params["code"]))
        elif req.kind == "ecc-dbe":
            g, n = self.gpus[req.gpu], int(req.params["count"])
            g.ecc_dbe_vol += n
            g.ecc_dbe_agg += n
            g.remapped_rows_uncorrectable += 1
            g.row_remap_pending = 1
            self._xid(req.gpu, 48)
            self._xid(req.gpu, 63)
        elif req.kind == "row-remap-failure":
            self.gpus[req.gpu].row_remap_failure = 1
            self._xid(req.gpu, 64)
        elif req.kind == "exporter-restart":
            self.exporter_generation += 1
            self._exporter_back_at = self.now + float(req.params["downtime_s"])
            if req.params["xid_state"] == "cleared":
                for g in self.gpus:
                    g.last_xid = None
                    g.xid_events.clear()

    def _recompute_effects(self) -> None:
        """Derive every continuous fault effect from the set of active faults (single source)."""
        active = list(self.faults.values())

        def params(kind: str, gpu: int | None = None) -> list[dict]:
            return [f.request.params for f in active if f.request.kind == kind and f.request.gpu == gpu]

        self.down = bool(params("down"))
        self.hung = bool(params("collective-hang")) and self.training is not None
        self.kv_factor = max([float(p["factor"]) for p in params("kv-pressure")], default=1.0)
        drivers = params("driver")
        self.driver_version = str(drivers[-1]["version"]) if drivers else self.cfg.driver_version
        leak = self.releases.profile(self.version).leak_mib_per_min * MIB / 60.0
        for i, g in enumerate(self.gpus):
            g.cooling_factor = max([float(p["cooling_factor"]) for p in params("thermal", i)], default=1.0)
            g.brake_factor = min([float(p["clock_factor"]) for p in params("power-brake", i)], default=1.0)
            g.nvlink_error_rate = sum(float(p["rate_per_s"]) for p in params("nvlink-errors", i))
            g.pcie_replay_rate = sum(float(p["rate_per_s"]) for p in params("pcie-replay", i))
            g.frag_bytes_per_s = sum(float(p["rate_mib_per_min"]) for p in params("fragmentation", i)) * MIB / 60.0
            g.leak_bytes_per_s = leak if self.engine is not None else 0.0
            g.hung = self.hung
            # Xid 79 removes the GPU until the fault is cleared (node rebooted / GPU recovered).
            g.present = not any(int(p["code"]) == 79 for p in params("xid", i))
            # Row-remap failure and a pending remap last until the GPU is reset: clearing the fault
            # stands for that reset.
            if not params("row-remap-failure", i):
                g.row_remap_failure = 0
            if not params("ecc-dbe", i):
                g.row_remap_pending = 0
            self.slowdowns[i] = max([float(p["slowdown"]) for p in params("straggler", i)], default=1.0)
