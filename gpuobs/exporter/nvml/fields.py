"""DCGM fields read from NVML: the field table and one reader per NVML call.

Each reader takes the ``pynvml`` module and a device handle and returns ``{DCGM field: value}`` in
dcgm-exporter's units; its docstring names the NVML call and the unit conversion. A reader raises
:class:`Unsupported` (or lets ``NVMLError_NotSupported`` through) when the GPU, driver or binding does
not offer the call; :func:`is_unsupported` classifies such errors so the collector omits the fields.
Constants are read from the binding, with nvml.h's values as fallbacks for old bindings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: NVML return codes (nvml.h), used when the binding lacks the named constant.
CODES = {"NVML_ERROR_INVALID_ARGUMENT": 2, "NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_DRIVER_NOT_LOADED": 9,
         "NVML_ERROR_TIMEOUT": 10, "NVML_ERROR_LIBRARY_NOT_FOUND": 12, "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
         "NVML_ERROR_GPU_IS_LOST": 15}
MIB = 1 << 20

# (name, type, integer-formatted, HELP) in page order; HELP as dcgm-exporter's default-counters.csv and
# the simulated collector (violation counters in ns, docs/nvml.md).
FIELDS: list[tuple[str, str, bool, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", True, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", True, "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", True, "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", True, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", False, "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", True, "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", True, "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", True, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", True, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", True, "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", True, "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", True, "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", True, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", True, "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", True, "Current clock event reasons (bitmask)."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", True, "Throttling duration due to power constraints (in ns)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", True, "Throttling duration due to thermal constraints (in ns)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", True, "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", True, "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", True, "Total number of single-bit persistent ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", True, "Total number of double-bit persistent ECC errors."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", True, "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", True, "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", True, "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", True, "Whether remapping of rows is pending (a GPU reset applies it)"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", True,
     "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", True, "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", True, "Total number of NVLink recovery errors."),
]

#: dcgm-exporter fields the NVML source never emits, and why (every ``DCGM_FI_PROF_*`` is omitted too:
#: those ratios come from DCGM's profiling module, which NVML does not expose).
OMITTED: dict[str, str] = {
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM's own aggregate of per-lane counters; NVML's NVLink throughput "
                                          "fields differ in unit and reset behaviour, so no value is approximated",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "only meaningful inside a vGPU guest; a bare-metal NVML has no such field",
}

Reader = Callable[[Any, Any], dict[str, float]]


class Unsupported(Exception):
    """The GPU, driver or binding does not offer this NVML call: its fields are omitted."""


def code(m: Any, name: str) -> int:
    """NVML constant ``name`` from the binding, else nvml.h's value."""
    return int(getattr(m, name, CODES[name]))


def error_value(exc: BaseException) -> int | None:
    """The NVML return code carried by an ``NVMLError`` (its ``value``), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def is_unsupported(m: Any, exc: BaseException) -> bool:
    """True for 'this GPU cannot give it': NOT_SUPPORTED, FUNCTION_NOT_FOUND, or :class:`Unsupported`."""
    return isinstance(exc, Unsupported) or error_value(exc) in (
        code(m, "NVML_ERROR_NOT_SUPPORTED"), code(m, "NVML_ERROR_FUNCTION_NOT_FOUND"))


def text(value: Any) -> str:
    """NVML strings arrive as ``bytes`` from struct fields and old bindings; decode them."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def fn(m: Any, name: str) -> Callable[..., Any]:
    """The binding's function ``name``; a binding too old to have it means 'not supported'."""
    f = getattr(m, name, None)
    if f is None:
        raise Unsupported(name)
    return f


def clocks(m: Any, h: Any) -> dict[str, float]:
    """SM and memory clocks, MHz (nvmlDeviceGetClockInfo with NVML_CLOCK_SM / NVML_CLOCK_MEM)."""
    get = fn(m, "nvmlDeviceGetClockInfo")
    return {"DCGM_FI_DEV_SM_CLOCK": get(h, getattr(m, "NVML_CLOCK_SM", 1)),
            "DCGM_FI_DEV_MEM_CLOCK": get(h, getattr(m, "NVML_CLOCK_MEM", 2))}


