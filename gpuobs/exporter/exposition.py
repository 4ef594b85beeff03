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


@dataclass
class Prerendered:
    """A section of exposition text rendered ahead (e.g. by :meth:`Template.fill`); ``render`` copies it."""

    text: str


def _header(fam: Family) -> str:
    return f"# HELP {fam.name} {escape_help(fam.help)}\n# TYPE {fam.name} {fam.type}\n"


def render(families: Iterable[Family | Prerendered]) -> str:
    """Render families to exposition text; families without samples are omitted."""
    out: list[str] = []
    for fam in families:
        if isinstance(fam, Prerendered):
            out.append(fam.text)
            continue
        if not fam.samples:
            continue
        out.append(_header(fam))
        for sample in fam.samples:
            if len(sample) == 3:
                name, labels, value = sample
            else:
                name, (labels, value) = fam.name, sample
            v = format_value(value, fam.integer)
            out.append(f"{name}{{{labels}}} {v}\n" if labels else f"{name} {v}\n")
    return "".join(out)


class Template:
    """Families whose layout (names, label strings, order) repeats scrape after scrape, compiled once
    into the literal text before each sample value plus one ``%``-format string of the values alone,
    so a scrape costs one C-level format and one join.

    Built from families whose samples' values are ignored; ``fill(values)`` with the values in sample
    order returns exactly ``render()`` of those families carrying those values: ``%d`` is ``int()``
    like dcgm-exporter's integer formatting, ``%f`` is ``format(v, "f")``, and prometheus_client-style
    (``integer=None``) values are ``%r`` of ``float(v)`` when all are finite, else they go through
    :func:`format_value` (``+Inf``, ``NaN``).
    """

    __slots__ = ("size", "_prefixes", "_slots", "_slots_s", "_plain", "_all_plain")

    def __init__(self, families: Iterable[Family]):
        prefixes: list[str] = []  # literal text before each value: family header (first sample) + name{labels}
        slots: list[str] = []
        plain: list[bool] = []  # per value: True = prometheus_client formatting
        for fam in families:
            if not fam.samples:
                continue
            header = _header(fam)
            slot = "%r\n" if fam.integer is None else "%d\n" if fam.integer else "%f\n"
            for sample in fam.samples:
                name, labels = (sample[0], sample[1]) if len(sample) == 3 else (fam.name, sample[0])
                prefixes.append(header + (f"{name}{{{labels}}} " if labels else f"{name} "))
                header = ""
            slots += [slot] * len(fam.samples)
            plain += [fam.integer is None] * len(fam.samples)
        self.size = len(prefixes)
        self._prefixes = prefixes
        self._slots = "".join(slots)
        self._slots_s = self._slots.replace("%r", "%s")  # fallback: format_value strings
        self._plain = plain if any(plain) else None
        self._all_plain = bool(plain) and all(plain)

    def fill(self, values: Sequence[float | int]) -> str:
        """The rendered text for ``values`` (one per sample, in order). ValueError on a count mismatch."""
        if len(values) != self.size:
            raise ValueError(f"template has {self.size} samples, got {len(values)} values")
        if self._plain is None:
            text = self._slots % tuple(values)
        elif self._all_plain and (total := sum(floats := tuple(map(float, values)))) - total == 0.0:
            text = self._slots % floats  # every value finite: repr(float) is prometheus_client's format
        else:
            text = self._slots_s % tuple(format_value(v, None) if p else v for v, p in zip(values, self._plain))
        out = [""] * (2 * self.size)
        out[0::2] = self._prefixes
        out[1::2] = text.splitlines(True)  # formatted numbers hold no line breaks: one piece per value
        return "".join(out)
