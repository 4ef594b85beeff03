"""What Prometheus stores from a simulated page: the page's series with the target's labels merged in,
for building promtool test series from the real shapes (profiles, host-label modes, scrape modes, MIG,
pod churn) instead of hand-written label sets.

Merge rule (prometheus/prometheus scrape/scrape.go ``mutateSampleLabels`` and
``resolveConflictingExposedLabels``, v2.42 and later): with ``honor_labels: false`` (the default, and
what kube-prometheus ServiceMonitors use unless ``honorLabels: true``) every target label is set on the
series; a page label of the same name with a non-empty value is kept as ``exported_<name>`` (more
``exported_`` prefixes while that name is taken), conflicts resolved shortest name first. With
``honor_labels: true`` the page's labels win and target labels fill only absent names. Labels with
empty values are dropped. ``tests/live/test_scrape_modes_live.py`` checks this against a real
Prometheus.

Target labels per scrape mode: ``file_sd`` = ``job`` (``dcgm`` / ``vllm``), ``instance`` and ``node``
(plus ``Hostname`` on vLLM targets), as ``gpuobs stack up`` writes them; ``servicemonitor`` =
:func:`gpuobs.exporter.sim.k8s.target_labels`.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from gpuobs.core.fleet import shipped_fleet
from gpuobs.exporter.exposition import label_string, render
from gpuobs.exporter.sim import k8s
from gpuobs.exporter.sim.mig import MigProfile
from gpuobs.exporter.sim.node import Node

K8sMap = dict[str, dict[int, dict[str, str]]]

EXPORTED_PREFIX = "exported_"
#: Scrape-config job names of the file_sd mode (prometheus/prometheus.yml).
FILE_SD_JOBS = {"dcgm": "dcgm", "vllm": "vllm", "logwatch": "logwatch"}


def file_sd_labels(kind: str, node: str) -> dict[str, str]:
    """Labels ``gpuobs stack up`` gives a file_sd target of page ``kind`` (``dcgm``/``vllm``/``logwatch``) besides
    ``job``/``instance``: the shipped fleet config's identity label (``node``), and on vLLM targets also
    ``Hostname`` (the vLLM page has no host label of its own; the DCGM page brings one, which a target
    label would rename)."""
    if kind not in FILE_SD_JOBS:
        raise ValueError(f"target kind must be one of {', '.join(FILE_SD_JOBS)}, got {kind!r}")
    return {shipped_fleet().identity_label: node, **({"Hostname": node} if kind == "vllm" else {})}


def target_labels(kind: str, scrape_mode: str, node: str, address: str, pod: str = "") -> dict[str, str]:
    """Every label the target of one page carries under ``scrape_mode`` (``job`` and ``instance`` included).

    ``pod``: the scraped pod's name (servicemonitor only). Raises ValueError for an unknown mode/kind.
    """
    if scrape_mode == "file_sd":
        return {"job": FILE_SD_JOBS.get(kind, kind), "instance": address, **file_sd_labels(kind, node)}
    if scrape_mode == "servicemonitor":
        return k8s.target_labels(kind, node, address, pod)
    raise ValueError(f"scrape mode must be one of {', '.join(k8s.SCRAPE_MODES)}; got {scrape_mode!r}")


def stored_labels(page_labels: dict[str, str], target: dict[str, str], honor_labels: bool = False) -> dict[str, str]:
    """The label set Prometheus stores for one sample with ``page_labels`` scraped from ``target``."""
    out = dict(page_labels)
    if honor_labels:
        for k, v in target.items():
            out.setdefault(k, v)
    else:
        conflicts = [(k, page_labels[k]) for k in target if page_labels.get(k)]
        out.update(target)
        for name, value in sorted(conflicts, key=lambda kv: len(kv[0])):  # stable: shortest first
            new = name
            while True:
                new = EXPORTED_PREFIX + new
                if not out.get(new):
                    out[new] = value
                    break
    return {k: v for k, v in out.items() if v != ""}


def stored_series(page_text: str, target: dict[str, str],
                  honor_labels: bool = False) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition page as stored: ``[(sample name, labels, value)]`` in page order.
    Raises ValueError if the page does not parse."""
    # prometheus_client's parser names counter samples <family>_total even where the page (like
    # dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) has no such suffix; Prometheus stores the
    # name as written, so map such names back.
    written = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", page_text, re.M))

    def name(n: str) -> str:
        return n[:-len("_total")] if n not in written and n.endswith("_total") and n[:-6] in written else n
    return [(name(s.name), stored_labels(dict(s.labels), target, honor_labels), s.value)
            for fam in text_string_to_metric_families(page_text) for s in fam.samples]


def promtool_series(name: str, labels: dict[str, str]) -> str:
    """``name{a="x",b="y"}`` (labels sorted) as promtool's ``input_series`` and PromQL selectors spell it."""
    return f"{name}{{{label_string(sorted(labels.items()))}}}"


def page_series(node: Node, kind: str = "dcgm", scrape_mode: str = "file_sd", profile: str = "stock",
                host_label_mode: str = "Hostname", mig: dict[int, MigProfile] | None = None,
                pods: K8sMap | None = None, address: str = "127.0.0.1:9400",
                honor_labels: bool = False) -> list[tuple[str, dict[str, str], float]]:
    """What Prometheus stores from one simulated node's page right now.

    ``kind``: ``dcgm`` (the DCGM page under ``profile``/``host_label_mode``/``mig``) or ``vllm`` (the
    engine page); ``pods``: the GPU -> workload pod map (``--k8s-map`` shape), defaulting under
    ``servicemonitor`` to :func:`gpuobs.exporter.sim.k8s.pod_map`; the target's ``pod`` is the node's
    exporter pod (``node.exporter_pod``, new after an ``exporter-restart`` fault) or engine pod.
    """
    from gpuobs.exporter.collectors.dcgm import DcgmCollector
    from gpuobs.exporter.collectors.vllm import EngineCollector

    seed, index = node.cfg.seed, node.cfg.index
    if scrape_mode == "servicemonitor" and pods is None:
        pods = k8s.pod_map([(node.hostname, index, node.cfg.role)], len(node.gpus), seed)
    if kind == "dcgm":
        page = render(DcgmCollector(node, host_label_mode, mig, pods, profile=profile).collect())
        pod = node.exporter_pod
    elif kind == "vllm":
        page = render(EngineCollector(node).collect())
        pod = k8s.engine_pod_name(seed, index)
    else:
        raise ValueError(f"page kind must be dcgm or vllm, got {kind!r}")
    return stored_series(page, target_labels(kind, scrape_mode, node.hostname, address, pod), honor_labels)
