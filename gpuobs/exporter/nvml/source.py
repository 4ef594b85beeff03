"""NVML source: dcgm-exporter's metric names filled from a real GPU through nvidia-ml-py (``pynvml``).

Each DCGM field comes from one NVML call (table and readers in :mod:`gpuobs.exporter.nvml.fields`;
``docs/nvml.md``). Fields NVML cannot give (the ``DCGM_FI_PROF_*`` profiling ratios, which need DCGM's
profiling module) are omitted, never invented. A call that answers ``NVML_ERROR_NOT_SUPPORTED`` (or
``FUNCTION_NOT_FOUND``, or is missing from an old binding) omits its fields for that GPU only; any
other error is counted in ``gpuobs_exporter_collector_errors_total`` and turns
``gpuobs_exporter_collector_success`` to 0 for that scrape, but never breaks the page. A GPU answering
``NVML_ERROR_GPU_IS_LOST`` vanishes from the page, like dcgm-exporter after Xid 79;
``gpuobs_node_expected_gpus`` (nvmlDeviceGetCount at start) keeps that alertable.

Xids arrive through NVML events (``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents`` with
``nvmlEventTypeXidCriticalError``), drained without blocking (``nvmlEventSetWait`` timeout 0) by
:meth:`NvmlCollector.poll_events`, which ``collect`` and the server's poller thread call.
"""

from __future__ import annotations

import collections
import ctypes
import importlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuobs.exporter.exposition import Family, label_string
from gpuobs.exporter.nvml import fields as F
from gpuobs.reference import xid as xidcat

#: DCGM's default Xid counting window (dcgm-exporter ``--xid-count-window-size``), milliseconds.
DEFAULT_XID_WINDOW_MS = 300_000

XID_HELP = "Value of the last XID error encountered."
XID_COUNT_HELP = "Count of XID Errors within user-specified time window (see xid-count-window-size param)."


class NvmlUnavailable(RuntimeError):
    """NVML cannot serve: nvidia-ml-py missing, libnvidia-ml/driver absent, or no GPU present."""


class _GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus and leaves the page."""


@dataclass
class _Gpu:
    """One GPU: index, NVML handle, dcgm-exporter identity labels and Xid state."""

    index: int
    handle: Any
    uuid: str
    labels: list[tuple[str, str]]
    xid_watched: bool = False
    last_xid: tuple[int, str] = (0, "No Error")
    xids: collections.deque = field(default_factory=collections.deque)  # (monotonic s, code)


def _handle_key(handle: Any) -> Any:
    """A hashable key for an NVML handle (ctypes pointer value, else the object itself)."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    try:
        hash(handle)
    except TypeError:
        return id(handle)
    return handle


