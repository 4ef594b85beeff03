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


def format_value(value: float | int, integer: bool | None) -> str:
    """Format a sample value.

    ``True``/``False``: dcgm-exporter formatting, integer fields plain, float fields ``%f`` (six
    decimals). ``None``: prometheus_client formatting (Python ``repr`` of the float, ``+Inf``,
    ``-Inf``, ``NaN``), used for the serving-engine page, which vLLM renders with prometheus_client.
    """
    if integer is None:
        v = float(value)
        if v != v:
            return "NaN"
        if v in (float("inf"), float("-inf")):
            return "+Inf" if v > 0 else "-Inf"
        return repr(v)
    if integer:
        return str(int(value))
    return f"{value:f}"


@dataclass
class Family:
    """One metric family: name, type (gauge|counter|...), help and samples.

    ``samples`` holds ``(label_string, value)`` with label_string already rendered by
    :func:`label_string`, or ``(sample_name, label_string, value)`` for histogram series whose
    samples carry suffixes (``_bucket``, ``_sum``, ``_count``); ``integer`` selects
    dcgm-exporter's integer formatting.
    """

    name: str
    type: str
    help: str
    integer: bool | None = False
    samples: list[tuple] = field(default_factory=list)


def render(families: Iterable[Family]) -> str:
    """Render families to exposition text; families without samples are omitted."""
    out: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        out.append(f"# HELP {fam.name} {escape_help(fam.help)}\n# TYPE {fam.name} {fam.type}\n")
        for sample in fam.samples:
            if len(sample) == 3:
                name, labels, value = sample
            else:
                name, (labels, value) = fam.name, sample
            v = format_value(value, fam.integer)
            out.append(f"{name}{{{labels}}} {v}\n" if labels else f"{name} {v}\n")
    return "".join(out)
