"""Fault kinds, their parameters, and validation of admin-API requests.

A fault request is a JSON object ``{"kind": ..., "gpu": ..., <params>}``. Validation never
mutates anything: it either returns a :class:`FaultRequest` or raises :class:`FaultError`
naming the offending field and the allowed values (the admin API turns that into HTTP 400).
Effects of each kind on the simulated node are applied in :mod:`gpuobs.exporter.sim.node`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from gpuobs.core.errors import InputError


class FaultError(InputError):
    """A bad fault request. ``field`` names the JSON field at fault; str() is the message."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Param:
    """One parameter of a fault kind: type ``int``, ``float`` (bounds inclusive) or ``str`` (regex)."""

    type: type
    required: bool = False
    default: float | int | str | None = None
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""
    pattern: str | None = None


@dataclass(frozen=True)
class FaultKind:
    """A fault kind: whether it targets one GPU (``gpu`` required), its parameters, and the node roles
    it acts on (:data:`gpuobs.exporter.sim.node.ROLES`; elsewhere it would be accepted and do nothing)."""

    name: str
    per_gpu: bool
    params: dict[str, Param] = field(default_factory=dict)
    help: str = ""
    roles: tuple[str, ...] = ("serving", "training")


#: Driver version format accepted by the ``driver`` fault (NVIDIA Linux driver: 535.104.05, 580.95.05).
DRIVER_PATTERN = r"^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$"

KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind(
            "xid", True,
            {
                "code": Param(int, True, None, 1, 65535, "Xid code, e.g. 48 (DBE) or 79 (fallen off the bus)"),
                "repeat_s": Param(float, False, 0.0, 0.0, 86400.0,
                                  "re-raise the Xid every N seconds while the fault is active; 0 = once"),
            },
            "raise an Xid on one GPU (Xid 79 also removes the GPU from the page)",
        ),
        FaultKind(
            "thermal", True,
            {"cooling_factor": Param(float, False, 3.0, 1.0, 10.0,
                                     "thermal resistance multiplier (3.0 ~ failed fan)")},
            "degrade cooling on one GPU: temperature rises past slowdown, clocks throttle",
        ),
        FaultKind(
            "power-brake", True,
            {"clock_factor": Param(float, False, 0.6, 0.1, 0.9, "clock fraction while the brake is asserted")},
            "assert the external power brake (HW_POWER_BRAKE): clocks collapse, power violation accrues",
        ),
        FaultKind(
            "ecc-dbe", True,
            {"count": Param(int, False, 1, 1, 1000, "double-bit errors to raise"),
             "repeat_s": Param(float, False, 0.0, 0.0, 86400.0, "raise another burst every N seconds; 0 = once")},
            "uncorrectable ECC error: DBE counters, Xid 48, a row remap pending (Xid 63)",
        ),
        FaultKind("row-remap-failure", True, {}, "row remapping failed (Xid 64): DCGM_FI_DEV_ROW_REMAP_FAILURE=1"),
        FaultKind(
            "nvlink-errors", True,
            {"rate_per_s": Param(float, False, 50.0, 0.1, 1e6, "CRC flit errors per second")},
            "NVLink CRC/replay/recovery error counters grow",
        ),
        FaultKind(
            "pcie-replay", True,
            {"rate_per_s": Param(float, False, 20.0, 0.1, 1e6, "PCIe replays per second")},
            "PCIe replay counter grows (bad riser/link)",
        ),
        FaultKind(
            "fragmentation", True,
            {"rate_mib_per_min": Param(float, False, 1500.0, 1.0, 1e6,
                                       "growth of the allocator's reserved-minus-allocated gap")},
            "caching-allocator fragmentation: reserved grows, allocated flat, retries, then OOM",
        ),
        FaultKind(
            "kv-pressure", False,
            {"factor": Param(float, False, 2.5, 1.0, 100.0, "multiplier of KV-cache demand per request")},
            "long-context surge on the node's engine: KV usage near 1, preemptions, queueing (serving nodes)",
            roles=("serving",),
        ),
        FaultKind("collective-hang", False, {},
                  "training collective hangs: steps stop, GPU_UTIL stays ~100 while SM_ACTIVE and power collapse "
                  "(training nodes)", roles=("training",)),
        FaultKind(
            "straggler", True,
            {"slowdown": Param(float, False, 1.6, 1.05, 20.0, "compute-time multiplier of this GPU's rank")},
            "one training rank is slow; every other rank waits for it in collectives (training nodes)",
            roles=("training",),
        ),
        FaultKind(
            "driver", False,
            {"version": Param(str, True, None, pattern=DRIVER_PATTERN, help="driver version, e.g. 580.95.05")},
            "change the node's driver version (driver skew / upgrade)",
        ),
        FaultKind("down", False, {}, "the node stops answering scrapes (admin API stays up)"),
        FaultKind(
            "exporter-restart", False,
            {"downtime_s": Param(float, False, 10.0, 0.0, 3600.0,
                                 "seconds the DCGM page does not answer while the new exporter pod starts (in scrape "
                                 "mode servicemonitor keep it above the 5 s file_sd refresh, or the new page is "
                                 "briefly scraped under the old pod's target)"),
             "xid_state": Param(str, False, "kept", pattern="^(kept|cleared)$",
                                help="kept: the last Xid reappears (the exporter reads a standalone nv-hostengine "
                                     "that remembers it); cleared: forgotten (embedded hostengine), e.g. kept")},
            "the dcgm-exporter pod is replaced (one shot): its page is gone for downtime_s, then returns under a "
            "new pod name (the Hostname in host-label mode pod)",
        ),
    )
}