def memory_temp(m: Any, h: Any) -> dict[str, float]:
    """HBM temperature, C (nvmlDeviceGetFieldValues with NVML_FI_DEV_MEMORY_TEMP, field 82; the
    per-field ``nvmlReturn`` NOT_SUPPORTED means the board has no memory sensor)."""
    fv = fn(m, "nvmlDeviceGetFieldValues")(h, [getattr(m, "NVML_FI_DEV_MEMORY_TEMP", 82)])[0]
    ret = int(getattr(fv, "nvmlReturn", 0))
    if ret == code(m, "NVML_ERROR_NOT_SUPPORTED"):
        raise Unsupported("NVML_FI_DEV_MEMORY_TEMP")
    if ret != 0:
        raise RuntimeError(f"NVML_FI_DEV_MEMORY_TEMP returned NVML error {ret}")
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return {"DCGM_FI_DEV_MEMORY_TEMP": getattr(fv.value, member.get(int(fv.valueType), "uiVal"))}


def gpu_temp(m: Any, h: Any) -> dict[str, float]:
    """GPU core temperature, C (nvmlDeviceGetTemperature with NVML_TEMPERATURE_GPU)."""
    return {"DCGM_FI_DEV_GPU_TEMP": fn(m, "nvmlDeviceGetTemperature")(h, getattr(m, "NVML_TEMPERATURE_GPU", 0))}


def power(m: Any, h: Any) -> dict[str, float]:
    """Power draw, W (nvmlDeviceGetPowerUsage returns mW; divided by 1000 as a float)."""
    return {"DCGM_FI_DEV_POWER_USAGE": fn(m, "nvmlDeviceGetPowerUsage")(h) / 1000.0}


