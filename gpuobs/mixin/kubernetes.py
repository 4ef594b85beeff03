"""Kubernetes manifests of gpuobs (``deploy/kubernetes/``), generated from the repository's sources.

One command writes or checks them all: ``gpuobs rules kubernetes [--check] [--out DIR]``. Output is
plain YAML arranged as kustomize bases (``kubectl apply -k deploy/kubernetes/<base>``): kustomize is
built into kubectl, needs no chart repository or template engine, and the files a reviewer reads are
exactly what the API server receives (a Helm chart would hide them behind templates that tests could
only check by running helm). Bases:

* ``monitoring/``: the gpuobs NVML exporter DaemonSet (Xid events come from NVML's event API, so the
  same pod is the kernel-log agent for Xids), PodMonitors for dcgm-exporter, vLLM and gpuobs with
  node-identity relabelling, one PrometheusRule per ``prometheus/rules/*.yml`` (the groups copied
  verbatim: no hand copy), Grafana dashboard ConfigMaps (label ``grafana_dashboard: "1"``, the
  kube-prometheus-stack sidecar's default), for namespace ``monitoring``.
* ``canary/``: ``gpuobs canary serve`` Deployment (durable ``--state-dir`` on a PVC, strategy
  Recreate so two servers never share the SQLite file), Service, NetworkPolicy, PVC.
* ``argo/``: the AnalysisTemplate; ``flagger/``: a Canary and a MetricTemplate (examples to adapt:
  the target's name and selectors are vLLM's).
* ``remediation/``: the remediation controller's identity and least-privilege RBAC for its Kubernetes
  adapter (:mod:`gpuobs.remediate.adapters.kubernetes`): namespace ``gpuobs-remediation`` (Pod Security
  ``privileged``: its GPU-reset and diagnostic Jobs are privileged), ServiceAccount, a ClusterRole with
  exactly the verbs the adapter calls (nodes get/list/update, nodes/status patch, pods list,
  pods/eviction create) and a Role for its Jobs (create/get/delete) in its namespace, with bindings
  (``rbac.yaml``); the ``gpuobs remediate serve --adapter kubernetes --mode dry-run`` Deployment (one
  replica, strategy Recreate: one writer of its SQLite store on a PVC; its webhook token from the
  Secret ``gpuobs-remediate-token``, which is not generated: the file's head says how to create it;
  the fleet config's identity label and runbook base in a ConfigMap), Service, NetworkPolicy (in from
  Alertmanager and Prometheus only) (``controller.yaml``); a PodMonitor for its ``/metrics`` and a
  Role letting kube-prometheus's Prometheus discover pods in its namespace (``podmonitor.yaml``).
* ``ha/``: the HA topology (docs/ha.md) as an overlay of ``monitoring/``: a sharded, replicated
  prometheus-operator ``Prometheus`` (2 x 2) whose shard key is the fleet config's identity label
  (:func:`shard_key`, set in the monitoring base's PodMonitors), an ``Alertmanager`` cluster of 3
  carrying the rendered gpuobs config (a generated Secret), VictoriaMetrics operator ``VMSingle``
  (replica dedup) and ``VMAlert`` with the fleet-wide VMRules, the node-local rules as
  PrometheusRules for the shards (:func:`ha_rules`: the native topology's split), the base's unsplit
  PrometheusRules deleted by patches. Objects written against prometheus-operator v0.93.0's and the
  VictoriaMetrics operator v0.74.1's CRDs (tests/data/crds).
* ``alertmanager/gpuobs-fragment.yaml``: an Alertmanager configuration (route tree, receivers,
  inhibit rules of ``alertmanager/alertmanager.yml``) to merge into the cluster's, with webhook URLs
  to fill in; first among its routes the remediated alerts to the controller (``continue: true``).

The controller settings (interval, count, limits) derive from the canary config's horizon and
interval by :func:`argo_limits`, whose reasoning docs/canary.md gives; tests drive the generated
AnalysisTemplate and Canary through emulations of Argo Rollouts v1.9.1 and Flagger v1.44.0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from gpuobs import __version__
from gpuobs.core import assets
from gpuobs.core.files import stale_files, write_tree
from gpuobs.core.fleet import FleetConfig
from gpuobs.mixin.alertmanager import remediation_route
from gpuobs.mixin.placement import GLOBAL_JOB, REMOTE_WRITE_DEADLINE_S, blind_rule, fresh_queries, place, vm_latency_offset_s
from gpuobs.mixin.render import render_all
from gpuobs.mixin.slo_rules import load_config as load_slo_config
from gpuobs.mixin.slo_rules import parse_period

NAMESPACE = "monitoring"
IMAGE = f"ghcr.io/gpuobs/gpuobs:{__version__}"
PART_OF = {"app.kubernetes.io/part-of": "gpuobs"}
SERVE_NAME, SERVE_PORT = "gpuobs-canary", 9098
EXPORTER_PORT = 9401  # beside dcgm-exporter's 9400 on the same node
LOGWATCH_PORT = 9500  # the kernel-log agent (gpuobs logwatch), same pod
#: Scrape interval of the gpuobs PodMonitors, seconds; in the HA base also the shards' and vmalert's
#: evaluation interval and VictoriaMetrics's dedup interval (which must equal the scrape interval).
SCRAPE_INTERVAL_S = 15
SERVE_URL = f"http://{SERVE_NAME}.{NAMESPACE}.svc:{SERVE_PORT}"
LOOK_DEADLINE_S = 15
CONTROLLER_TIMEOUT_S = 20
ARGO_ERROR_RETRY_S = 10  # DefaultErrorRetryInterval, analysis/analysis.go (argo-rollouts v1.9.1)
COUNT_MARGIN = 4
ROUTE_LABEL = "gpuobs"
HEADER = ("# Generated by `gpuobs rules kubernetes` from gpuobs/mixin/kubernetes.py and the repository's\n"
          "# rule files, dashboards and canary config. Do not edit: change the source and regenerate.\n")
# vLLM pods of a Deployment `vllm`: Flagger's canary pods are vllm-<hash>-<id>, its primary vllm-primary-*
FLAGGER_CANARY_SEL = 'namespace="serving",pod=~"vllm-[0-9a-z]+-[0-9a-z]+",pod!~"vllm-primary-.*"'
FLAGGER_BASELINE_SEL = 'namespace="serving",pod=~"vllm-primary-.*"'


def _meta(name: str, namespace: str | None = NAMESPACE, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/name": name, **PART_OF, **labels}
    return meta


def _restricted(uid: int = 65534) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


# ---- monitoring -------------------------------------------------------------------------------------
def exporter_daemonset() -> dict[str, Any]:
    """The gpuobs NVML exporter and the kernel-log agent (``gpuobs logwatch``, docs/logwatch.md) on every
    GPU node: read-only root filesystems, limits; the exporter non-root, the agent root with every
    capability dropped but SYSLOG (reading /dev/kmsg under ``kernel.dmesg_restrict=1``), /dev/kmsg
    mounted read-only and its position kept on the host so a rescheduled pod neither loses nor
    double-counts a line."""
    name = "gpuobs-nvml-exporter"
    labels = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta(name),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": {**labels, **PART_OF}},
                "spec": {
                    "automountServiceAccountToken": False,
                    # GPU Operator / NVIDIA container toolkit: the runtime class injects the driver
                    # library and device nodes; NVIDIA_VISIBLE_DEVICES=all sees every GPU without
                    # requesting one (as dcgm-exporter does).
                    "runtimeClassName": "nvidia",
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "exporter", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["gpuobs"],
                        "args": ["exporter", "--source", "nvml", "--host", "0.0.0.0",
                                 "--base-port", str(EXPORTER_PORT), "--hostname-label", "Hostname"],
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                                {"name": "GPUOBS_LOG_FORMAT", "value": "json"}],
                        "ports": [{"name": "metrics", "containerPort": EXPORTER_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/health", "port": "metrics"}, "periodSeconds": 15},
                        "livenessProbe": {"httpGet": {"path": "/health", "port": "metrics"}, "periodSeconds": 30,
                                          "failureThreshold": 4},
                        "resources": {"requests": {"cpu": "50m", "memory": "96Mi"},
                                      "limits": {"cpu": "500m", "memory": "256Mi"}},
                        "securityContext": _restricted(),
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }, {
                        "name": "logwatch", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["gpuobs"],
                        "args": ["logwatch", "--source", "kmsg", "--state-file", "/var/lib/gpuobs-logwatch/state.json",
                                 "--host", "0.0.0.0", "--port", str(LOGWATCH_PORT), "--hostname", "$(NODE_NAME)"],
                        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        "ports": [{"name": "logwatch", "containerPort": LOGWATCH_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/health", "port": "logwatch"}, "periodSeconds": 15},
                        "livenessProbe": {"httpGet": {"path": "/health", "port": "logwatch"}, "periodSeconds": 30,
                                          "failureThreshold": 4},
                        "resources": {"requests": {"cpu": "10m", "memory": "40Mi"},
                                      "limits": {"cpu": "200m", "memory": "100Mi"}},
                        "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"], "add": ["SYSLOG"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "volumeMounts": [{"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True},
                                         {"name": "logwatch-state", "mountPath": "/var/lib/gpuobs-logwatch"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
                                {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}},
                                {"name": "logwatch-state",
                                 "hostPath": {"path": "/var/lib/gpuobs-logwatch", "type": "DirectoryOrCreate"}}],
                },
            },
        },
    }


def _node_identity(identity_label: str) -> list[dict[str, Any]]:
    """Relabelling every gpuobs node PodMonitor applies: the Kubernetes node name becomes the fleet
    config's identity label (``node`` by default), and the shard key (:func:`shard_key`)."""
    return [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": identity_label, "action": "replace"},
            {"sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace", "action": "replace"},
            {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod", "action": "replace"},
            shard_key(identity_label)]


#: The label prometheus-operator hashes to pick a target's shard, and the one that makes every shard
#: scrape a target (prometheus-operator v0.93.0 pkg/prometheus/promcfg.go: hashLabelNameForSharding,
#: hashLabelNameForDisablingSharding).
SHARD_HASH_LABEL = "__tmp_hash"
SHARD_DISABLE_LABEL = "__tmp_disable_sharding"


def shard_key(identity_label: str) -> dict[str, Any]:
    """The relabelling that makes a sharded Prometheus (``spec.shards`` > 1) keep each node whole on one
    shard: ``__tmp_hash`` := the fleet config's identity label, as gpuobs's native HA topology shards
    (:func:`gpuobs.stack.ha.shard_relabel`, docs/ha.md "Sharding key").

    prometheus-operator v0.93.0, ``pkg/prometheus/promcfg.go`` ``generatePodMonitorConfig`` appends its
    sharding relabelling (``appendShardingRelabelingWithAddress`` -> ``appendShardingRelabelingWithLabel``)
    *after* the scrape class's and the endpoint's own ``relabelings``: ``__tmp_hash`` := ``__address__``
    only when ``__tmp_hash`` is still empty (``source_labels: [__address__, __tmp_hash], regex: (.+);``),
    then ``hashmod`` of ``__tmp_hash`` by the shard count, keep the pod's ``$(SHARD)``
    (Documentation/platform/sharding.md, "Implementing a custom distribution"). Its default, the
    address, would put a node's DCGM, vLLM and logwatch targets (three addresses) on different shards
    and break the node-local rules that join them. This relabelling follows the identity label's own
    (same list, earlier), so it hashes exactly the value the rules group by; a target without one keeps
    the operator's address fallback (regex ``(.+)`` leaves ``__tmp_hash`` unset), as the native
    topology falls back to ``__address__``. Without sharding (one shard) the keep matches every target."""
    return {"sourceLabels": [identity_label], "targetLabel": SHARD_HASH_LABEL, "regex": "(.+)",
            "replacement": "$1", "action": "replace"}


def _hostname_from_node(identity_label: str) -> list[dict[str, Any]]:
    """Metric relabelling: ``Hostname`` := the identity label. dcgm-exporter in a pod reports the pod's
    hostname (the pod name) as ``Hostname``; rules, dashboards and inhibitions join DCGM and vLLM series
    per host, so both must carry the node's name."""
    return [{"sourceLabels": [identity_label], "targetLabel": "Hostname", "action": "replace", "regex": "(.+)"}]


def pod_monitors(identity_label: str) -> list[dict[str, Any]]:
    """PodMonitors for dcgm-exporter, vLLM and the gpuobs exporter (``job`` as the rules expect), each
    target labelled with the fleet config's ``identity_label`` from its pod's node."""
    def monitor(name: str, job: str, selector: dict, namespaces: list[str] | None, port: str, path: str,
                extra_relabel: list[dict] | None = None, metric_relabel: list[dict] | None = None) -> dict:
        ep: dict[str, Any] = {"port": port, "path": path, "interval": _fmt_duration(SCRAPE_INTERVAL_S),
                              "scrapeTimeout": "10s",
                              "relabelings": [*_node_identity(identity_label),
                                              {"targetLabel": "job", "replacement": job, "action": "replace"},
                                              *(extra_relabel or [])]}
        if metric_relabel:
            ep["metricRelabelings"] = metric_relabel
        spec: dict[str, Any] = {"selector": selector, "podMetricsEndpoints": [ep]}
        spec["namespaceSelector"] = {"matchNames": namespaces} if namespaces else {"any": True}
        return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _meta(name), "spec": spec}

    return [
        monitor("gpuobs-dcgm-exporter", "dcgm", {"matchLabels": {"app": "nvidia-dcgm-exporter"}}, None,
                "gpu-metrics", "/metrics", metric_relabel=_hostname_from_node(identity_label)),
        monitor("gpuobs-nvml-exporter", "gpuobs-exporter",
                {"matchLabels": {"app.kubernetes.io/name": "gpuobs-nvml-exporter"}}, [NAMESPACE],
                "metrics", "/metrics", metric_relabel=_hostname_from_node(identity_label)),
        monitor("gpuobs-logwatch", "logwatch",
                {"matchLabels": {"app.kubernetes.io/name": "gpuobs-nvml-exporter"}}, [NAMESPACE],
                "logwatch", "/metrics", metric_relabel=_hostname_from_node(identity_label)),
        monitor("gpuobs-vllm", "vllm", {"matchLabels": {"app.kubernetes.io/component": "vllm"}}, None,
                "http", "/metrics",
                extra_relabel=[
                    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "Hostname",
                     "action": "replace"},
                    # Argo Rollouts labels each ReplicaSet's pods with its pod-template hash: the canary's
                    # and the stable's hashes tell the canary from its baseline in `gpuobs canary serve`.
                    {"sourceLabels": ["__meta_kubernetes_pod_label_rollouts_pod_template_hash"],
                     "targetLabel": "rollouts_pod_template_hash", "action": "replace"}]),
    ]


