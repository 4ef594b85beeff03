"""Kubernetes :class:`~gpuobs.remediate.interfaces.NodeActions` over the official ``kubernetes`` client
(``pip install 'gpuobs[k8s]'``; imported lazily, so the rest of gpuobs runs without it).

What each method does to the cluster (RBAC: ``deploy/kubernetes/remediation``):

* **Mark.** The controller's cordon is ``spec.unschedulable: true`` (kubectl's cordon) plus the taint
  ``gpuobs.io/remediation=quarantined:NoSchedule`` and the annotation ``gpuobs.io/remediation`` (JSON:
  ``reason``, ``since``, ``episode``, ``was_unschedulable``), written in one read-modify-write PUT of the Node that
  carries ``metadata.resourceVersion``; a 409 Conflict re-reads and re-applies (client-go
  ``retry.RetryOnConflict``, up to ``conflict_retries`` times). The node condition ``GpuobsRemediation``
  (True/False) goes through the ``status`` subresource (strategic merge patch, merged by ``type``).
  ``cordoned_by`` is ``gpuobs`` with the taint or annotation, ``human`` when unschedulable without them.
  :meth:`uncordon` removes only the controller's taint and annotation and clears ``unschedulable`` only
  when the controller's mark was there and the node was not already unschedulable when it was set: a
  human's cordon is never undone.
* **Drain.** Evictable pods are those ``kubectl drain --ignore-daemonsets --delete-emptydir-data
  --force`` would evict: every pod on the node except DaemonSet-owned and mirror pods, not finished
  (Succeeded/Failed pods hold no GPU). :meth:`drain` POSTs a policy/v1 Eviction for each pod not already
  terminating; 404 (gone) is done, 429 (a PodDisruptionBudget allows no disruption now) leaves the pod
  for the next :meth:`drain` call (kubectl retries after 5 s; the controller calls drain again until
  ``in_flight`` is 0 or its deadline). ``in_flight`` counts the evictable pods still on the node.
* **Jobs.** ``reset-gpu`` and the health check run as batch/v1 Jobs in ``namespace``, pinned to the node
  by node affinity on ``metadata.name`` and tolerating the controller's taint and
  ``node.kubernetes.io/unschedulable``; privileged, ``backoffLimit: 0``, ``ttlSecondsAfterFinished``.
  Names are deterministic: ``gpuobs-<kind>-<node>-<gpu>-<hash>`` with the hash over node, GPU and the
  remediation episode (the mark's ``episode``, a random token set with the mark), so a second create is 409 AlreadyExists, read as "already
  started" (``act`` is idempotent within one episode and a new episode gets a new Job).
* **Health check.** :meth:`health_check` creates the ``dcgmi diag -r 2`` Job if it does not exist and
  reads it. While it (or the same episode's reset Job of that GPU) runs, it raises :class:`ActionError`
  ``health check still running ...``: running is no verdict, and ActionError is never one, so the
  controller waits and polls. A finished Job gives the :class:`HealthResult` (failed: the Job's
  ``Failed`` condition reason and message) and is deleted, so the next check runs afresh.
* **Reboot** is refused by default: Kubernetes has no reboot API; reboots need a node-reboot provider.
  With ``reboot_sentinel=True`` the action creates a Job that writes ``/var/run/reboot-required`` on the
  host, the sentinel Kured watches by default; Kured then takes its cluster lock, drains, reboots and
  (as the node was cordoned before) leaves it cordoned; the controller sees the new ``boot_id``.
* **restart-engine** evicts the node's pods that match ``serving_selector`` (their Deployment or
  Rollout recreates them); a PDB that allows no disruption leaves them and the action fails.

Every method raises only :class:`ActionError`, one line with the operation, the node and the HTTP
status (or that the API server could not be reached).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

from gpuobs.remediate.interfaces import ACTIONS, ActionError, HealthResult, NodeView

MARK = "gpuobs.io/remediation"
TAINT = {"key": MARK, "value": "quarantined", "effect": "NoSchedule"}
CONDITION = "GpuobsRemediation"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuobs-remediation"}
FINISHED = ("Succeeded", "Failed")


def _client() -> Any:
    try:
        import kubernetes.client as k8s
    except ImportError:
        raise ActionError("the Kubernetes adapter needs the kubernetes client: pip install 'gpuobs[k8s]'") from None
    return k8s


class ApiRefusal(ActionError):
    """The API server answered with an HTTP error; ``status`` and ``reason`` (e.g. 409 AlreadyExists)."""

    def __init__(self, message: str, status: int, reason: str):
        super().__init__(message)
        self.status, self.reason = status, reason


def _one_line(text: object, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _mark(node: dict) -> dict | None:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(MARK)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    return doc if isinstance(doc, dict) else {"reason": raw}


def _has_taint(node: dict) -> bool:
    return any(t.get("key") == MARK and t.get("effect") == "NoSchedule" for t in (node.get("spec") or {}).get("taints") or [])


def _evictable(pod: dict) -> bool:
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return False
    if any(o.get("controller") and o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    return (pod.get("status") or {}).get("phase") not in FINISHED


def _job_state(job: dict) -> tuple[str, str]:
    """("complete" | "failed" | "running", detail) from a Job's conditions."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return "complete", ""
        if c.get("type") == "Failed":
            return "failed", _one_line(f"{c.get('reason', 'Failed')}: {c.get('message', '')}".rstrip(": "))
    return "running", ""


