"""The remediation controller's settings: mode, caps, windows and deadlines, each with its source.

Read from a YAML mapping (``gpuobs remediate serve --config FILE``) or built with defaults; every bad
value raises :class:`~gpuobs.core.errors.ConfigError` naming ``remediate.<key>`` and what is allowed.

Defaults and where they come from:

* ``mode: dry-run``: decide and record, never act (the local stack passes ``enforce``); ``observe``
  records events only.
* ``max_attempts: 3`` per node per ``attempts_window: 24h``, then Escalated (an RMA ticket): the cap
  NVSentinel's users asked for after unbounded remediation loops (NVIDIA/NVSentinel #1543, #127).
* ``pool_share: 0.10`` with ``pool_min: 1``: at most max(1, floor(10% of the pool)) nodes out of service
  at once; ``rate_share: 0.10`` with ``rate_min: 3`` per ``rate_window: 1h``: GKE node auto-repair's
  max(3, 10% of the pool) repairs per hour (cloud.google.com/kubernetes-engine/docs/how-to/node-auto-repair).
* ``breaker_share: 0.3`` with ``breaker_min_nodes: 3`` in ``breaker_window: 5m``: when that many distinct
  nodes raise remediation events the cause is fleet-wide (driver, firmware, release), not hardware, and
  the controller stops acting and pages (NVSentinel's breaker stops at half a cluster; 30% trips earlier
  because every node it would cordon meanwhile is capacity lost to a cause a reset does not fix).
* ``drain_timeout: 10m``: a drain that has not finished by then never proceeds to an action.
* ``settle: 45s`` after an action before verifying (a reboot's downtime, a reset's re-init);
  ``verify_hold: 60s``: the health check passed and the alert clear for that long; ``verify_timeout:
  15m``: a verification that has not passed by then counts as a failed attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from gpuobs.core.durations import parse_duration
from gpuobs.core.errors import ConfigError

MODES = ("observe", "dry-run", "enforce")
_DURATIONS = ("attempts_window", "rate_window", "breaker_window", "drain_timeout", "settle", "verify_hold",
              "verify_timeout")
_SHARES = ("pool_share", "rate_share", "breaker_share")
_COUNTS = ("max_attempts", "pool_min", "rate_min", "breaker_min_nodes")


@dataclass(frozen=True)
class RemediationConfig:
    """Settings (durations in seconds, shares in 0..1). See the module docstring for each default's source."""

    mode: str = "dry-run"
    max_attempts: int = 3
    attempts_window: float = 86400.0
    pool_share: float = 0.10
    pool_min: int = 1
    rate_share: float = 0.10
    rate_min: int = 3
    rate_window: float = 3600.0
    breaker_share: float = 0.3
    breaker_min_nodes: int = 3
    breaker_window: float = 300.0
    drain_timeout: float = 600.0
    settle: float = 45.0
    verify_hold: float = 60.0
    verify_timeout: float = 900.0

    def pool_cap(self, pool_size: int) -> int:
        """Most nodes of a pool of ``pool_size`` out of service at once: max(pool_min, floor(share x size))."""
        return max(self.pool_min, int(self.pool_share * pool_size))

    def rate_cap(self, pool_size: int) -> int:
        """Most quarantines started in a pool per ``rate_window``: max(rate_min, floor(share x size))."""
        return max(self.rate_min, int(self.rate_share * pool_size))

    def breaker_threshold(self, fleet_size: int) -> int:
        """Distinct nodes with events within ``breaker_window`` that trip the breaker:
        max(breaker_min_nodes, ceil(breaker_share x fleet size))."""
        return max(self.breaker_min_nodes, -int(-self.breaker_share * fleet_size // 1))


def parse_config(doc: Any, base: RemediationConfig | None = None, prefix: str = "remediate") -> RemediationConfig:
    """A config from a YAML mapping (unknown keys refused); ``base`` supplies the values not given."""
    cfg = base or RemediationConfig()
    if doc is None:
        return cfg
    if not isinstance(doc, dict):
        raise ConfigError(prefix, doc, "a mapping of " + ", ".join(f.name for f in fields(RemediationConfig)))
    known = {f.name for f in fields(RemediationConfig)}
    values: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}.{key}"
        if key not in known:
            raise ConfigError(name, key, "one of " + ", ".join(sorted(known)))
        if key == "mode":
            if value not in MODES:
                raise ConfigError(name, value, " | ".join(MODES))
            values[key] = value
        elif key in _DURATIONS:
            values[key] = parse_duration(value, name, allow_zero=key in ("settle", "verify_hold"))
        elif key in _SHARES:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ConfigError(name, value, "a share in (0, 1], e.g. 0.1")
            values[key] = float(value)
        elif key in _COUNTS:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
                raise ConfigError(name, value, "an integer from 1 to 10000")
            values[key] = value
    return replace(cfg, **values)
