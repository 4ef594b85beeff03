"""The one duration grammar of gpuobs (flags, config files, query parameters).

Accepted: a bare number of seconds (``90``, ``2.5``) or one or more ``<number><unit>`` parts with
units ``d`` (86400 s), ``h``, ``m``, ``s`` in that order (``30d``, ``1h30m``, ``1d12h``, ``0.5s``).
This is Prometheus's duration syntax for these units (prometheus/common model/time.go
``ParseDuration``) plus bare seconds; ``ms``, ``w`` and ``y`` are not accepted.
"""

from __future__ import annotations

import math
import re

from gpuobs.core.errors import ConfigError

ACCEPTED = "a duration such as 90 (seconds), 30s, 5m, 1h30m or 1d"
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = r"(\d+(?:\.\d+)?)([dhms])"
_FULL = re.compile(rf"(?:{_PART})+")


class DurationError(ConfigError):
    """A duration that does not parse or is out of range; names the field and the grammar."""

    def __init__(self, field_name: str, value: object, accepted: str = ACCEPTED):
        super().__init__(field_name, value, accepted)


def parse_duration(text: object, field_name: str = "duration", *, allow_zero: bool = False) -> float:
    """``text`` -> seconds (float, finite, > 0, or >= 0 with ``allow_zero``).

    ``text`` may be a str in the grammar above or an int/float. Units must appear in d, h, m, s order
    and at most once. Raises :class:`DurationError` naming ``field_name``.
    """
    if isinstance(text, bool):
        raise DurationError(field_name, text)
    if isinstance(text, (int, float)):
        try:
            value = float(text)
        except OverflowError:  # an int beyond a float (YAML reads a 400-digit number as one)
            raise DurationError(field_name, text) from None
    elif isinstance(text, str):
        s = text.strip()
        try:
            value = float(s) if re.fullmatch(r"\d+(?:\.\d+)?", s) else math.nan
        except ValueError:
            value = math.nan
        if math.isnan(value):
            if not _FULL.fullmatch(s):
                raise DurationError(field_name, text)
            parts = re.findall(_PART, s)
            units = [u for _, u in parts]
            if units != sorted(set(units), key="dhms".index):
                raise DurationError(field_name, text, ACCEPTED + " (units in d, h, m, s order, each once)")
            value = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise DurationError(field_name, text)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise DurationError(field_name, text, ("a non-negative " if allow_zero else "a positive ") + ACCEPTED.removeprefix("a "))
    return value


def format_duration(seconds: float) -> str:
    """Seconds -> the shortest exact single-unit duration (3600 -> ``1h``, 25920 -> ``432m``, 1.5 -> ``1.5s``)."""
    for unit, size in _UNITS.items():
        if seconds >= size and float(seconds) % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