class NvmlCollector:
    """DCGM-compatible families of this host's GPUs, read from NVML on every :meth:`collect`.

    ``nvml_module`` is the ``pynvml`` module (imported lazily from nvidia-ml-py when None; tests pass a
    fake). Raises :class:`NvmlUnavailable` when NVML cannot initialise or reports no GPU.
    """

    def __init__(self, nvml_module: Any = None, hostname: str | None = None, hostname_label: str = "Hostname",
                 xid_window_ms: int = DEFAULT_XID_WINDOW_MS, clock: Callable[[], float] = time.monotonic):
        if hostname_label not in ("Hostname", "hostname"):
            raise ValueError(f"hostname_label must be 'Hostname' or 'hostname', got {hostname_label!r}")
        if nvml_module is None:
            try:
                nvml_module = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py, "
                                      "or the gpuobs 'nvml' extra)") from exc
        self.nvml = nvml_module
        self.hostname = hostname or socket.gethostname()
        self.hostname_label = hostname_label
        self.xid_window_ms = xid_window_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._errors: dict[tuple[str, str], int] = {}
        self._event_set: Any = None
        self._closed = False
        try:
            self.nvml.nvmlInit()
        except Exception as exc:
            raise NvmlUnavailable(self._init_message(exc)) from exc
        try:
            self.driver_version = F.text(self.nvml.nvmlSystemGetDriverVersion())
            self.expected_gpus = int(self.nvml.nvmlDeviceGetCount())
            if self.expected_gpus < 1:
                raise NvmlUnavailable("NVML reports no GPU on this host (nvmlDeviceGetCount = 0)")
            self.gpus = [g for g in (self._open_gpu(i) for i in range(self.expected_gpus)) if g is not None]
            if not self.gpus:
                raise NvmlUnavailable(f"NVML reports {self.expected_gpus} GPUs but none could be opened")
        except NvmlUnavailable:
            self._shutdown()
            raise
        except Exception as exc:
            self._shutdown()
            raise NvmlUnavailable(f"NVML failed while listing GPUs: {exc}") from exc
        self._watch_xids()

    # ---- setup ----------------------------------------------------------------------------------
    def _init_message(self, exc: Exception) -> str:
        """One-line reason for a failed ``nvmlInit``."""
        value = F.error_value(exc)
        if value == F.code(self.nvml, "NVML_ERROR_LIBRARY_NOT_FOUND"):
            return "NVML library (libnvidia-ml.so.1) not found: is the NVIDIA driver installed?"
        if value == F.code(self.nvml, "NVML_ERROR_DRIVER_NOT_LOADED"):
            return "NVIDIA driver is not loaded (nvmlInit: driver not loaded)"
        return f"nvmlInit failed: {exc}"

    def _open_gpu(self, index: int) -> _Gpu | None:
        """Handle and identity labels of GPU ``index`` (nvmlDeviceGetHandleByIndex, GetUUID, GetPciInfo,
        GetMinorNumber, GetName); None (error counted) if NVML cannot open it."""
        m = self.nvml
        try:
            handle = m.nvmlDeviceGetHandleByIndex(index)
            uuid = F.text(m.nvmlDeviceGetUUID(handle))
            bus_id = F.text(m.nvmlDeviceGetPciInfo(handle).busId)
            name = F.text(m.nvmlDeviceGetName(handle))
        except Exception:
            self._count_error(str(index), "nvmlDeviceGetHandleByIndex")
            return None
        try:
            device = f"nvidia{int(m.nvmlDeviceGetMinorNumber(handle))}"
        except Exception:  # no minor number (e.g. not Linux): fall back to the index
            device = f"nvidia{index}"
        labels = [("gpu", str(index)), ("UUID", uuid), ("pci_bus_id", bus_id), ("device", device),
                  ("modelName", name), (self.hostname_label, self.hostname),
                  ("DCGM_FI_DRIVER_VERSION", self.driver_version)]
        return _Gpu(index, handle, uuid, labels)

    def _watch_xids(self) -> None:
        """Register every GPU for Xid critical-error events; a GPU that cannot be watched gets no Xid series."""
        m = self.nvml
        mask = getattr(m, "nvmlEventTypeXidCriticalError", 0x8)
        try:
            self._event_set = m.nvmlEventSetCreate()
        except Exception as exc:
            if not F.is_unsupported(self.nvml, exc):
                self._count_error("", "nvmlEventSetCreate")
            return
        for g in self.gpus:
            try:
                m.nvmlDeviceRegisterEvents(g.handle, mask, self._event_set)
                g.xid_watched = True
            except Exception as exc:
                if not F.is_unsupported(self.nvml, exc):
                    self._count_error(str(g.index), "nvmlDeviceRegisterEvents")

    # ---- reading -------------------------------------------------------------------------------
    def _count_error(self, gpu: str, call: str) -> None:
        self._errors[(gpu, call)] = self._errors.get((gpu, call), 0) + 1

    def _read_gpu(self, g: _Gpu) -> dict[str, float]:
        """All readable fields of one GPU (failed calls are counted); raises _GpuLost."""
        values: dict[str, float] = {}
        for call, reader in F.READERS:
            try:
                values.update(reader(self.nvml, g.handle))
            except Exception as exc:
                if F.error_value(exc) == F.code(self.nvml, "NVML_ERROR_GPU_IS_LOST"):
                    raise _GpuLost(g.uuid) from exc
                if not F.is_unsupported(self.nvml, exc):
                    self._count_error(str(g.index), call)
        return values

    # ---- Xid events -----------------------------------------------------------------------------
    def poll_events(self, max_events: int = 1000) -> int:
        """Drain queued Xid events without blocking (nvmlEventSetWait, timeout 0 ms); returns how many."""
        with self._lock:
            return self._poll_locked(max_events)

    def _poll_locked(self, max_events: int) -> int:
        if self._event_set is None or self._closed:
            return 0
        by_key = {_handle_key(g.handle): g for g in self.gpus}
        by_uuid = {g.uuid: g for g in self.gpus}
        mask = getattr(self.nvml, "nvmlEventTypeXidCriticalError", 0x8)
        seen = 0
        for _ in range(max_events):
            try:
                ev = self.nvml.nvmlEventSetWait(self._event_set, 0)
            except Exception as exc:
                if F.error_value(exc) != F.code(self.nvml, "NVML_ERROR_TIMEOUT"):
                    self._count_error("", "nvmlEventSetWait")
                break
            if not int(ev.eventType) & mask:
                continue
            g = by_key.get(_handle_key(ev.device))
            if g is None:
                try:
                    g = by_uuid.get(F.text(self.nvml.nvmlDeviceGetUUID(ev.device)))
                except Exception:
                    g = None
            if g is None:
                continue
            code = int(ev.eventData)
            g.last_xid = (code, xidcat.message(code))
            g.xids.append((self._clock(), code))
            seen += 1
        return seen

    # ---- collection -----------------------------------------------------------------------------
    def collect(self) -> list[Family]:
        """Read every GPU now and return the DCGM families plus self-metrics. Thread-safe."""
        with self._lock:
            if self._closed:
                raise RuntimeError("NVML collector is closed")
            errors_before = sum(self._errors.values())
            self._poll_locked(1000)
            fams = {name: Family(name, typ, hlp, integer) for name, typ, integer, hlp in F.FIELDS}
            xid = Family("DCGM_FI_DEV_XID_ERRORS", "gauge", XID_HELP, True)
            xid_count = Family("DCGM_EXP_XID_ERRORS_COUNT", "gauge", XID_COUNT_HELP, True)
            now = self._clock()
            window = str(self.xid_window_ms)
            for g in self.gpus:
                try:
                    values = self._read_gpu(g)
                except _GpuLost:
                    self._count_error(str(g.index), "gpu_is_lost")
                    continue
                base = label_string(g.labels)
                for name, fam in fams.items():
                    if name in values:
                        fam.samples.append((base, values[name]))
                if not g.xid_watched:
                    continue
                code, msg = g.last_xid
                xid.samples.append((label_string(g.labels + [("err_code", str(code)), ("err_msg", msg)]), code))
                while g.xids and g.xids[0][0] <= now - self.xid_window_ms / 1000.0:
                    g.xids.popleft()
                for c, n in sorted(collections.Counter(c for _, c in g.xids).items()):
                    xid_count.samples.append(
                        (label_string(g.labels + [("window_size_in_ms", window), ("xid", str(c))]), n))
            host = [(self.hostname_label, self.hostname)]
            ok = 1 if sum(self._errors.values()) == errors_before else 0
            self_fams = [
                # HELP texts and label order shared with the simulated collector (collector.py).
                Family("gpuobs_node_expected_gpus", "gauge", "Number of GPUs the node should have (GPUs that "
                       "fell off the bus vanish from the DCGM page).", True,
                       [(label_string(host), self.expected_gpus)]),
                Family("gpuobs_exporter_collector_success", "gauge",
                       "Whether a collector succeeded in the last scrape (1) or raised (0).", True,
                       [(label_string(host + [("collector", "nvml")]), ok)]),
                Family("gpuobs_exporter_collector_errors_total", "counter",
                       "NVML calls that failed (other than not-supported) since start, by GPU and call.", True,
                       [(label_string(host + [("collector", "nvml"), ("gpu", gpu), ("nvml_call", call)]), n)
                        for (gpu, call), n in sorted(self._errors.items())])]
            return list(fams.values()) + [xid, xid_count] + self_fams

    def _shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass

    def close(self) -> None:
        """Free the event set and shut NVML down (nvmlEventSetFree, nvmlShutdown). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._event_set is not None:
                try:
                    self.nvml.nvmlEventSetFree(self._event_set)
                except Exception:
                    pass
                self._event_set = None
            self._shutdown()