def prometheus_rules(files: dict[str, str]) -> list[dict[str, Any]]:
    """One PrometheusRule per rule file (``files``: file name -> YAML text, as rendered for the fleet
    config; label ``role: alert-rules`` as in kube-prometheus's own rules): its ``groups`` unchanged
    except the routing label ``gpuobs: "true"`` added to every alerting rule, which the Alertmanager
    fragment routes on."""
    return [{"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
             "metadata": _meta(f"gpuobs-{Path(name).stem}", role="alert-rules", prometheus="k8s"),
             "spec": {"groups": _routed_groups(text)}}
            for name, text in sorted(files.items())]


def _routed_groups(text: str) -> list[dict[str, Any]]:
    """The ``groups`` of a rule file's YAML ``text``, with the routing label ``gpuobs: "true"`` added to
    every alerting rule (the Alertmanager fragment routes on it)."""
    groups = (yaml.safe_load(text) or {}).get("groups") or []
    for g in groups:
        for r in g.get("rules") or []:
            if "alert" in r:
                r["labels"] = {**(r.get("labels") or {}), ROUTE_LABEL: "true"}
    return groups


def dashboard_configmaps(files: dict[str, str]) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard (``files``: file name -> JSON text, as rendered for the fleet config)
    for the Grafana sidecar (``grafana_dashboard: "1"``, folder "GPU")."""
    out = []
    for name, text in sorted(files.items()):
        meta = _meta(f"gpuobs-dashboard-{Path(name).stem}", grafana_dashboard="1")
        meta["annotations"] = {"grafana_folder": "GPU"}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {name: text}})
    return out


#: The pager's in-cluster address and the bearer token Alertmanager sends it (a Secret mounted into the
#: Alertmanager pods, e.g. the Prometheus Operator's ``spec.secrets: [gpuobs-pager-token]``, which
#: mounts it under /etc/alertmanager/secrets/<name>/).
PAGER_URL = "http://gpuobs-pager.monitoring.svc:9097"
PAGER_TOKEN_SECRET = "gpuobs-pager-token"
PAGER_TOKEN_FILE = f"/etc/alertmanager/secrets/{PAGER_TOKEN_SECRET}/token"


def alertmanager_fragment(text: str) -> dict[str, Any]:
    """gpuobs's Alertmanager route tree, receivers and inhibit rules (``text``: alertmanager.yml as
    rendered for the fleet config) as a config to merge into the cluster's: the local receivers are
    replaced with webhook receivers to the pager's Service (``/hook/page`` and ``/hook/ticket``, the
    pager's two routes) with its bearer token from a mounted Secret (:data:`PAGER_TOKEN_FILE`; the
    pager refuses webhooks without it). First among the routes, the remediation controller's
    (:func:`gpuobs.mixin.alertmanager.remediation_route`, ``continue: true``, limited to gpuobs's rules
    by the routing label): receiver ``gpuobs-remediate`` posts to :data:`REMEDIATION_URL`
    ``/hook/remediate`` with the controller's token (:data:`REMEDIATION_AM_TOKEN_FILE`)."""
    doc = yaml.safe_load(text)
    route = doc["route"]
    names = {"page": "gpuobs-page", "ticket": "gpuobs-ticket", "blackhole": "gpuobs-null"}

    def rename(r: dict) -> dict:
        r = dict(r)
        if "receiver" in r:
            r["receiver"] = names.get(r["receiver"], r["receiver"])
        if "routes" in r:
            r["routes"] = [rename(x) for x in r["routes"]]
        return r

    gpu_route = rename(route)
    gpu_route.pop("receiver", None)
    gpu_route = {"receiver": "gpuobs-null", "matchers": [f'{ROUTE_LABEL}="true"'], **gpu_route,
                 "continue": False}
    def webhook(channel: str) -> dict[str, Any]:
        return {"url": f"{PAGER_URL}/hook/{channel}", "send_resolved": True,
                "http_config": {"authorization": {"type": "Bearer", "credentials_file": PAGER_TOKEN_FILE}}}
    receivers = [{"name": "gpuobs-null"},
                 {"name": "gpuobs-page", "webhook_configs": [webhook("page")]},
                 {"name": "gpuobs-ticket", "webhook_configs": [webhook("ticket")]}]
    # the remediation controller's route first: continue: true passes the same alerts on to the pager
    rem_route, rem_receiver = remediation_route(REMEDIATION_URL)
    rem_route = {**rem_route, "receiver": "gpuobs-remediate",
                 "matchers": [f'{ROUTE_LABEL}="true"', *rem_route["matchers"]]}
    (rem_hook,) = rem_receiver["webhook_configs"]
    receivers.append({"name": "gpuobs-remediate", "webhook_configs": [{
        **rem_hook, "http_config": {"authorization": {"type": "Bearer",
                                                      "credentials_file": REMEDIATION_AM_TOKEN_FILE}}}]})
    return {"route": {"receiver": "gpuobs-null", "group_by": route.get("group_by", []),
                      "routes": [rem_route, gpu_route]},
            "receivers": receivers, "inhibit_rules": doc.get("inhibit_rules", [])}


