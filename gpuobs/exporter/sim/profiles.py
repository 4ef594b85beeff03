"""Exporter profiles (docs/metrics.md): which counters file the simulated dcgm-exporter serves, how it
prints the host label, and whether gpuobs's own extras are on the page.

* ``stock`` (default): dcgm-exporter 4.x ``etc/default-counters.csv`` (tag 4.5.3-4.8.2), exactly: 25
  metrics + the DCGM_FI_DRIVER_VERSION label. No gpuobs extras: no ``gpuobs_node_expected_gpus``
  (the exporter publishes no expected-GPU count, dcgm-exporter #348), no ``gpuobs_exporter_*``
  self-metrics, no PyTorch allocator metrics (those come from the framework, not the exporter).
* ``helm``: the dcgm-exporter Helm chart's ConfigMap (chart 4.8.2; same fields in charts 4.0.0-4.7.1):
  stock without the DCGM_FI_DRIVER_VERSION label and without DCGM_FI_DEV_FB_RESERVED.
* ``recommended``: ``deploy/dcgm-exporter/recommended.csv`` (stock + every field gpuobs's enhanced
  rule paths read), plus the gpuobs extras (allocator metrics, expected GPUs, self-metrics).

In every profile training application metrics (``training_*``, ``nccl_*``) stay on training nodes'
pages, and the Xid gauge behaves like dcgm-exporter 4.4+/4.5.x (absent until the first Xid, then the
last code held). ``clock_events_name="legacy"`` prints field 112 as DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
the pre-DCGM-3.3 name that fleets with old counters files still use.

Host-label modes (``--host-label-mode``), after dcgm-exporter ``internal/pkg/hostname/hostname.go`` and
``internal/pkg/rendermetrics/render_metrics.go`` (tag 4.5.3-4.8.2) and PR #655 (master d5e5f51):

* ``Hostname``: ``Hostname="<node name>"`` (NODE_NAME set: Helm chart, GPU Operator);
* ``hostname``: the same under master's lowercase label name;
* ``localhost``: ``Hostname="localhost"`` (4.0-4.5.3 started with ``-r localhost:5555``);
* ``pod``: ``Hostname="nvidia-dcgm-exporter-<5 chars>"``, the exporter pod's name (no NODE_NAME: the
  container's hostname), which changes whenever the exporter pod is replaced;
* ``none``: no host label at all (``-n``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuobs.reference import dcgm_exporter as upstream
from gpuobs.reference.dcgm_exporter import CounterField, recommended_counters

PROFILES = ("stock", "helm", "recommended")
HOST_LABEL_MODES = ("Hostname", "hostname", "localhost", "pod", "none")
CLOCK_EVENTS_NAMES = ("canonical", "legacy")
#: Field 112's current and legacy names (DCGM 3.3 renamed "throttle reasons" to "clock events").
CLOCK_EVENTS_FIELD = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
CLOCK_EVENTS_LEGACY = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"


@dataclass(frozen=True)
class ExporterProfile:
    """What one simulated exporter serves.

    ``counters``: counters-file records in page order (label-typed ones become labels);
    ``gpuobs_extras``: allocator metrics, ``gpuobs_node_expected_gpus`` and ``gpuobs_exporter_*``.
    """

    name: str
    counters: tuple[CounterField, ...]
    gpuobs_extras: bool = False
    clock_events_name: str = "canonical"

    @property
    def metric_fields(self) -> tuple[CounterField, ...]:
        return tuple(c for c in self.counters if not c.is_label)

    @property
    def label_fields(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.counters if c.is_label)

    def has(self, name: str) -> bool:
        """Whether the page carries field ``name`` (a metric or a label field)."""
        return any(c.name == name for c in self.counters)


def load(name: str = "stock", clock_events_name: str = "canonical") -> ExporterProfile:
    """The profile ``name`` (one of :data:`PROFILES`). Raises ValueError naming the allowed values."""
    if name not in PROFILES:
        raise ValueError(f"exporter profile must be one of {', '.join(PROFILES)}; got {name!r}")
    if clock_events_name not in CLOCK_EVENTS_NAMES:
        raise ValueError(f"clock events name must be one of {', '.join(CLOCK_EVENTS_NAMES)}; got {clock_events_name!r}")
    counters = {"stock": upstream.default_counters, "helm": upstream.helm_counters,
                "recommended": recommended_counters}[name]()
    if clock_events_name == "legacy":
        counters = tuple(CounterField(CLOCK_EVENTS_LEGACY, c.type, c.help) if c.name == CLOCK_EVENTS_FIELD else c
                         for c in counters)
    return ExporterProfile(name, tuple(counters), gpuobs_extras=name == "recommended",
                           clock_events_name=clock_events_name)


def host_label(mode: str, node_name: str, pod_name: str) -> tuple[str, str] | None:
    """The DCGM page's host label ``(name, value)`` under ``mode``, or None for ``none``.

    Raises ValueError naming the allowed modes.
    """
    if mode == "Hostname":
        return ("Hostname", node_name)
    if mode == "hostname":
        return ("hostname", node_name)
    if mode == "localhost":
        return ("Hostname", "localhost")
    if mode == "pod":
        return ("Hostname", pod_name)
    if mode == "none":
        return None
    raise ValueError(f"host label mode must be one of {', '.join(HOST_LABEL_MODES)}; got {mode!r}")
