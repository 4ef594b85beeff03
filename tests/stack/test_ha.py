"""HA topology rendering (gpuobs.stack.ha), without starting anything: every replica's config passes
promtool, the hashmod relabelling (run by promtool's own service discovery) puts each node, with all
of its targets, on exactly one shard; topology labels are dropped before VictoriaMetrics and
Alertmanager; bad shapes are refused with the field named."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuobs.exporter.sim.identity import hostname
from gpuobs.stack import alert_timing, ha
from gpuobs.stack.render import Ports, render_prometheus, write_targets
from gpuobs.stack.supervisor import StackConfig, StackError
from tests.stack.test_alert_timing import simulate_outage

NODES = 12


def _render(tmp_path: Path, shards: int) -> tuple[ha.HAConfig, dict[str, int], dict[tuple[int, int], Path]]:
    cfg = ha.HAConfig(stack=StackConfig(run_dir=tmp_path), shards=shards, base_port=30000)
    ports = ha.assign_ports(cfg)
    nodes = [(hostname("gpu-node", i), 40000 + i) for i in range(NODES)]
    engines = [(hostname("gpu-node", i), 41000 + i) for i in range(NODES - 2)]
    base = render_prometheus(tmp_path, Ports(), nodes, engines, "http://127.0.0.1:9097")
    write_targets(tmp_path, "logwatch", [(h, 42000 + i, {}) for i, (h, _p) in enumerate(nodes)])
    shard_rules, _fleet = ha.render_rules_placed(tmp_path, "http://127.0.0.1:9097", "drill")
    confs = {(s, r): ha.render_replica(tmp_path, base, ha.prometheus_name(s, r), s, r, cfg, ports, shard_rules)
             for s in range(shards) for r in range(cfg.replicas)}
    return cfg, ports, confs


def test_ports_are_one_block_in_a_fixed_order():
    ports = ha.assign_ports(ha.HAConfig(shards=3, base_port=20000))
    assert list(ports.values()) == list(range(20000, 20000 + 3 * 2 + 3 * 2 + 2))
    assert ports["prometheus-s0-r0"] == 20000 and ports["prometheus-s2-r1"] == 20005
    assert ports["alertmanager-0"] == 20006 and ports["alertmanager-0-cluster"] == 20009
    assert (ports["victoria-metrics"], ports["vmalert"]) == (20012, 20013)


def test_replica_configs_pass_promtool_and_label_their_place(tmp_path):
    cfg, ports, confs = _render(tmp_path, 2)
    res = subprocess.run(["promtool", "check", "config", *map(str, confs.values())], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(confs[(1, 0)].read_text())
    assert doc["global"]["external_labels"] == {"shard": "1", "replica": "0"}
    drop = {"regex": "shard|replica", "action": "labeldrop"}
    assert doc["remote_write"] == [{"url": f"http://127.0.0.1:{ports['victoria-metrics']}/api/v1/write",
                                    "write_relabel_configs": [drop], "queue_config": {"batch_send_deadline": "1s"}}]
    assert doc["alerting"]["alert_relabel_configs"] == [drop]
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        f"127.0.0.1:{ports[f'alertmanager-{i}']}" for i in range(3)]
    # The replicas of a shard differ only in the replica label.
    twin = yaml.safe_load(confs[(1, 1)].read_text())
    twin["global"]["external_labels"]["replica"] = "0"
    twin["scrape_configs"] = [sc for sc in twin["scrape_configs"] if sc["job_name"] != "prometheus"]
    assert twin == {**doc, "scrape_configs": [sc for sc in doc["scrape_configs"] if sc["job_name"] != "prometheus"]}
    # Shards load only the node-local rules; the fleet-wide ones are vmalert's.
    rules = "".join(p.read_text() for p in (tmp_path / "prometheus" / "rules-shard").glob("*.yml"))
    fleet = "".join(p.read_text() for p in (tmp_path / "vmalert" / "rules").glob("*.yml"))
    assert "alert: GpuXidCritical" in rules and "alert: GpuDriverSkew" not in rules
    assert "alert: GpuDriverSkew" in fleet and "alert: GpuXidCritical" not in fleet
    placed = json.loads((tmp_path / "placement.json").read_text())
    assert {r["name"] for r in placed if r["placement"] == "fleet"} >= {"GpuDriverSkew", "TrainingStraggler"}


@pytest.mark.parametrize("shards", [2, 3])
def test_every_node_lands_on_exactly_one_shard_with_all_its_targets(tmp_path, shards):
    _cfg, _ports, confs = _render(tmp_path, shards)
    owner: dict[str, set[int]] = {}
    # promtool waits out its --timeout on every call (file_sd answers at once): run them side by side.
    runs = {(s, job): subprocess.Popen([shutil.which("promtool") or "promtool", "check", "service-discovery",
                                        "--timeout=1s", str(confs[(s, 0)]), job], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
            for s in range(shards) for job in ("dcgm", "vllm", "logwatch")}
    for (s, job), proc in runs.items():
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        kept = [t["labels"] for t in json.loads(stdout) if t["labels"]]
        for labels in kept:
            owner.setdefault(labels["node"], set()).add(s)
    assert set(owner) == {hostname("gpu-node", i) for i in range(NODES)}
    assert all(len(s) == 1 for s in owner.values()), owner  # a node's DCGM, vLLM and logwatch targets together
    assert len({next(iter(s)) for s in owner.values()}) == shards  # every shard gets some of the 12 nodes


def test_a_target_without_node_is_sharded_by_address():
    rules = ha.shard_relabel(4, 2, "node")
    assert rules[1] == {"source_labels": ["__tmp_shard_key", "__address__"], "separator": ";", "regex": ";(.+)",
                        "target_label": "__tmp_shard_key", "replacement": "$1"}
    assert rules[-1] == {"source_labels": ["__tmp_shard"], "regex": "2", "action": "keep"}


@pytest.mark.parametrize("field, value, message", [
    ("shards", 0, "--shards must be 1..16; got 0"),
    ("replicas", 5, "--replicas must be 1..4; got 5"),
    ("alertmanagers", 0, "--alertmanagers must be 1..7; got 0"),
    ("scrape_interval_s", 0.5, "scrape interval must be 1..300 s; got 0.5"),
])
def test_bad_shapes_are_refused_naming_the_field(tmp_path, field, value, message):
    cfg = ha.HAConfig(stack=StackConfig(run_dir=tmp_path / "run"))
    setattr(cfg, field, value)
    with pytest.raises(StackError) as exc:
        ha.up(cfg)
    assert str(exc.value) == message and exc.value.exit_code == 2
    assert not (tmp_path / "run").exists()


def test_the_blind_alert_runs_on_the_shards_and_its_runbook_exists(tmp_path):
    from gpuobs.core import assets
    from gpuobs.mixin.placement import SHARD, place

    text = ha.blind_rule("http://127.0.0.1:9097")
    assert place({"ha-topology.yml": text}, "node").names(SHARD) == ["FleetRulesBlind"]
    (tmp_path / "ha.yml").write_text(text)
    res = subprocess.run(["promtool", "check", "rules", str(tmp_path / "ha.yml")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    rule = yaml.safe_load(text)["groups"][0]["rules"][0]
    runbook, anchor = rule["annotations"]["runbook_url"].split("/runbooks/", 1)[1].split("#")
    assert f"## {rule['alert']}" in (assets.path("runbooks") / runbook).read_text() and anchor == "fleetrulesblind"


def test_vmalert_resends_like_prometheus_so_an_outage_never_resolves_a_fleet_alert(tmp_path):
    """gpuobs.stack.alert_timing (vmalert v1.79.5 app/vmalert/group.go getResolveDuration: endsAt = now +
    4 max(group interval, -rule.resendDelay); alerting.go alertsToSend: resend when LastSent + delay <
    now): with Prometheus's resend delay vmalert's fleet-wide alerts outlive the same outages."""
    t = alert_timing.DEFAULT
    am = ["http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"]
    argv = ha.vmalert_argv("vmalert", tmp_path, "http://127.0.0.1:1", am, 5.0, 5, t)
    assert "-rule.resendDelay=3m" in argv and "-rule.maxResolveDuration=0" in argv
    assert [a for a in argv if a.startswith("-notifier.url=")] == [f"-notifier.url={u}" for u in am]
    assert "-evaluationInterval=5s" in argv and f"-rule={tmp_path}/*.yml" in argv
    assert "-datasource.queryTimeAlignment=false" in argv  # query at the evaluation's time (fault-to-page)
    # vmalert's send schedule is Prometheus's, so the replay of test_alert_timing applies; its restart
    # sends straight to the notifier list (no dropped first send), the Prometheus case is the worse one.
    for outage in (60, 180, 300):
        for dropped in (False, True):
            assert simulate_outage(t, die_at=600, outage_s=outage, restart_s=20, first_send_dropped=dropped)
    # Without the flag (resend delay 0): endsAt = 4 x 5 s, and a 60 s outage resolves the alert.
    bare = dataclasses.replace(t, resend_delay_s=0.0)
    assert not simulate_outage(bare, die_at=600, outage_s=60, restart_s=5, first_send_dropped=False)


def test_vmalert_accepts_the_rendered_flags(tmp_path):
    vmalert = shutil.which("vmalert")
    assert vmalert, "vmalert missing: `make binaries` installs Debian's victoria-metrics"
    _shard, fleet = ha.render_rules_placed(tmp_path, "http://127.0.0.1:9097", "drill")
    # Every fleet-wide group asks VictoriaMetrics for data as of its evaluation (nocache=1: no latency offset).
    for f in fleet.glob("*.yml"):
        assert all(g["params"] == {"nocache": ["1"]} for g in yaml.safe_load(f.read_text())["groups"]), f
    argv = ha.vmalert_argv(vmalert, fleet, "http://127.0.0.1:1", ["http://127.0.0.1:2"], 5.0, 5)
    res = subprocess.run([*argv, "-dryRun"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run([*argv, "-rule.noSuchFlag=1", "-dryRun"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0  # an unknown flag is refused, so the check above can fail