# ---- canary serve -----------------------------------------------------------------------------------
def canary_serve() -> list[dict[str, Any]]:
    """Deployment, Service, NetworkPolicy and PVC of ``gpuobs canary serve``."""
    labels = {"app.kubernetes.io/name": SERVE_NAME}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(f"{SERVE_NAME}-state"),
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    deploy = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(SERVE_NAME),
        "spec": {
            "replicas": 1,  # one writer of the run database; a restart keeps every run (PVC)
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**labels, **PART_OF}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "fsGroup": 65534,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "serve", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["gpuobs"],
                        # Access control in the cluster is the NetworkPolicy below (ingress only from the
                        # Argo Rollouts and Flagger namespaces): Flagger's webhooks cannot send a header,
                        # so the bearer token of the local stack is off here (docs/canary.md, "Tokens").
                        "args": ["canary", "serve", "--host", "0.0.0.0", "--port", str(SERVE_PORT),
                                 "--state-dir", "/var/lib/gpuobs-canary", "--look-deadline", f"{LOOK_DEADLINE_S}s",
                                 "--no-auth"],
                        "env": [
                            {"name": "GPUOBS_PROMETHEUS_URL", "value": "http://prometheus-k8s.monitoring.svc:9090"},
                            {"name": "OTEL_SERVICE_NAME", "value": SERVE_NAME},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "OTEL_RESOURCE_ATTRIBUTES",
                             "value": "k8s.namespace.name=monitoring,k8s.pod.name=$(POD_NAME),"
                                      "service.namespace=gpuobs"},
                        ],
                        "ports": [{"name": "http", "containerPort": SERVE_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 20,
                                          "failureThreshold": 3},
                        # a look costs about 0.1 s of CPU at look 20 of a run (bench/README.md, "Look cost"):
                        # 100m serves ~30 runs looked at every 30 s; the 1-CPU limit absorbs a cold start
                        # (the first look after a restart recomputes its boundary schedules, ~1.5 s)
                        "resources": {"requests": {"cpu": "100m", "memory": "192Mi"},
                                      "limits": {"cpu": "1", "memory": "512Mi"}},
                        "securityContext": _restricted(),
                        "volumeMounts": [{"name": "state", "mountPath": "/var/lib/gpuobs-canary"},
                                         {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": f"{SERVE_NAME}-state"}},
                                {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                },
            },
        },
    }
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(SERVE_NAME),
           "spec": {"selector": labels, "ports": [{"name": "http", "port": SERVE_PORT, "targetPort": "http",
                                                   "protocol": "TCP"}]}}
    netpol = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(SERVE_NAME),
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress", "Egress"],
            # callers: the Argo Rollouts controller, Flagger, and Prometheus (it scrapes nothing here
            # today, but kube-prometheus's own policies expect to reach pods in `monitoring`)
            "ingress": [{"from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "argo-rollouts"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "flagger-system"}}},
                {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
                "ports": [{"protocol": "TCP", "port": SERVE_PORT}]}],
            # out: Prometheus (query API) and DNS only
            "egress": [
                {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
                 "ports": [{"protocol": "TCP", "port": 9090}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}],
        },
    }
    return [pvc, deploy, svc, netpol]


