"""One simulated GPU node: its GPUs, a seeded load profile, its role (serving engine or training
shard), active faults, the deployed release and a kernel log.

Time is simulated: :meth:`Node.advance` moves the node ``dt`` seconds forward, so tests drive the
physics without sleeping; the fleet runner calls it from a ticker thread with wall-clock deltas.
All public methods are thread-safe (one lock per node) so scrapes, admin calls and ticks interleave.
Fault effects are derived in one place, :meth:`Node._recompute_effects`, from the active faults.

Node actions (the remediation controller's, through ``POST /admin/node``; validation in
:mod:`gpuobs.exporter.sim.actions`): :meth:`Node.cordon` / :meth:`Node.uncordon` / :meth:`Node.drain`
(traffic and training checkpoints), :meth:`Node.reset_gpu`, :meth:`Node.reboot`,
:meth:`Node.restart_engine`, :meth:`Node.diag` (``dcgmi diag -r 2``) and :meth:`Node.install_driver` (a
driver upgrade: module reload on a cordoned, drained node). Which fault a GPU reset or a
reboot clears follows NVIDIA's Xid catalogue (:mod:`gpuobs.reference.xid`): RESET_GPU codes clear on
a reset, Xid 79 (RESTART_BM) needs a reboot, a row-remap failure is the RMA path.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import uuid
from dataclasses import dataclass, field

from gpuobs.exporter.sim.behaviour import DriverProfile, Profile, combine
from gpuobs.exporter.sim.behaviour import SimCatalogue as Catalogue
from gpuobs.exporter.sim.behaviour import load as load_releases
from gpuobs.exporter.sim.actions import (
    CORDON_BY,
    DEFAULT_REBOOT_S,
    DEFAULT_RELOAD_S,
    NodeActionError,
    NodeStateError,
    check_gpu,
)
from gpuobs.exporter.sim.engine import Engine, EngineConfig
from gpuobs.exporter.sim.faults import FaultRequest
from gpuobs.exporter.sim.gpu import H100_SXM, MIB, GpuModel, GpuState
from gpuobs.exporter.sim.identity import exporter_pod_name, gpu_identity, hostname
from gpuobs.exporter.sim.training import TrainingShard
from gpuobs.reference import xid as xidcat
from gpuobs.reference.drivers import DriverCatalogue
from gpuobs.reference.drivers import load as load_drivers

#: dcgm-exporter's default Xid counting window (``--xid-count-window-size``), milliseconds.
DEFAULT_XID_WINDOW_MS = 300_000
ROLES = ("serving", "training")
#: Simulated seconds a training rank needs to write its checkpoint once drained (while not hung). A
#: real sharded checkpoint of a 70B model's weights and optimizer state takes tens of seconds to minutes.
CHECKPOINT_S = 30.0
#: Fault kinds a reboot does not clear: hardware that stays broken (RMA path, cooling, the external
#: power brake), and ``driver``, the installed driver version (node configuration, not a fault state).
REBOOT_PERSISTENT = ("row-remap-failure", "thermal", "power-brake", "driver")
#: Why a GPU reset cannot clear a fault kind (the reset fails and keeps every fault).
RESET_BLOCKERS = {
    "row-remap-failure": "row remap failure (Xid 64): RMA path",
    "thermal": "thermal fault (cooling is mechanical)",
    "power-brake": "power brake asserted (external)",
}
#: Fault kinds that live in the serving engine's process and end when it restarts.
ENGINE_PROCESS_KINDS = ("fragmentation", "kv-pressure")

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
    """Static configuration of a node: index, GPU count, seed, role, naming, driver (the one installed at
    start), GPU model (every GPU of a node is the same product), workload."""

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

    def __init__(self, cfg: NodeConfig, releases: Catalogue | None = None, drivers: DriverCatalogue | None = None):
        if cfg.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {cfg.role!r}")
        self.cfg = cfg
        self.hostname = hostname(cfg.host_prefix, cfg.index)
        #: The driver installed on the node (``install_driver`` changes it; a reboot keeps it).
        self.installed_driver = cfg.driver_version
        #: The driver running now: the installed one unless a ``driver`` fault overrides it.
        self.driver_version = cfg.driver_version
        #: The drivers ``install_driver`` accepts (:mod:`gpuobs.reference.drivers`; default: packaged).
        self.drivers = drivers or load_drivers()
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
        # The engine's weights and KV cache take 60-70 GB of an 80 GB H100: the same share of other models.
        fb_share = cfg.model.fb_total_mib / H100_SXM.fb_total_mib
        for g in self.gpus:
            g.alloc.base_allocated = g.alloc.allocated = self._rng.uniform(60000 * fb_share, 70000 * fb_share) * MIB
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
        #: Cordon marks on the node (``gpuobs``, ``human``); cordoned while any is set. Survive a reboot.
        self.cordons: set[str] = set()
        self.cordon_reason = ""
        self.draining = False
        #: Serving: the fraction of the node's traffic still on its GPUs (1 unless cordoned/draining).
        self._traffic = 1.0
        #: Training: simulated seconds of checkpointing left once drained (None: no checkpoint asked).
        self._checkpoint_left: float | None = None
        #: Training: the rank stopped after its checkpoint (no steps, GPUs idle) until uncordoned.
        self.training_stopped = False
        self._reboot_until: float | None = None
        #: install-driver: sim time the module reload ends, and the driver it loads (None: no reload).
        self._reload_until: float | None = None
        self._reload_to: str | None = None
        #: Xids a driver profile raises (``xid_per_hour``): their own stream, so the default fleet's
        #: random sequence does not change.
        self._driver_rng = random.Random(f"{cfg.seed}:{cfg.index}:driver")
        #: How many times the serving engine process was replaced (restart, GPU reset, reboot).
        self.engine_generation = 0
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
            return 0.0 if self.training_stopped else min(1.0, max(0.0, 0.93 + self._noise[gpu] * 0.3))
        return self._demand(gpu) * self._traffic

    def _demand(self, gpu: int) -> float:
        """Serving: the load the node's traffic would put on GPU ``gpu`` (before any cordon)."""
        wave = 0.12 * math.sin(2 * math.pi * self.now / 900.0 + self._phase)
        return min(1.0, max(0.0, self._base + wave + self._noise[gpu]))

    def advance(self, dt: float) -> None:
        """Move the node ``dt`` seconds (> 0) forward: repeating faults, GPU physics, engine/training."""
        if dt <= 0:
            return
        with self.lock:
            self.now += dt
            if self._reboot_until is not None and self.now >= self._reboot_until:
                self._boot()
            if self._reload_until is not None and self.now >= self._reload_until:
                self._driver_loaded()
            for i in range(len(self.gpus)):
                self._noise[i] = 0.9 * self._noise[i] + self._rng.gauss(0, 0.02) * math.sqrt(dt)
            offline = self.rebooting or self.reloading_driver
            for f in list(self.faults.values()):
                rep = f.request.params.get("repeat_s", 0)
                if rep and self.now - f.last_fired >= rep and not offline:  # a host that is off logs nothing
                    self._fire(f)
            if not offline and not self.down:
                self._driver_xids(dt)
            window_s = self.cfg.xid_window_ms / 1000.0
            for i, g in enumerate(self.gpus):
                g.advance(dt, self.load(i), self._rng)
                g.prune_xids(self.now, window_s)
            present = [g for g in self.gpus if g.present]
            clock = min((g.effective_clock_factor for g in present), default=1.0)
            if self.engine is not None and not self.engine_down:
                self.refresh_flags()
                if self.accepting:
                    rate_scale = sum(self._demand(i) for i in range(len(self.gpus))) / len(self.gpus) / self._base
                    self.engine.advance(dt, rate_scale, clock, self.kv_factor, self.profile)
                    self._traffic = 1.0
                else:
                    self._traffic *= self.engine.drain(dt, clock, self.profile)
                    if self.engine.in_flight == 0:
                        self._traffic = 0.0
            if self.training is not None:
                stuck = self.hung or len(present) < len(self.gpus)
                if self._checkpoint_left is not None and not stuck and not self.down:
                    # A hung collective (or a rank whose GPU is gone) cannot write its checkpoint.
                    self._checkpoint_left -= dt
                    if self._checkpoint_left <= 0:
                        self._checkpoint_left, self.training_stopped = None, True
                if self.training_stopped:
                    self.training.mfu = [0.0] * len(self.training.ranks)
                else:
                    self.training.advance(dt, [g.effective_clock_factor for g in self.gpus], self.slowdowns, stuck)

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
        """The engine's hidden behaviour now: the release's profile combined with each flag's that is on,
        the running driver's on this GPU model (:attr:`driver_profile`) and the model's latency scale
        (1 on H100)."""
        m = self.cfg.model
        return combine(self.releases.profile(self.version),
                       *(self.releases.flag_profile(f) for f, on in self.flags.items() if on),
                       self.driver_profile.serving, Profile(m.ttft_scale, m.itl_scale))

    @property
    def driver_profile(self) -> DriverProfile:
        """The hidden behaviour of the running driver (:attr:`driver_version`) on this node's GPU model."""
        return self.releases.driver_profile(self.driver_version, self.cfg.model.name)

    def _driver_xids(self, dt: float) -> None:
        """The running driver's Xids (``xid_per_hour``): Poisson arrivals over ``dt`` seconds, each on a
        GPU drawn uniformly among those present, recorded like an injected Xid (DCGM and kernel log)."""
        rate = self.driver_profile.xid_per_hour
        if rate <= 0:
            return
        present = [i for i, g in enumerate(self.gpus) if g.present]
        lam, n = rate / 3600.0 * dt, 0
        # Knuth's Poisson draw (lam is small per tick).
        limit, p = math.exp(-lam), self._driver_rng.random()
        while p > limit:
            n += 1
            p *= self._driver_rng.random()
        for _ in range(n if present else 0):
            self._xid(self._driver_rng.choice(present), self.driver_profile.xid_code)

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

        self.down = bool(params("down")) or self.rebooting or self.reloading_driver
        self.hung = bool(params("collective-hang")) and self.training is not None
        self.kv_factor = max([float(p["factor"]) for p in params("kv-pressure")], default=1.0)
        drivers = params("driver")
        self.driver_version = str(drivers[-1]["version"]) if drivers else self.installed_driver
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

    # ---- node actions (the remediation controller's; POST /admin/node) ---------------------------
    @property
    def cordoned(self) -> bool:
        """New work is not placed on the node (some cordon mark is on it)."""
        return bool(self.cordons)

    @property
    def cordoned_by(self) -> str:
        """``"human"`` while an operator's cordon is on (it wins: the controller must never return such a
        node to service), else ``"gpuobs"`` while the controller's is, else ``""``."""
        return "human" if "human" in self.cordons else "gpuobs" if self.cordons else ""

    @property
    def accepting(self) -> bool:
        """Serving: the load balancer routes new requests to the node (neither cordoned nor draining)."""
        return not self.cordons and not self.draining

    @property
    def rebooting(self) -> bool:
        """The node is down for a reboot (:meth:`reboot`) and not back yet."""
        return self._reboot_until is not None

    @property
    def reloading_driver(self) -> bool:
        """The node is down for a driver install's module reload (:meth:`install_driver`), not back yet."""
        return self._reload_until is not None

    @property
    def in_flight(self) -> float:
        """Work still running on the node. Serving: the engine's running + waiting requests (0 once
        fewer than 0.5 remain, and 0 while the engine is down). Training: 1 while the rank runs or writes
        its checkpoint, 0 once it stopped after a drain's checkpoint or while the node is down."""
        with self.lock:
            if self.engine is not None:
                n = 0.0 if self.engine_down else self.engine.in_flight
                return 0.0 if n < 0.5 else round(n, 3)
            return 0.0 if self.down or self.training_stopped else 1.0

    def status(self) -> dict:
        """The node as ``GET /admin/node`` reports it (JSON-ready): hostname, role, gpu_model (modelName),
        driver_version (running: the installed one unless a ``driver`` fault overrides it),
        installed_driver, cordoned, cordoned_by (:attr:`cordoned_by`), cordons (every mark),
        cordon_reason, draining, in_flight (:attr:`in_flight`), drained (no work in flight: in_flight 0),
        checkpointing and training_stopped (training), boot_id, rebooting, reboot_remaining_s (simulated
        seconds), reloading_driver, reload_remaining_s and driver_target (install-driver's reload: the
        driver it loads, ``""`` when none), down (rebooting, reloading or a ``down`` fault),
        engine_generation (engine process replacements)."""
        with self.lock:
            in_flight = self.in_flight
            return {"hostname": self.hostname, "role": self.cfg.role, "gpu_model": self.cfg.model.name,
                    "driver_version": self.driver_version, "installed_driver": self.installed_driver,
                    "cordoned": self.cordoned,
                    "cordoned_by": self.cordoned_by, "cordons": sorted(self.cordons),
                    "cordon_reason": self.cordon_reason, "draining": self.draining, "in_flight": in_flight,
                    "drained": in_flight == 0,
                    "checkpointing": self._checkpoint_left is not None, "training_stopped": self.training_stopped,
                    "boot_id": self.boot_id, "rebooting": self.rebooting,
                    "reboot_remaining_s": round(max(0.0, self._reboot_until - self.now), 3) if self.rebooting else 0.0,
                    "reloading_driver": self.reloading_driver,
                    "reload_remaining_s": (round(max(0.0, self._reload_until - self.now), 3)
                                           if self.reloading_driver else 0.0),
                    "driver_target": self._reload_to or "",
                    "down": self.down, "engine_generation": self.engine_generation}

    def cordon(self, by: str, reason: str = "") -> dict:
        """Put ``by``'s cordon mark (``gpuobs`` or ``human``) on the node: serving, no new requests
        reach it (its in-flight ones finish); training, the job keeps running (only :meth:`drain` stops
        it). Idempotent. Returns :meth:`status`. NodeActionError for an unknown ``by``."""
        if by not in CORDON_BY:
            raise NodeActionError("by", f"field 'by' must be one of {', '.join(CORDON_BY)}; got {by!r}")
        with self.lock:
            self.cordons.add(by)
            if reason:
                self.cordon_reason = reason
            return self.status()

    def uncordon(self, by: str) -> dict:
        """Remove a cordon: ``human`` removes every mark, ``gpuobs`` only the controller's (a human's
        cordon stays). Once no mark is left the node is back in service: draining ends, traffic returns,
        a stopped training rank rejoins. Idempotent. Returns :meth:`status`."""
        if by not in CORDON_BY:
            raise NodeActionError("by", f"field 'by' must be one of {', '.join(CORDON_BY)}; got {by!r}")
        with self.lock:
            if by == "human":
                self.cordons.clear()
            else:
                self.cordons.discard("gpuobs")
            if not self.cordons:
                self.cordon_reason = ""
                self.draining = False
                self._checkpoint_left, self.training_stopped = None, False
            return self.status()

    def drain(self, reason: str = "") -> dict:
        """Start moving work off the node. Serving: no new requests (as a cordon does); in-flight
        ones finish over about the nominal service time. Training: signal a checkpoint; the rank writes
        it for :data:`CHECKPOINT_S` simulated seconds (not while the collective is hung or a GPU is gone:
        a hung job cannot checkpoint) and then stops. Idempotent (a second drain does not restart the
        checkpoint). Returns :meth:`status`."""
        with self.lock:
            if not self.draining:
                self.draining = True
                if self.training is not None and not self.training_stopped:
                    self._checkpoint_left = CHECKPOINT_S
            return self.status()

    def _require_up(self, action: str) -> None:
        """NodeStateError unless the node's host answers (not rebooting, not reloading its driver, no
        ``down`` fault)."""
        if self.rebooting:
            raise NodeStateError(f"{action}: {self.hostname} is rebooting (back in "
                                 f"{max(0.0, self._reboot_until - self.now):.0f} s)")
        if self.reloading_driver:
            raise NodeStateError(f"{action}: {self.hostname} is reloading its driver ({self._reload_to}; back in "
                                 f"{max(0.0, self._reload_until - self.now):.0f} s)")
        if self.down:
            raise NodeStateError(f"{action}: {self.hostname} is down (its host does not answer); reboot it")

    def _new_engine(self) -> list[str]:
        """Replace the serving engine process: a fresh Engine (counters from zero), every GPU's
        allocator back to its base (the process's memory is freed), and the faults that lived in the
        process (:data:`ENGINE_PROCESS_KINDS`) end. Returns the ended faults' ids. Caller recomputes."""
        self.engine_generation += 1
        seed = random.Random(f"{self.cfg.seed}:{self.cfg.index}:engine:{self.engine_generation}").randrange(2**32)
        self.engine = Engine(self.cfg.engine, seed)
        self._traffic = 1.0 if self.accepting else 0.0  # a fresh engine has nothing in flight
        for g in self.gpus:
            g.alloc.gap, g.alloc.allocated = g.alloc.base_gap, g.alloc.base_allocated
        ended = [fid for fid, f in self.faults.items() if f.request.kind in ENGINE_PROCESS_KINDS]
        for fid in ended:
            del self.faults[fid]
        return ended

    def reset_gpu(self, gpu: int) -> tuple[bool, str]:
        """Reset GPU ``gpu`` (``nvidia-smi -r``). Returns ``(ok, one-line detail)``.

        Fails, changing nothing, when the GPU has a fault a reset cannot clear: a row-remap failure
        (RMA path), Xid 79 (fallen off the bus: the catalogue's RESTART_BM, reboot the node), a thermal
        fault or an asserted power brake (mechanical / external). Otherwise clears the GPU's xid faults
        (the catalogue's RESET_GPU codes and any other), its ecc-dbe (the pending row remap activates:
        row_remap_pending 0) and nvlink-errors faults, empties its DCGM Xid state (last Xid, windowed
        events: the reset restarts the host engine's state), frees its allocator (fragmentation on it
        ends) and, on a serving node, restarts the engine (its process used the GPU; see
        :meth:`restart_engine`). pcie-replay (a link fault) stays. NodeActionError for a bad index,
        NodeStateError while the node is rebooting or down.
        """
        check_gpu(gpu, len(self.gpus))
        with self.lock:
            self._require_up("reset-gpu")
            mine = [f for f in self.faults.values() if f.request.gpu == gpu]
            blockers = list(dict.fromkeys(RESET_BLOCKERS[f.request.kind] for f in mine
                                          if f.request.kind in RESET_BLOCKERS))
            if any(f.request.kind == "xid" and int(f.request.params["code"]) == 79 for f in mine):
                blockers.append("fallen off the bus (Xid 79): reboot the node (RESTART_BM)")
            if blockers:
                return False, f"GPU {gpu} reset failed: {'; '.join(blockers)}; faults kept"
            cleared = [f for f in mine if f.request.kind in ("xid", "ecc-dbe", "nvlink-errors", "fragmentation")]
            for f in cleared:
                del self.faults[f.id]
            g = self.gpus[gpu]
            g.last_xid = None
            g.xid_events.clear()
            g.alloc.gap, g.alloc.allocated = g.alloc.base_gap, g.alloc.base_allocated
            names = [f"xid {f.request.params['code']}" if f.request.kind == "xid" else f.request.kind for f in cleared]
            parts = [f"GPU {gpu} reset", f"cleared {', '.join(names)}" if names else "no fault cleared"]
            if any(f.request.kind == "ecc-dbe" for f in cleared):
                parts.append("pending row remap activated")
            if self.engine is not None:
                ended = self._new_engine()
                parts.append(f"engine restarted (generation {self.engine_generation}"
                             + (f", ended {', '.join(ended)})" if ended else ")"))
            self._recompute_effects()
            return True, "; ".join(parts)

    def reboot(self, downtime_s: float = DEFAULT_REBOOT_S) -> str:
        """Reboot the node: down for ``downtime_s`` simulated seconds (no scrapes, no engine; the admin
        API stays up), then back with a new boot_id, a new (empty) kernel log, empty DCGM Xid state and
        volatile ECC counters, a fresh engine, and every fault cleared except :data:`REBOOT_PERSISTENT`
        (Xid 79 clears). Cordon marks and draining survive (as a Kubernetes node's unschedulable does);
        a drained training rank stays stopped. A reboot while rebooting changes nothing. Returns a
        one-line detail. NodeActionError for a negative or non-finite ``downtime_s``."""
        if not isinstance(downtime_s, (int, float)) or not math.isfinite(downtime_s) or downtime_s < 0:
            raise NodeActionError("downtime_s", f"field 'downtime_s' must be a finite number >= 0, got {downtime_s!r}")
        with self.lock:
            if self.rebooting:
                return f"{self.hostname} is already rebooting (back in {self._reboot_until - self.now:.0f} s)"
            old = self.boot_id
            self._reboot_until = self.now + float(downtime_s)
            self._recompute_effects()
            if downtime_s == 0:
                self._boot()
            return f"{self.hostname} rebooting for {float(downtime_s):g} s (boot_id was {old})"

    def _boot(self) -> None:
        """The end of a reboot (see :meth:`reboot`). A driver install whose reload the reboot interrupted
        completes: the node boots on the new driver (its module load line starts the new kernel log)."""
        self._reboot_until = None
        pending, self._reload_to, self._reload_until = self._reload_to, None, None
        for fid in [fid for fid, f in self.faults.items() if f.request.kind not in REBOOT_PERSISTENT]:
            del self.faults[fid]
        self.boot_id = str(uuid.uuid4())
        self.kernel_log = []
        self._uuid_logged = set()
        for g in self.gpus:
            g.last_xid = None
            g.xid_events.clear()
            g.ecc_sbe_vol = g.ecc_dbe_vol = 0
        if self.engine is not None:
            self._new_engine()
        if self.training is not None and self.draining:
            self._checkpoint_left, self.training_stopped = None, True
        if pending:
            self.installed_driver = pending
            self._log_driver_load(pending)
        self._recompute_effects()

    def restart_engine(self) -> str:
        """Restart the serving engine process (serving nodes only): a fresh Engine (counters restart),
        every GPU's allocator back to base, and the node's fragmentation and kv-pressure faults end (the
        fragmented process is gone; the surge's requests were dropped). Returns a one-line detail.
        NodeActionError on a training node; NodeStateError while the node is rebooting or down, or a
        GPU has fallen off the bus (the engine cannot start without it: reboot the node)."""
        with self.lock:
            if self.engine is None:
                raise NodeActionError("action", f"action 'restart-engine' needs a serving node; {self.hostname} "
                                                f"is a training node (it has no serving engine)")
            self._require_up("restart-engine")
            absent = [i for i, g in enumerate(self.gpus) if not g.present]
            if absent:
                raise NodeStateError(f"restart-engine: GPU {', '.join(map(str, absent))} of {self.hostname} fell off "
                                     f"the bus; the engine cannot start without it (reboot the node)")
            ended = self._new_engine()
            self._recompute_effects()
            return (f"engine restarted (generation {self.engine_generation})"
                    + (f"; ended {', '.join(ended)}" if ended else ""))

    def diag(self, gpu: int | None = None) -> dict:
        """The active health check, as ``dcgmi diag -r 2`` would report it, over GPU ``gpu`` (None:
        every GPU): ``{"passed": bool, "failures": ["GPU 3: row remap failure (Xid 64)", ...]}``, one
        string per problem. Fails for a GPU that is absent, or has an active Xid fault whose catalogue
        severity is critical (:func:`gpuobs.reference.xid.critical_codes`), ecc-dbe, row-remap-failure,
        nvlink-errors, pcie-replay, thermal or power-brake; and, while the running driver's hidden profile
        on this GPU model has ``diag_fails``, one more: ``driver 575.57.08: health check failed on NVIDIA L40S
        (...)``. NodeActionError for a bad index, NodeStateError while the node is rebooting, reloading its
        driver or down (no verdict)."""
        indexes = range(len(self.gpus)) if gpu is None else [check_gpu(gpu, len(self.gpus))]
        with self.lock:
            self._require_up("diag")
            failures: list[str] = []
            for i in indexes:
                if not self.gpus[i].present:
                    failures.append(f"GPU {i}: not found on the PCIe bus (Xid 79: fallen off the bus)")
                    continue
                for f in self.faults.values():
                    if f.request.gpu == i and (problem := self._diag_problem(f)):
                        failures.append(f"GPU {i}: {problem}")
            dp = self.driver_profile
            if dp.diag_fails:
                which = "every GPU" if gpu is None else f"GPU {gpu}"
                failures.append(f"driver {self.driver_version}: health check failed on {self.cfg.model.name} "
                                f"(dcgmi diag -r 2: the 'diagnostic' (GPU stress) test failed on {which})")
            failures = list(dict.fromkeys(failures))
            return {"passed": not failures, "failures": failures}

    def _diag_problem(self, f: Fault) -> str | None:
        """What the diagnostic reports for fault ``f`` on its GPU, or None if it does not see it."""
        kind, p, g = f.request.kind, f.request.params, self.gpus[f.request.gpu]
        if kind == "xid":
            info = xidcat.catalog().get(int(p["code"]))
            return f"Xid {info.code} ({info.message})" if info and info.severity == "critical" else None
        return {
            "ecc-dbe": f"uncorrectable ECC errors (Xid 48: {g.ecc_dbe_vol} DBE volatile), row remap pending (Xid 63)",
            "row-remap-failure": "row remap failure (Xid 64)",
            "nvlink-errors": f"NVLink CRC errors ({float(p.get('rate_per_s', 0)):g}/s)",
            "pcie-replay": f"PCIe replays ({float(p.get('rate_per_s', 0)):g}/s)",
            "thermal": f"thermal: cooling degraded (x{float(p.get('cooling_factor', 0)):g}), {g.temp_c:.0f} C",
            "power-brake": "power brake asserted (HW_POWER_BRAKE)",
        }.get(kind)

    # ---- driver install (a driver upgrade or downgrade; POST /admin/node install-driver) ----------------
    def install_driver(self, version: str, reload_s: float = DEFAULT_RELOAD_S) -> dict:
        """Install driver ``version`` (a version of :attr:`drivers`) and reload the kernel module.

        Idempotent: when ``version`` is already installed, returns at once with ``changed`` False and
        nothing else happens (no precondition checked, no reload). Otherwise the node must be cordoned
        and drained, no work in flight (:attr:`in_flight` 0: a serving engine with no requests, a
        training rank stopped after its drain's checkpoint). The reload: the node is down for
        ``reload_s`` simulated seconds (no DCGM or engine page; the admin API stays up), then back on the
        new driver: every GPU reset (as :meth:`reset_gpu` clears: ``xid``, ``ecc-dbe``, ``nvlink-errors``
        and ``fragmentation`` faults end, the DCGM Xid state empties), the serving engine restarted
        (counters restart, ``engine_generation`` +1, like :meth:`restart_engine`), the kernel log gains
        the module's ``NVRM: loading NVIDIA UNIX x86_64 Kernel Module  <version>  <build>`` line, and
        ``driver_version`` (the ``DCGM_FI_DRIVER_VERSION`` label) is the new one unless a ``driver``
        fault overrides it. Cordons, draining and the boot_id stay (a module reload is not a reboot);
        a reboot during the reload completes the install at boot.

        Returns :meth:`status` plus ``changed`` (bool), ``previous`` (the driver installed before) and
        ``detail`` (one line). NodeActionError(``version``) for a version not in the catalogue (the
        message lists them), (``reload_s``) for a negative or non-finite one; NodeStateError (409) while
        the node is rebooting, reloading or down, not cordoned, has work in flight, or has a GPU off the
        bus (the module cannot reload over a lost GPU: reboot the node).
        """
        if version not in self.drivers.drivers:
            raise NodeActionError("version", f"field 'version' must be one of {', '.join(self.drivers.drivers)}; "
                                             f"got {version!r}")
        if not isinstance(reload_s, (int, float)) or not math.isfinite(reload_s) or reload_s < 0:
            raise NodeActionError("reload_s", f"field 'reload_s' must be a finite number >= 0, got {reload_s!r}")
        with self.lock:
            self._require_up("install-driver")
            previous = self.installed_driver
            if version == previous:
                return {**self.status(), "changed": False, "previous": previous,
                        "detail": f"driver {version} is already installed on {self.hostname}; nothing to do"}
            if not self.cordons:
                raise NodeStateError(f"install-driver: {self.hostname} is not cordoned; cordon and drain it first")
            work = self.in_flight
            if work:
                what = (f"{work:g} requests in flight" if self.engine is not None else
                        "its training rank is still writing its checkpoint" if self._checkpoint_left is not None
                        else "its training rank is still running (drain it: the rank checkpoints, then stops)")
                raise NodeStateError(f"install-driver: {self.hostname} is not drained ({what}); wait until "
                                     f"GET /admin/node says drained")
            absent = [i for i, g in enumerate(self.gpus) if not g.present]
            if absent:
                raise NodeStateError(f"install-driver: GPU {', '.join(map(str, absent))} of {self.hostname} fell off "
                                     f"the bus; the driver cannot reload over it (reboot the node)")
            self._reload_to, self._reload_until = version, self.now + float(reload_s)
            self._recompute_effects()
            if reload_s == 0:
                self._driver_loaded()
            return {**self.status(), "changed": True, "previous": previous,
                    "detail": f"installing driver {version} on {self.hostname} (was {previous}): module reload, "
                              f"down for {float(reload_s):g} s"}

    def _driver_loaded(self) -> None:
        """The end of a driver install's reload (see :meth:`install_driver`). Caller holds the lock."""
        version, self._reload_to, self._reload_until = self._reload_to, None, None
        self.installed_driver = version
        for fid in [fid for fid, f in self.faults.items()
                    if f.request.kind in ("xid", "ecc-dbe", "nvlink-errors", "fragmentation")]:
            del self.faults[fid]
        for g in self.gpus:
            g.last_xid = None
            g.xid_events.clear()
            g.alloc.gap, g.alloc.allocated = g.alloc.base_gap, g.alloc.base_allocated
        self._uuid_logged = set()
        if self.engine is not None:
            self._new_engine()
        self._log_driver_load(version)
        self._recompute_effects()

    def _log_driver_load(self, version: str) -> None:
        """Append the kernel module's load line for ``version`` to the kernel log, dmesg-style."""
        try:
            line = self.drivers.get(version).load_line
        except KeyError:  # a version outside the catalogue (not reachable through install_driver)
            line = f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {version}"
        self.kernel_log.append(f"[{self.now:12.6f}] {line}")
