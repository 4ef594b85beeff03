"""Fault kinds, their parameters, and validation of admin-API requests.

A fault request is a JSON object ``{"kind": ..., "gpu": ..., <params>}``. Validation never
mutates anything: it either returns a :class:`FaultRequest` or raises :class:`FaultError`
naming the offending field and the allowed values (the admin API turns that into HTTP 400).
Effects of each kind on the simulated node are applied in :mod:`gpuobs.exporter.node`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class FaultError(ValueError):
    """A bad fault request. ``field`` names the JSON field at fault; str() is the message."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Param:
    """One numeric parameter of a fault kind: type ``int`` or ``float``, bounds inclusive."""

    type: type
    required: bool = False
    default: float | int | None = None
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""


@dataclass(frozen=True)
class FaultKind:
    """A fault kind: whether it targets one GPU (``gpu`` required) and its parameters."""

    name: str
    per_gpu: bool
    params: dict[str, Param] = field(default_factory=dict)
    help: str = ""


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
        FaultKind("down", False, {}, "the node stops answering scrapes (admin API stays up)"),
    )
}


@dataclass(frozen=True)
class FaultRequest:
    """A validated fault: kind, target GPU index (None for node-wide kinds), parameters."""

    kind: str
    gpu: int | None
    params: dict[str, float | int]


def _number(name: str, value: Any, spec: Param) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(name, f"field '{name}' must be {'an integer' if spec.type is int else 'a number'}, got {value!r}")
    if spec.type is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise FaultError(name, f"field '{name}' must be an integer, got {value!r}")
            value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise FaultError(name, f"field '{name}' must be a finite number, got {value!r}")
    lo, hi = spec.minimum, spec.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise FaultError(name, f"field '{name}' must be between {lo:g} and {hi:g}, got {value!r}")
    return value


def validate(body: Any, gpu_count: int) -> FaultRequest:
    """Validate a decoded JSON fault request against :data:`KINDS` for a node with ``gpu_count`` GPUs.

    Raises FaultError for: body not an object, missing/unknown ``kind``, missing or out-of-range
    ``gpu`` for per-GPU kinds, ``gpu`` given for node-wide kinds, unknown fields, and parameters of
    the wrong type or out of bounds.
    """
    if not isinstance(body, dict):
        raise FaultError("body", "request body must be a JSON object")
    kind_name = body.get("kind")
    if kind_name not in KINDS:
        raise FaultError("kind", f"field 'kind' must be one of {', '.join(sorted(KINDS))}; got {kind_name!r}")
    kind = KINDS[kind_name]
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
    params: dict[str, float | int] = {}
    for name, spec in kind.params.items():
        if name in body:
            params[name] = _number(name, body[name], spec)
        elif spec.required:
            raise FaultError(name, f"field '{name}' is required for kind '{kind_name}' ({spec.help})")
        elif spec.default is not None:
            params[name] = spec.default
    return FaultRequest(kind_name, gpu, params)
