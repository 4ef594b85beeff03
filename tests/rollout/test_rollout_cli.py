"""The rollout's real adapters (StackFleet, PromSignals) and its command line (usage errors, status,
abort of a live controller)."""

from __future__ import annotations

import json
import math

import pytest

from gpuobs.cli import run
from gpuobs.promapi.prometheus import PromClient
from gpuobs.rollout.adapters.native import StackFleet
from gpuobs.rollout.adapters.prometheus import PromSignals
from gpuobs.rollout.interfaces import FleetError
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.render import write_targets
from gpuobs.stack.state import StackState
from tests.conftest import TOKEN
from tests.fakes.prometheus import FakePrometheus, ok, vector
from tests.fakes.rollout import ASSUMPTION, rig, spec


def cli(argv: list[str]) -> int:
    return run(argv)


def make_stack(run, node_urls, nodes=4, training=1):
    hosts = [f"gpu-node-0{i}" for i in range(nodes)]
    (run / "admin-token").write_text(TOKEN + "\n")
    stack = {"run_dir": str(run), "nodes": nodes, "training_nodes": training, "hostnames": hosts,
             "token_file": str(run / "admin-token"), "components": {"exporter": {"pid": 1, "argv": ["x"]}},
             "urls": {"prometheus": "http://127.0.0.1:9", "alertmanager": "http://127.0.0.1:9",
                      "pager": "http://127.0.0.1:9", "nodes": node_urls}}
    (run / "stack.json").write_text(json.dumps(stack))
    write_targets(run, "dcgm", [(h, 9400 + i, {}) for i, h in enumerate(hosts)])
    write_targets(run, "vllm", [(h, 8000 + i, {"zone": "a"}) for i, h in enumerate(hosts[: nodes - training])])
    return stack


def targets(run, job):
    path = run / "prometheus" / "targets" / f"{job}-nodes.json"
    return {g["labels"]["node"]: g["labels"] for g in json.loads(path.read_text())}


def test_stack_fleet_relabels_serving_nodes_and_restores(tmp_path):
    make_stack(tmp_path, [f"http://127.0.0.1:{9400 + i}/metrics" for i in range(4)])
    fleet = StackFleet(StackState.from_dict(json.loads((tmp_path / "stack.json").read_text())))
    assert fleet.hosts == ["gpu-node-00", "gpu-node-01", "gpu-node-02"]  # the training node is not rolled
    before = {job: (tmp_path / "prometheus" / "targets" / f"{job}-nodes.json").read_text() for job in ("dcgm", "vllm")}
    snap = fleet.label_snapshot()
    assert snap["vllm"][0] == ["gpu-node-00", 8000, {"zone": "a"}]
    fleet.apply_labels(snap, {"gpu-node-00"})
    v, d = targets(tmp_path, "vllm"), targets(tmp_path, "dcgm")
    assert v["gpu-node-00"] == {"node": "gpu-node-00", "Hostname": "gpu-node-00", "zone": "a", "track": "canary"}
    assert v["gpu-node-02"]["track"] == "baseline" and d["gpu-node-01"]["track"] == "baseline"
    assert d["gpu-node-00"]["track"] == "canary" and "track" not in d["gpu-node-03"]  # training node untouched
    fleet.apply_labels(snap, None)
    assert {job: (tmp_path / "prometheus" / "targets" / f"{job}-nodes.json").read_text() for job in before} == before


def test_stack_fleet_deploys_through_the_admin_api(tmp_path, node_server):
    url, node = node_server
    assert node.hostname == "gpu-node-01"
    make_stack(tmp_path, ["http://127.0.0.1:9/metrics", f"{url}/metrics"], nodes=2, training=0)
    fleet = StackFleet(StackState.from_dict(json.loads((tmp_path / "stack.json").read_text())))
    assert fleet.version(node.hostname) == "1.4.0"
    assert fleet.deploy(node.hostname, "1.6.0") == "1.4.0" and node.version == "1.6.0"
    with pytest.raises(FleetError, match="deploy 9.9 failed"):
        fleet.deploy(node.hostname, "9.9")
    with pytest.raises(FleetError, match="gpu-node-00: version query failed: cannot reach"):
        fleet.version("gpu-node-00")
    with pytest.raises(FleetError, match="unknown node 'nope'"):
        fleet.version("nope")


