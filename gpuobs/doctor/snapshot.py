"""What ``gpuobs doctor`` reads from a Prometheus-API backend, and the reading itself.

:func:`collect` runs a fixed set of instant queries (no range queries, no series dumps: every answer is
an aggregate, so a 1000-node fleet answers in a few thousand rows) and returns a :class:`Snapshot`, the
plain data :func:`gpuobs.doctor.verdict.diagnose` judges. Tests build Snapshots from a fake Prometheus
through the same :func:`collect`.

Selectors are lists of Prometheus label matchers on *target* labels (``job="dcgm"``,
``job=~"nvidia-dcgm-exporter|dcgm"``, ``namespace="gpu-operator",service="nvidia-dcgm-exporter"``):
the rules use them on ``up`` too, so a matcher on a label only the exporter's page carries cannot work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpuobs.core.errors import InputError
from gpuobs.doctor.fixes import LEGACY_NAMES
from gpuobs.core.fleet import parse_matchers
from gpuobs.mixin.families import FAMILIES, Family
from gpuobs.promapi.prometheus import PromClient

_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_MATCHER = re.compile(rf'\s*({_LABEL})\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
#: Label names of dcgm-exporter's host label: capital H in every release, lowercase on master after PR #655.
HOST_LABELS = ("Hostname", "hostname")
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"

TargetKey = tuple[str, str]  # (job, instance)


def parse_selector(text: str, flag: str) -> str:
    """Normalise a selector (``job="dcgm"`` or ``{job="dcgm", namespace="x"}``) to ``m1,m2`` in the fleet
    config's grammar (:func:`gpuobs.core.fleet.parse_matchers`). Raises an InputError (exit 2) naming
    ``flag`` when it is not a non-empty list of label matchers or when it matches on ``__name__``."""
    return ",".join(parse_matchers(text, flag))


@dataclass(frozen=True)
class Target:
    """A scrape target the selector matches: its ``up`` sample (``labels`` are its target labels)."""

    job: str
    instance: str
    identity: str  # "" when the identity label is missing or empty
    up: bool
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> TargetKey:
        return (self.job, self.instance)

    @property
    def name(self) -> str:
        """How reports name the target: its identity, else ``job/instance``."""
        return self.identity or f"{self.job}/{self.instance}"


@dataclass(frozen=True)
class HostRow:
    """One distinct (target, host-label values, driver label) combination on a DCGM target's page."""

    job: str
    instance: str
    identity: str
    hostname: str  # value of ``Hostname`` ("" when absent)
    hostname_lower: str  # value of lowercase ``hostname``
    driver: str
    series: int


@dataclass
class Snapshot:
    """The answers doctor judges (all instant; see :func:`collect`).

    ``served[metric]``: the targets (job, instance) serving ``metric`` under its selector (DCGM fields
    under the DCGM selector, ``vllm:*`` under the vLLM selector, ``up`` as the targets themselves).
    ``anywhere[metric]``: {job: {identity values}} of every series of ``metric`` in the TSDB, whatever
    the selectors (identity "" where missing). ``mig_total[target]``: MIG instances on the target;
    ``mig_served[metric][target]``: of those, how many carry ``metric``.
    ``exported_pod_jobs``: DCGM jobs whose series carry ``exported_pod`` (ServiceMonitor, honorLabels false).
    ``legacy_xid_targets``: DCGM targets whose ``DCGM_FI_DEV_XID_ERRORS`` has no ``err_code`` label
    (dcgm-exporter before 3.3.6, where the gauge's value is the last Xid code).
    """

    url: str
    identity_label: str
    dcgm_selector: str
    vllm_selector: str
    dcgm_targets: list[Target] = field(default_factory=list)
    vllm_targets: list[Target] = field(default_factory=list)
    served: dict[str, set[TargetKey]] = field(default_factory=dict)
    anywhere: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    mig_total: dict[TargetKey, int] = field(default_factory=dict)
    mig_served: dict[str, dict[TargetKey, int]] = field(default_factory=dict)
    hosts: list[HostRow] = field(default_factory=list)
    exported_pod_jobs: set[str] = field(default_factory=set)
    legacy_xid_targets: set[TargetKey] = field(default_factory=set)


def signal_metrics(families: Iterable[Family], job: str) -> list[str]:
    """The metric names of every signal on ``job`` (``dcgm``, ``vllm``, ``app``, ``agent``), sorted."""
    out = set()
    for f in families:
        for s in (*f.stock, *f.enhanced, *f.alternatives, *f.optional):
            if s.job == job and s.metric != "up":
                out.add(s.metric)
    return sorted(out)


