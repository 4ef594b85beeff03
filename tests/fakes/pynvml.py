"""A fake ``pynvml`` module for the NVML source tests: two GPUs with fixed values, one queued Xid.

It exposes the nvidia-ml-py names the collector calls (functions, constants, ``NVMLError`` and its
``NVMLError_*`` subclasses carrying ``value``). Tests change :class:`FakeState` to inject faults:
``fail[(call, gpu_index)] = exception`` makes that call raise for that GPU.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20


class NVMLError(Exception):
    """Like pynvml.NVMLError: carries the NVML return code in ``value``."""

    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


def _error_class(name: str, value: int) -> type:
    return type(name, (NVMLError,), {"__init__": lambda self: NVMLError.__init__(self, value)})


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", 1)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", 2)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", 3)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", 4)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", 9)
NVMLError_Timeout = _error_class("NVMLError_Timeout", 10)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", 12)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound", 13)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", 15)
NVMLError_Unknown = _error_class("NVMLError_Unknown", 999)


@dataclass
class FakeGpu:
    """Deterministic readings of one fake GPU, in NVML's own units (mW, bytes, ns, MHz)."""

    uuid: str
    bus_id: bytes
    minor: int
    name: str
    temp_c: int
    mem_temp_c: int | None          # None: NOT_SUPPORTED
    power_mw: int
    energy_mj: int
    sm_mhz: int
    mem_mhz: int
    util_gpu: int
    util_mem: int
    enc: int | None
    dec: int
    total_b: int
    reserved_b: int
    used_b: int
    reasons: int
    power_violation_ns: int
    thermal_violation_ns: int
    ecc: dict[tuple[int, int], int]  # (error type, counter type) -> count
    rows: tuple[int, int, int, int]  # corr, unc, pending, failure
    replay: int
    nvlinks: int                     # active links; 0 = no NVLink (NOT_SUPPORTED)


def default_gpus() -> list[FakeGpu]:
    return [
        FakeGpu("GPU-0a1b2c3d-0000-4000-8000-000000000001", b"00000000:18:00.0", 0, "NVIDIA H100 80GB HBM3",
                47, 55, 351_200, 123_456_789, 1980, 2619, 87, 41, 0, 3,
                81_559 * MIB, 535 * MIB, 40_000 * MIB + 123_456, 0x64, 1_500_000_000, 2_750_000_123,
                {(0, 0): 3, (1, 0): 0, (0, 1): 12, (1, 1): 1}, (2, 1, 0, 0), 7, 4),
        FakeGpu("GPU-0a1b2c3d-0000-4000-8000-000000000002", b"00000000:2A:00.0", 1, "NVIDIA H100 80GB HBM3",
                39, None, 72_450, 98_765_432, 345, 2619, 0, 0, None, 0,
                81_559 * MIB, 535 * MIB, 1 * MIB, 0x1, 0, 0,
                {(0, 0): 0, (1, 0): 0, (0, 1): 0, (1, 1): 0}, (0, 0, 0, 1), 0, 0),
    ]


@dataclass
class FakeState:
    gpus: list[FakeGpu] = field(default_factory=default_gpus)
    driver: str = "550.54.15"
    init_error: Exception | None = None
    fail: dict[tuple[str, int], Exception] = field(default_factory=dict)
    events: list[Any] = field(default_factory=list)
    registered: set[int] = field(default_factory=set)
    mem_temp_raises: bool = True    # True: NotSupported raised; False: per-field nvmlReturn = 3
    initialised: int = 0
    shutdowns: int = 0


class Handle:
    def __init__(self, index: int):
        self.index = index