def test_prom_signals_budget_pages_and_inventory():
    def respond(endpoint, params):
        q = params["query"][0]
        if q == "slo:error_budget_remaining:ratio":
            name = "slo:error_budget_remaining:ratio"
            return ok(vector([({"__name__": name, "slo": "ttft", "model_name": "llama"}, -0.4),
                              ({"__name__": name, "slo": "availability"}, math.nan)]))
        if q.startswith("sum by (model_name) (increase(vllm:request_success_total[30d]))"):
            return ok(vector([({"model_name": "llama"}, 2500.0)]))
        if q.startswith("ALERTS{"):
            return ok(vector([({"__name__": "ALERTS", "alertname": "ServingErrorBudgetBurn", "alertstate": "firing",
                                "severity": "critical", "slo": "ttft"}, 1.0)]))
        assert q == 'count by (node, modelName, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP{job=~"dcgm|.*dcgm-exporter.*"})'
        labels = {"node": "gpu-node-00", "modelName": "NVIDIA L4", "DCGM_FI_DRIVER_VERSION": "550.54.15"}
        return ok(vector([(labels, 4)]))
    with FakePrometheus(respond) as prom:
        sig = PromSignals(PromClient(prom.url, retries=0))
        (row,) = sig.budget()  # the NaN one (no traffic in the window) is skipped
        assert (row.labels, row.remaining, row.requests) == ({"slo": "ttft", "model_name": "llama"}, -0.4, 2500.0)
        assert not row.judged and not row.exhausted  # 2,500 requests: one error swings a 99.9% budget by 40%
        assert sig.pages() == {"ServingErrorBudgetBurn{severity=critical,slo=ttft}"}
        assert [(r.hostname, r.gpu_model, r.gpus) for r in sig.inventory()] == [("gpu-node-00", "NVIDIA L4", 4)]
        assert PromSignals(sig.client, min_requests=2000).budget()[0].exhausted
    sent = [r["params"]["query"][0] for r in prom.requests]
    assert sent[1] == "sum by (model_name) (increase(vllm:request_success_total[30d]))"
    assert sent[2] == 'ALERTS{alertname="ServingErrorBudgetBurn",severity="critical",alertstate="firing"}'
    assert sent[3] == 'count by (node, modelName, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP{job=~"dcgm|.*dcgm-exporter.*"})'


@pytest.mark.parametrize("argv,needle", [
    (["--version", "1.5.0", "--override-freeze"], "--override-freeze needs --reason"),
    (["--version", "1.5.0", "--reason", "why"], "--override-freeze needs --reason"),
    (["--version", "1.5.0", "--override-freeze", "--reason", "  "], "--override-freeze needs --reason"),
    (["--version", "9.9.9"], "--version: unknown version '9.9.9'"),
    (["--version", "1.5.0", "--interval", "soon"], "--interval: 'soon' is not valid"),
    (["--version", "1.5.0"], "no running stack in"),
])
def test_start_usage_errors_exit_2(tmp_path, capsys, argv, needle):
    assert cli(["rollout", "start", "--run-dir", str(tmp_path), *argv]) == 2
    assert needle in capsys.readouterr().err