def _names(metrics: Iterable[str]) -> str:
    return "|".join(sorted(metrics))


def _targets(client: PromClient, selector: str, ident: str) -> list[Target]:
    res = client.query(f"up{{{selector}}}")
    out = [Target(s.labels.get("job", ""), s.labels.get("instance", ""), s.labels.get(ident, ""), s.value == 1,
                  {k: v for k, v in s.labels.items() if k != "__name__"}) for s in res.samples]
    return sorted(out, key=lambda t: (t.job, t.identity, t.instance))


def collect(client: PromClient, identity_label: str, dcgm_selector: str, vllm_selector: str,
            families: tuple[Family, ...] = FAMILIES) -> Snapshot:
    """Read everything doctor needs from ``client`` (instant queries only; 9 requests, 10 on a fleet with MIG): the targets the
    fleet config's selectors pick (the same targets its rules see; a literal job="dcgm" missed the GPU
    Operator's ServiceMonitor job and reported a working fleet as blind) and its identity label.

    Selectors must already be normalised (:func:`parse_selector`). Raises the
    :class:`gpuobs.promapi.prometheus.PrometheusError` subclasses of the client (unreachable: exit 1;
    query rejected: exit 2)."""
    ident = identity_label
    snap = Snapshot(client.url, ident, dcgm_selector, vllm_selector)
    snap.dcgm_targets = _targets(client, dcgm_selector, ident)
    snap.vllm_targets = _targets(client, vllm_selector, ident)
    snap.served["up"] = {t.key for t in snap.dcgm_targets}

    dcgm = signal_metrics(families, "dcgm")
    vllm = signal_metrics(families, "vllm")
    for names, sel in ((dcgm, dcgm_selector), (vllm, vllm_selector)):
        if not names:
            continue
        res = client.query(f'count by (__name__, job, instance) ({{__name__=~"{_names(names)}",{sel}}})')
        for s in res.samples:
            snap.served.setdefault(s.labels.get("__name__", ""), set()).add(
                (s.labels.get("job", ""), s.labels.get("instance", "")))

    every = set(dcgm) | set(vllm) | set(signal_metrics(families, "app")) | set(signal_metrics(families, "agent"))
    every |= {legacy for legacy, _ in LEGACY_NAMES.values()}
    by = ", ".join(dict.fromkeys(("__name__", "job", ident)))
    res = client.query(f'count by ({by}) ({{__name__=~"{_names(every)}"}})')
    for s in res.samples:
        snap.anywhere.setdefault(s.labels.get("__name__", ""), {}).setdefault(
            s.labels.get("job", ""), set()).add(s.labels.get(ident, ""))

    mig = f'GPU_I_ID=~".+",{dcgm_selector}'
    res = client.query(f'count by (job, instance) (group by (job, instance, gpu, GPU_I_ID) '
                       f'({{__name__=~"DCGM_FI_.+",{mig}}}))')
    snap.mig_total = {(s.labels.get("job", ""), s.labels.get("instance", "")): int(s.value) for s in res.samples}
    if snap.mig_total:
        res = client.query(f'count by (__name__, job, instance) ({{__name__=~"{_names(dcgm)}",{mig}}})')
        for s in res.samples:
            snap.mig_served.setdefault(s.labels.get("__name__", ""), {})[
                (s.labels.get("job", ""), s.labels.get("instance", ""))] = int(s.value)

    by = ", ".join(dict.fromkeys(("job", "instance", ident, *HOST_LABELS, DRIVER_LABEL)))
    res = client.query(f'count by ({by}) '
                       f'({{__name__=~"DCGM_FI_.+",{dcgm_selector}}})')
    snap.hosts = sorted((HostRow(s.labels.get("job", ""), s.labels.get("instance", ""), s.labels.get(ident, ""),
                                 s.labels.get("Hostname", ""), s.labels.get("hostname", ""),
                                 s.labels.get(DRIVER_LABEL, ""), int(s.value)) for s in res.samples),
                        key=lambda h: (h.job, h.identity, h.instance, h.hostname, h.driver))
    res = client.query(f'count by (job) ({{__name__=~"DCGM_FI_.+",exported_pod=~".+",{dcgm_selector}}})')
    snap.exported_pod_jobs = {s.labels.get("job", "") for s in res.samples}
    res = client.query(f'count by (job, instance) (DCGM_FI_DEV_XID_ERRORS{{err_code="",{dcgm_selector}}})')
    snap.legacy_xid_targets = {(s.labels.get("job", ""), s.labels.get("instance", "")) for s in res.samples}
    return snap
