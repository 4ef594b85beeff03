"""Physics of one simulated GPU: load -> activity -> power -> temperature -> clocks, plus its
error counters and the framework's caching allocator.

Quantities use dcgm-exporter's units (docs/metrics.md): clocks MHz, temperature C, power W, energy mJ,
framebuffer MiB, violation counters ns; the allocator uses bytes (torch.cuda.memory_stats).
The thermal model is a first-order RC circuit with a proportional clock governor:

* power  = idle + (P_boost - idle) * activity * f**2   (f = clock factor 0..1; dynamic power ~ f*V^2;
  P_boost = what a fully busy GPU would draw at max boost, more than its power limit under dense load)
* at the power limit (TDP by default) the power governor lowers f so that power stays at the limit, sets
  SW_POWER_CAP (0x4) and accrues DCGM_FI_DEV_POWER_VIOLATION, as a real H100 does under dense load
  (training, ~0.93 busy, runs at its cap most of the time): normal operation, not a fault (the
  GPUThrottling rule ignores it, runbooks/throttling.md)
* dT/dt  = (ambient + R * cooling * power - T) / tau
* above the slowdown temperature the governor lowers f until temperature settles inside a 2 C
  band, sets SW_THERMAL (0x20) and, past the hardware slowdown point, HW_SLOWDOWN (0x8) and
  HW_THERMAL (0x40), and accrues DCGM_FI_DEV_THERMAL_VIOLATION; an asserted power brake caps f,
  sets HW_POWER_BRAKE (0x80) and HW_SLOWDOWN and accrues DCGM_FI_DEV_POWER_VIOLATION.

H100 SXM5 figures (NVIDIA H100 datasheet): TDP 700 W, max boost SM clock 1980 MHz, HBM3 memory
clock 2619 MHz, 81559 MiB framebuffer as NVML reports it; idle power ~70 W (docs/faults.md, healthy bands).
L40S figures: :data:`L40S`. :data:`GPU_MODELS` maps the short names ``--gpu-models`` takes (``H100``,
``L40S``) to the models; :func:`parse_gpu_models` reads that flag.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field

from gpuobs.core.errors import InputError
from gpuobs.exporter.sim.identity import GpuIdentity
from gpuobs.reference.dcgm_exporter import (  # noqa: F401  (clock-event bits, re-exported for the simulator)
    GPU_IDLE,
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_POWER_CAP,
    SW_THERMAL,
)


MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuModel:
    """Static characteristics of a GPU product (datasheet values)."""

    name: str = "NVIDIA H100 80GB HBM3"
    tdp_w: float = 700.0
    #: Power a fully busy GPU would draw at max boost with no limit: dense kernels push an H100 past
    #: its 700 W TDP, so under dense load the power governor (SW_POWER_CAP) holds it at its limit.
    boost_power_w: float = 750.0
    idle_w: float = 70.0
    max_sm_clock_mhz: float = 1980.0
    idle_sm_clock_mhz: float = 345.0
    mem_clock_mhz: float = 2619.0
    fb_total_mib: int = 81559
    fb_reserved_mib: int = 579
    context_mib: int = 560
    ambient_c: float = 30.0
    thermal_resistance_c_per_w: float = 0.068
    thermal_tau_s: float = 20.0
    slowdown_temp_c: float = 87.0
    hw_slowdown_temp_c: float = 92.0
    nvlink_bytes_per_s_at_full_load: float = 120e9
    pcie_bytes_per_s_at_full_load: float = 6e9
    #: Whether DCGM reports FB_* fields for a MIG instance of this product: not on H100
    #: (NVIDIA/dcgm-exporter issues #512, #380: H100 instances carry no FB_FREE/FB_USED series).
    mig_instance_fb: bool = False
    #: Serving latency of the simulated workload on this product relative to an H100 SXM (multiplies the
    #: engine's TTFT and ITL; 1 on H100, so the default fleet's numbers are unchanged).
    ttft_scale: float = 1.0
    itl_scale: float = 1.0


H100_SXM = GpuModel()

#: NVIDIA L40S (Ada Lovelace AD102, PCIe Gen4 x16, dual-slot, passively cooled). Source: NVIDIA L40S
#: datasheet (nvidia.com, "L40S GPU for AI and Graphics Performance", 2023): max power 350 W, 48 GB
#: GDDR6 with ECC, 864 GB/s, no NVLink, passive cooling; boost clock 2520 MHz (NVIDIA's product
#: specifications). Framebuffer as NVML reports it: 46068 MiB (``nvidia-smi``'s FB total on an L40S).
#: Memory clock 9001 MHz is what NVML reports for its 18 Gbps GDDR6 (``nvidia-smi -q`` max memory clock on
#: L40/L40S). Estimates, not datasheet figures: idle power ~35 W and idle SM clock 210 MHz (Ada parks
#: at P8), driver reserve 512 MiB, context 420 MiB; thermals of a passive card in a server's air stream
#: (warmer inlet, 35 C, behind the chassis fans; ~74 C at 350 W steady state; a heavier heatsink, tau
#: 30 s; the same 87/92 C slowdown points as the H100 model). P_boost 380 W: like the H100, a dense load
#: would exceed the limit, so the power governor caps it. No NVLink: ``nvlink_bytes_per_s_at_full_load``
#: 0, tensor-parallel traffic goes over PCIe (12 GB/s at full load, half of a Gen4 x16 link's 25 GB/s).
#: Serving latency: TTFT x1.3 and ITL x1.3 against an H100 for the simulated workload, a deliberately
#: mild scale: the datasheet ratios (362 vs 989 dense FP16 TFLOPS for prefill, 864 GB/s vs 3.35 TB/s for
#: decode) would be ~2.7x and ~3.9x and push the default workload past the simulated KV cache, while the
#: driver-upgrade judge compares each model only with its own history.
L40S = GpuModel(
    name="NVIDIA L40S",
    tdp_w=350.0,
    boost_power_w=380.0,
    idle_w=35.0,
    max_sm_clock_mhz=2520.0,
    idle_sm_clock_mhz=210.0,
    mem_clock_mhz=9001.0,
    fb_total_mib=46068,
    fb_reserved_mib=512,
    context_mib=420,
    ambient_c=35.0,
    thermal_resistance_c_per_w=0.11,
    thermal_tau_s=30.0,
    slowdown_temp_c=87.0,
    hw_slowdown_temp_c=92.0,
    nvlink_bytes_per_s_at_full_load=0.0,
    pcie_bytes_per_s_at_full_load=12e9,
    mig_instance_fb=False,
    ttft_scale=1.3,
    itl_scale=1.3,
)

#: Short name (what ``--gpu-models`` takes) -> model.
GPU_MODELS: dict[str, GpuModel] = {"H100": H100_SXM, "L40S": L40S}


def parse_gpu_models(spec: str, serving_nodes: int, field_name: str = "--gpu-models") -> list[GpuModel]:
    """The model of each serving node, in node order, from ``spec`` = ``SHORT:COUNT[,SHORT:COUNT...]``
    (e.g. ``H100:19,L40S:1``: the first 19 serving nodes H100, the next one L40S). An empty ``spec``:
    every serving node an H100. Raises :class:`~gpuobs.core.errors.InputError` naming ``field_name``:
    a malformed entry, an unknown short name (the message lists :data:`GPU_MODELS`), a count below 1,
    or counts whose sum differs from ``serving_nodes``."""
    spec = (spec or "").strip()
    if not spec:
        return [H100_SXM] * serving_nodes
    known = ", ".join(GPU_MODELS)
    out: list[GpuModel] = []
    for entry in spec.split(","):
        name, sep, count = entry.strip().partition(":")
        if not sep or not count.strip().isdigit() or not name.strip():
            raise InputError(f"{field_name} {spec!r}: entry {entry.strip()!r} must be MODEL:COUNT (e.g. "
                             f"H100:19,L40S:1); models: {known}")
        if name.strip() not in GPU_MODELS:
            raise InputError(f"{field_name} {spec!r}: unknown GPU model {name.strip()!r}; known: {known}")
        if int(count) < 1:
            raise InputError(f"{field_name} {spec!r}: count of {name.strip()} must be at least 1, got {count.strip()}")
        out += [GPU_MODELS[name.strip()]] * int(count)
    if len(out) != serving_nodes:
        raise InputError(f"{field_name} {spec!r}: counts sum to {len(out)}, expected {serving_nodes} (the serving "
                         f"nodes: --nodes minus --training-nodes)")
    return out


@dataclass
class XidEvent:
    """One Xid as the driver reports it: sim time (s), code, message."""

    t: float
    code: int
    message: str


@dataclass
class Allocator:
    """The framework's caching allocator on one GPU (torch.cuda.memory_stats names), bytes.

    ``reserved - allocated`` is the cache; fragmentation grows it while allocated stays flat. When
    reserved nears capacity the allocator frees its cache and retries (``num_alloc_retries``); when
    that fails it raises OOM (``num_ooms``) and the engine restarts with a fresh cache.
    """

    allocated: float = 0.0
    base_allocated: float = 0.0
    gap: float = 0.0
    base_gap: float = 384 * MIB
    retries: int = 0
    ooms: int = 0

    @property
    def reserved(self) -> float:
        return self.allocated + self.gap

    @property
    def inactive_split(self) -> float:
        """Bytes in inactive split blocks: most of a fragmented cache is unusable split blocks."""
        return 0.15 * self.base_gap + 0.85 * max(0.0, self.gap - self.base_gap)

    def advance(self, dt: float, capacity: float, frag_bytes_per_s: float, leak_bytes_per_s: float,
                rng: random.Random) -> None:
        """Grow gap (fragmentation) and allocated (leak) for ``dt`` s against ``capacity`` bytes."""
        self.gap += frag_bytes_per_s * dt
        self.allocated += leak_bytes_per_s * dt
        if frag_bytes_per_s == 0 and self.gap > self.base_gap:  # healthy churn slowly compacts the cache
            self.gap = max(self.base_gap, self.gap - 64 * MIB * dt)
        if self.reserved > 0.97 * capacity:
            self.retries += 1 + int(rng.random() < 0.5 * dt)
        if self.reserved >= capacity:
            self.ooms += 1
            self.gap = self.base_gap
            self.allocated = self.base_allocated


@dataclass
class GpuState:
    """Mutable state of one GPU. ``advance`` moves it ``dt`` seconds forward.

    Fault effects are set by the node from its active faults: ``cooling_factor`` (multiplies the
    thermal resistance), ``brake_factor`` (clock cap while HW_POWER_BRAKE is asserted, 1 = off),
    ``hung`` (a collective hang: kernel resident but idle), ``present`` (False = fallen off the bus).
    """

    ident: GpuIdentity
    model: GpuModel = H100_SXM
    activity: float = 0.0
    clock_factor: float = 1.0
    temp_c: float = 35.0
    power_w: float = 70.0
    energy_mj: float = 0.0
    thermal_violation_ns: float = 0.0
    power_violation_ns: float = 0.0
    clock_event_reasons: int = GPU_IDLE
    present: bool = True
    cooling_factor: float = 1.0
    brake_factor: float = 1.0
    #: Enforced power limit (W); None = the model's TDP (`nvidia-smi -pl` sets it on a real GPU).
    power_limit_w: float | None = None
    #: Clock cap the power governor applies to hold power at the limit (1 = not at the cap).
    power_cap_factor: float = 1.0
    hung: bool = False
    ecc_sbe_vol: int = 0
    ecc_dbe_vol: int = 0
    ecc_sbe_agg: int = 0
    ecc_dbe_agg: int = 0
    remapped_rows_correctable: int = 0
    remapped_rows_uncorrectable: int = 0
    row_remap_failure: int = 0
    row_remap_pending: int = 0
    nvlink_crc_flit_errors: float = 0.0
    nvlink_replay_errors: float = 0.0
    nvlink_recovery_errors: float = 0.0
    nvlink_bandwidth_total: float = 0.0
    pcie_replays: float = 0.0
    nvlink_error_rate: float = 0.0
    pcie_replay_rate: float = 0.0
    alloc: Allocator = field(default_factory=Allocator)
    frag_bytes_per_s: float = 0.0
    leak_bytes_per_s: float = 0.0
    last_xid: XidEvent | None = None
    xid_events: collections.deque = field(default_factory=collections.deque)

    def advance(self, dt: float, load: float, rng: random.Random) -> None:
        """Advance ``dt`` seconds with demanded load ``load`` (0..1)."""
        m = self.model
        self.activity = min(1.0, max(0.0, load))
        # Hysteresis: hold the clock within 2 C below the slowdown point, creep up within 5 C, recover
        # quickly only when well below it, so the governor settles instead of hunting.
        over = self.temp_c - m.slowdown_temp_c
        if over > 0:
            self.clock_factor -= min(0.05, 0.004 * over) * dt
        elif over < -5.0:  # well below the limit (cooling restored): recover quickly
            self.clock_factor += 0.03 * dt
        elif over < -2.0:
            self.clock_factor += 0.003 * dt
        self.clock_factor = min(1.0, max(0.4, self.clock_factor))
        thermal_throttled = self.clock_factor < 0.999
        braked = self.brake_factor < 1.0
        f = min(self.clock_factor, self.brake_factor)
        busy = 0.03 if self.hung else self.activity
        dyn_w = (m.boost_power_w - m.idle_w) * busy
        limit_w = m.tdp_w if self.power_limit_w is None else self.power_limit_w
        # Power governor: the clock that holds power at the limit, if the demand at f exceeds it.
        capped = dyn_w > 0 and m.idle_w + dyn_w * f ** 2 > limit_w
        self.power_cap_factor = (max(0.0, limit_w - m.idle_w) / dyn_w) ** 0.5 if capped else 1.0
        f = min(f, self.power_cap_factor)
        self.power_w = m.idle_w + dyn_w * f ** 2
        self.energy_mj += self.power_w * dt * 1000.0
        t_ss = m.ambient_c + m.thermal_resistance_c_per_w * self.cooling_factor * self.power_w
        self.temp_c += (t_ss - self.temp_c) * min(1.0, dt / m.thermal_tau_s)
        if thermal_throttled:
            self.thermal_violation_ns += dt * 1e9
        if braked or capped:
            self.power_violation_ns += dt * 1e9
        reasons = 0
        if self.activity < 0.05 and not self.hung:
            reasons |= GPU_IDLE
        if thermal_throttled:
            reasons |= SW_THERMAL
        if self.temp_c >= m.hw_slowdown_temp_c:
            reasons |= HW_SLOWDOWN | HW_THERMAL
        if braked:
            reasons |= HW_POWER_BRAKE | HW_SLOWDOWN
        if capped:
            reasons |= SW_POWER_CAP
        self.clock_event_reasons = reasons
        self.nvlink_bandwidth_total += busy * m.nvlink_bytes_per_s_at_full_load * dt / 1024  # KiB counter
        if self.nvlink_error_rate:
            self.nvlink_crc_flit_errors += self.nvlink_error_rate * dt
            self.nvlink_replay_errors += 0.1 * self.nvlink_error_rate * dt
            self.nvlink_recovery_errors += 0.01 * self.nvlink_error_rate * dt
        self.pcie_replays += self.pcie_replay_rate * dt
        capacity = (m.fb_total_mib - m.fb_reserved_mib - m.context_mib) * MIB
        self.alloc.advance(dt, capacity, self.frag_bytes_per_s, self.leak_bytes_per_s, rng)

    @property
    def effective_clock_factor(self) -> float:
        """Fraction of max SM clock currently allowed (thermal governor, power brake and power cap)."""
        return min(self.clock_factor, self.brake_factor, self.power_cap_factor)

    @property
    def sm_clock_mhz(self) -> float:
        """Current SM clock: idle GPUs park at a low clock, busy ones run at f * max boost."""
        m = self.model
        if self.activity < 0.05 and not self.hung:
            return m.idle_sm_clock_mhz
        return m.max_sm_clock_mhz * self.effective_clock_factor

    @property
    def gpu_util_pct(self) -> float:
        """DCGM_FI_DEV_GPU_UTIL: % of the sample period a kernel was resident (saturates early; a
        hung NCCL kernel spinning on a flag keeps it at 100)."""
        return 100.0 if self.hung else min(100.0, self.activity * 140.0)

    @property
    def sm_active(self) -> float:
        """DCGM_FI_PROF_SM_ACTIVE ratio: fraction of cycles with a warp on an SM."""
        if self.hung:
            return 0.02
        return min(1.0, self.activity * 0.92 * (0.6 + 0.4 * self.effective_clock_factor))

    @property
    def tensor_active(self) -> float:
        """DCGM_FI_PROF_PIPE_TENSOR_ACTIVE ratio: tensor (HMMA) pipe busy fraction."""
        return 0.0 if self.hung else self.sm_active * 0.55

    @property
    def dram_active(self) -> float:
        """DCGM_FI_PROF_DRAM_ACTIVE ratio: memory interface busy fraction (decode is memory-bound)."""
        return 0.01 if self.hung else min(1.0, self.activity * 0.6)

    @property
    def fb_used_mib(self) -> float:
        """DCGM_FI_DEV_FB_USED: the allocator's reserved memory plus the CUDA context."""
        return self.alloc.reserved / MIB + self.model.context_mib

    @property
    def fb_free_mib(self) -> float:
        """Free framebuffer: total - used - driver reserved."""
        m = self.model
        return max(0.0, m.fb_total_mib - m.fb_reserved_mib - self.fb_used_mib)

    def record_xid(self, t: float, code: int, message: str, window_s: float) -> None:
        """Record an Xid at sim time ``t``; keeps events inside the sliding window."""
        ev = XidEvent(t, code, message)
        self.last_xid = ev
        self.xid_events.append(ev)
        self.prune_xids(t, window_s)

    def prune_xids(self, now: float, window_s: float) -> None:
        """Drop Xid events older than ``window_s`` seconds (DCGM_EXP_XID_ERRORS_COUNT window)."""
        while self.xid_events and self.xid_events[0].t <= now - window_s:
            self.xid_events.popleft()

    def xid_counts(self) -> dict[int, int]:
        """Xid code -> count of events still inside the window."""
        counts: dict[int, int] = {}
        for ev in self.xid_events:
            counts[ev.code] = counts.get(ev.code, 0) + 1
        return counts