def energy(m: Any, h: Any) -> dict[str, float]:
    """Energy since the driver loaded, mJ (nvmlDeviceGetTotalEnergyConsumption)."""
    return {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": fn(m, "nvmlDeviceGetTotalEnergyConsumption")(h)}


def pcie_replay(m: Any, h: Any) -> dict[str, float]:
    """PCIe replays, count (nvmlDeviceGetPcieReplayCounter)."""
    return {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": fn(m, "nvmlDeviceGetPcieReplayCounter")(h)}


def utilization(m: Any, h: Any) -> dict[str, float]:
    """GPU and memory-copy utilisation, % (nvmlDeviceGetUtilizationRates ``.gpu`` / ``.memory``)."""
    u = fn(m, "nvmlDeviceGetUtilizationRates")(h)
    return {"DCGM_FI_DEV_GPU_UTIL": u.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": u.memory}


def encoder(m: Any, h: Any) -> dict[str, float]:
    """Encoder utilisation, % (nvmlDeviceGetEncoderUtilization()[0]; [1] is the sample period)."""
    return {"DCGM_FI_DEV_ENC_UTIL": fn(m, "nvmlDeviceGetEncoderUtilization")(h)[0]}


def decoder(m: Any, h: Any) -> dict[str, float]:
    """Decoder utilisation, % (nvmlDeviceGetDecoderUtilization()[0])."""
    return {"DCGM_FI_DEV_DEC_UTIL": fn(m, "nvmlDeviceGetDecoderUtilization")(h)[0]}


def memory(m: Any, h: Any) -> dict[str, float]:
    """Framebuffer free / used / reserved, MiB (bytes // 2**20) from nvmlDeviceGetMemoryInfo with
    ``version=nvmlMemory_v2`` (used excludes driver-reserved memory). A binding or driver without v2
    falls back to v1, which has no reserved figure: FB_RESERVED is then omitted."""
    get = fn(m, "nvmlDeviceGetMemoryInfo")
    v2 = getattr(m, "nvmlMemory_v2", None)
    mem = None
    if v2 is not None:
        try:
            mem = get(h, version=v2)
        except TypeError:  # binding predates the version argument
            mem = None
        except Exception as exc:
            if not is_unsupported(m, exc):
                raise
    if mem is None:
        mem = get(h)
    out = {"DCGM_FI_DEV_FB_FREE": mem.free // MIB, "DCGM_FI_DEV_FB_USED": mem.used // MIB}
    reserved = getattr(mem, "reserved", None)
    if reserved is not None:
        out["DCGM_FI_DEV_FB_RESERVED"] = reserved // MIB
    return out


def clock_events(m: Any, h: Any) -> dict[str, float]:
    """Clock event reasons bitmask, NVML's bits equal DCGM's (nvmlDeviceGetCurrentClocksEventReasons;
    nvmlDeviceGetCurrentClocksThrottleReasons in older bindings)."""
    f = getattr(m, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        fn(m, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": f(h)}


def _violation(policy: str, default: int, name: str) -> Reader:
    def read(m: Any, h: Any) -> dict[str, float]:
        return {name: fn(m, "nvmlDeviceGetViolationStatus")(h, getattr(m, policy, default)).violationTime}
    read.__doc__ = f"Throttled time, ns (nvmlDeviceGetViolationStatus({policy}).violationTime)."
    return read


def _ecc(kind: str, counter: str, name: str) -> Reader:
    defaults = {"NVML_MEMORY_ERROR_TYPE_CORRECTED": 0, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
                "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1}

    def read(m: Any, h: Any) -> dict[str, float]:
        args = [getattr(m, n, defaults[n]) for n in (kind, counter)]
        return {name: fn(m, "nvmlDeviceGetTotalEccErrors")(h, *args)}
    read.__doc__ = (f"ECC errors, count (nvmlDeviceGetTotalEccErrors({kind}, {counter})); volatile resets "
                    "at driver load, aggregate is lifetime; NOT_SUPPORTED when ECC is off.")
    return read


def remapped_rows(m: Any, h: Any) -> dict[str, float]:
    """Remapped rows, count, and pending/failure flags 0/1 (nvmlDeviceGetRemappedRows -> corr, unc, pending, failure)."""
    corr, unc, pending, failure = fn(m, "nvmlDeviceGetRemappedRows")(h)
    return {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": unc, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": corr,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1 if failure else 0, "DCGM_FI_DEV_ROW_REMAP_PENDING": 1 if pending else 0}


def nvlink_errors(m: Any, h: Any) -> dict[str, float]:
    """NVLink errors, count, summed over active links (nvmlDeviceGetNvLinkState, then
    nvmlDeviceGetNvLinkErrorCounter with NVML_NVLINK_ERROR_DL_CRC_FLIT / DL_REPLAY / DL_RECOVERY).
    A GPU with no active link (or no NVLink) omits the three fields."""
    state, counter = fn(m, "nvmlDeviceGetNvLinkState"), fn(m, "nvmlDeviceGetNvLinkErrorCounter")
    kinds = {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": getattr(m, "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
             "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": getattr(m, "NVML_NVLINK_ERROR_DL_REPLAY", 0),
             "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": getattr(m, "NVML_NVLINK_ERROR_DL_RECOVERY", 1)}
    totals = dict.fromkeys(kinds, 0)
    active = 0
    for link in range(int(getattr(m, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if not state(h, link):
                continue
        except Exception as exc:
            if is_unsupported(m, exc) or error_value(exc) == code(m, "NVML_ERROR_INVALID_ARGUMENT"):
                continue
            raise
        active += 1
        for name, kind in kinds.items():
            totals[name] += counter(h, link, kind)
    if not active:
        raise Unsupported("no active NVLink")
    return totals


#: (NVML call named in error counts, reader), in page order of their first field.
READERS: list[tuple[str, Reader]] = [
    ("nvmlDeviceGetClockInfo", clocks),
    ("nvmlDeviceGetFieldValues", memory_temp),
    ("nvmlDeviceGetTemperature", gpu_temp),
    ("nvmlDeviceGetPowerUsage", power),
    ("nvmlDeviceGetTotalEnergyConsumption", energy),
    ("nvmlDeviceGetPcieReplayCounter", pcie_replay),
    ("nvmlDeviceGetUtilizationRates", utilization),
    ("nvmlDeviceGetEncoderUtilization", encoder),
    ("nvmlDeviceGetDecoderUtilization", decoder),
    ("nvmlDeviceGetMemoryInfo", memory),
    ("nvmlDeviceGetCurrentClocksEventReasons", clock_events),
    ("nvmlDeviceGetViolationStatus", _violation("NVML_PERF_POLICY_POWER", 0, "DCGM_FI_DEV_POWER_VIOLATION")),
    ("nvmlDeviceGetViolationStatus", _violation("NVML_PERF_POLICY_THERMAL", 1, "DCGM_FI_DEV_THERMAL_VIOLATION")),
    ("nvmlDeviceGetTotalEccErrors", _ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC",
                                         "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")),
    ("nvmlDeviceGetTotalEccErrors", _ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC",
                                         "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
    ("nvmlDeviceGetTotalEccErrors", _ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC",
                                         "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")),
    ("nvmlDeviceGetTotalEccErrors", _ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC",
                                         "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")),
    ("nvmlDeviceGetRemappedRows", remapped_rows),
    ("nvmlDeviceGetNvLinkErrorCounter", nvlink_errors),
]