# ---- progressive delivery ---------------------------------------------------------------------------
def argo_limits(horizon_s: float, interval_s: float, look_deadline_s: float = LOOK_DEADLINE_S) -> dict[str, int]:
    """Argo ``web`` metric limits that keep the documented guarantees (docs/canary.md, "Argo Rollouts").

    * ``count`` = ceil(horizon / interval) + 1 + COUNT_MARGIN: every look up to and past the horizon
      fits, even when Argo re-enqueues up to 1 s early per look (whole-second ``finishedAt``); at
      ``count`` without a PROMOTE the metric ends Inconclusive (``consecutiveSuccessLimit`` and
      ``failureLimit`` both apply: ``assessMetricStatus``, analysis/analysis.go v1.9.1), never Successful.
    * ``inconclusiveLimit`` = count: HOLD keeps measuring; only ``count`` ends an undecided run.
    * ``consecutiveErrorLimit``: errors are retried every 10 s and do not count; serve turns a failing
      look into INCONCLUSIVE once horizon + one interval (its grace) has passed, so at most
      (horizon + interval + deadline) / 10 s + 1 errors come in a row. The limit exceeds that, so a
      Prometheus outage never ends the analysis in Error (which aborts the rollout).
    """
    count = math.ceil(horizon_s / interval_s) + 1 + COUNT_MARGIN
    errors = math.ceil((horizon_s + interval_s + look_deadline_s) / ARGO_ERROR_RETRY_S) + 2
    return {"count": count, "inconclusiveLimit": count, "consecutiveErrorLimit": errors}


def _fmt_duration(s: float) -> str:
    return f"{int(s // 60)}m" if s % 60 == 0 and s >= 60 else f"{int(s)}s"


def analysis_template(horizon_s: float, interval_s: float) -> dict[str, Any]:
    """The Argo Rollouts AnalysisTemplate (needs Argo Rollouts >= 1.8 for consecutiveSuccessLimit)."""
    lim = argo_limits(horizon_s, interval_s)
    url = (f"{SERVE_URL}/api/v1/analysis?run={{{{args.canary-hash}}}}&step={{{{args.step}}}}"
           "&canary=rollouts_pod_template_hash%3D%22{{args.canary-hash}}%22"
           "&baseline=rollouts_pod_template_hash%3D%22{{args.stable-hash}}%22")
    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
        "metadata": {"name": SERVE_NAME, "labels": dict(PART_OF)},
        "spec": {
            "args": [{"name": "canary-hash"}, {"name": "stable-hash"}, {"name": "step", "value": "background"}],
            "metrics": [{
                "name": "gpuobs-verdict",
                "interval": _fmt_duration(interval_s),
                "count": lim["count"],
                "consecutiveSuccessLimit": 1,
                "failureLimit": 0,
                "inconclusiveLimit": lim["inconclusiveLimit"],
                "consecutiveErrorLimit": lim["consecutiveErrorLimit"],
                "successCondition": 'result.verdict == "PROMOTE"',
                "failureCondition": 'result.verdict == "ROLLBACK"',
                "provider": {"web": {"url": url, "jsonPath": "{$}", "timeoutSeconds": CONTROLLER_TIMEOUT_S}},
            }],
        },
    }


def flagger_objects(horizon_s: float, interval_s: float) -> list[dict[str, Any]]:
    """A Flagger Canary (valid against Flagger v1.44.0's CRD) and the MetricTemplate it uses."""
    meta = {"canary": FLAGGER_CANARY_SEL, "baseline": FLAGGER_BASELINE_SEL}
    hook_url = f"{SERVE_URL}/flagger"
    threshold = 3
    mt = {"apiVersion": "flagger.app/v1beta1", "kind": "MetricTemplate",
          "metadata": {"name": "gpuobs-canary-ok", "namespace": "serving", "labels": dict(PART_OF)},
          "spec": {"provider": {"type": "prometheus", "address": SERVE_URL},
                   "query": ('gpuobs_canary_ok{namespace="{{ namespace }}",name="{{ target }}",'
                             'canary="' + FLAGGER_CANARY_SEL.replace('"', '\\"') + '",'
                             'baseline="' + FLAGGER_BASELINE_SEL.replace('"', '\\"') + '"}')}}
    canary = {
        "apiVersion": "flagger.app/v1beta1", "kind": "Canary",
        "metadata": {"name": "vllm", "namespace": "serving", "labels": dict(PART_OF)},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm"},
            "progressDeadlineSeconds": 600,
            "service": {"port": 8000, "targetPort": 8000},
            "analysis": {
                "interval": _fmt_duration(interval_s),
                "threshold": threshold,
                "maxWeight": 50,
                "stepWeight": 10,
                "metrics": [{"name": "gpuobs-canary-ok", "interval": _fmt_duration(interval_s),
                             "thresholdRange": {"min": 1},
                             "templateRef": {"name": "gpuobs-canary-ok", "namespace": "serving"}}],
                "webhooks": [
                    {"name": "gpuobs-rollback", "type": "rollback", "url": f"{hook_url}/rollback",
                     "timeout": f"{CONTROLLER_TIMEOUT_S}s", "metadata": meta},
                    {"name": "gpuobs-analysis", "type": "rollout", "url": f"{hook_url}/rollout",
                     "timeout": f"{CONTROLLER_TIMEOUT_S}s", "metadata": meta},
                    {"name": "gpuobs-traffic-gate", "type": "confirm-traffic-increase",
                     "url": f"{hook_url}/confirm-traffic-increase", "timeout": f"{CONTROLLER_TIMEOUT_S}s",
                     "metadata": meta},
                    {"name": "gpuobs-promotion-gate", "type": "confirm-promotion",
                     "url": f"{hook_url}/confirm-promotion", "timeout": f"{CONTROLLER_TIMEOUT_S}s",
                     "metadata": meta},
                ],
            },
        },
    }
    return [mt, canary]


