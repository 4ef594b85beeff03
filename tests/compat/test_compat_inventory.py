"""``gpuobs compat fleet``: inventory from Prometheus labels, per-node verdicts, exit codes."""

from __future__ import annotations

import json

import pytest

from gpuobs.cli import run
from gpuobs.compat.inventory import InventoryRow, judge_fleet
from gpuobs.reference.releases import load
from tests.fakes.prometheus import FakePrometheus, ok, vector

H100 = "NVIDIA H100 80GB HBM3"


def inventory_responder(rows, identity="node"):
    def respond(endpoint, params):
        respond.queries.append(params["query"][0])
        ident = respond.identity
        return ok(vector([({ident: h, "modelName": m, "DCGM_FI_DRIVER_VERSION": d}, n) for h, m, d, n in rows]))
    respond.queries, respond.identity = [], identity
    return respond


def cli(argv: list[str]) -> int:
    return run(argv)


def test_fleet_table_and_exit_codes(capsys):
    rows = [("gpu-node-00", H100, "550.54.15", 8), ("gpu-node-01", H100, "580.95.05", 8)]
    with FakePrometheus(inventory_responder(rows)) as prom:
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "2.0.0"]) == 1
        out = capsys.readouterr().out
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0"]) == 0
        ok_out = capsys.readouterr().out
    # keyed by the fleet config's identity label through its DCGM selector (not dcgm-exporter's Hostname)
    assert prom.responder.queries[0] == ("count by (node, modelName, DCGM_FI_DRIVER_VERSION) "
                                         '(DCGM_FI_DEV_GPU_TEMP{job=~"dcgm|.*dcgm-exporter.*"})')
    lines = out.splitlines()
    assert lines[0] == "Release 2.0.0 (vllm==0.26.0, CUDA 13.0): INCOMPATIBLE, 1 of 2 node row(s) blocking"
    assert lines[2].split()[:4] == ["gpu-node-00", "8", "NVIDIA", "H100"] and "INCOMPATIBLE" in lines[2]
    assert "fail: toolkit-min-driver, minor-version-compat, forward-compat" in lines[2]
    assert "COMPATIBLE" in lines[3] and "INCOMPATIBLE" not in lines[3]  # 580 runs CUDA 13.0
    assert "toolkit-min-driver: driver 550.54.15 vs CUDA 13.0 GA minimum 580.65.06" in out
    assert ok_out.startswith("Release 1.5.0 (vllm==0.11.0, CUDA 12.8): COMPATIBLE_WITH_WARNINGS, 0 of 2")


def test_fleet_json_and_unjudgeable_nodes(capsys):
    rows = [("gpu-node-00", H100, "550.54.15", 2), ("gpu-node-01", "", "550.54.15", 2),
            ("gpu-node-02", "NVIDIA Imaginary 9000", "550.54.15", 2),
            ("gpu-node-03", "Tesla V100-SXM2-32GB", "550.54.15", 4)]
    with FakePrometheus(inventory_responder(rows)) as prom:
        code = cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0", "--json",
                    "--selector", 'job="dcgm"'])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"] == "INCOMPATIBLE" and doc["exit_code"] == 1
    assert prom.responder.queries[0].endswith('(DCGM_FI_DEV_GPU_TEMP{job="dcgm"})')
    by_host = {n["hostname"]: n for n in doc["nodes"]}
    assert by_host["gpu-node-00"]["verdict"] == "COMPATIBLE_WITH_WARNINGS"
    assert by_host["gpu-node-01"]["verdict"] == "UNKNOWN" and "modelName" in by_host["gpu-node-01"]["error"]
    assert by_host["gpu-node-02"]["verdict"] == "UNKNOWN" and "Imaginary" in by_host["gpu-node-02"]["error"]
    assert by_host["gpu-node-03"]["gpus"] == 4 and by_host["gpu-node-03"]["rules"][0]["rule"] == "gpu-arch"


