"""deploy/kubernetes/ha: the HA topology of docs/ha.md on prometheus-operator and the VictoriaMetrics
operator. Every object validates strictly against the stored CRD schemas (tests/data/crds,
test_kubernetes.py's ``strict``), also after ``kubectl kustomize``; the shard key keeps each node whole
on one shard under prometheus-operator v0.93.0's own sharding relabelling (emulated below from
pkg/prometheus/promcfg.go); the rule split is the native topology's, for any fleet config."""

from __future__ import annotations

import copy
import hashlib
import re
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from gpuobs.canary.config import load_config
from gpuobs.core.fleet import parse_fleet, shipped_fleet
from gpuobs.mixin import kubernetes as k8s
from gpuobs.mixin.placement import FLEET, GLOBAL_JOB, SHARD, place
from gpuobs.stack import alert_timing
from tests.mixin.test_kubernetes import DEPLOY, crd_schemas, rendered

OTHER_FLEET = {"identity_label": "k8s_node", "runbook_base": "https://runbooks.example",
               "dashboard_base": "https://grafana.example",
               "selectors": {"dcgm": 'job="dcgm"', "vllm": 'job="vllm"'}}


def _render(fleet=None) -> dict[str, str]:
    cfg = load_config(None)
    return k8s.render(cfg.horizon_s, cfg.interval_s, fleet or shipped_fleet())


def _docs(files: dict[str, str], *rels: str) -> list[dict]:
    return [d for rel in rels for d in k8s.load_docs(files[rel])]