# ---- files ------------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Safe dumper that writes shared objects out in full (no ``&id001`` anchors in manifests)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(*docs: dict[str, Any], note: str = "") -> str:
    """The documents as one YAML file under :data:`HEADER`; ``note``: comment lines placed after it."""
    return HEADER + note + "".join("---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120) for d in docs)


# ---- remediation ------------------------------------------------------------------------------------
REMEDIATION_NS = "gpuobs-remediation"
REMEDIATION_NAME = "gpuobs-remediation"
#: (apiGroup, resource, verbs): what KubeActions calls, cluster-wide; tests/remediate checks it against
#: the requests the adapter makes to the API-server emulation.
REMEDIATION_CLUSTER_RULES = [("", "nodes", ["get", "list", "update"]), ("", "nodes/status", ["patch"]),
                             ("", "pods", ["list"]), ("", "pods/eviction", ["create"])]
#: The same in the controller's namespace: its reset / diagnostic / reboot-sentinel Jobs.
REMEDIATION_NS_RULES = [("batch", "jobs", ["create", "get", "delete"])]


def _rules(rules: list[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
    return [{"apiGroups": [g], "resources": [r], "verbs": list(v)} for g, r, v in rules]


def remediation_rbac() -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, ClusterRole + binding, Role + binding of the remediation controller."""
    ns = {"apiVersion": "v1", "kind": "Namespace",
          "metadata": {"name": REMEDIATION_NS, "labels": {
              "app.kubernetes.io/name": REMEDIATION_NS, **PART_OF,
              # the GPU reset (nvidia-smi -r) and dcgmi diag Jobs run privileged on the node
              "pod-security.kubernetes.io/enforce": "privileged"}}}
    meta = _meta(REMEDIATION_NAME, REMEDIATION_NS)
    subject = [{"kind": "ServiceAccount", "name": REMEDIATION_NAME, "namespace": REMEDIATION_NS}]
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    crole = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": _meta(REMEDIATION_NAME, None), "rules": _rules(REMEDIATION_CLUSTER_RULES)}
    cbind = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": _meta(REMEDIATION_NAME, None),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": REMEDIATION_NAME},
             "subjects": subject}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
            "rules": _rules(REMEDIATION_NS_RULES)}
    bind = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": REMEDIATION_NAME},
            "subjects": subject}
    return [ns, sa, crole, cbind, role, bind]


#: The controller's in-cluster address (Alertmanager's webhook: ``/hook/remediate``), its database's
#: directory (the PVC) and where its bearer token and fleet settings are mounted.
REMEDIATION_PORT = 9098
REMEDIATION_URL = f"http://{REMEDIATION_NAME}.{REMEDIATION_NS}.svc:{REMEDIATION_PORT}"
REMEDIATION_STATE_DIR = "/var/lib/gpuobs-remediation"
REMEDIATION_DB = f"{REMEDIATION_STATE_DIR}/remediate.sqlite"
REMEDIATION_TOKEN_SECRET = "gpuobs-remediate-token"
REMEDIATION_TOKEN_FILE = f"/etc/{REMEDIATION_TOKEN_SECRET}/token"
#: Where Alertmanager reads the same token: the Secret listed in the Alertmanager resource's
#: ``spec.secrets`` (created in ``monitoring`` too), as for the pager's.
REMEDIATION_AM_TOKEN_FILE = f"/etc/alertmanager/secrets/{REMEDIATION_TOKEN_SECRET}/token"
#: kube-prometheus's Services in ``monitoring`` (the canary base's Prometheus; Alertmanager ``main``).
PROMETHEUS_URL = "http://prometheus-k8s.monitoring.svc:9090"
ALERTMANAGER_URL = "http://alertmanager-main.monitoring.svc:9093"
#: kube-prometheus's Prometheus ServiceAccount (it discovers pods only in namespaces where a Role lets it).
PROMETHEUS_SA = "prometheus-k8s"


#: The comment atop remediation/controller.yaml: what to do before and after applying it.
REMEDIATION_NOTE = f"""\
#
# Before applying: create the webhook's bearer token (not generated: no token in the repository), the
# same token Alertmanager's gpuobs-remediate receiver sends, in this namespace and in `monitoring`
# (list it in the Alertmanager resource's spec.secrets, as for the pager's token):
#   TOKEN=$(openssl rand -hex 32)
#   kubectl -n {REMEDIATION_NS} create secret generic {REMEDIATION_TOKEN_SECRET} --from-literal=token=$TOKEN
#   kubectl -n {NAMESPACE} create secret generic {REMEDIATION_TOKEN_SECRET} --from-literal=token=$TOKEN
# The controller starts in --mode dry-run: it records what it would do on its timeline and changes no
# node. Switch to --mode enforce after reviewing the dry-run timeline (`kubectl -n {REMEDIATION_NS}
# exec deploy/{REMEDIATION_NAME} -- gpuobs remediate status`; docs/remediation.md).
"""


def remediation_controller(fleet: FleetConfig) -> list[dict[str, Any]]:
    """PVC, fleet ConfigMap, Deployment, Service and NetworkPolicy of ``gpuobs remediate serve
    --adapter kubernetes`` (dry-run), as :func:`canary_serve` does for the verdict server."""
    name = REMEDIATION_NAME
    labels = {"app.kubernetes.io/name": name}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(f"{name}-state", REMEDIATION_NS),
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    # what the controller needs of the fleet config: the node label its ALERTS queries and webhooks use,
    # and where its notices' runbook links point (rendered here, so a non-default fleet config reaches it)
    fleet_cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{name}-fleet", REMEDIATION_NS),
                "data": {"fleet.yaml": yaml.safe_dump({"identity_label": fleet.identity_label,
                                                       "runbook_base": fleet.runbook_base}, sort_keys=False)}}
    deploy = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, REMEDIATION_NS),
        "spec": {
            "replicas": 1,  # one writer of the SQLite store; a restart resumes every episode from it (PVC)
            "strategy": {"type": "Recreate"},  # never two controllers on one database, not even for a rollout
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**labels, **PART_OF}},
                "spec": {
                    "serviceAccountName": name,
                    # the Kubernetes adapter calls the API server as this ServiceAccount (rbac.yaml)
                    "automountServiceAccountToken": True,
                    "securityContext": {"runAsNonRoot": True, "fsGroup": 65534,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "controller", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["gpuobs"],
                        # --mode dry-run: the controller decides and records every step on its timeline
                        # (`gpuobs remediate status`, /api/status) but changes no node. Switch to
                        # `--mode enforce` after reviewing the dry-run timeline (docs/remediation.md).
                        # --interval 5: every tick lists the GPU nodes and the pods from the API server.
                        "args": ["remediate", "serve", "--adapter", "kubernetes", "--mode", "dry-run",
                                 "--host", "0.0.0.0", "--port", str(REMEDIATION_PORT),
                                 "--db", REMEDIATION_DB, "--run-dir", REMEDIATION_STATE_DIR,
                                 "--token-file", REMEDIATION_TOKEN_FILE,
                                 "--fleet", "/etc/gpuobs-remediation/fleet.yaml",
                                 "--prometheus", PROMETHEUS_URL, "--alertmanager", ALERTMANAGER_URL,
                                 "--namespace", REMEDIATION_NS, "--interval", "5"],
                        # `kubectl exec` into the pod: `gpuobs remediate status|hold|release` find the
                        # database under GPUOBS_RUN_DIR without --db
                        "env": [{"name": "GPUOBS_RUN_DIR", "value": REMEDIATION_STATE_DIR},
                                {"name": "GPUOBS_LOG_FORMAT", "value": "json"}],
                        "ports": [{"name": "http", "containerPort": REMEDIATION_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
                        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 20,
                                          "failureThreshold": 3},
                        # the node and pod lists of each tick dominate memory: raise the limit on large clusters
                        "resources": {"requests": {"cpu": "50m", "memory": "192Mi"},
                                      "limits": {"cpu": "1", "memory": "1Gi"}},
                        "securityContext": _restricted(),
                        "volumeMounts": [{"name": "state", "mountPath": REMEDIATION_STATE_DIR},
                                         {"name": "token", "mountPath": f"/etc/{REMEDIATION_TOKEN_SECRET}",
                                          "readOnly": True},
                                         {"name": "fleet", "mountPath": "/etc/gpuobs-remediation", "readOnly": True},
                                         {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": f"{name}-state"}},
                                # not generated (no token in the repository): see REMEDIATION_NOTE
                                {"name": "token", "secret": {"secretName": REMEDIATION_TOKEN_SECRET,
                                                             "defaultMode": 0o440}},
                                {"name": "fleet", "configMap": {"name": f"{name}-fleet"}},
                                {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                },
            },
        },
    }
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, REMEDIATION_NS),
           "spec": {"selector": labels, "ports": [{"name": "http", "port": REMEDIATION_PORT, "targetPort": "http",
                                                   "protocol": "TCP"}]}}

    def in_monitoring(app: str) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": app}}}
    dns = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                   "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
           "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    netpol = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(name, REMEDIATION_NS),
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress", "Egress"],
            # in: Alertmanager's webhook (/hook/remediate) and Prometheus's scrape (/metrics), both in
            # `monitoring`; add a `from` for a pager whose console reads /api/status (--remediate-url)
            "ingress": [{"from": [in_monitoring("alertmanager"), in_monitoring("prometheus")],
                         "ports": [{"protocol": "TCP", "port": REMEDIATION_PORT}]}],
            # out: Prometheus (ALERTS), Alertmanager (notices), the API server, DNS. The API server is no
            # pod a selector can name and its address is the cluster's: any destination on its ports
            # (narrow it with an ipBlock of `kubectl get endpoints kubernetes`).
            "egress": [
                {"to": [in_monitoring("prometheus")], "ports": [{"protocol": "TCP", "port": 9090}]},
                {"to": [in_monitoring("alertmanager")], "ports": [{"protocol": "TCP", "port": 9093}]},
                {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]},
                dns],
        },
    }
    return [pvc, fleet_cm, deploy, svc, netpol]


def remediation_monitoring() -> list[dict[str, Any]]:
    """The PodMonitor that has kube-prometheus scrape the controller's ``/metrics`` (``job``
    ``gpuobs-remediation``), and the Role letting kube-prometheus's Prometheus (whose own Roles cover
    only ``default``, ``kube-system`` and ``monitoring``) discover the pod in the controller's namespace."""
    name = REMEDIATION_NAME
    # No node-identity relabelling (unlike the monitoring base's): the controller's series carry the GPU
    # node they are about in `node`, which a target label of the controller's own node would displace.
    ep = {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s",
          "relabelings": [{"targetLabel": "job", "replacement": name, "action": "replace"}]}
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _meta(name, REMEDIATION_NS),
               "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                        "namespaceSelector": {"matchNames": [REMEDIATION_NS]},
                        "podMetricsEndpoints": [ep]}}
    meta = _meta(f"{name}-prometheus", REMEDIATION_NS)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}
    bind = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-prometheus"},
            "subjects": [{"kind": "ServiceAccount", "name": PROMETHEUS_SA, "namespace": NAMESPACE}]}
    return [monitor, role, bind]


