"""The Compose profile ``ha`` offline (no Docker engine): the same members as the native HA topology
(``make up-ha``), rendered by the same code (gpuobs.stack.ha): 2 Prometheus shards x 2 replicas with
the identity-preserving shard relabelling, a 3-member Alertmanager cluster gossiping by service name
and feeding the pager, VictoriaMetrics with replica dedup, vmalert with the fleet-wide rules. The
compose file's commands must be :func:`gpuobs.stack.ha.compose_ha_commands`, and every file they name
must be one :func:`gpuobs.stack.ha.render_compose_ha` writes. The live run is tests/live/test_compose_ha.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuobs.stack import compose as compose_mode
from gpuobs.stack import ha
from tests.stack.test_compose import COMPOSE_DIR, HA_DIR_DEFAULT, HA_SERVICES, interpolated

MOUNT = ha.COMPOSE_HA_MOUNT


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(interpolated((COMPOSE_DIR / "docker-compose.yml").read_text()))["services"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compose-ha")
    ha.render_compose_ha(out, COMPOSE_DIR / "prometheus.yml", "drill", "http://127.0.0.1:9097")
    return out


def test_the_profile_has_the_native_topologys_members(services):
    members = {n for n, s in services.items() if "ha" in (s.get("profiles") or [])}
    assert members == HA_SERVICES == set(ha.compose_ha_services())
    # Same shape as `make up-ha` (gpuobs stack up --topology ha's defaults).
    native = ha.HAConfig()
    assert (native.shards, native.replicas, native.alertmanagers) == (2, 2, 3)


def test_commands_are_the_native_renderers_with_service_names(services):
    for name, argv in ha.compose_ha_commands().items():
        assert services[name]["command"] == argv, name
    assert services["vmalert"]["entrypoint"] == ["/usr/bin/vmalert"]
    assert services["victoria-metrics"]["image"] == services["vmalert"]["image"] == "gpuobs-victoria-metrics:bookworm"


def test_alertmanager_members_gossip_with_each_other_by_service_name(services):
    names = [f"alertmanager-{i}" for i in range(3)]
    for name in names:
        argv = services[name]["command"]
        peers = sorted(a.split("=", 1)[1] for a in argv if a.startswith("--cluster.peer="))
        assert peers == sorted(f"{n}:9094" for n in names if n != name), name
        assert "--cluster.listen-address=0.0.0.0:9094" in argv and "--cluster.peer-timeout=3s" in argv
        assert services[name]["networks"] == ["backend"] and "ports" not in services[name]
        assert services[name]["depends_on"]["pager"]["condition"] == "service_healthy"


def test_every_file_the_services_name_is_rendered(services, rendered):
    for name in HA_SERVICES - {"victoria-metrics"}:
        vols = [v for v in services[name]["volumes"] if v.startswith("${") or v.startswith(HA_DIR_DEFAULT)]
        assert vols == [f"{HA_DIR_DEFAULT}:{MOUNT}:ro"], name
        for arg in services[name]["command"]:
            value = arg.split("=", 1)[-1]
            if value.startswith(MOUNT):
                host = rendered / value.removeprefix(MOUNT + "/")
                hits = list(host.parent.glob(host.name)) if "*" in host.name else [host]
                assert hits and all(h.is_file() for h in hits), (name, arg)


def test_replicas_shard_by_node_with_the_native_relabelling(rendered):
    drop = {"regex": "shard|replica", "action": "labeldrop"}
    docs = {(s, r): yaml.safe_load((rendered / "prometheus" / f"prometheus-s{s}-r{r}.yml").read_text())
            for s in range(2) for r in range(2)}
    for (s, r), doc in docs.items():
        assert doc["global"]["external_labels"] == {"shard": str(s), "replica": str(r)}
        assert doc["global"]["scrape_interval"] == doc["global"]["evaluation_interval"] == "5s"
        assert doc["remote_write"] == [{"url": "http://victoria-metrics:8428/api/v1/write",
                                        "write_relabel_configs": [drop],
                                        "queue_config": {"batch_send_deadline": "1s"}}]
        assert doc["alerting"]["alert_relabel_configs"] == [drop]
        assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
            f"alertmanager-{i}:9093" for i in range(3)]
        assert doc["rule_files"] == [f"{MOUNT}/prometheus/rules-shard/*.yml"]
        jobs = {sc["job_name"]: sc for sc in doc["scrape_configs"]}
        for job in ("dcgm", "vllm", "logwatch", "alertmanager"):
            assert jobs[job]["relabel_configs"][:4] == ha.shard_relabel(2, s, "node"), (job, s)
        assert jobs["alertmanager"]["static_configs"] == [{"targets": [f"alertmanager-{i}:9093" for i in range(3)]}]
        assert jobs[ha.GLOBAL_JOB]["static_configs"] == [{"targets": ["victoria-metrics:8428", "vmalert:8880"]}]
        assert "relabel_configs" not in jobs[ha.GLOBAL_JOB]
    # The two replicas of a shard differ in the replica label only.
    for s in range(2):
        twin = docs[(s, 1)]
        twin["global"]["external_labels"]["replica"] = "0"
        assert twin == docs[(s, 0)]


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed")
def test_promtool_accepts_the_replicas_and_every_node_lands_on_one_shard(tmp_path, rendered):
    """promtool's own service discovery on the compose targets (compose/targets): every node, with its
    DCGM and vLLM targets, on exactly one shard, and both shards get nodes."""
    owner: dict[str, set[int]] = {}
    for s in range(2):
        doc = yaml.safe_load((rendered / "prometheus" / f"prometheus-s{s}-r0.yml").read_text())
        doc["rule_files"] = [str(rendered / "prometheus" / "rules-shard" / "*.yml")]
        for sc in doc["scrape_configs"]:
            for fsd in sc.get("file_sd_configs", []):
                fsd["files"] = [f.replace("/etc/prometheus/targets", str(COMPOSE_DIR / "targets")) for f in fsd["files"]]
        conf = tmp_path / f"s{s}.yml"
        conf.write_text(yaml.safe_dump(doc, sort_keys=False))
        res = subprocess.run(["promtool", "check", "config", str(conf)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        for job in ("dcgm", "vllm"):
            res = subprocess.run(["promtool", "check", "service-discovery", "--timeout=1s", str(conf), job],
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
            for t in json.loads(res.stdout):
                if t["labels"]:
                    owner.setdefault(t["labels"]["node"], set()).add(s)
    assert sorted(owner) == [f"gpu-node-0{i}" for i in range(4)]
    assert all(len(v) == 1 for v in owner.values()), owner
    assert {next(iter(v)) for v in owner.values()} == {0, 1}


def test_rules_are_placed_like_the_native_topology(rendered):
    shard = "".join(p.read_text() for p in (rendered / "prometheus" / "rules-shard").glob("*.yml"))
    fleet = "".join(p.read_text() for p in (rendered / "vmalert" / "rules").glob("*.yml"))
    assert "alert: GpuXidCritical" in shard and "alert: FleetRulesBlind" in shard
    assert "alert: GpuDriverSkew" in fleet and "alert: GpuXidCritical" not in fleet
    placed = json.loads((rendered / "placement.json").read_text())
    assert {r["name"] for r in placed if r["placement"] == "fleet"} >= {"GpuDriverSkew", "TrainingStraggler"}


def test_the_cluster_feeds_the_pager_container(services, rendered):
    cfg = yaml.safe_load((rendered / "alertmanager" / "alertmanager.yml").read_text())
    urls = [wh["url"] for r in cfg["receivers"] for wh in r.get("webhook_configs", [])]
    assert urls and all(u.startswith("http://pager:9097/hook/") for u in urls)
    # The compose pager takes no token (--no-auth), so no webhook carries one.
    assert "--no-auth" in services["pager"]["command"]
    assert not [r for r in cfg["receivers"] for wh in r.get("webhook_configs", []) if "http_config" in wh]
    # The repository's routing, unchanged but for the URLs and the HA resolve_timeout.
    repo = yaml.safe_load((COMPOSE_DIR.parent / "alertmanager" / "alertmanager.yml").read_text())
    assert cfg["route"] == repo["route"] and cfg["inhibit_rules"] == repo["inhibit_rules"]


def test_up_ha_starts_the_profile_instead_of_the_single_pipeline(services):
    svcs = {n: s for n, s in services.items()}
    started = compose_mode._services_of(svcs, "ha")
    assert set(started) == HA_SERVICES | {f"node-{i}" for i in range(4)} | {"pager"}
    assert set(compose_mode._services_of(svcs, "single")) == {f"node-{i}" for i in range(4)} | {
        "pager", "prometheus", "alertmanager"}


def test_bad_shape_or_topology_is_one_line_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="^shards must be 2 for the compose profile ha"):
        ha.render_compose_ha(tmp_path, COMPOSE_DIR / "prometheus.yml", cfg=ha.HAConfig(shards=3))
    with pytest.raises(compose_mode.ComposeError, match="^topology must be one of single, ha; got 'triple'"):
        compose_mode.check(topology="triple")


@pytest.mark.skipif(subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0
                    if shutil.which("docker") else True, reason="no Compose plugin")
def test_docker_compose_config_accepts_the_profile(rendered):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "GPUOBS_HA_DIR": str(rendered)}
    res = subprocess.run(["docker", "compose", "-f", str(COMPOSE_DIR / "docker-compose.yml"), "--profile", "ha",
                          "config", "--format", "json"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert HA_SERVICES <= set(json.loads(res.stdout)["services"])