def _by_kind(files: dict[str, str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rel in k8s.HA_RESOURCES:
        for d in k8s.load_docs(files[f"ha/{rel}"]):
            out.setdefault(d["kind"], []).append(d)
    return out


def _validate(doc: dict, schemas: dict) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in schemas:
        jsonschema.validate(doc, schemas[key])
    else:
        import kubernetes_validate
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


# ---- prometheus-operator v0.93.0's target relabelling, emulated --------------------------------------
def _relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str] | None:
    """Prometheus's relabel_config semantics (model/relabel/relabel.go) for the actions used here:
    replace, hashmod, keep. Source values joined by ``;``, the regex anchored, an empty replace result
    deletes the label; ``hashmod``: the last 8 bytes of the md5 of the value, big-endian, mod the
    modulus. Keys in either the CRD's camelCase or Prometheus's snake_case. None: dropped."""
    out = dict(labels)
    for c in configs:
        src = c.get("sourceLabels", c.get("source_labels", []))
        target = c.get("targetLabel", c.get("target_label"))
        regex = re.compile(f"^(?:{c.get('regex', '(.*)')})$")
        val = c.get("separator", ";").join(out.get(s, "") for s in src)
        action = c.get("action", "replace").lower()
        if action == "replace":
            m = regex.match(val)
            if m:
                res = re.sub(r"\$\{?(\d+)\}?", lambda g: m.group(int(g.group(1))) or "", c.get("replacement", "$1"))
                if res:
                    out[target] = res
                else:
                    out.pop(target, None)
        elif action == "hashmod":
            out[target] = str(int.from_bytes(hashlib.md5(val.encode()).digest()[8:], "big") % c["modulus"])
        elif action == "keep":
            if not regex.match(val):
                return None
        else:
            raise AssertionError(f"action {action} not emulated")
    return out


def _operator_sharding(shards: int, shard: int) -> list[dict]:
    """prometheus-operator v0.93.0 pkg/prometheus/promcfg.go appendShardingRelabelingWithLabel (no
    retention policy, no topology mode), with the pod's $(SHARD) substituted, appended after the
    endpoint's relabelings (generatePodMonitorConfig / generateServiceMonitorConfig)."""
    return [{"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash", "regex": "(.+);",
             "replacement": "$1", "action": "replace"},
            {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": shards, "action": "hashmod"},
            {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": f"{shard};|.+;.+", "action": "keep"}]


def _targets(monitors: list[dict], nodes: int) -> list[tuple[str, dict, list[dict]]]:
    """(node, discovered labels, endpoint relabelings) of every PodMonitor endpoint on every node: one
    pod per monitor and node (the nvml exporter's pod serves two monitors, as in the DaemonSet)."""
    out = []
    for n in range(nodes):
        node = f"gpu-node-{n:02d}"
        for i, m in enumerate(monitors):
            for ep in m["spec"]["podMetricsEndpoints"]:
                meta = {"__address__": f"10.1.{n}.{i}:{9400 + i}", "__meta_kubernetes_pod_node_name": node,
                        "__meta_kubernetes_namespace": "gpu", "__meta_kubernetes_pod_name": f"{m['metadata']['name']}-{n}"}
                out.append((node, meta, ep["relabelings"]))
    return out


def _shards_of_each_node(monitors: list[dict], shards: int, nodes: int = 12) -> dict[str, set[int]]:
    kept: dict[str, set[int]] = {}
    for node, meta, relabelings in _targets(monitors, nodes):
        where = {s for s in range(shards) if _relabel(meta, relabelings + _operator_sharding(shards, s))}
        assert len(where) == 1, f"a target of {node} is kept by shards {where}"  # each target once
        kept.setdefault(node, set()).update(where)
    return kept


def test_every_node_lands_whole_on_one_shard():
    """The DCGM, nvml-exporter, logwatch and vLLM targets of one node are kept by exactly one shard under
    the operator's sharding (docs/ha.md "Sharding key"), and the nodes spread over both shards; with the
    operator's default key (the address) the same targets split nodes across shards."""
    files = _render()
    (prom,) = _by_kind(files)["Prometheus"]
    shards = prom["spec"]["shards"]
    monitors = _docs(files, "monitoring/podmonitors.yaml")
    kept = _shards_of_each_node(monitors, shards)
    assert all(len(s) == 1 for s in kept.values()), kept
    assert set().union(*kept.values()) == set(range(shards))
    # the shard is the hash of the identity label alone: the native topology's key (gpuobs.stack.ha)
    for node, (s,) in kept.items():
        assert s == int.from_bytes(hashlib.md5(node.encode()).digest()[8:], "big") % shards
    # without the shard key the operator hashes __address__ and splits nodes
    bare = copy.deepcopy(monitors)
    for m in bare:
        for ep in m["spec"]["podMetricsEndpoints"]:
            ep["relabelings"] = [r for r in ep["relabelings"] if r.get("targetLabel") != k8s.SHARD_HASH_LABEL]
    assert any(len(s) > 1 for s in _shards_of_each_node(bare, shards).values())


def test_the_global_job_is_scraped_by_every_shard():
    """VictoriaMetrics and vmalert (job ha-global) are scraped unsharded, so each shard can raise
    FleetRulesBlind on its own."""
    files = _render()
    kinds = _by_kind(files)
    (sm,) = kinds["ServiceMonitor"]
    (prom,) = kinds["Prometheus"]
    assert prom["spec"]["serviceMonitorSelector"]["matchLabels"].items() <= sm["metadata"]["labels"].items()
    (ep,) = sm["spec"]["endpoints"]
    meta = {"__address__": "10.2.0.1:8428"}
    for s in range(prom["spec"]["shards"]):
        out = _relabel(meta, ep["relabelings"] + _operator_sharding(prom["spec"]["shards"], s))
        assert out is not None and out["job"] == GLOBAL_JOB
    # it selects the two Services the VictoriaMetrics operator makes (SelectorLabels, v0.74.1)
    sel = sm["spec"]["selector"]
    for obj in kinds["VMSingle"] + kinds["VMAlert"]:
        svc_labels = {"app.kubernetes.io/name": obj["kind"].lower(), "app.kubernetes.io/instance": obj["metadata"]["name"],
                      "app.kubernetes.io/component": "monitoring", "managed-by": "vm-operator"}
        assert sel["matchLabels"].items() <= svc_labels.items()
        assert all(svc_labels[e["key"]] in e["values"] for e in sel["matchExpressions"])
    assert ep["port"] == "http"


def test_topology_and_dedup_settings():
    """docs/ha.md's topology and "Dedup settings", as operator fields."""
    files = _render()
    kinds = _by_kind(files)
    (prom,), (am,), (single,), (vmalert,) = kinds["Prometheus"], kinds["Alertmanager"], kinds["VMSingle"], kinds["VMAlert"]
    spec = prom["spec"]
    assert (spec["shards"], spec["replicas"], am["spec"]["replicas"]) == (2, 2, 3)
    # the replica label: an external label the remote write drops (and the operator drops from alerts)
    assert spec["replicaExternalLabelName"] == "replica" and spec["prometheusExternalLabelName"] == ""
    (rw,) = spec["remoteWrite"]
    assert rw["url"] == f"{k8s.VM_URL}/api/v1/write"
    assert rw["writeRelabelConfigs"] == [{"action": "labeldrop", "regex": spec["replicaExternalLabelName"]}]
    assert rw["queueConfig"] == {"batchSendDeadline": "1s"}  # as the native topology (placement.REMOTE_WRITE_DEADLINE_S)
    # VictoriaMetrics dedups at the scrape interval of the PodMonitors
    intervals = {ep["interval"] for m in _docs(files, "monitoring/podmonitors.yaml") for ep in m["spec"]["podMetricsEndpoints"]}
    assert intervals == {spec["scrapeInterval"]} == {single["spec"]["extraArgs"]["dedup.minScrapeInterval"]}
    assert single["spec"]["extraArgs"]["search.latencyOffset"] == "16s"  # 15 s + the 1 s batch deadline
    assert int(single["spec"]["retentionPeriod"].rstrip("d")) >= 30  # the SLO period (prometheus/slo.yaml)
    # vmalert: against VMSingle, every Alertmanager member, the shards' alert timing
    vs = vmalert["spec"]
    assert vs["datasource"]["url"] == vs["remoteWrite"]["url"] == vs["remoteRead"]["url"] == k8s.VM_URL
    assert [n["url"] for n in vs["notifiers"]] == [
        f"http://alertmanager-{am['metadata']['name']}-{i}.alertmanager-operated.monitoring.svc:9093" for i in range(3)]
    timing = alert_timing.derive(evaluation_interval_s=k8s.SCRAPE_INTERVAL_S)
    assert (k8s.HA_RESEND_DELAY_S, k8s.HA_FOR_GRACE_S) == (timing.resend_delay_s, timing.for_grace_period_s)
    assert vs["extraArgs"] == {"rule.resendDelay": "3m", "rule.maxResolveDuration": "0",
                               "datasource.queryTimeAlignment": "false"}
    # every fleet-wide rule group asks VictoriaMetrics for fresh data (no latency offset), as natively
    vmrules = kinds["VMRule"]
    assert vmrules and all(g["params"] == {"nocache": ["1"]} for r in vmrules for g in r["spec"]["groups"])
    assert spec["rules"]["alert"] == {"resendDelay": "3m", "forGracePeriod": "15s"}
    assert vs["evaluationInterval"] == spec["evaluationInterval"] == "15s"
    # Prometheus alerts every member through a Service selecting the operator's Alertmanager pods
    svc = next(d for d in kinds["Service"] if d["metadata"]["name"] == k8s.HA_AM_SERVICE)
    (target,) = spec["alerting"]["alertmanagers"]
    assert (target["name"], target["namespace"], target["port"]) == (k8s.HA_AM_SERVICE, "monitoring", "web")
    assert svc["spec"]["selector"] == {"app.kubernetes.io/name": "alertmanager", "alertmanager": am["metadata"]["name"]}
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["ports"][0]["name"] == "web"
    # the Prometheus ServiceAccount may discover the PodMonitors' pods in any namespace
    (crole,) = kinds["ClusterRole"]
    assert spec["serviceAccountName"] == kinds["ServiceAccount"][0]["metadata"]["name"]
    assert {"pods", "services", "endpoints"} <= set(crole["rules"][0]["resources"])
    # it selects every gpuobs PodMonitor and only the shard rules
    for m in _docs(files, "monitoring/podmonitors.yaml", "remediation/podmonitor.yaml"):
        assert spec["podMonitorSelector"]["matchLabels"].items() <= m["metadata"]["labels"].items()
    for r in _docs(files, "ha/rules-shard.yaml"):
        assert spec["ruleSelector"]["matchLabels"].items() <= r["metadata"]["labels"].items()
    for r in _docs(files, "monitoring/prometheusrules.yaml"):
        assert not spec["ruleSelector"]["matchLabels"].items() <= r["metadata"]["labels"].items()
    for r in _docs(files, "ha/rules-fleet.yaml"):
        assert vs["ruleSelector"]["matchLabels"].items() <= r["metadata"]["labels"].items()
        assert r["metadata"]["namespace"] == vmalert["metadata"]["namespace"]  # no ruleNamespaceSelector


def test_alertmanager_carries_the_gpuobs_config(tmp_path):
    """The HA Alertmanager's config Secret is the rendered gpuobs config (the fragment: a whole config),
    valid for amtool, with every webhook token file in a Secret the Alertmanager mounts."""
    files = _render()
    (am,) = _by_kind(files)["Alertmanager"]
    text = files[f"ha/{k8s.HA_AM_CONFIG_FILE}"]
    assert text == files["alertmanager/gpuobs-fragment.yaml"]
    (tmp_path / "am.yml").write_text(text)
    r = subprocess.run(["amtool", "check-config", str(tmp_path / "am.yml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = yaml.safe_load(text)
    token_files = {h["http_config"]["authorization"]["credentials_file"]
                   for rc in cfg["receivers"] for h in rc.get("webhook_configs", [])}
    assert token_files == {f"/etc/alertmanager/secrets/{s}/token" for s in am["spec"]["secrets"]}
    assert am["spec"]["configSecret"] == k8s.HA_AM_CONFIG_SECRET


@pytest.mark.parametrize("fleet_doc", [None, OTHER_FLEET], ids=["shipped", "k8s_node"])
def test_rules_are_split_as_the_native_topology_splits_them(fleet_doc):
    """The shards' PrometheusRules and vmalert's VMRules are gpuobs.mixin.placement's split of the rule
    files rendered for the fleet config (the same function gpuobs.stack.ha uses), plus FleetRulesBlind
    on the shards; no rule lost or doubled; every alert carries the routing label."""
    fleet = parse_fleet(fleet_doc) if fleet_doc else shipped_fleet()
    files = _render(fleet)
    from gpuobs.mixin.render import render_all
    rule_files = {rel.split("/")[-1]: t for rel, t in render_all(fleet).items() if rel.startswith("prometheus/rules/")}
    placed = place(rule_files, fleet.identity_label)

    def names(docs):
        return [r.get("record") or r.get("alert") for d in docs for g in d["spec"]["groups"] for r in g["rules"]]
    shard, vm = _docs(files, "ha/rules-shard.yaml"), _docs(files, "ha/rules-fleet.yaml")
    assert sorted(names(shard)) == sorted(placed.names(SHARD) + ["FleetRulesBlind"])
    assert sorted(names(vm)) == sorted(placed.names(FLEET))
    assert {"GpuDriverSkew", "TrainingStraggler", "ServingErrorBudgetBurn"} <= set(names(vm))
    assert "increase_prometheus(" in files["ha/rules-fleet.yaml"]  # MetricsQL counting (placement.for_metricsql)
    for d in shard + vm:
        for g in d["spec"]["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    assert r["labels"]["gpuobs"] == "true", r["alert"]
    blind = next(r for d in shard for g in d["spec"]["groups"] for r in g["rules"] if r.get("alert") == "FleetRulesBlind")
    assert blind["annotations"]["runbook_url"] == f"{fleet.runbook_base}/runbooks/ha.md#fleetrulesblind"
    assert f'job="{GLOBAL_JOB}"' in blind["expr"]


def test_a_non_default_fleet_config_reaches_the_ha_base():
    """--fleet with identity label k8s_node: the shard key hashes k8s_node, the rules group by it, and no
    default literal (node, the default selectors and runbook base) is left in the HA files."""
    from tests.mixin.test_render import _DEFAULT_LITERALS

    fleet = parse_fleet(OTHER_FLEET)
    files = _render(fleet)
    for m in _docs(files, "monitoring/podmonitors.yaml"):
        (ep,) = m["spec"]["podMetricsEndpoints"]
        (key,) = [r for r in ep["relabelings"] if r.get("targetLabel") == k8s.SHARD_HASH_LABEL]
        assert key["sourceLabels"] == ["k8s_node"]
        # the identity label is set earlier in the same list, from the pod's node
        first = ep["relabelings"].index(key)
        assert any(r.get("targetLabel") == "k8s_node" for r in ep["relabelings"][:first])
    kept = _shards_of_each_node(_docs(files, "monitoring/podmonitors.yaml"), k8s.HA_SHARDS)
    assert all(len(s) == 1 for s in kept.values())
    for rel in ("ha/rules-shard.yaml", "ha/rules-fleet.yaml", f"ha/{k8s.HA_AM_CONFIG_FILE}"):
        hits = [p.pattern for p in _DEFAULT_LITERALS if p.search(files[rel])]
        assert hits == [], rel
    assert re.search(r"\bby \([^)]*\bk8s_node\b", files["ha/rules-shard.yaml"])
    assert "https://runbooks.example/runbooks/ha.md#fleetrulesblind" in files["ha/rules-shard.yaml"]


def test_strict_validation_catches_a_typo_in_each_ha_kind():
    """A misspelt field is rejected (unknown fields fail, as the API server's Strict field validation
    rejects them), and so is a missing required field."""
    schemas = crd_schemas()
    kinds = _by_kind(_render())
    cases = [("Prometheus", lambda d: d["spec"].__setitem__("shard", 2)),
             ("Prometheus", lambda d: d["spec"]["remoteWrite"][0].__setitem__("writeRelabelConfig", [])),
             ("Alertmanager", lambda d: d["spec"].__setitem__("configSecrets", "x")),
             ("VMSingle", lambda d: d["spec"].__setitem__("extraArg", {})),
             ("VMAlert", lambda d: d["spec"]["notifiers"][0].__setitem__("ulr", "http://x")),
             ("VMAlert", lambda d: d["spec"].pop("datasource")),
             ("VMRule", lambda d: d["spec"]["groups"][0]["rules"][0].__setitem__("exrp", "up")),
             ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].__setitem__("relabeling", []))]
    for kind, spoil in cases:
        doc = copy.deepcopy(kinds[kind][0])
        jsonschema.validate(doc, schemas[(doc["apiVersion"], kind)])
        spoil(doc)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schemas[(doc["apiVersion"], kind)])


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl (with its built-in kustomize) is not installed")
def test_kustomize_build_of_the_ha_overlay(tmp_path):
    """`kubectl kustomize deploy/kubernetes/ha` builds: the monitoring base plus the HA objects, the base's
    unsplit PrometheusRules deleted, the Alertmanager config as the Secret the Alertmanager names; every
    object of the build validates strictly."""
    r = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "ha")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    schemas = crd_schemas()
    for d in docs:
        _validate(d, schemas)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    rules = {n for k, n in names if k == "PrometheusRule"}
    assert rules == {d["metadata"]["name"] for d in _docs(rendered(), "ha/rules-shard.yaml")}
    assert ("DaemonSet", "gpuobs-nvml-exporter") in names and ("Prometheus", k8s.HA_NAME) in names
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    (am,) = [d for d in docs if d["kind"] == "Alertmanager"]
    assert secret["metadata"]["name"] == am["spec"]["configSecret"]
    import base64
    assert base64.b64decode(secret["data"]["alertmanager.yaml"]).decode() == rendered()[f"ha/{k8s.HA_AM_CONFIG_FILE}"]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")} \
        == {"monitoring"}