# ---- HA topology -------------------------------------------------------------------------------------
#: Name of the HA base's Prometheus, Alertmanager, VMSingle and VMAlert (the operators prefix their
#: workloads: prometheus-gpuobs-ha-<j> for shard 0 and prometheus-gpuobs-ha-shard-<i>-<j> for the others,
#: alertmanager-gpuobs-ha-<i>, vmsingle-gpuobs-ha, vmalert-gpuobs-ha).
HA_NAME = "gpuobs-ha"
HA_SHARDS, HA_REPLICAS, HA_ALERTMANAGERS = 2, 2, 3
#: External label carrying the replica (the pod name); dropped before remote write and, by the
#: operator itself, from alerts. Named as the native topology's (gpuobs.stack.ha.TOPOLOGY_LABELS).
HA_REPLICA_LABEL = "replica"
#: Which evaluator a rule object is for: ``shard`` (PrometheusRule, the shards' ruleSelector) or
#: ``fleet`` (VMRule, vmalert's ruleSelector).
PLACEMENT_LABEL = "gpuobs.io/placement"
#: Alert timing of the shards and vmalert: gpuobs.stack.alert_timing.derive at a 15 s evaluation
#: interval (a 5-minute Prometheus or vmalert outage never resolves a firing alert): resend delay
#: r = ceil((300 + 15 + 45) / 2 / 30) x 30 s = 180 s, ``for`` grace period = the evaluation interval.
#: The mixin sits below the stack in the layers; tests/mixin/test_kubernetes.py checks these against
#: the derivation.
HA_RESEND_DELAY_S = 180
HA_FOR_GRACE_S = SCRAPE_INTERVAL_S
HA_PROMETHEUS_SA = f"{HA_NAME}-prometheus"
HA_AM_SERVICE = f"{HA_NAME}-alertmanager"
HA_AM_CONFIG_SECRET = f"{HA_NAME}-alertmanager-config"
#: The prometheus-operator's Alertmanager web port and the headless Service of every Alertmanager
#: StatefulSet it runs (v0.93.0 pkg/alertmanager/statefulset.go: alertmanagerWebPort,
#: defaultOperatedServiceName), through which each member has a DNS name.
AM_WEB_PORT = 9093
AM_OPERATED_SERVICE = "alertmanager-operated"
#: VictoriaMetrics operator v0.74.1 api/operator/v1beta1/vmsingle_types.go (PrefixedName, AsURL):
#: Service vmsingle-<name>, port 8428 (http); vmalert_types.go: vmalert-<name>, port 8080.
VM_URL = f"http://vmsingle-{HA_NAME}.{NAMESPACE}.svc:8428"
#: The kustomize secretGenerator's source file (key alertmanager.yaml in the Secret, as the operator
#: reads it) of the HA Alertmanager's configuration.
HA_AM_CONFIG_FILE = "alertmanager-config.yaml"


def ha_alertmanager_urls() -> list[str]:
    """Every HA Alertmanager member's URL (pod DNS through the operator's headless Service), in the
    order of the StatefulSet's ordinals: vmalert notifies each one, as the native topology does."""
    return [f"http://alertmanager-{HA_NAME}-{i}.{AM_OPERATED_SERVICE}.{NAMESPACE}.svc:{AM_WEB_PORT}"
            for i in range(HA_ALERTMANAGERS)]


