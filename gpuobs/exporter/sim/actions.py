"""Node actions of the simulated fleet (cordon, drain, GPU reset, reboot, engine restart, diag, driver
install): the admin API's request validation and the errors the node's action methods raise.

A node action request is a JSON object ``{"action": ..., <params>}`` (``POST /admin/node``, see
:mod:`gpuobs.exporter.server`). Validation never mutates anything: it returns a :class:`NodeAction`
or raises :class:`NodeActionError` naming the offending field and the allowed values (HTTP 400).
The effects are :class:`gpuobs.exporter.sim.node.Node`'s ``cordon``, ``uncordon``, ``drain``,
``reset_gpu``, ``reboot``, ``restart_engine``, ``diag`` and ``install_driver``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpuobs.core.errors import GpuobsError, InputError

#: Actions ``POST /admin/node`` takes.
NODE_ACTIONS = ("cordon", "uncordon", "drain", "reset-gpu", "reboot", "restart-engine", "diag", "install-driver")
#: Who sets or removes a cordon: the remediation controller (``gpuobs``) or an operator (``human``).
CORDON_BY = ("gpuobs", "human")
#: Default and bounds of a reboot's downtime, simulated seconds.
DEFAULT_REBOOT_S = 30.0
MAX_REBOOT_S = 3600.0
#: Default of a driver install's module reload (node down), simulated seconds; bounds as a reboot's.
DEFAULT_RELOAD_S = 20.0
MAX_REASON_CHARS = 200

#: Fields each action accepts besides ``action`` (``gpu`` is required for reset-gpu only).
_FIELDS: dict[str, tuple[str, ...]] = {
    "cordon": ("by", "reason"),
    "uncordon": ("by", "reason"),
    "drain": ("reason",),
    "reset-gpu": ("gpu",),
    "reboot": ("downtime_s",),
    "restart-engine": (),
    "diag": ("gpu",),
    "install-driver": ("version", "reload_s"),
}


class NodeActionError(InputError):
    """A bad node action request, or an action the node's role cannot take (HTTP 400).
    ``field`` names the JSON field at fault; str() is the message."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


class NodeStateError(GpuobsError):
    """The node cannot take the action in its present state (rebooting, unreachable, its GPU gone):
    a conflict (HTTP 409), not a verdict on its health. Try again later or take another action."""


@dataclass(frozen=True)
class NodeAction:
    """A validated node action: ``action`` (one of :data:`NODE_ACTIONS`), ``by`` (cordon/uncordon),
    ``gpu`` (reset-gpu: required; diag: None = every GPU), ``downtime_s`` (reboot), ``reason`` (free text
    for the log and the cordon mark), ``version`` and ``reload_s`` (install-driver: the driver to install
    and the module reload's downtime, simulated seconds)."""

    action: str
    by: str = "human"
    gpu: int | None = None
    downtime_s: float = DEFAULT_REBOOT_S
    reason: str = ""
    version: str = ""
    reload_s: float = DEFAULT_RELOAD_S


def check_gpu(value: Any, gpu_count: int) -> int:
    """``value`` as a GPU index of a node with ``gpu_count`` GPUs; NodeActionError(``gpu``) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < gpu_count:
        raise NodeActionError("gpu", f"field 'gpu' must be an integer GPU index 0..{gpu_count - 1}; got {value!r}")
    return value


def _seconds(body: dict, name: str, default: float) -> float:
    """``body[name]`` as a finite number of seconds in 0..:data:`MAX_REBOOT_S`; NodeActionError(``name``)."""
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NodeActionError(name, f"field '{name}' must be a number of seconds, got {value!r}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or not 0 <= value <= MAX_REBOOT_S:
        raise NodeActionError(name, f"field '{name}' must be between 0 and {MAX_REBOOT_S:g} seconds, "
                                    f"got {str(value)[:40]}")
    return value


def validate(body: Any, gpu_count: int, driver_versions: tuple[str, ...] | None = None) -> NodeAction:
    """Validate a decoded ``POST /admin/node`` body for a node with ``gpu_count`` GPUs whose driver
    catalogue holds ``driver_versions`` (None: any string version passes here; the node checks it).

    Raises NodeActionError for: a body that is not an object, a missing or unknown ``action`` (the
    message lists the allowed ones), a field the action does not take, ``by`` not gpuobs|human,
    ``gpu`` missing (reset-gpu) or not a GPU index, ``downtime_s`` or ``reload_s`` not a finite number
    in 0..3600, ``reason`` not a string of at most 200 characters, ``version`` missing (install-driver),
    not a string or not in ``driver_versions`` (the message lists them).
    """
    if not isinstance(body, dict):
        raise NodeActionError("body", "request body must be a JSON object")
    action = body.get("action")
    if not isinstance(action, str) or action not in NODE_ACTIONS:
        raise NodeActionError("action", f"field 'action' must be one of {', '.join(NODE_ACTIONS)}; got {action!r}")
    allowed = ("action", *_FIELDS[action])
    for key in body:
        if key not in allowed:
            raise NodeActionError(key, f"unknown field '{key}' for action '{action}'; allowed fields: "
                                       f"{', '.join(sorted(allowed))}")
    by = body.get("by", "human")
    if by not in CORDON_BY:
        raise NodeActionError("by", f"field 'by' must be one of {', '.join(CORDON_BY)}; got {by!r}")
    gpu = None
    if action == "reset-gpu" and "gpu" not in body:
        raise NodeActionError("gpu", f"field 'gpu' is required for action 'reset-gpu' (0..{gpu_count - 1})")
    if body.get("gpu") is not None:
        gpu = check_gpu(body["gpu"], gpu_count)
    downtime = _seconds(body, "downtime_s", DEFAULT_REBOOT_S)
    reload_s = _seconds(body, "reload_s", DEFAULT_RELOAD_S)
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise NodeActionError("reason", f"field 'reason' must be a string of at most {MAX_REASON_CHARS} characters")
    version = ""
    if action == "install-driver":
        known = ", ".join(driver_versions) if driver_versions is not None else "a catalogue driver version"
        if "version" not in body:
            raise NodeActionError("version", f"field 'version' is required for action 'install-driver' (one of {known})")
        version = body["version"]
        if not isinstance(version, str) or (driver_versions is not None and version not in driver_versions):
            raise NodeActionError("version", f"field 'version' must be one of {known}; got {repr(version)[:60]}")
    return NodeAction(action, by, gpu, downtime, reason, version, reload_s)
