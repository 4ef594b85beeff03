"""Physics of one simulated GPU: load -> activity -> power -> temperature -> clocks.

All quantities are in the units dcgm-exporter reports them in (design §4.1): clocks MHz,
temperature degrees C, power W, energy mJ, framebuffer MiB, violation counters ns.
The model is a first-order thermal RC circuit with a proportional clock governor:

* power  = idle + (TDP - idle) * activity * f**2   (f = clock factor 0..1; dynamic power ~ f*V^2)
* dT/dt  = (ambient + R * power - T) / tau          (R: thermal resistance C/W, tau: seconds)
* above the slowdown temperature the governor lowers f until temperature settles, sets the
  clock-event bits SW_THERMAL (0x20) and, past the hardware slowdown point, HW_SLOWDOWN (0x8) and
  HW_THERMAL (0x40), and accrues DCGM_FI_DEV_THERMAL_VIOLATION.

H100 SXM5 figures (NVIDIA H100 datasheet): TDP 700 W, max boost SM clock 1980 MHz, HBM3 memory
clock 2619 MHz, 81559 MiB framebuffer as NVML reports it; idle power ~70 W (design §5).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from gpuobs.exporter.identity import GpuIdentity

# Clock event reason bits (DCGM_FI_DEV_CLOCKS_EVENT_REASONS; NVML nvmlClocksEventReason*).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80


@dataclass(frozen=True)
class GpuModel:
    """Static characteristics of a GPU product (datasheet values)."""

    name: str = "NVIDIA H100 80GB HBM3"
    tdp_w: float = 700.0
    idle_w: float = 70.0
    max_sm_clock_mhz: float = 1980.0
    mem_clock_mhz: float = 2619.0
    fb_total_mib: int = 81559
    fb_reserved_mib: int = 579
    ambient_c: float = 30.0
    thermal_resistance_c_per_w: float = 0.068
    thermal_tau_s: float = 20.0
    slowdown_temp_c: float = 87.0
    hw_slowdown_temp_c: float = 92.0


H100_SXM = GpuModel()


@dataclass
class XidEvent:
    """One Xid as the driver reports it: sim time (s), code, message."""

    t: float
    code: int
    message: str


@dataclass
class GpuState:
    """Mutable state of one GPU. ``advance`` moves it ``dt`` seconds forward.

    Fault effects are applied by the node through the ``cooling_factor`` (multiplies thermal
    resistance; 2.0 = failed fan / blocked airflow) and ``present`` (False = fallen off the bus).
    """

    ident: GpuIdentity
    model: GpuModel = H100_SXM
    activity: float = 0.0
    clock_factor: float = 1.0
    temp_c: float = 35.0
    power_w: float = 70.0
    energy_mj: float = 0.0
    fb_used_mib: float = 0.0
    thermal_violation_ns: float = 0.0
    clock_event_reasons: int = GPU_IDLE
    present: bool = True
    cooling_factor: float = 1.0
    last_xid: XidEvent | None = None
    xid_events: collections.deque = field(default_factory=collections.deque)

    def advance(self, dt: float, load: float, fb_target_mib: float) -> None:
        """Advance ``dt`` seconds with demanded load ``load`` (0..1) and framebuffer target (MiB)."""
        m = self.model
        self.activity = min(1.0, max(0.0, load))
        # Proportional governor: cut clocks while above the slowdown point, recover slowly otherwise.
        # A 2 C hysteresis band below the slowdown point holds the clock steady instead of hunting.
        over = self.temp_c - m.slowdown_temp_c
        if over > 0:
            self.clock_factor -= min(0.05, 0.004 * over) * dt
        elif over < -2.0:
            self.clock_factor += 0.01 * dt
        self.clock_factor = min(1.0, max(0.4, self.clock_factor))
        throttled = self.clock_factor < 0.999
        dyn = (m.tdp_w - m.idle_w) * self.activity * self.clock_factor ** 2
        self.power_w = m.idle_w + dyn
        self.energy_mj += self.power_w * dt * 1000.0
        t_ss = m.ambient_c + m.thermal_resistance_c_per_w * self.cooling_factor * self.power_w
        alpha = min(1.0, dt / m.thermal_tau_s)
        self.temp_c += (t_ss - self.temp_c) * alpha
        if throttled:
            self.thermal_violation_ns += dt * 1e9
        reasons = 0
        if self.activity < 0.05:
            reasons |= GPU_IDLE
        if throttled:
            reasons |= SW_THERMAL
        if self.temp_c >= m.hw_slowdown_temp_c:
            reasons |= HW_SLOWDOWN | HW_THERMAL
        self.clock_event_reasons = reasons
        self.fb_used_mib += (fb_target_mib - self.fb_used_mib) * min(1.0, dt / 5.0)

    @property
    def sm_clock_mhz(self) -> float:
        """Current SM clock: idle GPUs park at a low clock, busy ones run at f * max boost."""
        m = self.model
        if self.activity < 0.05:
            return 345.0
        return m.max_sm_clock_mhz * self.clock_factor

    @property
    def gpu_util_pct(self) -> float:
        """DCGM_FI_DEV_GPU_UTIL: % of the sample period a kernel was resident (saturates early)."""
        return min(100.0, self.activity * 140.0)

    @property
    def sm_active(self) -> float:
        """DCGM_FI_PROF_SM_ACTIVE ratio: fraction of cycles with a warp on an SM."""
        return min(1.0, self.activity * 0.92 * (0.6 + 0.4 * self.clock_factor))

    @property
    def tensor_active(self) -> float:
        """DCGM_FI_PROF_PIPE_TENSOR_ACTIVE ratio: tensor (HMMA) pipe busy fraction."""
        return self.sm_active * 0.55

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