def ha_prometheus() -> list[dict[str, Any]]:
    """The sharded, replicated Prometheus (prometheus-operator ``monitoring.coreos.com/v1``
    ``Prometheus``, fields as in v0.93.0 example/prometheus-operator-crd/monitoring.coreos.com_prometheuses.yaml)
    and its identity: ServiceAccount, ClusterRole (discover pods, Services, Endpoints and
    EndpointSlices in every namespace: the dcgm-exporter and vLLM PodMonitors select any namespace)
    and ClusterRoleBinding.

    * ``shards: 2`` x ``replicas: 2`` (pods ``prometheus-gpuobs-ha-shard-<s>-<r>``); each node lands
      whole on one shard through the PodMonitors' :func:`shard_key` (in ``monitoring/podmonitors.yaml``).
    * ``replicaExternalLabelName: replica`` (value: the pod name), ``prometheusExternalLabelName: ""``
      (no ``prometheus`` label: the series in VictoriaMetrics carry exactly the labels the rules and
      dashboards expect). The operator drops the replica label from the alerts it sends
      (v0.93.0 pkg/prometheus/promcfg.go ``appendAlertingConfig``: ``labeldrop`` of it), so both
      replicas' copies of an alert have one fingerprint; ``remoteWrite[0].writeRelabelConfigs`` drops it
      before VictoriaMetrics, so the two replicas write identical series that ``-dedup.minScrapeInterval``
      collapses (docs/ha.md, "Dedup settings").
    * Rules: the PrometheusRules labelled ``gpuobs.io/placement: shard`` (the node-local rules);
      alerts to every member of the HA Alertmanager through the Endpoints of :data:`HA_AM_SERVICE`.
    * ``rules.alert``: :data:`HA_RESEND_DELAY_S`, :data:`HA_FOR_GRACE_S`. Local retention 1 day: the
      global view and the long windows (SLO rules, in vmalert) are VictoriaMetrics's."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(HA_PROMETHEUS_SA)}
    crole = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": _meta(HA_PROMETHEUS_SA, None),
             "rules": [{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                        "verbs": ["get", "list", "watch"]},
                       {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                        "verbs": ["get", "list", "watch"]}]}
    cbind = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": _meta(HA_PROMETHEUS_SA, None),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": HA_PROMETHEUS_SA},
             "subjects": [{"kind": "ServiceAccount", "name": HA_PROMETHEUS_SA, "namespace": NAMESPACE}]}
    interval = _fmt_duration(SCRAPE_INTERVAL_S)
    prom = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus", "metadata": _meta(HA_NAME),
        "spec": {
            "shards": HA_SHARDS, "replicas": HA_REPLICAS,
            "serviceAccountName": HA_PROMETHEUS_SA,
            "scrapeInterval": interval, "evaluationInterval": interval,
            "replicaExternalLabelName": HA_REPLICA_LABEL, "prometheusExternalLabelName": "",
            # every gpuobs PodMonitor, in any namespace (monitoring/, remediation/)
            "podMonitorSelector": {"matchLabels": dict(PART_OF)}, "podMonitorNamespaceSelector": {},
            # only the HA base's own ServiceMonitor (VictoriaMetrics and vmalert, job ha-global), in monitoring
            "serviceMonitorSelector": {"matchLabels": {"app.kubernetes.io/name": f"{HA_NAME}-global"}},
            "ruleSelector": {"matchLabels": {PLACEMENT_LABEL: "shard"}},
            "rules": {"alert": {"resendDelay": _fmt_duration(HA_RESEND_DELAY_S),
                                "forGracePeriod": _fmt_duration(HA_FOR_GRACE_S)}},
            "alerting": {"alertmanagers": [{"namespace": NAMESPACE, "name": HA_AM_SERVICE, "port": "web",
                                            "apiVersion": "v2"}]},
            "remoteWrite": [{"url": f"{VM_URL}/api/v1/write",
                             "writeRelabelConfigs": [{"action": "labeldrop", "regex": HA_REPLICA_LABEL}],
                             "queueConfig": {"batchSendDeadline": _fmt_duration(REMOTE_WRITE_DEADLINE_S)}}],
            "retention": "1d",
            "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
        },
    }
    return [sa, crole, cbind, prom]


def ha_alertmanager() -> list[dict[str, Any]]:
    """The Alertmanager cluster (prometheus-operator ``Alertmanager``, v0.93.0 CRD): 3 replicas, which
    the operator joins into one gossip cluster (every pod gets ``--cluster.peer`` for every member,
    v0.93.0 pkg/alertmanager/statefulset.go), so the copies of one alert from two replicas x three
    members make one notification (docs/ha.md). Its configuration is the Secret
    :data:`HA_AM_CONFIG_SECRET` (``spec.configSecret``: "the name of a Kubernetes Secret ... which
    contains the configuration for this Alertmanager instance ... under the ``alertmanager.yaml``
    key", v0.93.0 pkg/apis/monitoring/v1/alertmanager_types.go), a plain Alertmanager config: the
    operator copies it verbatim, unlike an AlertmanagerConfig resource, which it rewrites (every
    route scoped to the resource's namespace) and which has no ``credentials_file``. The webhook
    tokens are files of the Secrets listed in ``spec.secrets`` (mounted under
    /etc/alertmanager/secrets/<name>/; not generated, see the alertmanager base). Plus the Service
    whose Endpoints (each member, not a load balancer) Prometheus sends alerts to: Alertmanager docs,
    "It's important not to load balance traffic between Prometheus and its Alertmanagers"."""
    am = {"apiVersion": "monitoring.coreos.com/v1", "kind": "Alertmanager", "metadata": _meta(HA_NAME),
          "spec": {"replicas": HA_ALERTMANAGERS, "configSecret": HA_AM_CONFIG_SECRET,
                   "secrets": [PAGER_TOKEN_SECRET, REMEDIATION_TOKEN_SECRET],
                   "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                                 "limits": {"cpu": "500m", "memory": "512Mi"}}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(HA_AM_SERVICE),
           "spec": {"clusterIP": "None",
                    # the operator's pod labels (v0.93.0 pkg/alertmanager/operator.go makeSelectorLabels)
                    "selector": {"app.kubernetes.io/name": "alertmanager", "alertmanager": HA_NAME},
                    "ports": [{"name": "web", "port": AM_WEB_PORT, "targetPort": "web", "protocol": "TCP"}]}}
    return [svc, am]


def ha_victoriametrics(slo_period_s: int) -> list[dict[str, Any]]:
    """VictoriaMetrics operator (``operator.victoriametrics.com/v1beta1``, v0.74.1) objects:

    * ``VMSingle``: the global store every shard replica remote-writes to, with
      ``-dedup.minScrapeInterval`` = the scrape interval (VictoriaMetrics docs, "Deduplication": "If
      duplicate data is pushed to VictoriaMetrics from identically configured vmagent instances or
      Prometheus instances, then the -dedup.minScrapeInterval must be set to scrape_interval from scrape
      configs"), ``-search.latencyOffset`` = :func:`gpuobs.mixin.placement.vm_latency_offset_s`, retention the
      SLO period (``slo_period_s``, seconds) plus a week: the error-budget rules read a whole period.
    * ``VMAlert``: the fleet-wide rules (the VMRules labelled ``gpuobs.io/placement: fleet``; with
      ``ruleNamespaceSelector`` unset the operator selects VMRules in VMAlert's namespace only,
      vmalert_types.go ``RuleSelector``) against VMSingle, recording results and ``ALERTS`` written
      back and ``for`` state restored from it, every Alertmanager member notified, and
      ``-rule.resendDelay`` = the shards' resend delay with ``-rule.maxResolveDuration=0``
      (gpuobs.stack.alert_timing: the same validity, 4 x resend delay, as the shards' alerts).

    The VictoriaMetrics operator also converts PrometheusRules into VMRules by default, keeping their
    labels: the shards' PrometheusRules (``placement: shard``) are then not selected by this VMAlert."""
    interval = _fmt_duration(SCRAPE_INTERVAL_S)
    retention_days = math.ceil(slo_period_s / 86400) + 7
    single = {"apiVersion": "operator.victoriametrics.com/v1beta1", "kind": "VMSingle", "metadata": _meta(HA_NAME),
              "spec": {"retentionPeriod": f"{retention_days}d",
                       "extraArgs": {"dedup.minScrapeInterval": interval,
                                     "search.latencyOffset": _fmt_duration(vm_latency_offset_s(SCRAPE_INTERVAL_S))},
                       "storage": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Gi"}}},
                       "resources": {"requests": {"cpu": "500m", "memory": "2Gi"},
                                     "limits": {"cpu": "4", "memory": "8Gi"}}}}
    vmalert = {"apiVersion": "operator.victoriametrics.com/v1beta1", "kind": "VMAlert", "metadata": _meta(HA_NAME),
               "spec": {"replicaCount": 1, "evaluationInterval": interval,
                        "datasource": {"url": VM_URL}, "remoteWrite": {"url": VM_URL}, "remoteRead": {"url": VM_URL},
                        "notifiers": [{"url": u} for u in ha_alertmanager_urls()],
                        "ruleSelector": {"matchLabels": {PLACEMENT_LABEL: "fleet"}},
                        "extraArgs": {"rule.resendDelay": _fmt_duration(HA_RESEND_DELAY_S),
                                      "rule.maxResolveDuration": "0",
                                      # a rule reads the data of its own evaluation time (gpuobs.stack.ha.vmalert_argv)
                                      "datasource.queryTimeAlignment": "false"},
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                      "limits": {"cpu": "1", "memory": "1Gi"}}}}
    return [single, vmalert]


def ha_global_monitor() -> dict[str, Any]:
    """The ServiceMonitor through which every shard replica scrapes VictoriaMetrics and vmalert as job
    ``ha-global`` (:data:`gpuobs.mixin.placement.GLOBAL_JOB`), for ``FleetRulesBlind``: unsharded
    (``__tmp_disable_sharding``: prometheus-operator v0.93.0 Documentation/platform/sharding.md,
    "Scraping a target from all the shards"), since each shard must notice for itself that the global
    view is gone. It selects the operator's Services by their labels (VictoriaMetrics operator v0.74.1
    ``SelectorLabels``: app.kubernetes.io/name vmsingle|vmalert, app.kubernetes.io/instance, managed-by)."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": _meta(f"{HA_NAME}-global"),
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/instance": HA_NAME, "managed-by": "vm-operator"},
                                  "matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                                        "values": ["vmsingle", "vmalert"]}]},
                     "endpoints": [{"port": "http", "path": "/metrics", "interval": _fmt_duration(SCRAPE_INTERVAL_S),
                                    "relabelings": [
                                        {"targetLabel": "job", "replacement": GLOBAL_JOB, "action": "replace"},
                                        {"targetLabel": SHARD_DISABLE_LABEL, "replacement": "true",
                                         "action": "replace"}]}]}}


def ha_rules(rule_files: dict[str, str], fleet: FleetConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rules split as the native HA topology splits them (``rule_files``: file name -> YAML text as
    rendered for ``fleet``): :func:`gpuobs.mixin.placement.place` by ``fleet.identity_label``, the
    node-local rules plus ``FleetRulesBlind`` (:func:`gpuobs.mixin.placement.blind_rule`, with
    ``fleet.runbook_base``) as PrometheusRules for the shards, the fleet-wide rules (their counter
    functions rewritten for MetricsQL by the placement) as VMRules for vmalert; every alerting rule
    with the routing label. Returns (PrometheusRules, VMRules), one object per rule file and side."""
    placed = place(rule_files, fleet.identity_label)
    shard = {**placed.shard, "ha-topology.yml": blind_rule(fleet.runbook_base)}
    prom = [{"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
             "metadata": _meta(f"{HA_NAME}-{Path(name).stem}", **{PLACEMENT_LABEL: "shard"}),
             "spec": {"groups": _routed_groups(text)}} for name, text in sorted(shard.items())]
    vm = [{"apiVersion": "operator.victoriametrics.com/v1beta1", "kind": "VMRule",
           "metadata": _meta(f"{HA_NAME}-{Path(name).stem}", **{PLACEMENT_LABEL: "fleet"}),
           "spec": {"groups": _routed_groups(fresh_queries(text))}} for name, text in sorted(placed.fleet.items())]
    return prom, vm


#: The comment atop ha/kustomization.yaml: what the overlay is and how to apply it.
HA_NOTE = f"""\
#
# The HA topology (docs/ha.md): the monitoring base plus {HA_SHARDS} Prometheus shards x {HA_REPLICAS} replicas,
# a {HA_ALERTMANAGERS}-member Alertmanager cluster, VictoriaMetrics (VMSingle) and vmalert (VMAlert).
# Needs the prometheus-operator and VictoriaMetrics operator CRDs and controllers, and the webhook
# token Secrets {PAGER_TOKEN_SECRET} and {REMEDIATION_TOKEN_SECRET} in `{NAMESPACE}` (see remediation/controller.yaml).
#   kubectl apply --server-side -k deploy/kubernetes/ha   (instead of monitoring/; server-side: the dashboards' size)
# The monitoring base's PrometheusRules (every rule, for one unsharded Prometheus) are deleted here:
# the shards get the node-local rules, vmalert the fleet-wide ones.
"""


class _BlockDumper(_Dumper):
    """:class:`_Dumper` writing multi-line strings as literal blocks (``|``): the inline patches."""


_BlockDumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                                  style="|" if "\n" in s else None))


def ha_kustomization(base_rules: list[dict[str, Any]]) -> str:
    """ha/kustomization.yaml: the monitoring base plus the HA objects, the Alertmanager config Secret
    generated from :data:`HA_AM_CONFIG_FILE` (no name hash: ``spec.configSecret`` is no field kustomize
    rewrites), and one inline delete patch (strategic merge ``$patch: delete``) for each of the
    monitoring base's PrometheusRules (``base_rules``), which hold every rule for one unsharded
    Prometheus; the HA base ships them split instead (:func:`ha_rules`). One patch per object: kustomize
    v5.5.0 (kubectl 1.32) panics on a patch file holding several delete documents."""
    def delete(r: dict[str, Any]) -> dict[str, Any]:
        meta = {"name": r["metadata"]["name"], "namespace": r["metadata"]["namespace"]}
        body = {"$patch": "delete", "apiVersion": r["apiVersion"], "kind": r["kind"], "metadata": meta}
        return {"target": {"kind": r["kind"], "name": meta["name"]}, "patch": yaml.safe_dump(body, sort_keys=False)}
    doc: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../monitoring", *HA_RESOURCES],
        "secretGenerator": [{"name": HA_AM_CONFIG_SECRET, "namespace": NAMESPACE,
                             "files": [f"alertmanager.yaml={HA_AM_CONFIG_FILE}"],
                             "options": {"disableNameSuffixHash": True, "labels": dict(PART_OF)}}],
        "patches": [delete(r) for r in base_rules],
    }
    return HEADER + HA_NOTE + yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, width=120)


