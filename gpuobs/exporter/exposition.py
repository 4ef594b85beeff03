"""Prometheus text exposition (format 0.0.4) written the way dcgm-exporter writes it.

dcgm-exporter prints integer fields plain and floating-point fields with six decimals
(internal/pkg/rendermetrics: ``%d`` / ``%f``); label values are escaped per the exposition format
(backslash, double quote and newline). Families are rendered as ``# HELP``, ``# TYPE``, samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: Content type of text format 0.0.4 (what dcgm-exporter serves).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    """Escape a label value: ``\\`` -> ``\\\\``, ``"`` -> ``\\"``, newline -> ``\\n``."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """Escape HELP text: backslash and newline."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def label_string(pairs: Sequence[tuple[str, str]]) -> str:
    """Render ordered label pairs as ``a="x",b="y"`` (no braces), preserving the given order."""
    return ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)


def format_value(value: float | int, integer: bool) -> str:
    """dcgm-exporter value formatting: integer fields plain, float fields ``%f`` (six decimals)."""
    if integer:
        return str(int(value))
    return f"{value:f}"


@dataclass
class Family:
    """One metric family: name, type (gauge|counter|...), help and samples.

    ``samples`` holds ``(label_string, value)`` with label_string already rendered by
    :func:`label_string`; ``integer`` selects dcgm-exporter's integer formatting.
    """

    name: str
    type: str
    help: str
    integer: bool = False
    samples: list[tuple[str, float]] = field(default_factory=list)


def render(families: Iterable[Family]) -> str:
    """Render families to exposition text; families without samples are omitted."""
    out: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        out.append(f"# HELP {fam.name} {escape_help(fam.help)}\n# TYPE {fam.name} {fam.type}\n")
        for labels, value in fam.samples:
            v = format_value(value, fam.integer)
            out.append(f"{fam.name}{{{labels}}} {v}\n" if labels else f"{fam.name} {v}\n")
    return "".join(out)