class KubeActions:
    """:class:`~gpuobs.remediate.interfaces.NodeActions` on a Kubernetes cluster (module docstring).

    ``api``: a ``kubernetes.client.ApiClient`` or ``Configuration``; ``pool_label``: the node label whose
    value is the pool (e.g. ``nvidia.com/gpu.product``); ``node_selector``: label selector of the managed
    GPU nodes; ``namespace``: where the Jobs run; ``image``: the reset/reboot Jobs' image (with
    ``nvidia-smi``); ``diag_image``: the health-check image (with ``dcgmi``; default ``image``), run with
    host networking so ``dcgmi`` reaches the node's DCGM host engine; ``serving_selector``: the pods
    ``restart-engine`` evicts.
    """

    def __init__(self, api: Any, *, pool_label: str, node_selector: str, namespace: str, image: str,
                 diag_image: str | None = None, serving_selector: str = "app.kubernetes.io/name=vllm",
                 reboot_sentinel: bool = False, timeout_s: float = 10.0, conflict_retries: int = 5,
                 job_ttl_s: int = 86400, clock: Callable[[], float] = time.time):
        k8s = _client()
        if isinstance(api, k8s.Configuration):
            api = k8s.ApiClient(api)
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.batch = k8s.BatchV1Api(api)
        self._exc = k8s.ApiException
        self.pool_label, self.node_selector, self.namespace = pool_label, node_selector, namespace
        self.image, self.diag_image = image, diag_image or image
        self.serving_selector, self.reboot_sentinel = serving_selector, reboot_sentinel
        self.timeout_s, self.conflict_retries, self.job_ttl_s, self.clock = timeout_s, conflict_retries, job_ttl_s, clock
        self.held: dict[str, list[str]] = {}  # node -> pods a PDB kept at the last drain

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **kw: Any) -> "KubeActions":
        """Credentials as kubectl finds them: ``kubeconfig`` when given, else the in-cluster service
        account, else ``~/.kube/config`` (kubernetes-client/python ``config.load_incluster_config`` /
        ``load_kube_config``). Raises ActionError (one line) when none works."""
        k8s = _client()
        from kubernetes import config as kconfig

        cfg = k8s.Configuration()
        try:
            if kubeconfig:
                kconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
            else:
                try:
                    kconfig.load_incluster_config(client_configuration=cfg)
                except kconfig.ConfigException:
                    kconfig.load_kube_config(client_configuration=cfg)
        except (kconfig.ConfigException, OSError, ValueError, TypeError) as exc:
            raise ActionError(_one_line(f"kubeconfig{f' {kubeconfig}' if kubeconfig else ''}: {exc}")) from None
        return cls(cfg, **kw)

    # -- transport ---------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> dict:
        """One API call; the decoded JSON answer, or ActionError (ApiRefusal for an HTTP error)."""
        import urllib3

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout_s, **kw)
            data = resp.data
            return json.loads(data) if data else {}
        except self._exc as exc:
            reason, message = exc.reason or "", ""
            try:
                body = json.loads(exc.body or "{}")
                reason, message = body.get("reason") or reason, body.get("message") or ""
            except (ValueError, AttributeError):
                message = exc.body or ""
            status = int(exc.status or 0)
            if not status:  # the client's own refusal (no HTTP answer)
                raise ActionError(_one_line(f"{what}: {reason or exc}")) from None
            raise ApiRefusal(_one_line(f"{what}: HTTP {status} {reason}: {message}".rstrip(": ")), status,
                             reason) from None
        except urllib3.exceptions.HTTPError as exc:
            host = getattr(self.api.configuration, "host", "?")
            raise ActionError(_one_line(f"{what}: Kubernetes API server {host} unreachable: "
                                        f"{type(exc).__name__}")) from None
        except ValueError as exc:  # an unreadable JSON answer, or the client refusing an argument
            raise ActionError(_one_line(f"{what}: {type(exc).__name__}: {exc}")) from None

    def _node(self, node: str) -> dict:
        return self._call(f"get node {node}", self.core.read_node, node)

    def _pods(self, what: str, node: str | None = None, label_selector: str | None = None) -> list[dict]:
        fields = ["status.phase!=Succeeded", "status.phase!=Failed"]
        if node is not None:
            fields.insert(0, f"spec.nodeName={node}")
        kw: dict[str, Any] = {"field_selector": ",".join(fields)}
        if label_selector:
            kw["label_selector"] = label_selector
        return self._call(what, self.core.list_pod_for_all_namespaces, **kw).get("items") or []

    # -- views -------------------------------------------------------------------------------------

    def _view(self, n: dict, pods: list[dict]) -> NodeView:
        meta, spec = n.get("metadata") or {}, n.get("spec") or {}
        name = meta.get("name", "")
        cordoned = bool(spec.get("unschedulable"))
        mark = _mark(n)
        marked = mark is not None or _has_taint(n)
        by = "gpuobs" if marked else ("human" if cordoned else "")
        evict = sorted(f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}" for p in pods if _evictable(p))
        detail = {"pods": evict, "mark": mark or {}, "held_by_pdb": list(self.held.get(name, []))}
        return NodeView(node=name, pool=(meta.get("labels") or {}).get(self.pool_label, ""), cordoned=cordoned,
                        cordoned_by=by, in_flight=float(len(evict)),
                        boot_id=((n.get("status") or {}).get("nodeInfo") or {}).get("bootID", ""), detail=detail)

    def nodes(self) -> list[NodeView]:
        items = self._call("list nodes", self.core.list_node, label_selector=self.node_selector).get("items") or []
        by_node: dict[str, list[dict]] = {}
        for p in self._pods("list pods"):
            by_node.setdefault((p.get("spec") or {}).get("nodeName") or "", []).append(p)
        return [self._view(n, by_node.get(n["metadata"]["name"], [])) for n in items]

    def view(self, node: str) -> NodeView:
        n = self._node(node)
        return self._view(n, self._pods(f"list pods on {node}", node))

    # -- cordon ------------------------------------------------------------------------------------

    def _update(self, node: str, mutate: Callable[[dict], bool]) -> dict:
        """Read-modify-write of the Node with its resourceVersion; 409 Conflict re-reads and re-applies."""
        for attempt in range(self.conflict_retries + 1):
            n = self._node(node)
            if not mutate(n):
                return n
            try:
                return self._call(f"update node {node}", self.core.replace_node, node, n)
            except ApiRefusal as exc:
                if exc.status != 409 or attempt == self.conflict_retries:
                    raise
            time.sleep(0.01 * (1 + random.random() * 0.1))  # client-go retry.DefaultRetry: 10 ms steps
        raise AssertionError("unreachable")

    def _condition(self, node: str, n: dict, status: str, reason: str, message: str) -> None:
        conds = (n.get("status") or {}).get("conditions") or []
        old = next((c for c in conds if c.get("type") == CONDITION), None)
        if old is None and status == "False":
            return
        if old and (old.get("status"), old.get("reason"), old.get("message")) == (status, reason, message):
            return
        now = _iso(self.clock())
        cond = {"type": CONDITION, "status": status, "reason": reason, "message": _one_line(message),
                "lastHeartbeatTime": now,
                "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status
                and old.get("lastTransitionTime") else now}
        self._call(f"set condition on node {node}", self.core.patch_node_status, node,
                   {"status": {"conditions": [cond]}})

    def cordon(self, node: str, reason: str) -> None:
        def mutate(n: dict) -> bool:
            spec = n.setdefault("spec", {})
            ann = n.setdefault("metadata", {}).setdefault("annotations", {}) or {}
            n["metadata"]["annotations"] = ann
            if spec.get("unschedulable") and _has_taint(n) and MARK in ann:
                return False
            if MARK not in ann:
                ann[MARK] = json.dumps({"reason": _one_line(reason), "since": _iso(self.clock()),
                                        "episode": uuid.uuid4().hex[:12],
                                        "was_unschedulable": bool(spec.get("unschedulable"))}, sort_keys=True)
            if not _has_taint(n):
                spec["taints"] = [*(spec.get("taints") or []), dict(TAINT)]
            spec["unschedulable"] = True
            return True

        n = self._update(node, mutate)
        self._condition(node, n, "True", "Quarantined", (_mark(n) or {}).get("reason", reason))

    def uncordon(self, node: str) -> None:
        def mutate(n: dict) -> bool:
            spec = n.setdefault("spec", {})
            ann = (n.get("metadata") or {}).get("annotations") or {}
            if MARK not in ann and not _has_taint(n):
                return False
            mark = _mark(n) or {}
            ann.pop(MARK, None)
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != MARK] or None
            if spec["taints"] is None:
                del spec["taints"]
            if not mark.get("was_unschedulable"):
                spec["unschedulable"] = False
            return True

        n = self._update(node, mutate)
        self._condition(node, n, "False", "Released", "gpuobs remediation finished; node returned")

    # -- drain -------------------------------------------------------------------------------------

    def _evict(self, what: str, pod: dict) -> str:
        """Evict one pod: "evicted", "gone" (404) or "held" (429, a PDB); raises ActionError otherwise."""
        meta = pod["metadata"]
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        try:
            self._call(f"{what}: evict {meta['namespace']}/{meta['name']}", self.core.create_namespaced_pod_eviction,
                       meta["name"], meta["namespace"], body)
        except ApiRefusal as exc:
            if exc.status == 404:
                return "gone"
            if exc.status == 429:
                return "held"
            raise
        return "evicted"

    def drain(self, node: str) -> None:
        pods = [p for p in self._pods(f"list pods on {node}", node)
                if _evictable(p) and not p["metadata"].get("deletionTimestamp")]
        held, errors = [], []
        for p in pods:
            try:
                if self._evict(f"drain {node}", p) == "held":
                    held.append(f"{p['metadata']['namespace']}/{p['metadata']['name']}")
            except ActionError as exc:
                errors.append(str(exc))
        self.held[node] = held
        if errors:
            raise ActionError(_one_line(f"{errors[0]} ({len(errors)} of {len(pods)} evictions failed)"))

    # -- actions -----------------------------------------------------------------------------------

    def _job_name(self, kind: str, node: str, gpu: int | None, episode: str) -> str:
        h = hashlib.sha256(f"{kind}|{node}|{gpu}|{episode}".encode()).hexdigest()[:8]
        tail = f"-{'all' if gpu is None else f'g{gpu}'}-{h}"
        head = f"gpuobs-{kind}-"
        slug = re.sub(r"[^a-z0-9-]+", "-", node.lower())[: 63 - len(head) - len(tail)].strip("-")
        return f"{head}{slug}{tail}"

    def _episode(self, node: str) -> str:
        mark = _mark(self._node(node)) or {}
        return str(mark.get("episode") or mark.get("since") or "")

    def _job(self, name: str, node: str, kind: str, image: str, command: list[str], deadline_s: int,
             host_network: bool = False, host_path: str | None = None) -> dict:
        labels = {**MANAGED_BY, "gpuobs.io/action": kind}
        container: dict[str, Any] = {
            "name": kind, "image": image, "command": command,
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            "securityContext": {"privileged": True},
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}
        pod: dict[str, Any] = {
            "restartPolicy": "Never", "automountServiceAccountToken": False,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "tolerations": [{"key": MARK, "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [container]}
        if host_network:
            pod["hostNetwork"] = True
        if host_path:
            pod["volumes"] = [{"name": "host", "hostPath": {"path": host_path, "type": "Directory"}}]
            container["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels,
                             "annotations": {"gpuobs.io/node": node}},
                "spec": {"backoffLimit": 0, "activeDeadlineSeconds": deadline_s,
                         "ttlSecondsAfterFinished": self.job_ttl_s,
                         "template": {"metadata": {"labels": labels}, "spec": pod}}}

    def _create_job(self, what: str, job: dict) -> bool:
        """Create ``job``; False when it already exists (409 AlreadyExists: started before)."""
        try:
            self._call(what, self.batch.create_namespaced_job, self.namespace, job)
        except ApiRefusal as exc:
            if exc.status == 409 and exc.reason == "AlreadyExists":
                return False
            raise
        return True

    def act(self, node: str, action: str, gpu: int | None) -> str:
        if action not in ACTIONS or action == "none":
            raise ActionError(f"act on {node}: unknown action {action!r}; expected one of "
                              f"{', '.join(a for a in ACTIONS if a != 'none')}")
        if action == "reset-gpu":
            if gpu is None or gpu < 0:
                raise ActionError(f"reset-gpu on {node}: needs a GPU index, got {gpu!r}")
            name = self._job_name("reset", node, gpu, self._episode(node))
            job = self._job(name, node, "reset-gpu", self.image, ["nvidia-smi", "-r", "-i", str(gpu)], 300)
            created = self._create_job(f"reset-gpu {gpu} on {node}", job)
            return f"reset-gpu {gpu} on {node}: Job {self.namespace}/{name} {'created' if created else 'already started'}"
        if action == "reboot":
            if not self.reboot_sentinel:
                raise ActionError(f"reboot on {node}: not enabled; reboots need a node-reboot provider (e.g. Kured "
                                  "watching /var/run/reboot-required): KubeActions(reboot_sentinel=True)")
            name = self._job_name("reboot", node, None, self._episode(node))
            job = self._job(name, node, "reboot", self.image, ["touch", "/host/reboot-required"], 120,
                            host_path="/var/run")
            created = self._create_job(f"reboot {node}", job)
            return (f"reboot {node}: Job {self.namespace}/{name} {'created' if created else 'already started'} "
                    "(writes /var/run/reboot-required for the reboot provider)")
        pods = self._pods(f"restart-engine on {node}: list pods", node, self.serving_selector)
        if not pods:
            return f"restart-engine on {node}: no pods match {self.serving_selector}; nothing to restart"
        outcome = {p["metadata"]["name"]: self._evict(f"restart-engine on {node}", p) for p in pods}
        held = sorted(k for k, v in outcome.items() if v == "held")
        if len(held) == len(pods):
            raise ActionError(_one_line(f"restart-engine on {node}: a PodDisruptionBudget allows no eviction of "
                                        f"{', '.join(held)}"))
        done = len(pods) - len(held)
        return _one_line(f"restart-engine on {node}: evicted {done} of {len(pods)} serving pods"
                         + (f"; held by a PodDisruptionBudget: {', '.join(held)}" if held else ""))

    def health_check(self, node: str, gpu: int | None) -> HealthResult:
        episode = self._episode(node)
        where = f"{node}" + ("" if gpu is None else f" gpu {gpu}")
        if gpu is not None:  # never diagnose while this episode's reset of that GPU runs
            reset = self._job_name("reset", node, gpu, episode)
            try:
                job = self._call(f"health check on {where}", self.batch.read_namespaced_job, reset, self.namespace)
            except ApiRefusal as exc:
                if exc.status != 404:
                    raise
            else:
                if _job_state(job)[0] == "running":
                    raise ActionError(f"health check still running on {where}: waiting for reset Job "
                                      f"{self.namespace}/{reset}")
        name = self._job_name("diag", node, gpu, episode)
        what = f"health check on {where}"
        try:
            job = self._call(what, self.batch.read_namespaced_job, name, self.namespace)
        except ApiRefusal as exc:
            if exc.status != 404:
                raise
            command = ["dcgmi", "diag", "-r", "2"] + ([] if gpu is None else ["-i", str(gpu)])
            self._create_job(what, self._job(name, node, "health-check", self.diag_image, command, 900,
                                             host_network=True))
            raise ActionError(f"health check still running on {where}: Job {self.namespace}/{name} started") from None
        state, detail = _job_state(job)
        if state == "running":
            raise ActionError(f"health check still running on {where}: Job {self.namespace}/{name}")
        try:  # consume the result: the next check runs afresh
            self._call(what, self.batch.delete_namespaced_job, name, self.namespace,
                       body={"propagationPolicy": "Background"})
        except ApiRefusal as exc:
            if exc.status != 404:
                raise
        if state == "complete":
            return HealthResult(passed=True)
        return HealthResult(passed=False, failures=(_one_line(f"dcgmi diag -r 2 on {where}: {detail}"),))