#: The HA base's own object files (ha/kustomization.yaml's resources after ../monitoring).
HA_RESOURCES = ["prometheus.yaml", "alertmanager.yaml", "victoriametrics.yaml", "rules-shard.yaml", "rules-fleet.yaml"]


def _kustomization(resources: list[str], namespace: str | None = None) -> str:
    doc: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace:
        doc["namespace"] = namespace
    doc["resources"] = resources
    return HEADER + yaml.safe_dump(doc, sort_keys=False)


def render(horizon_s: float, interval_s: float, fleet: FleetConfig) -> dict[str, str]:
    """Every file of ``deploy/kubernetes`` (relative path -> text) for the canary config's horizon and
    interval, seconds (the CLI passes the packaged config's; mixin sits below canary in the layers), and
    the fleet config ``fleet``: the PodMonitors' identity label and shard key, the PrometheusRules,
    dashboards and Alertmanager fragment rendered from it (:func:`gpuobs.mixin.render.render_all`), the
    HA base's rule split by its identity label. Raises FleetConfigError / SloConfigError for a bad
    config, PlacementError for a rule that does not parse."""
    generated = render_all(fleet)

    def under(prefix: str) -> dict[str, str]:
        return {Path(rel).name: text for rel, text in generated.items() if rel.startswith(prefix)}
    files = {
        "monitoring/exporter-daemonset.yaml": _dump(exporter_daemonset()),
        "monitoring/podmonitors.yaml": _dump(*pod_monitors(fleet.identity_label)),
        "monitoring/prometheusrules.yaml": _dump(*prometheus_rules(under("prometheus/rules/"))),
        "monitoring/dashboards.yaml": _dump(*dashboard_configmaps(under("grafana/dashboards/"))),
        "canary/serve.yaml": _dump(*canary_serve()),
        "argo/analysistemplate.yaml": _dump(analysis_template(horizon_s, interval_s)),
        "flagger/canary.yaml": _dump(*flagger_objects(horizon_s, interval_s)),
        "remediation/rbac.yaml": _dump(*remediation_rbac()),
        "remediation/controller.yaml": _dump(*remediation_controller(fleet), note=REMEDIATION_NOTE),
        "remediation/podmonitor.yaml": _dump(*remediation_monitoring()),
        "alertmanager/gpuobs-fragment.yaml": HEADER + yaml.safe_dump(
            alertmanager_fragment(generated["alertmanager/alertmanager.yml"]), sort_keys=False),
    }
    shard_rules, fleet_rules = ha_rules(under("prometheus/rules/"), fleet)
    slo_period_s = parse_period(load_slo_config(assets.path("prometheus/slo.yaml"))["period"])
    files.update({
        "ha/prometheus.yaml": _dump(*ha_prometheus(), ha_global_monitor()),
        "ha/alertmanager.yaml": _dump(*ha_alertmanager()),
        # the Alertmanager fragment is a whole config: its root route catches what is not gpuobs's
        "ha/" + HA_AM_CONFIG_FILE: files["alertmanager/gpuobs-fragment.yaml"],
        "ha/victoriametrics.yaml": _dump(*ha_victoriametrics(slo_period_s)),
        "ha/rules-shard.yaml": _dump(*shard_rules),
        "ha/rules-fleet.yaml": _dump(*fleet_rules),
        "ha/kustomization.yaml": ha_kustomization(prometheus_rules(under("prometheus/rules/"))),
    })
    files["monitoring/kustomization.yaml"] = _kustomization(
        ["exporter-daemonset.yaml", "podmonitors.yaml", "prometheusrules.yaml", "dashboards.yaml"])
    files["canary/kustomization.yaml"] = _kustomization(["serve.yaml"])
    files["argo/kustomization.yaml"] = _kustomization(["analysistemplate.yaml"])
    files["flagger/kustomization.yaml"] = _kustomization(["canary.yaml"])
    files["remediation/kustomization.yaml"] = _kustomization(["rbac.yaml", "controller.yaml", "podmonitor.yaml"])
    return dict(sorted(files.items()))


def load_docs(text: str) -> list[dict[str, Any]]:
    """The YAML documents of a generated file (empty documents dropped)."""
    return [d for d in yaml.safe_load_all(text) if d]


def write(horizon_s: float, interval_s: float, fleet: FleetConfig, out: Path | None = None,
          check: bool = False) -> tuple[list[Path], list[str]]:
    """Write every file of :func:`render` for ``fleet`` under ``out`` (default ``deploy/kubernetes`` of the
    checkout or asset root), or with ``check`` write nothing and list the stale or missing ones. Returns
    (written, stale)."""
    out = out or assets.root() / "deploy" / "kubernetes"
    files = render(horizon_s, interval_s, fleet)
    if check:
        return [], stale_files(out, files)
    return write_tree(out, files), []


