"""Parse NVIDIA driver kernel-log lines into events.

Formats (NVIDIA/open-gpu-kernel-modules, tag 595.45.04, read for facts):

* Xid, ``src/nvidia/src/kernel/gpu/rc/kernel_rc.c`` ``krcReportXid_IMPL``::

      NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s%s
      NVRM: Xid (PCI:%04x:%02x:%02x): %d, %s%s                         (no process context)
      NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): ...                    (MIG GPU instance)
      NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): ...        (MIG compute instance)

  Older drivers print ``pid='<unknown>', name=<unknown>`` for Xid 79 and, before the ``PCI:``
  prefix was added, ``NVRM: Xid (0000:2b:00): 79, ...``; both are accepted.
* The one-time UUID line logged before a GPU's first Xid (``_krcLogUuidOnce``, same file)::

      NVRM: GPU at PCI:%04x:%02x:%02x: GPU-<uuid>

* Fallen off the bus: ``src/nvidia/arch/nvalloc/unix/src/osinit.c`` logs Xid 79 with the message
  "GPU has fallen off the bus." and then, via ``NV_DEV_PRINTF`` (``kernel-open/common/inc/
  os-interface.h``, ``NV_PCI_DEV_FMT`` = ``%04x:%02x:%02x.%x`` in ``nv.h``)::

      NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.

  At probe time ``osapi.c`` prints a three-line variant: ``NVRM: The NVIDIA GPU 0000:2b:00.0`` /
  ``NVRM: (PCI ID: 10de:2330) installed in this system has`` / ``NVRM: fallen off the bus and is
  not responding to commands.`` (the parser keeps the bus id of the first line for the third).
* Xid 154, ``src/nvidia/src/kernel/gpu/gpu.c`` ``_gpuRefreshRecoveryActionInLock``: message
  ``GPU recovery action changed from 0x%x (%s) to 0x%x (%s)``; action values from
  ``ctrl2080gpu.h`` ``NV2080_CTRL_GPU_RECOVERY_ACTION``: 0 None, 1 GPU Reset Required,
  2 Node Reboot Required, 3 Drain P2P, 4 Drain and Reset, 5 Recover IMEX Domain.
* SXid (NVSwitch), ``src/common/nvswitch/kernel/inc/common_nvswitch.h`` ``NVSWITCH_PRINT_SXID``::

      nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, <message>

  One error prints an event line (``Fatal, Link %02d ...`` / ``Non-fatal, Link %02d ...``, from
  ``intr_nvswitch.h``) followed by detail lines with the same SXid (``Severity %d Engine instance
  ...`` and ``Data {...}``, ``error_nvswitch.c``); only the event line counts as an event.

Lines may carry a dmesg ``[   12.345678]`` stamp, a syslog/journal prefix (``... kernel: ``) or
nothing (``/dev/kmsg`` and journal MESSAGE fields); the parser looks for the markers anywhere.
:func:`parse` never raises: lines that carry a marker but match no format are ``UNPARSED``; other
kernel lines are ``IGNORED``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

IGNORED = "ignored"
UNPARSED = "unparsed"
XID = "xid"
SXID = "sxid"
GPU_UUID = "gpu_uuid"
FALLEN_OFF_BUS = "fallen_off_bus"

#: NV2080_CTRL_GPU_RECOVERY_ACTION values and names (ctrl2080gpu.h / gpu.c, driver 595.45.04).
RECOVERY_ACTIONS: dict[int, str] = {
    0: "None", 1: "GPU Reset Required", 2: "Node Reboot Required", 3: "Drain P2P",
    4: "Drain and Reset", 5: "Recover IMEX Domain",
}

_HEX_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
_XID_RE = re.compile(
    r"Xid \((?:PCI:)?(?P<bus>" + _HEX_BUS + r")(?:\.[0-7])?"
    r"(?: GPU-I:(?P<gi>\d{1,3}))?(?: GPU-CI:(?P<ci>\d{1,3}))?\): (?P<xid>\d{1,5}),(?: (?P<rest>.*))?$")
_PID_RE = re.compile(r"pid=(?P<pid>'<unknown>'|<unknown>|\d+), name=(?P<name>[^,]*), ?")
_RECOVERY_RE = re.compile(
    r"GPU recovery action changed from 0x(?P<old>[0-9a-fA-F]+) \([^)]*\) to 0x(?P<new>[0-9a-fA-F]+) \((?P<name>[^)]*)\)")
_GPU_AT_RE = re.compile(r"GPU at PCI:(?P<bus>" + _HEX_BUS + r"): (?P<uuid>GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})\s*$")
_FALLEN_RE = re.compile(r"GPU (?P<bus>" + _HEX_BUS + r")\.[0-7]: GPU has fallen off the bus\.")
_PROBE_GPU_RE = re.compile(r"The NVIDIA GPU (?P<bus>" + _HEX_BUS + r")\.[0-7]\s*$")
_SXID_RE = re.compile(
    r"(?P<dev>[A-Za-z0-9_.-]+): SXid \(PCI:(?P<bus>" + _HEX_BUS + r")(?:\.[0-7])?\): (?P<sxid>\d{1,5}), (?P<msg>.*)$")


@dataclass(slots=True)  # not frozen: frozen dataclasses pay object.__setattr__ per field
class Event:
    """One parsed line.

    ``kind``: one of IGNORED, UNPARSED, XID, SXID, GPU_UUID, FALLEN_OFF_BUS. ``pci_bus_id`` is in
    dcgm-exporter's form (``00000000:2B:00.0``; NVML ``busId``). Xid: ``code``, ``gpu_instance`` /
    ``compute_instance`` (MIG, else None), ``pid`` (None when not printed or unknown), ``process``,
    ``message``, ``recovery_action`` (Xid 154: the new NV2080_CTRL_GPU_RECOVERY_ACTION value).
    SXid: ``code``, ``device`` (e.g. ``nvidia-nvswitch3``), ``message``, ``fatal`` (True/False for an
    event line, None for a detail line). GPU_UUID: ``uuid``.
    """

    kind: str
    pci_bus_id: str = ""
    code: int = 0
    gpu_instance: int | None = None
    compute_instance: int | None = None
    pid: int | None = None
    process: str | None = None
    message: str = ""
    uuid: str = ""
    device: str = ""
    fatal: bool | None = None
    recovery_action: int | None = None


IGNORED_EVENT = Event(IGNORED)
UNPARSED_EVENT = Event(UNPARSED)


@functools.lru_cache(maxsize=1024)
def dcgm_bus_id(bus: str) -> str:
    """``0000:2b:00`` / ``0000:2b:00.0`` / ``00000000:2B:00.0`` -> ``00000000:2B:00.0``.

    dcgm-exporter's ``pci_bus_id`` is NVML's ``busId`` (8-digit domain, upper-case hex, function).
    Xid lines print no function; a GPU is PCI function 0. Raises ValueError on another shape.
    """
    head, _, fn = bus.partition(".")
    parts = head.split(":")
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus!r}")
    domain, b, dev = parts
    return f"{int(domain, 16):08X}:{int(b, 16):02X}:{int(dev, 16):02X}.{int(fn or '0', 16):X}"


class Parser:
    """Stateful line parser (the probe-time "fallen off the bus" message spans three lines).

    :meth:`parse` takes one line without its newline (str) and returns an :class:`Event`; it never
    raises. Cost: one substring scan for lines without a marker (the common case).
    """

    __slots__ = ("_probe_bus",)

    def __init__(self) -> None:
        self._probe_bus: str | None = None

    def parse(self, line: str) -> Event:
        try:
            return self._parse(line)
        except Exception:  # defensive: a parser bug must never stop the agent
            return UNPARSED_EVENT

    def _parse(self, line: str) -> Event:
        i = line.find("NVRM: ")
        if i < 0:
            j = line.find("SXid")
            if j < 0:
                return IGNORED_EVENT
            m = _SXID_RE.search(line)
            if m is None:
                return UNPARSED_EVENT
            msg = m["msg"].strip()
            fatal: bool | None
            if msg.startswith("Fatal"):
                fatal = True
            elif msg.startswith("Non-fatal"):
                fatal = False
            elif msg.startswith(("Severity ", "Data {")):
                fatal = None  # detail line of the event printed just before
            else:
                fatal = False  # other SXid prints (e.g. host PRIV errors) are non-fatal events
            return Event(SXID, dcgm_bus_id(m["bus"]), int(m["sxid"]), message=msg, device=m["dev"], fatal=fatal)
        body = line[i + 6:]
        if body.startswith("Xid"):
            m = _XID_RE.match(body)
            if m is None:
                return UNPARSED_EVENT
            rest = m["rest"] or ""
            pid = process = None
            pm = _PID_RE.match(rest)
            if pm is not None:
                pid = int(pm["pid"]) if pm["pid"].isdigit() else None
                name = pm["name"].strip()
                process = None if name in ("<unknown>", "'<unknown>'") else name
                rest = rest[pm.end():]
            code = int(m["xid"])
            action = None
            if code == 154:
                rm = _RECOVERY_RE.search(rest)
                if rm is not None:
                    action = int(rm["new"], 16)
            return Event(XID, dcgm_bus_id(m["bus"]), code,
                         int(m["gi"]) if m["gi"] is not None else None,
                         int(m["ci"]) if m["ci"] is not None else None,
                         pid, process, rest.strip(), recovery_action=action)
        if body.startswith("GPU at PCI:"):
            m = _GPU_AT_RE.match(body)
            if m is None:
                return UNPARSED_EVENT
            return Event(GPU_UUID, dcgm_bus_id(m["bus"]), uuid=m["uuid"])
        if "fallen off the bus" in body:
            m = _FALLEN_RE.match(body)
            if m is not None:
                return Event(FALLEN_OFF_BUS, dcgm_bus_id(m["bus"]), message="GPU has fallen off the bus.")
            if body.startswith("fallen off the bus and is not responding") and self._probe_bus:
                bus, self._probe_bus = self._probe_bus, None
                return Event(FALLEN_OFF_BUS, bus, message=body.strip())
            return UNPARSED_EVENT
        if body.startswith("The NVIDIA GPU "):
            m = _PROBE_GPU_RE.match(body)
            self._probe_bus = dcgm_bus_id(m["bus"]) if m else None
            return IGNORED_EVENT
        if "Xid" in body:
            return UNPARSED_EVENT  # an Xid mention in a shape we do not know
        return IGNORED_EVENT


def parse(line: str) -> Event:
    """Parse one line with a fresh :class:`Parser` (stateless convenience for single lines)."""
    return Parser().parse(line)