@dataclass(frozen=True)
class FaultRequest:
    """A validated fault: kind, target GPU index (None for node-wide kinds), parameters."""

    kind: str
    gpu: int | None
    params: dict[str, float | int | str]


def _string(name: str, value: Any, spec: Param) -> str:
    if not isinstance(value, str) or (spec.pattern and not re.fullmatch(spec.pattern, value)):
        raise FaultError(name, f"field '{name}' must be a string like {spec.help.split('e.g. ')[-1]!r}; got {value!r}")
    return value


def _number(name: str, value: Any, spec: Param) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(name, f"field '{name}' must be {'an integer' if spec.type is int else 'a number'}, got {value!r}")
    if spec.type is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise FaultError(name, f"field '{name}' must be an integer, got {value!r}")
            value = int(value)
    else:
        try:
            value = float(value)
        except OverflowError:  # an integer literal beyond 1.8e308
            value = math.inf
        if not math.isfinite(value):
            raise FaultError(name, f"field '{name}' must be a finite number, got {str(value)[:40]}")
    lo, hi = spec.minimum, spec.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise FaultError(name, f"field '{name}' must be between {lo:g} and {hi:g}, got {str(value)[:40]}")
    return value


def validate(body: Any, gpu_count: int, role: str | None = None) -> FaultRequest:
    """Validate a decoded JSON fault request against :data:`KINDS` for a node with ``gpu_count`` GPUs
    and the given ``role`` (serving|training; None skips the role check).

    Raises FaultError for: body not an object, missing/unknown ``kind``, a kind that does nothing on
    the node's role (``straggler`` on a serving node, ``kv-pressure`` on a training node), missing or out-of-range
    ``gpu`` for per-GPU kinds, ``gpu`` given for node-wide kinds, unknown fields, and parameters of
    the wrong type or out of bounds.
    """
    if not isinstance(body, dict):
        raise FaultError("body", "request body must be a JSON object")
    kind_name = body.get("kind")
    if not isinstance(kind_name, str) or kind_name not in KINDS:
        raise FaultError("kind", f"field 'kind' must be one of {', '.join(sorted(KINDS))}; got {kind_name!r}")
    kind = KINDS[kind_name]
    if role is not None and role not in kind.roles:
        raise FaultError("kind", f"kind '{kind_name}' does nothing on a {role} node (it acts on "
                                 f"{' or '.join(kind.roles)} nodes only); this node's role is {role}")
    allowed = {"kind", "gpu", *kind.params}
    for key in body:
        if key not in allowed:
            raise FaultError(key, f"unknown field '{key}' for kind '{kind_name}'; allowed fields: {', '.join(sorted(allowed))}")
    gpu = None
    if kind.per_gpu:
        if "gpu" not in body:
            raise FaultError("gpu", f"field 'gpu' is required for kind '{kind_name}' (0..{gpu_count - 1})")
        gpu_val = body["gpu"]
        if isinstance(gpu_val, bool) or not isinstance(gpu_val, int) or not 0 <= gpu_val < gpu_count:
            raise FaultError("gpu", f"field 'gpu' must be an integer GPU index 0..{gpu_count - 1}; got {gpu_val!r}")
        gpu = gpu_val
    elif body.get("gpu") is not None:
        raise FaultError("gpu", f"kind '{kind_name}' applies to the whole node; omit field 'gpu'")
    params: dict[str, float | int | str] = {}
    for name, spec in kind.params.items():
        if name in body:
            params[name] = _string(name, body[name], spec) if spec.type is str else _number(name, body[name], spec)
        elif spec.required:
            raise FaultError(name, f"field '{name}' is required for kind '{kind_name}' ({spec.help})")
        elif spec.default is not None:
            params[name] = spec.default
    return FaultRequest(kind_name, gpu, params)
