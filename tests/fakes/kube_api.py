"""The few Kubernetes API server endpoints :class:`gpuobs.remediate.adapters.kubernetes.KubeActions`
calls, served over HTTP on 127.0.0.1 so the official ``kubernetes`` Python client talks to it unchanged.

Semantics read from kubernetes/kubernetes (facts, not code; each file at the commit given):

* ``staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go`` (0021a864a65a) ``Store.Update``:
  an update whose ``metadata.resourceVersion`` differs from the stored one fails with
  ``NewConflict(resource, name, OptimisticLockErrorMsg)``, HTTP 409 reason ``Conflict``, message
  ``Operation cannot be fulfilled on nodes "<name>": the object has been modified; please apply your
  changes to the latest version and try again``; an empty resourceVersion is an unconditional update
  when the strategy allows it (nodes do); a missing object is 404 ``NotFound``.
  ``staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go``: ``NewAlreadyExists`` (409
  ``AlreadyExists``, ``jobs.batch "<name>" already exists``), ``NewNotFound`` (404, ``<resource> "<name>"
  not found``), ``NewTooManyRequests`` (429 ``TooManyRequests``, ``details.retryAfterSeconds``), all as a
  ``Status`` object.
* ``pkg/registry/core/node/strategy.go`` ``PrepareForUpdate``: ``newNode.Status = oldNode.Status`` (a
  PUT of the node never changes its status; conditions go through the ``status`` subresource).
  ``staging/src/k8s.io/api/core/v1/types.go``: ``NodeStatus.Conditions`` is ``patchStrategy:"merge"
  patchMergeKey:"type"`` (a strategic merge patch merges conditions by type; the Python client sends a
  dict patch as ``application/strategic-merge-patch+json``).
* ``pkg/registry/core/pod/storage/eviction.go`` (01aa0f3f6052) ``EvictionREST.Create`` (policy/v1
  Eviction, POST ``/api/v1/namespaces/{ns}/pods/{name}/eviction``): the body's name must match the URL's
  (400); a missing pod is 404; a pod in phase Succeeded/Failed/Pending or already terminating is deleted
  without a PDB check (``canIgnorePDB``); more than one matching PDB is a 500 Status; a not-ready pod is
  deleted without decrementing when ``currentHealthy >= desiredHealthy > 0``; otherwise
  ``checkAndDecrement``: ``observedGeneration < generation`` -> 429; ``disruptionsAllowed < 0`` -> 403;
  ``disruptionsAllowed == 0`` -> 429 ``Cannot evict pod as it would violate the pod's disruption
  budget.`` with cause ``DisruptionBudget`` ``The disruption budget <pdb> needs <desired> healthy pods and
  has <current> currently``; else decrement, record the pod in ``disruptedPods``, delete the pod. PDBs
  match by their selector in the pod's namespace; an empty selector matches nothing.
* ``staging/src/k8s.io/kubectl/pkg/drain/cordon.go`` (2556d2c3ca87): cordon is ``spec.unschedulable``
  set on the Node; ``drain/filters.go`` (121817a592d7): drain skips pods whose controller owner is a
  DaemonSet and mirror pods (annotation ``kubernetes.io/config.mirror``); finished pods (Succeeded/Failed)
  may always go; ``drain/drain.go`` (014e1fb54c12) ``evictPods``: NotFound is done, TooManyRequests (429)
  is retried later (kubectl: after 5 s), any other error fails that pod.

Eviction here deletes the pod at once (a zero grace period: no terminating phase is emulated). Jobs are
stored as sent; tests finish them with :meth:`KubeAPI.finish_job`. Field selectors: ``spec.nodeName``,
``status.phase``, ``metadata.name``, ``metadata.namespace`` with ``=``, ``==``, ``!=``; label selectors:
``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (..)``, ``k notin (..)``.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

OPTIMISTIC_LOCK = "the object has been modified; please apply your changes to the latest version and try again"
PDB_VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
MIRROR = "kubernetes.io/config.mirror"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str, **details: Any) -> dict:
    """An ``unversioned`` Status object as the API server writes an error."""
    doc = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
           "reason": reason, "code": code}
    if details:
        doc["details"] = details
    return doc


class ApiError(Exception):
    def __init__(self, doc: dict):
        super().__init__(doc["message"])
        self.doc = doc


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(status(404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource))


# -- selectors ---------------------------------------------------------------------------------------

def _split(sel: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in sel:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def label_match(selector: str | None, labels: dict) -> bool:
    for req in _split(selector or ""):
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", req)
        if m:
            vals = {v.strip() for v in m.group(3).split(",")}
            ok = labels.get(m.group(1)) in vals
            if (m.group(2) == "in") != ok:
                return False
            continue
        m = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", req)
        if m:
            k, op, v = m.groups()
            if (labels.get(k) == v) != (op != "!="):
                return False
        elif req.startswith("!"):
            if req[1:] in labels:
                return False
        elif req not in labels:
            return False
    return True


def _field(obj: dict, path: str) -> str:
    cur: Any = obj
    for p in path.split("."):
        cur = (cur or {}).get(p) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def field_match(selector: str | None, obj: dict) -> bool:
    for req in _split(selector or ""):
        m = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", req)
        if not m or m.group(1) not in ("spec.nodeName", "status.phase", "metadata.name", "metadata.namespace"):
            raise ApiError(status(400, "BadRequest", f'"{req}" is not a known field selector'))
        if (_field(obj, m.group(1)) == m.group(3)) != (m.group(2) != "!="):
            return False
    return True


def strategic_merge(dst: Any, patch: Any, key: str = "") -> Any:
    """Strategic merge of ``patch`` into ``dst``: maps merge recursively (null deletes); lists replace,
    except the ``conditions`` lists, merged by ``type``."""
    if not isinstance(patch, dict) or not isinstance(dst, dict):
        if key == "conditions" and isinstance(dst, list) and isinstance(patch, list):
            out = [copy.deepcopy(c) for c in dst]
            for c in patch:
                for i, old in enumerate(out):
                    if old.get("type") == c.get("type"):
                        out[i] = strategic_merge(old, c)
                        break
                else:
                    out.append(copy.deepcopy(c))
            return out
        return copy.deepcopy(patch)
    out = copy.deepcopy(dst)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = strategic_merge(out.get(k), v, k) if k in out else copy.deepcopy(v)
    return out


# -- the server --------------------------------------------------------------------------------------

class KubeAPI:
    """State (nodes, pods, PDBs, jobs) plus the HTTP server; use as a context manager. ``url`` is the
    ``Configuration.host`` for the client. ``calls`` logs ``(method, path, status)``."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.pdbs: dict[tuple[str, str], dict] = {}
        self.jobs: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str, int]] = []
        self.evictions: list[tuple[str, str]] = []
        self.conflicts: dict[str, int] = {}
        self.fail_next: list[tuple[str, int]] = []  # (path regex, HTTP status) injected once each
        self._rv = 1000
        self.lock = threading.RLock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                u = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                try:
                    code, doc = api.handle(method, u.path, q, body, self.headers.get("Content-Type", ""))
                except ApiError as exc:
                    code, doc = exc.doc["code"], exc.doc
                with api.lock:
                    api.calls.append((method, u.path, code))
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._closed = False

    def __enter__(self) -> KubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.shutdown()
        self.server.server_close()

    # -- fixtures ---------------------------------------------------------------------------------

    def _meta(self, meta: dict) -> dict:
        self._rv += 1
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = str(self._rv)
        return meta

    def add_node(self, name: str, labels: dict | None = None, unschedulable: bool = False,
                 boot_id: str = "boot-1") -> dict:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": self._meta({"name": name, "labels": dict(labels or {})}),
                "spec": {"unschedulable": True} if unschedulable else {},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status"}],
                           "nodeInfo": {"bootID": boot_id}}}
        with self.lock:
            self.nodes[name] = node
        return node

    def add_pod(self, ns: str, name: str, node: str, owner_kind: str | None = "ReplicaSet",
                labels: dict | None = None, phase: str = "Running", ready: bool = True,
                mirror: bool = False) -> dict:
        meta: dict = {"name": name, "namespace": ns, "labels": dict(labels or {})}
        if owner_kind:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": f"{name}-owner",
                                        "uid": str(uuid.uuid4()), "controller": True}]
        if mirror:
            meta["annotations"] = {MIRROR: "hash"}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": self._meta(meta),
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "img"}]},
               "status": {"phase": phase,
                          "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        with self.lock:
            self.pods[(ns, name)] = pod
        return pod

    def add_pdb(self, ns: str, name: str, match_labels: dict, disruptions_allowed: int,
                desired: int = 1, current: int = 1) -> dict:
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {**self._meta({"name": name, "namespace": ns}), "generation": 1},
               "spec": {"selector": {"matchLabels": dict(match_labels)}},
               "status": {"observedGeneration": 1, "disruptionsAllowed": disruptions_allowed,
                          "desiredHealthy": desired, "currentHealthy": current, "expectedPods": current}}
        with self.lock:
            self.pdbs[(ns, name)] = pdb
        return pdb

    def set_pdb_allowed(self, ns: str, name: str, allowed: int) -> None:
        with self.lock:
            self.pdbs[(ns, name)]["status"]["disruptionsAllowed"] = allowed

    def conflict_on_next_update(self, node: str, times: int = 1) -> None:
        """Before each of the next ``times`` PUTs of ``node``, another writer changes it (a label
        ``other-writer/touch``), so the PUT's resourceVersion is stale."""
        with self.lock:
            self.conflicts[node] = times

    def finish_job(self, ns: str, name: str, ok: bool, reason: str = "BackoffLimitExceeded",
                   message: str = "Job has reached the specified backoff limit") -> None:
        with self.lock:
            job = self.jobs[(ns, name)]
            job["status"] = {"startTime": _now(), "completionTime": _now(), "active": 0}
            if ok:
                job["status"]["succeeded"] = 1
                job["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
            else:
                job["status"]["failed"] = 1
                job["status"]["conditions"] = [{"type": "Failed", "status": "True", "reason": reason,
                                                "message": message}]
            self._meta(job["metadata"])

    # -- dispatch ---------------------------------------------------------------------------------

    def handle(self, method: str, path: str, q: dict, body: Any, ctype: str) -> tuple[int, dict]:
        with self.lock:
            for i, (pat, code) in enumerate(self.fail_next):
                if re.search(pat, f"{method} {path}"):
                    del self.fail_next[i]
                    return code, status(code, {500: "InternalError", 403: "Forbidden"}.get(code, "Unknown"),
                                        f"injected failure {code}")
            return self._route(method, path, q, body, ctype)

    def _route(self, method: str, path: str, q: dict, body: Any, ctype: str) -> tuple[int, dict]:
        m = re.fullmatch(r"/api/v1/nodes(?:/([^/]+))?(/status)?", path)
        if m:
            name, sub = m.groups()
            if name is None and method == "GET":
                items = [copy.deepcopy(n) for n in self.nodes.values()
                         if label_match(q.get("labelSelector"), n["metadata"].get("labels") or {})]
                return 200, self._list("NodeList", items)
            if name not in self.nodes:
                raise not_found("nodes", name)
            if method == "GET" and not sub:
                return 200, copy.deepcopy(self.nodes[name])
            if method == "PUT" and not sub:
                return 200, self._update_node(name, body)
            if method == "PATCH" and sub:
                if "strategic-merge-patch" not in ctype and "merge-patch" not in ctype:
                    raise ApiError(status(415, "UnsupportedMediaType", f"unsupported patch type {ctype}"))
                node = self.nodes[name]
                node["status"] = strategic_merge(node.get("status") or {}, (body or {}).get("status") or {},
                                                 "status")
                self._meta(node["metadata"])
                return 200, copy.deepcopy(node)
        if path == "/api/v1/pods" and method == "GET":
            items = [copy.deepcopy(p) for p in self.pods.values()
                     if field_match(q.get("fieldSelector"), p)
                     and label_match(q.get("labelSelector"), p["metadata"].get("labels") or {})]
            return 200, self._list("PodList", items)
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", path)
        if m and method == "POST":
            return self._evict(m.group(1), m.group(2), body or {})
        m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?", path)
        if m:
            ns, name = m.groups()
            if method == "POST" and name is None:
                jname = (body or {}).get("metadata", {}).get("name", "")
                if (ns, jname) in self.jobs:
                    raise ApiError(status(409, "AlreadyExists", f'jobs.batch "{jname}" already exists',
                                          name=jname, group="batch", kind="jobs"))
                job = copy.deepcopy(body)
                job["metadata"]["namespace"] = ns
                self._meta(job["metadata"])
                job["status"] = {"active": 1, "startTime": _now()}
                self.jobs[(ns, jname)] = job
                return 201, copy.deepcopy(job)
            if (ns, name) not in self.jobs:
                raise not_found("jobs.batch", name)
            if method == "GET":
                return 200, copy.deepcopy(self.jobs[(ns, name)])
            if method == "DELETE":
                del self.jobs[(ns, name)]
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
        raise ApiError(status(404, "NotFound", f"the server could not find the requested resource ({method} {path})"))

    def _list(self, kind: str, items: list) -> dict:
        return {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _update_node(self, name: str, body: dict) -> dict:
        if self.conflicts.get(name):
            self.conflicts[name] -= 1
            other = self.nodes[name]
            labels = other["metadata"].setdefault("labels", {})
            labels["other-writer/touch"] = str(int(labels.get("other-writer/touch", "0")) + 1)
            self._meta(other["metadata"])
        old = self.nodes[name]
        rv = (body.get("metadata") or {}).get("resourceVersion") or ""
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": {OPTIMISTIC_LOCK}',
                                  name=name, kind="nodes"))
        new = copy.deepcopy(body)
        new["status"] = copy.deepcopy(old.get("status"))  # nodeStrategy.PrepareForUpdate
        for k in ("uid", "creationTimestamp"):
            new["metadata"][k] = old["metadata"][k]
        self._meta(new["metadata"])
        self.nodes[name] = new
        return copy.deepcopy(new)

    def _evict(self, ns: str, name: str, body: dict) -> tuple[int, dict]:
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiError(status(400, "BadRequest", "name in URL does not match name in Eviction object"))
        pod = self.pods.get((ns, name))
        if pod is None:
            raise not_found("pods", name)
        ok = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        phase = pod["status"].get("phase")
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            return self._delete_pod(ns, name, ok)
        labels = pod["metadata"].get("labels") or {}
        pdbs = [p for (pns, _), p in self.pdbs.items() if pns == ns
                and (p["spec"].get("selector") or {}).get("matchLabels")
                and label_match(",".join(f"{k}={v}" for k, v in p["spec"]["selector"]["matchLabels"].items()), labels)]
        if len(pdbs) > 1:
            doc = status(500, "", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.")
            return 500, doc
        if pdbs:
            pdb = pdbs[0]
            st, pname = pdb["status"], pdb["metadata"]["name"]
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod["status"].get("conditions") or [])
            if not ready and st["currentHealthy"] >= st["desiredHealthy"] and st["desiredHealthy"] > 0:
                return self._delete_pod(ns, name, ok)
            if st.get("observedGeneration", 0) < pdb["metadata"].get("generation", 0):
                raise ApiError(status(429, "TooManyRequests", PDB_VIOLATION, retryAfterSeconds=10, causes=[
                    {"reason": "DisruptionBudget",
                     "message": f"The disruption budget {pname} is still being processed by the server."}]))
            if st["disruptionsAllowed"] < 0:
                raise ApiError(status(403, "Forbidden", f'poddisruptionbudget.policy "{pname}" is forbidden: '
                                                        "pdb disruptions allowed is negative"))
            if st["disruptionsAllowed"] == 0:
                raise ApiError(status(429, "TooManyRequests", PDB_VIOLATION, causes=[
                    {"reason": "DisruptionBudget",
                     "message": f"The disruption budget {pname} needs {st['desiredHealthy']} healthy pods "
                                f"and has {st['currentHealthy']} currently"}]))
            st["disruptionsAllowed"] -= 1
            st.setdefault("disruptedPods", {})[name] = _now()
        return self._delete_pod(ns, name, ok)

    def _delete_pod(self, ns: str, name: str, ok: dict) -> tuple[int, dict]:
        del self.pods[(ns, name)]
        self.evictions.append((ns, name))
        return 201, ok
