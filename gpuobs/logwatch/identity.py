"""Bus id -> GPU identity (``gpu`` index, ``UUID``), so log-derived series carry dcgm-exporter's labels.

Sources, most authoritative first: NVML (``nvmlDeviceGetCount``/``GetHandleByIndex``/``GetPciInfo``
/``GetUUID``: index, busId, UUID), the kernel log's own ``NVRM: GPU at PCI:... GPU-<uuid>`` lines
(UUID only; the driver prints one before a GPU's first Xid), and a mapping file in the format of
``nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv[,noheader]``. A bus id found in none of
them keeps ``pci_bus_id`` (always known: the Xid line carries it) and empty ``gpu``/``UUID``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from gpuobs.logwatch.parser import dcgm_bus_id

_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


class MapError(ValueError):
    """A mapping file is unreadable or malformed (names the file, the line and the field)."""


@dataclass(frozen=True)
class GpuId:
    """Identity labels of one GPU: ``gpu`` (index as text, "" if unknown), ``uuid`` ("" if unknown)."""

    gpu: str = ""
    uuid: str = ""


def load_map_file(path: Path) -> dict[str, GpuId]:
    """Parse an ``index, pci.bus_id, uuid`` CSV (nvidia-smi output, header optional).

    Returns ``{pci_bus_id (dcgm form): GpuId}``. Raises MapError naming the line and field.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MapError(f"--gpu-map {path}: cannot read ({exc})") from None
    out: dict[str, GpuId] = {}
    for n, row in enumerate(csv.reader(text.splitlines()), 1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if cells[0] == "index":
            continue  # nvidia-smi header: index, pci.bus_id, uuid
        if len(cells) != 3:
            raise MapError(f"--gpu-map {path}:{n}: expected 3 fields 'index, pci.bus_id, uuid', got {len(cells)}")
        idx, bus, uuid = cells
        if not idx.isdigit():
            raise MapError(f"--gpu-map {path}:{n}: field 'index' must be a GPU index (0, 1, ...), got {idx!r}")
        try:
            bus = dcgm_bus_id(bus)
        except ValueError:
            raise MapError(f"--gpu-map {path}:{n}: field 'pci.bus_id' must look like 00000000:18:00.0, "
                           f"got {cells[1]!r}") from None
        if not _UUID_RE.match(uuid):
            raise MapError(f"--gpu-map {path}:{n}: field 'uuid' must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, "
                           f"got {uuid!r}")
        out[bus] = GpuId(str(int(idx)), uuid)
    return out


def load_nvml(nvml=None) -> dict[str, GpuId]:
    """Map from NVML (``pynvml`` from nvidia-ml-py); {} when NVML or the driver is unavailable."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[import-not-found]
        nvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU: fall back to the other sources
        return {}
    out: dict[str, GpuId] = {}
    try:
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            bus = nvml.nvmlDeviceGetPciInfo(h).busId
            uuid = nvml.nvmlDeviceGetUUID(h)
            bus = bus.decode() if isinstance(bus, bytes) else bus
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            out[dcgm_bus_id(bus)] = GpuId(str(i), uuid)
    except Exception:
        pass  # keep what was read; a GPU lost mid-enumeration is exactly what we are here to see
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return out


class GpuMap:
    """Resolve a bus id to labels: NVML first, then the log's UUID lines, then the mapping file."""

    def __init__(self, nvml: dict[str, GpuId] | None = None, file_map: dict[str, GpuId] | None = None):
        self.nvml = nvml or {}
        self.file = file_map or {}

    def known_buses(self, log_uuids: dict[str, str]) -> set[str]:
        """Every bus id any source knows about."""
        return set(self.nvml) | set(self.file) | set(log_uuids)

    def resolve(self, bus: str, log_uuids: dict[str, str]) -> GpuId:
        if bus in self.nvml:
            return self.nvml[bus]
        f = self.file.get(bus, GpuId())
        return GpuId(f.gpu, log_uuids.get(bus) or f.uuid)