def make_fake_pynvml(state: FakeState | None = None) -> tuple[types.ModuleType, FakeState]:
    """A module object exposing the pynvml surface over ``state`` (a fresh default one if None)."""
    st = state or FakeState()
    m = types.ModuleType("pynvml")
    for name, value in globals().items():
        if name.startswith("NVMLError"):
            setattr(m, name, value)
    consts = dict(NVML_SUCCESS=0, NVML_ERROR_NOT_SUPPORTED=3, NVML_ERROR_TIMEOUT=10, NVML_ERROR_GPU_IS_LOST=15,
                  NVML_ERROR_LIBRARY_NOT_FOUND=12, NVML_ERROR_DRIVER_NOT_LOADED=9, NVML_ERROR_FUNCTION_NOT_FOUND=13,
                  NVML_ERROR_INVALID_ARGUMENT=2, NVML_TEMPERATURE_GPU=0, NVML_CLOCK_GRAPHICS=0, NVML_CLOCK_SM=1,
                  NVML_CLOCK_MEM=2, NVML_FI_DEV_MEMORY_TEMP=82, NVML_VALUE_TYPE_UNSIGNED_INT=1,
                  NVML_PERF_POLICY_POWER=0, NVML_PERF_POLICY_THERMAL=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
                  NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0, NVML_AGGREGATE_ECC=1,
                  NVML_NVLINK_MAX_LINKS=18, NVML_NVLINK_ERROR_DL_REPLAY=0, NVML_NVLINK_ERROR_DL_RECOVERY=1,
                  NVML_NVLINK_ERROR_DL_CRC_FLIT=2, nvmlEventTypeXidCriticalError=0x8, nvmlMemory_v2=0x02000028)
    for k, v in consts.items():
        setattr(m, k, v)
    handles = [Handle(i) for i in range(len(st.gpus))]

    def gpu(call: str, h: Handle) -> FakeGpu:
        err = st.fail.get((call, h.index))
        if err is not None:
            raise err
        return st.gpus[h.index]

    def api(fn):
        setattr(m, fn.__name__, fn)
        return fn

    @api
    def nvmlInit():
        if st.init_error is not None:
            raise st.init_error
        st.initialised += 1

    @api
    def nvmlShutdown():
        st.shutdowns += 1

    @api
    def nvmlSystemGetDriverVersion():
        return st.driver

    @api
    def nvmlDeviceGetCount():
        return len(st.gpus)

    @api
    def nvmlDeviceGetHandleByIndex(i):
        return handles[i]

    @api
    def nvmlDeviceGetUUID(h):
        return gpu("nvmlDeviceGetUUID", h).uuid

    @api
    def nvmlDeviceGetPciInfo(h):
        return types.SimpleNamespace(busId=gpu("nvmlDeviceGetPciInfo", h).bus_id)

    @api
    def nvmlDeviceGetMinorNumber(h):
        return gpu("nvmlDeviceGetMinorNumber", h).minor

    @api
    def nvmlDeviceGetName(h):
        return gpu("nvmlDeviceGetName", h).name

    @api
    def nvmlDeviceGetTemperature(h, sensor):
        assert sensor == m.NVML_TEMPERATURE_GPU
        return gpu("nvmlDeviceGetTemperature", h).temp_c

    @api
    def nvmlDeviceGetFieldValues(h, ids):
        g = gpu("nvmlDeviceGetFieldValues", h)
        assert ids == [m.NVML_FI_DEV_MEMORY_TEMP]
        if g.mem_temp_c is None and st.mem_temp_raises:
            raise NVMLError_NotSupported()
        ret = 3 if g.mem_temp_c is None else 0
        return [types.SimpleNamespace(fieldId=ids[0], nvmlReturn=ret, valueType=1,
                                      value=types.SimpleNamespace(uiVal=g.mem_temp_c or 0))]

    @api
    def nvmlDeviceGetPowerUsage(h):
        return gpu("nvmlDeviceGetPowerUsage", h).power_mw

    @api
    def nvmlDeviceGetTotalEnergyConsumption(h):
        return gpu("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    @api
    def nvmlDeviceGetClockInfo(h, kind):
        g = gpu("nvmlDeviceGetClockInfo", h)
        return {m.NVML_CLOCK_SM: g.sm_mhz, m.NVML_CLOCK_MEM: g.mem_mhz}[kind]

    @api
    def nvmlDeviceGetUtilizationRates(h):
        g = gpu("nvmlDeviceGetUtilizationRates", h)
        return types.SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    @api
    def nvmlDeviceGetEncoderUtilization(h):
        g = gpu("nvmlDeviceGetEncoderUtilization", h)
        if g.enc is None:
            raise NVMLError_NotSupported()
        return [g.enc, 167_000]

    @api
    def nvmlDeviceGetDecoderUtilization(h):
        return [gpu("nvmlDeviceGetDecoderUtilization", h).dec, 167_000]

    @api
    def nvmlDeviceGetMemoryInfo(h, version=None):
        g = gpu("nvmlDeviceGetMemoryInfo", h)
        if version is None:  # v1: used counts the reserved memory too
            return types.SimpleNamespace(total=g.total_b, free=g.total_b - g.used_b - g.reserved_b,
                                         used=g.used_b + g.reserved_b)
        assert version == m.nvmlMemory_v2
        return types.SimpleNamespace(version=version, total=g.total_b, reserved=g.reserved_b,
                                     free=g.total_b - g.used_b - g.reserved_b, used=g.used_b)

    @api
    def nvmlDeviceGetCurrentClocksEventReasons(h):
        return gpu("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    @api
    def nvmlDeviceGetCurrentClocksThrottleReasons(h):
        return gpu("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    @api
    def nvmlDeviceGetViolationStatus(h, policy):
        g = gpu("nvmlDeviceGetViolationStatus", h)
        ns = {m.NVML_PERF_POLICY_POWER: g.power_violation_ns, m.NVML_PERF_POLICY_THERMAL: g.thermal_violation_ns}
        return types.SimpleNamespace(referenceTime=1_700_000_000_000_000, violationTime=ns[policy])

    @api
    def nvmlDeviceGetTotalEccErrors(h, error_type, counter_type):
        return gpu("nvmlDeviceGetTotalEccErrors", h).ecc[(error_type, counter_type)]

    @api
    def nvmlDeviceGetRemappedRows(h):
        return gpu("nvmlDeviceGetRemappedRows", h).rows

    @api
    def nvmlDeviceGetPcieReplayCounter(h):
        return gpu("nvmlDeviceGetPcieReplayCounter", h).replay

    @api
    def nvmlDeviceGetNvLinkState(h, link):
        g = gpu("nvmlDeviceGetNvLinkState", h)
        if not g.nvlinks:
            raise NVMLError_NotSupported()
        if link >= 6:
            raise NVMLError_InvalidArgument()
        return 1 if link < g.nvlinks else 0

    @api
    def nvmlDeviceGetNvLinkErrorCounter(h, link, counter):
        # CRC_FLIT: link+1 per link; REPLAY: 2 per link; RECOVERY: 0.
        return {m.NVML_NVLINK_ERROR_DL_CRC_FLIT: link + 1, m.NVML_NVLINK_ERROR_DL_REPLAY: 2,
                m.NVML_NVLINK_ERROR_DL_RECOVERY: 0}[counter]

    @api
    def nvmlEventSetCreate():
        return "event-set"

    @api
    def nvmlDeviceRegisterEvents(h, mask, event_set):
        assert mask == m.nvmlEventTypeXidCriticalError and event_set == "event-set"
        st.registered.add(h.index)

    @api
    def nvmlEventSetWait(event_set, timeout_ms):
        assert timeout_ms == 0
        while st.events:
            ev = st.events.pop(0)
            if ev.device.index in st.registered:
                return ev
        raise NVMLError_Timeout()

    @api
    def nvmlEventSetFree(event_set):
        pass

    m.handles = handles
    return m, st


def xid_event(module: types.ModuleType, gpu_index: int, code: int) -> Any:
    """An Xid critical-error event as nvmlEventSetWait returns it."""
    return types.SimpleNamespace(device=module.handles[gpu_index], eventType=module.nvmlEventTypeXidCriticalError,
                                 eventData=code, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
