"""Facts about NVIDIA dcgm-exporter that the simulator imitates: its counters-file format, the counters
files it ships, and the ``err_msg`` texts of its Xid gauge.

Sources (read at tag 4.5.3-4.8.2, commit 691c92762eb5, of https://github.com/NVIDIA/dcgm-exporter):

* counters-file format: ``internal/pkg/counters/counter_config.go`` (Go ``encoding/csv`` with
  ``Comment = '#'``; each field trimmed of spaces; exactly 3 fields per record: DCGM field name,
  Prometheus type, help text; the type must be one of gauge, counter, histogram, summary, label);
  label-typed fields become labels of every series instead of series of their own.
* ``data/dcgm_exporter_default_counters.csv``: ``etc/default-counters.csv`` (what a stock exporter serves).
* ``data/dcgm_exporter_helm_counters.csv``: the Helm chart's ConfigMap
  (``deployment/templates/metrics-configmap.yaml``, chart 4.8.2; same fields in charts 4.0.0-4.7.1).
* ``data/dcgm_exporter_xid_text.csv``: ``internal/pkg/collector/xid_errors.go`` (``xidErrCodeToText``)
  and ``gpu_collector.go`` (``unknownErr``).
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from importlib import resources

from gpuobs.core import assets

#: Prometheus types a counters file may name (dcgm-exporter ``promMetricType`` plus ``label``).
COUNTER_TYPES = ("gauge", "counter", "histogram", "summary", "label")
#: Clock-event reason bits of ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` (legacy name
#: ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``): NVML's ``nvmlClocksEventReason*`` masks (nvml.h).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
#: The bits that cost clock to thermal or power limits (docs/metrics.md), by name: what the throttling
#: rules and the throttling dashboard test.
THROTTLE_BITS = (("SW_POWER_CAP", SW_POWER_CAP), ("HW_SLOWDOWN", HW_SLOWDOWN), ("SW_THERMAL", SW_THERMAL),
                 ("HW_THERMAL", HW_THERMAL), ("HW_POWER_BRAKE", HW_POWER_BRAKE))
#: The bits that say the power limit was not merely reached but enforced from outside or by
#: protection, i.e. a fault: NVML's HW_SLOWDOWN ("HW Slowdown (reducing the core clocks by a factor of 2
#: or more) is engaged": temperature too high, External Power Brake Assertion, or power draw too high
#: with Fast Trigger protection) and HW_POWER_BRAKE ("HW Power Brake Slowdown ... External Power Brake
#: Assertion being triggered (e.g. by the system power supply)"). SW_POWER_CAP is NOT one: "SW Power
#: Scaling algorithm is reducing the clocks below requested clocks" / "the clocks have been optimized to
#: ensure not to exceed currently set power limits" is a healthy GPU at its configured power limit under
#: dense load (NVML API reference, nvmlClocksEventReasons; DCGM dcgmFieldConstants
#: DCGM_CLOCKS_THROTTLE_REASON_*). The GPUThrottling rule counts DCGM_FI_DEV_POWER_VIOLATION time only
#: with one of these bits (or power collapsed); thermal time (SW/HW_THERMAL) always counts.
POWER_FAULT_BITS = (("HW_SLOWDOWN", HW_SLOWDOWN), ("HW_POWER_BRAKE", HW_POWER_BRAKE))
#: ``err_msg`` for codes outside ``xidErrCodeToText`` (gpu_collector.go ``unknownErr``).
UNKNOWN_XID_TEXT = "Unknown Error"


@dataclass(frozen=True)
class CounterField:
    """One record of a counters file: DCGM field name, Prometheus type (or ``label``), help text."""

    name: str
    type: str
    help: str

    @property
    def is_label(self) -> bool:
        return self.type == "label"


class CountersError(ValueError):
    """A counters file that dcgm-exporter would reject; the message names the source and line."""


def parse_counters(text: str, source: str = "counters file") -> list[CounterField]:
    """Parse dcgm-exporter counters-file text into its records, in file order.

    Blank lines and lines starting with ``#`` are skipped. Raises :class:`CountersError` naming
    ``source`` and the line for a record without exactly 3 fields, an unknown type, or a field
    listed twice.
    """
    out: list[CounterField] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        record = [f.strip(" ") for f in next(csv.reader([line]))]
        if len(record) != 3:
            raise CountersError(f"{source} line {lineno}: expected 3 fields (DCGM field, Prometheus type, help), "
                                f"got {len(record)}: {line.strip()!r}")
        name, mtype, help_text = record
        if mtype not in COUNTER_TYPES:
            raise CountersError(f"{source} line {lineno}: type {mtype!r} of {name} is not one of {', '.join(COUNTER_TYPES)}")
        if name in seen:
            raise CountersError(f"{source} line {lineno}: {name} is listed twice")
        seen.add(name)
        out.append(CounterField(name, mtype, help_text))
    return out


#: The counters file gpuobs ships for fleets that can edit theirs (stock fields + every field the
#: enhanced paths read), relative to the asset root (checkout or wheel).
RECOMMENDED_CSV = "deploy/dcgm-exporter/recommended.csv"


@functools.cache
def recommended_counters() -> tuple[CounterField, ...]:
    """Records of ``deploy/dcgm-exporter/recommended.csv``, in file order. Raises CountersError if it
    cannot be read or is malformed."""
    path = assets.path(RECOMMENDED_CSV)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CountersError(f"cannot read {path}: {exc}") from None
    return tuple(parse_counters(text, str(path)))


def _data(name: str) -> str:
    return resources.files("gpuobs.reference").joinpath(f"data/{name}").read_text(encoding="utf-8")


@functools.cache
def default_counters() -> tuple[CounterField, ...]:
    """``etc/default-counters.csv`` of dcgm-exporter 4.5.3-4.8.2: 25 metrics + the driver-version label."""
    return tuple(parse_counters(_data("dcgm_exporter_default_counters.csv"), "dcgm_exporter_default_counters.csv"))


@functools.cache
def helm_counters() -> tuple[CounterField, ...]:
    """The Helm chart's ConfigMap counters (chart 4.8.2): default-counters without the driver label and FB_RESERVED."""
    return tuple(parse_counters(_data("dcgm_exporter_helm_counters.csv"), "dcgm_exporter_helm_counters.csv"))


@functools.cache
def _xid_texts() -> dict[int, str]:
    lines = [ln for ln in _data("dcgm_exporter_xid_text.csv").splitlines() if ln and not ln.startswith("#")]
    return {int(row["code"]): row["text"] for row in csv.DictReader(lines)}


def xid_text(code: int) -> str:
    """dcgm-exporter's ``err_msg`` for Xid ``code`` (``Unknown Error`` outside its table)."""
    return _xid_texts().get(code, UNKNOWN_XID_TEXT)