def test_fleet_input_errors(capsys):
    with FakePrometheus(inventory_responder([])) as prom:
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "9.9.9"]) == 2
        assert "unknown version '9.9.9'; known: 1.4.0" in capsys.readouterr().err
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0"]) == 1  # empty inventory
        assert "INCOMPATIBLE, 0 of 0" in capsys.readouterr().out
    rejected = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    with FakePrometheus(lambda e, p: (400, rejected)) as bad:
        assert cli(["compat", "fleet", "--prometheus", bad.url, "--release", "1.5.0"]) == 2
    assert cli(["compat", "fleet", "--prometheus", "http://127.0.0.1:9", "--release", "1.5.0", "--retries", "0"]) == 1
    assert "cannot reach Prometheus at http://127.0.0.1:9 (connection refused)" in capsys.readouterr().err


def test_judge_fleet_restricts_to_hosts_and_reports_missing():
    rel = load().get("1.6.0")
    rows = [InventoryRow("a", H100, "550.54.15", 2), InventoryRow("b", H100, "550.54.15", 2)]
    rep = judge_fleet(rows, rel, hosts=["a", "c"])
    assert [n.row.hostname for n in rep.nodes] == ["a"] and rep.missing == ["c"]
    assert rep.verdict == "INCOMPATIBLE"
    assert rep.blockers() == ["c: no modelName/DCGM_FI_DRIVER_VERSION series in Prometheus"]
    assert judge_fleet(rows, rel, hosts=["a", "b"]).exit_code == 0


def test_fleet_inventory_follows_the_fleet_config(tmp_path, capsys):
    """--fleet FILE: the inventory is keyed by its identity label and read through its DCGM selector; a bad
    identity label or fleet file is one line, exit 2, and no query is sent."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text('identity_label: k8s_node\nselectors:\n  dcgm: \'job="gpu-operator/nvidia-dcgm-exporter"\'\n')
    rows = [("gpu-node-00", H100, "580.95.05", 8)]
    with FakePrometheus(inventory_responder(rows, "k8s_node")) as prom:
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0", "--fleet", str(fleet)]) == 0
        assert "gpu-node-00" in capsys.readouterr().out
        assert prom.responder.queries == ["count by (k8s_node, modelName, DCGM_FI_DRIVER_VERSION) "
                                          '(DCGM_FI_DEV_GPU_TEMP{job="gpu-operator/nvidia-dcgm-exporter"})']
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0", "--identity-label", "a b"]) == 2
        assert "--identity-label" in capsys.readouterr().err
        fleet.write_text("identity_label: Hostname\n")
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0", "--fleet", str(fleet)]) == 2
        err = capsys.readouterr().err
        assert "identity_label" in err and "Traceback" not in err
        assert len(prom.responder.queries) == 1


def test_a_selector_that_is_not_label_matchers_is_refused_before_any_query(capsys):
    with FakePrometheus(inventory_responder([])) as prom:
        for bad in ('} or vector(1) or {a="b"', "job", "", '__name__="up"'):
            assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0", "--selector", bad]) == 2
            err = capsys.readouterr().err
            assert "--selector" in err and err.count("\n") == 1, (bad, err)
        assert prom.responder.queries == []
        with pytest.raises(SystemExit) as exc:  # argparse's usage error
            cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0", "--timeout", "0"])
        assert exc.value.code == 2 and "--timeout" in capsys.readouterr().err


def test_gpus_without_the_identity_label_are_unknown_not_one_compatible_node(capsys):
    """A fleet whose series lack the identity label folds every node into one nameless row: that row is
    UNKNOWN and the fleet INCOMPATIBLE (exit 1), not one compatible 32-GPU node."""
    rows = [("", H100, "580.95.05", 32)]
    with FakePrometheus(inventory_responder(rows)) as prom:
        assert cli(["compat", "fleet", "--prometheus", prom.url, "--release", "1.5.0", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "INCOMPATIBLE" and doc["nodes"][0]["verdict"] == "UNKNOWN"
    assert "identity label" in doc["nodes"][0]["error"]
