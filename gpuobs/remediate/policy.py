"""Which node action a page calls for: alert -> fault class -> action.

The action for an Xid comes from NVIDIA's Xid catalogue (:mod:`gpuobs.reference.xid`, the
``recommended_action`` column's ``immediate:`` part, from https://docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html): ``RESET_GPU`` (and Xid 48's "solo -> RESET_GPU; with Xid 63/64 ->
DRAIN_AND_RESET") -> a GPU reset; ``RESTART_BM``/``RESTART_VM`` -> a node reboot; ``RESTART_APP`` and
``IGNORE`` -> no node action (application-class: the workload is at fault, as k8s-device-plugin's
health check also ignores 13, 31, 43, 45, 68); anything else (``CONTACT_SUPPORT``, ``UPDATE_SWFW``,
``CHECK_MECHANICALS``, the decode workflows) -> escalate to a person without acting.

The other alerts are mapped by what fixes them: a GPU gone from the bus or the page (``GpuFallenOffBus``,
``GpuMissing``: Xid 79, RESTART_BM) -> reboot; uncorrectable ECC (``GpuEccDoubleBitError``: Xid 48's
DRAIN_AND_RESET) and a row-remap failure (``GpuRowRemapFailure``: Xid 64's RESET_GPU, "repeat after
reset -> RMA") -> GPU reset; allocator fragmentation and KV-cache pressure (``KVFragmentationRisk``,
``ServingKVCachePressure``) -> restart the serving engine (the brief's fragmentation-restart, one node at
a time). Alerts not listed get no remediation (the page goes to a person as before).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuobs.reference import xid as xidcat

#: Fault classes and the node action each takes (:data:`gpuobs.remediate.interfaces.ACTIONS`).
CLASS_ACTION = {"gpu-reset": "reset-gpu", "node-reboot": "reboot", "engine-restart": "restart-engine",
                "application": "none", "escalate": "none"}

#: Alerts remediated without reading an Xid code.
ALERT_CLASS = {
    "GpuFallenOffBus": "node-reboot",
    "GpuMissing": "node-reboot",
    "GpuEccDoubleBitError": "gpu-reset",
    "GpuRowRemapFailure": "gpu-reset",
    "KVFragmentationRisk": "engine-restart",
    "ServingKVCachePressure": "engine-restart",
}
#: Alerts whose class follows the ``xid`` label through the catalogue.
XID_ALERTS = ("GpuXidCritical", "GpuKernelXidCritical")


@dataclass(frozen=True)
class Plan:
    """What to do about one alert: ``fault_class`` (a key of :data:`CLASS_ACTION`), ``action``, the GPU
    (None for node-wide), and ``why`` (one line citing the source of the mapping)."""

    fault_class: str
    action: str
    gpu: int | None
    why: str


def xid_class(code: int) -> tuple[str, str]:
    """Fault class of Xid ``code`` and the catalogue's immediate action text; codes outside the
    catalogue escalate (a person reads the code)."""
    info = xidcat.catalog().get(code)
    if info is None:
        return "escalate", "not in the Xid catalogue"
    m = re.search(r"immediate:\s*([^;]*(?:;\s*with[^;]*)?)", info.recommended_action)
    immediate = (m.group(1) if m else info.recommended_action).strip()
    head = immediate.split("(")[0]
    if code == 48 or "RESET_GPU" in head:
        return "gpu-reset", immediate
    if "RESTART_BM" in head or "RESTART_VM" in head:
        return "node-reboot", immediate
    if head.startswith("RESTART_APP") or head.startswith("IGNORE"):
        return "application", immediate
    if "app error" in info.recommended_action:  # Xid 45: k8s-device-plugin's application errors
        return "application", immediate
    if "Follow Xid 48" in immediate or "GPU reset or node reboot clears it" in info.recommended_action:
        return "gpu-reset", immediate  # Xid 171/172 (SRAM, as 48), Xid 74 (NVLink workflow)
    return "escalate", immediate


def _gpu(labels: dict[str, str]) -> int | None:
    try:
        return int(labels.get("gpu", ""))
    except ValueError:
        return None


def plan(alertname: str, labels: dict[str, str]) -> Plan | None:
    """The plan for a firing alert with ``labels``, or None when gpuobs does not remediate it."""
    gpu = _gpu(labels)
    if alertname in XID_ALERTS:
        try:
            code = int(labels.get("xid", ""))
        except ValueError:
            return Plan("escalate", "none", gpu, f"{alertname} without a numeric xid label")
        cls, immediate = xid_class(code)
        return Plan(cls, CLASS_ACTION[cls], gpu, f"Xid {code}: NVIDIA Xid catalogue, immediate action {immediate}")
    cls = ALERT_CLASS.get(alertname)
    if cls is None:
        return None
    return Plan(cls, CLASS_ACTION[cls], gpu, f"{alertname}: {cls}")


def remediated_alertnames() -> list[str]:
    """Every alertname :func:`plan` may act on; equal to
    :data:`gpuobs.mixin.alertmanager.REMEDIATED_ALERTS`, which the Alertmanager route matches."""
    return sorted({*XID_ALERTS, *ALERT_CLASS})
