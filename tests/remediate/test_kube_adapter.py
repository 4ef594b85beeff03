"""KubeActions (gpuobs/remediate/adapters/kubernetes.py) through the official kubernetes client against
the API-server emulation tests/fakes/kube_api.py (its docstring cites the semantics emulated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")
import kubernetes  # noqa: E402

from gpuobs.remediate.adapters.kubernetes import MARK, KubeActions  # noqa: E402
from gpuobs.remediate.interfaces import ActionError, HealthResult  # noqa: E402
from tests.fakes.kube_api import KubeAPI  # noqa: E402

POOL = "nvidia.com/gpu.product"
NS = "gpuobs-remediation"


@pytest.fixture
def kube():
    with KubeAPI() as api:
        api.add_node("gpu-1", {POOL: "H100", "gpu": "true"}, boot_id="b1")
        api.add_node("gpu-2", {POOL: "A100", "gpu": "true"})
        api.add_node("cpu-1", {"gpu": "false"})
        yield api


def actions(api: KubeAPI, **kw) -> KubeActions:
    cfg = kubernetes.client.Configuration(host=api.url)
    cfg.retries = 0
    return KubeActions(cfg, pool_label=POOL, node_selector="gpu=true", namespace=NS, image="nvcr.io/nvidia/cuda:12",
                       timeout_s=5, **kw)


def test_nodes_and_view(kube):
    kube.add_pod("serving", "vllm-a", "gpu-1", labels={"app.kubernetes.io/name": "vllm"})
    kube.add_pod("kube-system", "dcgm-x", "gpu-1", owner_kind="DaemonSet")
    kube.add_pod("kube-system", "static", "gpu-1", owner_kind="Node", mirror=True)
    kube.add_pod("batch", "done", "gpu-1", phase="Succeeded")
    ka = actions(kube)
    views = {v.node: v for v in ka.nodes()}
    assert set(views) == {"gpu-1", "gpu-2"}
    assert views["gpu-1"].pool == "H100" and views["gpu-2"].pool == "A100"
    assert views["gpu-1"].in_flight == 1 and views["gpu-2"].in_flight == 0
    v = ka.view("gpu-1")
    assert (v.cordoned, v.cordoned_by, v.in_flight, v.boot_id) == (False, "", 1.0, "b1")
    assert v.detail["pods"] == ["serving/vllm-a"]


def test_cordon_is_idempotent_and_marks_the_node(kube):
    ka = actions(kube)
    ka.cordon("gpu-1", "xid 79")
    rv = kube.nodes["gpu-1"]["metadata"]["resourceVersion"]
    ka.cordon("gpu-1", "xid 79")
    node = kube.nodes["gpu-1"]
    assert node["metadata"]["resourceVersion"] == rv  # second cordon wrote nothing
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [{"key": MARK, "value": "quarantined", "effect": "NoSchedule"}]
    mark = json.loads(node["metadata"]["annotations"][MARK])
    assert mark["reason"] == "xid 79" and mark["was_unschedulable"] is False
    (cond,) = [c for c in node["status"]["conditions"] if c["type"] == "GpuobsRemediation"]
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "Quarantined", "xid 79")
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GpuobsRemediation"]  # merged by type
    v = ka.view("gpu-1")
    assert (v.cordoned, v.cordoned_by) == (True, "gpuobs")
    ka.uncordon("gpu-1")
    ka.uncordon("gpu-1")
    node = kube.nodes["gpu-1"]
    assert node["spec"].get("unschedulable") is False and "taints" not in node["spec"]
    assert MARK not in node["metadata"]["annotations"]
    (cond,) = [c for c in node["status"]["conditions"] if c["type"] == "GpuobsRemediation"]
    assert cond["status"] == "False"
    assert (ka.view("gpu-1").cordoned, ka.view("gpu-1").cordoned_by) == (False, "")


def test_a_human_cordon_is_never_undone(kube):
    kube.add_node("gpu-3", {POOL: "H100", "gpu": "true"}, unschedulable=True)
    ka = actions(kube)
    assert (ka.view("gpu-3").cordoned, ka.view("gpu-3").cordoned_by) == (True, "human")
    ka.uncordon("gpu-3")
    assert kube.nodes["gpu-3"]["spec"]["unschedulable"] is True
    ka.cordon("gpu-3", "xid 48")  # the controller marks a node a human had cordoned ...
    assert ka.view("gpu-3").cordoned_by == "gpuobs"
    ka.uncordon("gpu-3")  # ... and returning it leaves the human's cordon
    assert kube.nodes["gpu-3"]["spec"]["unschedulable"] is True
    assert (ka.view("gpu-3").cordoned, ka.view("gpu-3").cordoned_by) == (True, "human")


def test_a_conflicting_update_is_reread_and_reapplied(kube):
    ka = actions(kube)
    kube.conflict_on_next_update("gpu-1", times=2)
    ka.cordon("gpu-1", "xid 79")
    puts = [c for c in kube.calls if c[0] == "PUT"]
    assert [c[2] for c in puts] == [409, 409, 200]
    node = kube.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"]["other-writer/touch"] == "2"  # the other writer's change survived
    kube.conflict_on_next_update("gpu-1", times=99)
    with pytest.raises(ActionError, match=r"^update node gpu-1: HTTP 409 Conflict: Operation cannot be fulfilled"):
        ka.uncordon("gpu-1")


def test_drain_honours_the_pdb_and_retries_on_the_next_call(kube):
    kube.add_pod("serving", "vllm-a", "gpu-1", labels={"app": "vllm"})
    kube.add_pod("serving", "other", "gpu-1", labels={"app": "other"})
    kube.add_pod("kube-system", "dcgm-x", "gpu-1", owner_kind="DaemonSet")
    kube.add_pod("kube-system", "static", "gpu-1", owner_kind="Node", mirror=True)
    kube.add_pdb("serving", "vllm", {"app": "vllm"}, disruptions_allowed=0, desired=2, current=2)
    ka = actions(kube)
    ka.cordon("gpu-1", "xid 79")
    ka.drain("gpu-1")  # 429 for vllm-a is not an error
    assert ("serving", "vllm-a") in kube.pods and ("serving", "other") not in kube.pods
    assert ("kube-system", "dcgm-x") in kube.pods and ("kube-system", "static") in kube.pods  # never evicted
    assert not any("dcgm-x" in c[1] or "static" in c[1] for c in kube.calls if c[0] == "POST")
    v = ka.view("gpu-1")
    assert v.in_flight == 1 and v.detail["held_by_pdb"] == ["serving/vllm-a"]
    assert ("POST", "/api/v1/namespaces/serving/pods/vllm-a/eviction", 429) in kube.calls
    kube.set_pdb_allowed("serving", "vllm", 1)
    ka.drain("gpu-1")
    assert ("serving", "vllm-a") not in kube.pods
    assert ka.view("gpu-1").in_flight == 0
    assert kube.pdbs[("serving", "vllm")]["status"]["disruptionsAllowed"] == 0
    ka.drain("gpu-1")  # nothing left: no eviction at all
    assert kube.evictions == [("serving", "other"), ("serving", "vllm-a")]


def test_drain_errors_are_one_line_action_errors(kube):
    kube.add_pod("serving", "vllm-a", "gpu-1")
    kube.add_pod("serving", "vllm-b", "gpu-1")
    kube.fail_next.append((r"POST .*/vllm-a/eviction", 500))
    ka = actions(kube)
    with pytest.raises(ActionError) as e:
        ka.drain("gpu-1")
    assert str(e.value) == ("drain gpu-1: evict serving/vllm-a: HTTP 500 InternalError: injected failure 500 "
                            "(1 of 2 evictions failed)")
    assert ("serving", "vllm-b") not in kube.pods  # the others were still evicted


def test_reset_job_is_created_once(kube):
    ka = actions(kube)
    ka.cordon("gpu-1", "xid 79")
    first = ka.act("gpu-1", "reset-gpu", 3)
    second = ka.act("gpu-1", "reset-gpu", 3)
    (key,) = kube.jobs
    assert first == f"reset-gpu 3 on gpu-1: Job {NS}/{key[1]} created"
    assert second == f"reset-gpu 3 on gpu-1: Job {NS}/{key[1]} already started"
    assert [c[2] for c in kube.calls if c[0] == "POST" and c[1].endswith("/jobs")] == [201, 409]
    job = kube.jobs[key]
    assert key[1].startswith("gpuobs-reset-gpu-1-g3-") and len(key[1]) <= 63
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["nvidia-smi", "-r", "-i", "3"]
    assert pod["containers"][0]["securityContext"] == {"privileged": True}
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}
    assert {"key": MARK, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert job["spec"]["backoffLimit"] == 0
    assert ka.act("gpu-1", "reset-gpu", 2) != first and len(kube.jobs) == 2
    ka.uncordon("gpu-1")
    ka.cordon("gpu-1", "xid 79 again")  # a new episode resets again
    assert ka.act("gpu-1", "reset-gpu", 3).endswith("created")


def test_generated_jobs_are_valid_kubernetes_objects(kube):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    ka = actions(kube, reboot_sentinel=True)
    ka.act("gpu-1", "reset-gpu", 0)
    ka.act("gpu-1", "reboot", None)
    with pytest.raises(ActionError):
        ka.health_check("gpu-1", None)
    assert len(kube.jobs) == 3
    for job in kube.jobs.values():
        doc = {k: v for k, v in job.items() if k != "status"}
        doc["metadata"] = {k: v for k, v in doc["metadata"].items()
                           if k in ("name", "namespace", "labels", "annotations")}
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_reboot_needs_a_provider(kube):
    with pytest.raises(ActionError, match=r"^reboot on gpu-1: not enabled; reboots need a node-reboot provider"):
        actions(kube).act("gpu-1", "reboot", None)
    assert not kube.jobs
    detail = actions(kube, reboot_sentinel=True).act("gpu-1", "reboot", None)
    assert "created" in detail and "/var/run/reboot-required" in detail
    (job,) = kube.jobs.values()
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "host", "hostPath": {"path": "/var/run", "type": "Directory"}}]


def test_restart_engine_evicts_the_serving_pods(kube):
    kube.add_pod("serving", "vllm-a", "gpu-1", labels={"app.kubernetes.io/name": "vllm"})
    kube.add_pod("serving", "vllm-b", "gpu-2", labels={"app.kubernetes.io/name": "vllm"})
    kube.add_pod("serving", "router", "gpu-1", labels={"app.kubernetes.io/name": "router"})
    ka = actions(kube)
    assert ka.act("gpu-1", "restart-engine", None) == "restart-engine on gpu-1: evicted 1 of 1 serving pods"
    assert set(kube.pods) == {("serving", "vllm-b"), ("serving", "router")}
    assert "nothing to restart" in ka.act("gpu-1", "restart-engine", None)
    kube.add_pod("serving", "vllm-c", "gpu-1", labels={"app.kubernetes.io/name": "vllm"})
    kube.add_pdb("serving", "vllm", {"app.kubernetes.io/name": "vllm"}, disruptions_allowed=0)
    with pytest.raises(ActionError, match="a PodDisruptionBudget allows no eviction of vllm-c"):
        ka.act("gpu-1", "restart-engine", None)
    with pytest.raises(ActionError, match="unknown action"):
        ka.act("gpu-1", "none", None)
    with pytest.raises(ActionError, match="needs a GPU index"):
        ka.act("gpu-1", "reset-gpu", None)


def test_health_check_job_results(kube):
    ka = actions(kube)
    ka.cordon("gpu-1", "xid 79")
    with pytest.raises(ActionError, match=r"^health check still running on gpu-1 gpu 0: Job .* started$"):
        ka.health_check("gpu-1", 0)
    (key,) = kube.jobs
    assert kube.jobs[key]["spec"]["template"]["spec"]["containers"][0]["command"] == \
        ["dcgmi", "diag", "-r", "2", "-i", "0"]
    with pytest.raises(ActionError, match="^health check still running"):
        ka.health_check("gpu-1", 0)
    assert len(kube.jobs) == 1
    kube.finish_job(*key, ok=True)
    assert ka.health_check("gpu-1", 0) == HealthResult(passed=True)
    assert not kube.jobs  # consumed: the next check runs afresh
    with pytest.raises(ActionError):
        ka.health_check("gpu-1", 0)
    (key,) = kube.jobs
    kube.finish_job(*key, ok=False, reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit")
    res = ka.health_check("gpu-1", 0)
    assert res == HealthResult(passed=False, failures=(
        "dcgmi diag -r 2 on gpu-1 gpu 0: BackoffLimitExceeded: Job has reached the specified backoff limit",))


def test_health_check_waits_for_the_reset(kube):
    ka = actions(kube)
    ka.cordon("gpu-1", "xid 79")
    ka.act("gpu-1", "reset-gpu", 1)
    (reset,) = kube.jobs
    with pytest.raises(ActionError, match="waiting for reset Job"):
        ka.health_check("gpu-1", 1)
    assert len(kube.jobs) == 1  # no diagnostic started during the reset
    kube.finish_job(*reset, ok=True)
    with pytest.raises(ActionError, match="started"):
        ka.health_check("gpu-1", 1)
    assert len(kube.jobs) == 2


def test_errors_are_one_line_action_errors(kube):
    ka = actions(kube)
    with pytest.raises(ActionError) as e:
        ka.view("gpu-9")
    assert str(e.value) == 'get node gpu-9: HTTP 404 NotFound: nodes "gpu-9" not found'
    kube.fail_next.append((r"PATCH /api/v1/nodes/gpu-1/status", 403))
    with pytest.raises(ActionError, match=r"^set condition on node gpu-1: HTTP 403 Forbidden: injected failure 403$"):
        ka.cordon("gpu-1", "x")
    kube.fail_next.append((r"GET /api/v1/nodes$", 500))
    with pytest.raises(ActionError, match=r"^list nodes: HTTP 500 InternalError"):
        ka.nodes()
    port = kube.url
    kube.__exit__(None, None, None)
    with pytest.raises(ActionError) as e:
        ka.nodes()
    assert str(e.value).startswith(f"list nodes: Kubernetes API server {port} unreachable: ")
    assert "\n" not in str(e.value)


def test_the_client_is_imported_lazily():
    import subprocess
    import sys

    code = ("import sys; sys.modules['kubernetes'] = None\n"
            "import gpuobs.remediate.adapters.kubernetes as k\n"
            "try:\n    k.KubeActions(None, pool_label='p', node_selector='s', namespace='n', image='i')\n"
            "except k.ActionError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "the Kubernetes adapter needs the kubernetes client: pip install 'gpuobs[k8s]'"
    assert "kubernetes" not in sys.modules.get("gpuobs.remediate.adapters.kubernetes").__dict__


def _permission(method: str, path: str) -> tuple[str, str, str, bool]:
    """(apiGroup, resource, verb, namespaced) an RBAC authorizer checks for one request."""
    import re

    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    namespaced = rest[0] == "namespaces"
    if namespaced:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}[method]
    assert re.fullmatch(r"[a-z/]+", resource), path
    return group, resource, verb, namespaced


def test_the_shipped_rbac_grants_exactly_what_the_adapter_calls(kube):
    from gpuobs.mixin import kubernetes as k8s

    kube.add_pod("serving", "vllm-a", "gpu-1", labels={"app.kubernetes.io/name": "vllm"})
    ka = actions(kube, reboot_sentinel=True)
    ka.nodes()
    ka.cordon("gpu-1", "xid 79")
    ka.drain("gpu-1")
    ka.act("gpu-1", "reset-gpu", 0)
    ka.act("gpu-1", "reboot", None)
    kube.add_pod("serving", "vllm-b", "gpu-1", labels={"app.kubernetes.io/name": "vllm"})
    ka.act("gpu-1", "restart-engine", None)
    kube.finish_job(NS, next(iter(kube.jobs))[1], ok=True)
    for _ in range(3):
        try:
            ka.health_check("gpu-1", None)
        except ActionError:
            kube.finish_job(NS, [n for _, n in kube.jobs if "diag" in n][0], ok=True)
    ka.uncordon("gpu-1")
    used = {_permission(m, p) for m, p, _ in kube.calls}
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "remediation" / "rbac.yaml"
    docs = {d["kind"]: d for d in k8s.load_docs(shipped.read_text())}
    granted = set()
    for kind, namespaced in (("ClusterRole", False), ("Role", True)):
        for rule in docs[kind]["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    granted |= {(g, r, v, namespaced) for v in rule["verbs"]}
    # a request in a namespace is granted by the Role there, else by the ClusterRole
    needed = {u if u in granted else (*u[:3], False) for u in used}
    assert needed == granted, (needed - granted, granted - needed)
    assert docs["Role"]["metadata"]["namespace"] == NS
    crb = docs["ClusterRoleBinding"]
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": docs["ServiceAccount"]["metadata"]["name"],
                                "namespace": NS}]
