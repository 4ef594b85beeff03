"""The simulated fleet as Kubernetes would show it: pod names, which pod owns which GPU, and the target
labels a kube-prometheus ServiceMonitor scrape gives each page.

Shapes follow the NVIDIA GPU Operator (dcgm-exporter DaemonSet and Service ``nvidia-dcgm-exporter`` in
namespace ``gpu-operator``, port name ``gpu-metrics``) and prometheus-operator's generated scrape
config for a ServiceMonitor endpoint with ``honorLabels: false``: target labels ``job`` (the Service
name), ``namespace``, ``service``, ``endpoint`` (the port name), ``pod``, ``container``, ``instance``
(the address). Because the target has ``namespace``/``pod``/``container``, Prometheus stores the
page's own labels of those names (dcgm-exporter's pod mapping, kubernetes.go) as ``exported_*``.
gpuobs's shipped relabelling adds ``node`` from ``__meta_kubernetes_pod_node_name``
(deploy/dcgm-exporter/values-recommended.yaml); there is no ``node`` without it.
"""

from __future__ import annotations

from gpuobs.core.fleet import shipped_fleet
from gpuobs.exporter.sim.identity import DCGM_EXPORTER_DAEMONSET, pod_suffix

SCRAPE_MODES = ("file_sd", "servicemonitor")
#: ServiceMonitor-style identity of the two page kinds: Service (= job), namespace, port name, container.
DCGM_SERVICE = {"job": DCGM_EXPORTER_DAEMONSET, "namespace": "gpu-operator", "service": DCGM_EXPORTER_DAEMONSET,
                "endpoint": "gpu-metrics", "container": DCGM_EXPORTER_DAEMONSET}
ENGINE_SERVICE = {"job": "vllm-engine", "namespace": "serving", "service": "vllm-engine", "endpoint": "http",
                  "container": "vllm"}
#: Namespaces and containers of the workload pods that own GPUs (their labels land on the DCGM page).
SERVING_WORKLOAD = {"namespace": "serving", "container": "vllm"}
TRAINING_WORKLOAD = {"namespace": "training", "container": "pytorch"}


def engine_pod_name(seed: int, node: int) -> str:
    """The serving engine's pod on node ``node``: ``vllm-engine-<10-char ReplicaSet hash>-<5 chars>``."""
    rs = pod_suffix("vllm-rs", seed) + pod_suffix("vllm-rs2", seed)
    return f"vllm-engine-{rs}-{pod_suffix('vllm', seed, node)}"


def training_pod_name(job: str, rank0: int) -> str:
    """The training worker pod that owns a node's GPUs: ``<job>-worker-<n>`` (PyTorchJob naming)."""
    return f"{job}-worker-{rank0}"


def pod_map(nodes: list[tuple[str, int, str]], gpus: int, seed: int,
            training_job: str = "llama3-70b-pretrain") -> dict[str, dict[int, dict[str, str]]]:
    """GPU -> owning pod for every node (the ``--k8s-map`` shape): ``nodes`` is ``[(hostname, index,
    role)]``; a serving node's GPUs belong to its engine pod, a training node's to its worker pod."""
    out: dict[str, dict[int, dict[str, str]]] = {}
    for host, index, role in nodes:
        if role == "serving":
            labels = {"pod": engine_pod_name(seed, index), **SERVING_WORKLOAD}
        else:
            labels = {"pod": training_pod_name(training_job, index), **TRAINING_WORKLOAD}
        out[host] = {g: dict(labels) for g in range(gpus)}
    return out


def target_labels(kind: str, node: str, address: str, pod: str) -> dict[str, str]:
    """Target labels of one page under a ServiceMonitor scrape plus gpuobs's relabelling of the node into
    the shipped fleet config's identity label (``node``).

    ``kind``: ``dcgm`` or ``vllm``; ``pod``: the scraped pod (the exporter's, or the engine's).
    Raises ValueError for another kind.
    """
    if kind not in ("dcgm", "vllm"):
        raise ValueError(f"target kind must be dcgm or vllm, got {kind!r}")
    service = DCGM_SERVICE if kind == "dcgm" else ENGINE_SERVICE
    return {**service, "pod": pod, "instance": address, shipped_fleet().identity_label: node}

