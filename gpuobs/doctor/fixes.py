"""The exact fixes ``gpuobs doctor`` prints: counters-CSV lines, scrape relabelling snippets, selector
and label hints.

CSV lines: dcgm-exporter's counters-file format is ``DCGM FIELD, Prometheus metric type, help message``
(``#`` starts a comment; Go ``encoding/csv``, fields trimmed). Every line is the record of
``deploy/dcgm-exporter/recommended.csv`` (the counters file gpuobs ships; read through
:func:`gpuobs.reference.dcgm_exporter.recommended_counters`), so a suggested line and the shipped file
never disagree. Those records are the upstream lines of NVIDIA/dcgm-exporter ``etc/default-counters.csv``
at tag ``4.5.3-4.8.2`` (commit 691c92762eb5; ``etc/`` unchanged on master d5e5f51) with the leading ``# ``
removed where upstream ships them commented out, except: the two fields in NO shipped CSV
(:data:`NOT_IN_ANY_CSV`: DCGM field 112 ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``, which dcgm-exporter's own
``pkg/cmd/app.go`` watches for DCGM_EXP_CLOCK_EVENTS_COUNT, and field 396 ``DCGM_FI_DEV_ROW_REMAP_PENDING``),
whose help texts are gpuobs's; and ``DCGM_EXP_XID_ERRORS_COUNT``, which ``etc/default-counters.csv:40``
declares a ``counter`` while dcgm-exporter's own tests declare and expect a ``gauge``
(``internal/pkg/integration_test/collector_test.go`` around line 580 and its ``MetricType_GAUGE``
assertion; ``tests/integration/testdata/default-counters.csv:37``, master d5e5f51). Its value is the
count within a sliding window, which falls as events age out, so it is a gauge: declared a counter,
``rate()`` would read every fall as a reset.

Relabel snippets: Prometheus ``relabel_configs`` / ``kubernetes_sd_config`` (``__meta_kubernetes_pod_node_name``
is set for pod, endpoints and endpointslice targets backed by a pod; prometheus.io configuration docs),
Prometheus Operator ``ServiceMonitor``/``PodMonitor`` ``relabelings`` (camelCase ``sourceLabels``,
``targetLabel``), and the dcgm-exporter Helm chart's ``serviceMonitor.relabelings`` value
(deployment/values.yaml and templates/service-monitor.yaml, chart 4.8.2, whose endpoint port is ``metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuobs.reference.dcgm_exporter import RECOMMENDED_CSV, recommended_counters

#: Where the upstream lines come from.
UPSTREAM_CSV = "NVIDIA/dcgm-exporter etc/default-counters.csv @ 4.5.3-4.8.2"

#: The DCGM fields doctor can suggest a line for (every DCGM signal of every alert family).
SUGGESTED_FIELDS = (
    # uncommented in the stock file (a fleet lacks them only if its counters file dropped them)
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    # commented out in the stock file
    "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_PROF_SM_ACTIVE",
    # in no shipped CSV (field ids 112 and 396)
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ROW_REMAP_PENDING",
)
#: metric -> the counters-file line that enables it: its record in recommended.csv.
CSV_LINES: dict[str, str] = {f.name: f"{f.name}, {f.type}, {f.help}" for f in recommended_counters()
                             if f.name in SUGGESTED_FIELDS}
#: Stock-file lines (uncommented upstream).
STOCK_FIELDS = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"})
#: Fields no shipped counters file names, not even commented out (docs/metrics.md).
NOT_IN_ANY_CSV = frozenset({"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ROW_REMAP_PENDING"})
#: Legacy metric names that mean a field is there under an old name (metric -> legacy name, why).
LEGACY_NAMES: dict[str, tuple[str, str]] = {
    "vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc",
                                 "the engine serves vLLM V0 metric names (gone upstream; vllm/v1/metrics/loggers.py): "
                                 "upgrade vLLM to a V1-metrics release"),
}

#: A pod's name as Kubernetes builds it for a DaemonSet pod: ``<name>-<5 chars>`` from the alphabet of
#: k8s.io/apimachinery pkg/util/rand (consonants and digits without vowels, 0, 1, 3).
POD_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True)
class Fix:
    """One fix: ``kind`` (``csv``, ``relabel``, ``selector``, ``exporter``, ``instrument``), a one-line
    ``title`` and the ``text`` to paste (a CSV line, a YAML snippet, a flag)."""

    kind: str
    title: str
    text: str
    source: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "title": self.title, "text": self.text, "source": self.source}


def csv_fix(metrics: list[str]) -> Fix:
    """The counters-file lines that enable ``metrics`` (DCGM fields), in the order given.

    Raises KeyError for a metric that is no DCGM field gpuobs knows a line for."""
    lines = [CSV_LINES[m] for m in metrics]
    extra = [m for m in metrics if m in NOT_IN_ANY_CSV]
    src = f"{RECOMMENDED_CSV} (from {UPSTREAM_CSV})" + (f"; {', '.join(extra)}: in no shipped CSV, help text gpuobs's"
                                                          if extra else "")
    return Fix("csv", f"add to the dcgm-exporter counters CSV (or use {RECOMMENDED_CSV})", "\n".join(lines), src)


def identity_fixes(label: str) -> list[Fix]:
    """How to give every target the identity ``label`` (the Kubernetes node name) for each kind of scrape."""
    k8s = (f"- sourceLabels: [__meta_kubernetes_pod_node_name]\n"
           f"  targetLabel: {label}")
    indent = lambda text, n: "\n".join(" " * n + line for line in text.splitlines())  # noqa: E731
    return [
        Fix("relabel", "file_sd: put the node's name in each target group's labels",
            f'[{{"targets": ["10.0.0.11:9400"], "labels": {{"{label}": "gpu-node-01"}}}}]',
            "prometheus.io file_sd_config"),
        Fix("relabel", "static_configs: one target group per node",
            f"static_configs:\n  - targets: ['10.0.0.11:9400']\n    labels:\n      {label}: gpu-node-01",
            "prometheus.io static_config"),
        Fix("relabel", "kubernetes_sd_configs (plain Prometheus): copy the pod's node name",
            f"relabel_configs:\n  - source_labels: [__meta_kubernetes_pod_node_name]\n    target_label: {label}",
            "prometheus.io kubernetes_sd_config, relabel_config"),
        Fix("relabel", "ServiceMonitor (kube-prometheus): on the exporter's endpoint",
            "spec:\n  endpoints:\n    - port: metrics\n      relabelings:\n" + indent(k8s, 8),
            "Prometheus Operator API, ServiceMonitor.spec.endpoints[].relabelings"),
        Fix("relabel", "PodMonitor: on the pod's metrics endpoint",
            "spec:\n  podMetricsEndpoints:\n    - port: metrics\n      relabelings:\n" + indent(k8s, 8),
            "Prometheus Operator API, PodMonitor.spec.podMetricsEndpoints[].relabelings"),
        Fix("relabel", "dcgm-exporter Helm chart values",
            "serviceMonitor:\n  relabelings:\n" + indent(k8s, 4),
            "NVIDIA/dcgm-exporter deployment/values.yaml, chart 4.8.2"),
    ]


def selector_fix(kind: str, jobs: list[str], flag: str) -> Fix:
    """Point the ``kind`` (``dcgm``/``vllm``) selector at the jobs that serve its metrics."""
    matcher = f'job="{jobs[0]}"' if len(jobs) == 1 else f'job=~"{"|".join(jobs)}"'
    return Fix("selector", f"the {kind} metrics are scraped by job(s) {', '.join(jobs)}",
               f"gpuobs doctor {flag} '{matcher}'\n"
               f"# and render the rules with the same selector (fleet config: selectors.{kind}: '{matcher}')")


def node_name_fix() -> Fix:
    """Make dcgm-exporter print the node name as its host label (NODE_NAME from the downward API)."""
    return Fix("exporter", "set NODE_NAME on the dcgm-exporter container (its Hostname is NODE_NAME, else the "
               "container's hostname = the pod name)",
               "env:\n  - name: NODE_NAME\n    valueFrom:\n      fieldRef:\n        fieldPath: spec.nodeName",
               "NVIDIA/dcgm-exporter internal/pkg/hostname/hostname.go and deployment/templates/daemonset.yaml @ 4.5.3-4.8.2")