def test_a_bad_prometheus_url_or_an_unknown_id_is_one_plain_line(tmp_path, capsys):
    make_stack(tmp_path, [f"http://127.0.0.1:{9400 + i}/metrics" for i in range(4)])
    assert cli(["rollout", "start", "--run-dir", str(tmp_path), "--version", "1.5.0",
                "--prometheus", "ftp://x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prometheus" in err and "Traceback" not in err
    RolloutStore(tmp_path / "rollout.sqlite").close()
    for argv in (["status"], ["abort"], ["resume"], ["pause", "--reason", "r"], ["promote", "--reason", "r"]):
        assert cli(["rollout", *argv, "--run-dir", str(tmp_path), "--id", "nope"]) == 2
        err = capsys.readouterr().err
        assert "nope" in err and '"' not in err, (argv, err)  # the store's message, not a KeyError's repr


def test_the_notices_runbook_base_comes_from_the_fleet_config(tmp_path, capsys, monkeypatch):
    from gpuobs.cli.decide import fleet_of, group_options
    from gpuobs.core.fleet import shipped_fleet

    monkeypatch.delenv("GPUOBS_FLEET_CONFIG", raising=False)
    (tmp_path / "fleet.yaml").write_text("runbook_base: https://runbooks.example/\n")
    assert fleet_of(group_options().parse_args([])) == shipped_fleet()
    assert fleet_of(group_options().parse_args(["--fleet", str(tmp_path / "fleet.yaml")])).runbook_base == \
        "https://runbooks.example"
    make_stack(tmp_path, [f"http://127.0.0.1:{9400 + i}/metrics" for i in range(4)])
    (tmp_path / "bad.yaml").write_text("runbook_base: not-a-url\n")
    assert cli(["rollout", "start", "--run-dir", str(tmp_path), "--version", "1.5.0",
                "--fleet", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runbook_base: expected an http(s) URL" in err and "Traceback" not in err


def test_start_rejects_stages_without_a_baseline(tmp_path, capsys):
    make_stack(tmp_path, [f"http://127.0.0.1:{9400 + i}/metrics" for i in range(4)])
    assert cli(["rollout", "start", "--run-dir", str(tmp_path), "--version", "1.5.0", "--stages", "100%"]) == 2
    assert "first stage must leave a baseline: 3 serving node(s)" in capsys.readouterr().err


def test_status_reports_stage_times_and_json(tmp_path, capsys):
    assert cli(["rollout", "status", "--run-dir", str(tmp_path)]) == 2
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["ROLLBACK"]})
    rec = r.controller.run(r.controller.create(spec()).id)
    r.store.close()
    capsys.readouterr()
    assert cli(["rollout", "status", "--run-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    out = text.splitlines()
    assert out[0] == f"Rollout {rec.id}: RolledBack (exit 1)"
    # the header: a short reason (the deciding test, effect and interval), then each assumption once
    assert out[1] == "reason: canary analysis ROLLBACK in stage 2/3: ttft: High (+20.0% [+12.0%, +28.0%])"
    assert out[2] == f"assumption: ttft: {ASSUMPTION}"
    assert out[4].split()[:7] == ["1/3", "canary", "1/3", "gpu-node-00", "passed", "1", "PROMOTE"]
    assert out[5].split()[:7] == ["2/3", "canary", "2/3", "gpu-node-00,gpu-node-01", "failed", "1", "ROLLBACK"]
    assert out[6].startswith("deploys: gpu-node-00 1.4.0 -> 1.5.0 (stage 1); gpu-node-01 1.4.0 -> 1.5.0 (stage 2)")
    assert out[7] == "Deciding canary verdict (stage 2/3, look 1):"
    assert out[8].startswith("Canary verdict: ROLLBACK")
    # said once: both stages' verdicts rested on it, and neither the verdict table nor a reason repeats it
    assert text.count(ASSUMPTION) == 1
    assert "reason: ttft: High (+20.0% [+12.0%, +28.0%])" in out
    assert not any(ASSUMPTION in line for line in r.lines)  # nor any progress line of the run
    assert cli(["rollout", "status", "--run-dir", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "RolledBack" and doc["exit_code"] == 1
    assert [(s["idx"], s["status"], s["ended_at"] - s["started_at"]) for s in doc["stages"]] == [
        (0, "passed", 15.0), (1, "failed", 15.0)]
    assert [t["to_state"] for t in doc["transitions"]][-2:] == ["RollingBack", "RolledBack"]
    # the same document feeds `gpuobs report rollout --file` (gpuobs/reports/rollout.py)
    assert (doc["rollout_id"], doc["version"], doc["baseline_version"]) == (rec.id, "1.5.0", "1.4.0")
    assert [(s["index"], s["share"], s["nodes"]) for s in doc["stages"]] == [
        (0, "33%", ["gpu-node-00"]), (1, "67%", ["gpu-node-00", "gpu-node-01"])]
    assert doc["final_verdict"]["verdict"] == "ROLLBACK" and doc["final_verdict"]["metrics"][0]["name"] == "ttft"
    assert doc["assumptions"] == [f"ttft: {ASSUMPTION}"] and doc["final_verdict"]["deciding"][0]["metric"] == "ttft"
    assert doc["ended_at"] == doc["transitions"][-1]["ts"] and doc["prometheus"] is None
    from gpuobs.reports.rollout import write_rollout_report

    html = write_rollout_report(doc, tmp_path / "reports").read_text()
    assert rec.id in html and "RolledBack" in html
    assert html.count("node-to-node variation from 2 baseline and 1 canary instance(s)") == 1  # once, in the summary


def test_abort_asks_a_live_controller_through_the_database(tmp_path, capsys):
    r = rig(tmp_path, {1: ["PROMOTE"]})
    rid = r.controller.create(spec()).id
    held = RunLock(tmp_path)
    assert held.acquire()  # a controller is running
    try:
        code = cli(["rollout", "abort", "--run-dir", str(tmp_path), "--reason", "bad build", "--wait", "0.2s"])
    finally:
        held.release()
    assert code == 3  # it did not finish within --wait
    assert r.store.get(rid).abort_reason == "bad build"
    assert "abort requested" in capsys.readouterr().out
