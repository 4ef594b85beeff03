"""Driver upgrade planning: inventory validation, batches and gates, compatibility on the target."""

from __future__ import annotations

import json

import pytest

from gpuobs.cli import run as cli_run
from gpuobs.compat.upgrade_plan import (
    load_inventory,
    parse_inventory,
    plan_driver_upgrade,
)
from gpuobs.reference.compat import CompatInputError

FLEET = """
releases:
  chat: {cuda: 12.4, engine: "vllm==0.6.3"}
  trainer: {cuda: "12.8", engine: "pytorch==2.7"}
nodes:
  - {hostname: gpu-a-01, modelName: NVIDIA H100 80GB HBM3, driver: 550.54.15, releases: [chat, trainer]}
  - {hostname: gpu-a-02, modelName: NVIDIA H100 80GB HBM3, driver: 550.54.15, releases: [chat]}
  - {hostname: gpu-a-03, modelName: NVIDIA H100 80GB HBM3, driver: 550.54.15, releases: [chat]}
  - {hostname: gpu-b-01, modelName: NVIDIA A100-SXM4-80GB, driver: 535.104.05, releases: [chat]}
  - {hostname: gpu-c-01, modelName: NVIDIA L4, driver: 580.95.05, releases: [chat]}
  - {hostname: gpu-d-01, modelName: NVIDIA B200, driver: 595.45.04, releases: []}
  - Hostname: gpu-v-01
    modelName: Tesla V100-SXM2-32GB
    DCGM_FI_DRIVER_VERSION: 535.104.05
    releases: [{name: legacy, cuda: 11.8, engine: "pytorch==2.5"}]
"""


@pytest.fixture()
def fleet(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def run_cli(argv, capsys):
    rc = cli_run(["compat", "plan-driver-upgrade", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_inventory_resolves_nodes_and_aliases(fleet):
    nodes = load_inventory(fleet)
    assert [n.hostname for n in nodes][-1] == "gpu-v-01"
    v100 = nodes[-1]
    assert v100.gpu.row.architecture == "Volta" and str(v100.driver) == "535.104.05"
    assert v100.releases[0].name == "legacy" and str(v100.releases[0].cuda) == "11.8"
    assert nodes[0].releases[0].engine.row.version_spec == "<=0.6.3.x"


@pytest.mark.parametrize(("max_unavailable", "sizes"), [(1, [1, 1, 1, 1, 1]), (2, [1, 2, 2]), (10, [1, 4])])
def test_batches_canary_first_then_at_most_max_unavailable(fleet, max_unavailable, sizes):
    plan = plan_driver_upgrade(load_inventory(fleet), "580.95.05", max_unavailable)
    assert [len(b.hosts) for b in plan.batches] == sizes
    assert plan.batches[0].canary and not any(b.canary for b in plan.batches[1:])
    # fewest releases (but at least one), ties by hostname
    assert plan.batches[0].hosts == ("gpu-a-02",)
    upgraded = [h for b in plan.batches for h in b.hosts]
    assert sorted(upgraded) == ["gpu-a-01", "gpu-a-02", "gpu-a-03", "gpu-b-01", "gpu-v-01"]
    assert dict(plan.skipped) == {"gpu-c-01": "already on 580.95.05",
                                  "gpu-d-01": "driver 595.45.04 is newer than 580.95.05; not downgraded"}


def test_gates_per_batch(fleet):
    plan = plan_driver_upgrade(load_inventory(fleet), "580.95.05", 2)
    assert [g.gate for g in plan.batches[0].gates] == ["drain", "upgrade", "health-check", "soak", "uncordon"]
    assert [g.gate for g in plan.batches[1].gates] == ["drain", "upgrade", "health-check", "uncordon"]
    upgrade = plan.batches[1].gates[1].action
    assert "580.95.05 (R580 LTSB)" in upgrade and "gpu-a-01, gpu-a-03" in upgrade
    assert "DCGM_FI_DRIVER_VERSION report 580.95.05" in plan.batches[1].gates[2].action


def test_upgrade_to_r580_keeps_everything_compatible(fleet):
    plan = plan_driver_upgrade(load_inventory(fleet), "580.95.05", 1)
    assert plan.exit_code == 0 and plan.blockers == []
    by_key = {(c.hostname, c.release.name): c for c in plan.checks}
    chat = by_key[("gpu-b-01", "chat")]
    assert chat.before.verdict == "COMPATIBLE_WITH_WARNINGS"  # 535 runs 12.4 only via minor-version compat
    assert [r.status for r in chat.after.rules if r.rule == "toolkit-min-driver"] == ["pass"]
    assert chat.change == "stays compatible"
    assert len(plan.checks) == 6  # gpu-a-01 x2, a-02, a-03, b-01, v-01


def test_upgrade_past_r580_blocks_on_volta(fleet):
    plan = plan_driver_upgrade(load_inventory(fleet), "595.45.04", 1)
    assert plan.exit_code == 1
    assert plan.gpu_checks["gpu-v-01"].status == "fail"
    assert "last branch is R580" in plan.gpu_checks["gpu-v-01"].message
    legacy = next(c for c in plan.checks if c.release.name == "legacy")
    assert legacy.change == "becomes incompatible" and legacy.after.failed() == ["gpu-driver-branch"]
    assert any(b.startswith("gpu-v-01: legacy (CUDA 11.8, pytorch==2.5) becomes incompatible") for b in plan.blockers)


def test_release_filter_and_explicit_canary(fleet):
    plan = plan_driver_upgrade(load_inventory(fleet), "580.95.05", 1, releases=["trainer"], canary="gpu-b-01")
    assert [c.release.name for c in plan.checks] == ["trainer"]
    assert plan.batches[0].hosts == ("gpu-b-01",)


def test_cuda_compat_release_breaks_when_driver_falls_below_floor():
    doc = {"nodes": [{"hostname": "n1", "modelName": "NVIDIA H100 80GB HBM3", "driver": "535.104.05",
                      "releases": [{"name": "r13", "cuda": "13.0", "cuda_compat": True}]}]}
    plan = plan_driver_upgrade(parse_inventory(doc), "550.54.15", 1)
    check = plan.checks[0]
    assert check.before.verdict == "COMPATIBLE_WITH_WARNINGS"  # R535 LTSB + cuda-compat
    assert check.after.verdict == "INCOMPATIBLE" and "forward-compat" in check.after.failed()
    assert plan.exit_code == 1


@pytest.mark.parametrize(("doc", "needles"), [
    ({"nodes": []}, ["nodes", "no nodes listed"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA H100 80GB HBM3"}]}, ["nodes[0].driver", "missing"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA H100 80GB HBM3", "driver": "535.104"}]}, []),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA H100 80GB HBM3", "driver": "535"}]},
     ["nodes[0].driver", "'535'", "535.104.05"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA A10G", "driver": "535.104.05"}]},
     ["nodes[0].modelName", "A10G", "unknown GPU"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA L4", "driver": "535.104.05", "gpus": 8}]},
     ["nodes[0].gpus", "unknown key", "hostname"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA L4", "driver": "535.104.05", "releases": ["nope"]}]},
     ["nodes[0].releases[0]", "'nope'", "catalogue"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA L4", "driver": "535.104.05",
                 "releases": [{"cuda": "12.4", "engine": "sglang==1"}]}]}, ["nodes[0].releases[0].engine", "sglang"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA L4", "driver": "535.104.05",
                 "releases": [{"cuda": "12.4", "ptx_jit": "yes"}]}]},
     ["nodes[0].releases[0].ptx_jit", "true or false"]),
    ({"nodes": [{"hostname": "n1", "modelName": "NVIDIA L4", "driver": "535.104.05"},
                {"hostname": "n1", "modelName": "NVIDIA L4", "driver": "535.104.05"}]},
     ["nodes[1].hostname", "duplicate"]),
])
def test_inventory_validation(doc, needles):
    if not needles:  # a valid two-part driver is accepted
        assert parse_inventory(doc)[0].driver.parts == (535, 104, 0)
        return
    with pytest.raises(CompatInputError) as err:
        parse_inventory(doc)
    for needle in needles:
        assert needle in str(err.value)


def test_yaml_keeps_version_spelling(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("- {hostname: n1, modelName: NVIDIA L4, driver: 570.26, releases: [{cuda: 12.10}]}\n")
    with pytest.raises(CompatInputError) as err:
        load_inventory(path)
    assert "'12.10'" in str(err.value) and "nodes[0].releases[0].cuda" in str(err.value)


def test_json_inventory(tmp_path):
    path = tmp_path / "inv.json"
    path.write_text(json.dumps({"nodes": [{"hostname": "n1", "modelName": "NVIDIA L4", "driver": "550.54.15",
                                           "releases": [{"name": "r", "cuda": 12.4}]}]}))
    (node,) = load_inventory(path)
    assert str(node.releases[0].cuda) == "12.4"


def test_cli_plan_text(fleet, capsys):
    rc, out, err = run_cli(["--to", "595.45.04", "--max-unavailable", "2", "--inventory", str(fleet)], capsys)
    assert rc == 1 and err == ""
    assert out.startswith("Driver upgrade to 595.45.04 (R595 PB): 6 node(s) in 4 batch(es)")
    assert "Batch 0 (canary): gpu-a-02" in out
    assert "FAIL gpu-v-01 GPU gpu-driver-branch" in out and "[source: gpu_compute_capability.csv [Tesla V100" in out
    assert out.rstrip().splitlines()[-1].startswith("Result: BLOCKED, 2 blocker(s)")


def test_cli_plan_json(fleet, capsys):
    rc, out, _ = run_cli(["--to", "580.95.05", "--inventory", str(fleet), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["result"] == "OK" and doc["target"] == "580.95.05"
    assert doc["batches"][0]["canary"] is True and doc["batches"][0]["hosts"] == ["gpu-a-02"]
    assert {c["after"]["verdict"] for c in doc["checks"]} <= {"COMPATIBLE", "COMPATIBLE_WITH_WARNINGS"}


@pytest.mark.parametrize(("argv", "needles"), [
    (["--to", "580.95", "--max-unavailable", "0"], ["--max-unavailable", "'0'", "positive integer"]),
    (["--to", "580.95", "--max-unavailable", "x"], ["--max-unavailable", "'x'"]),
    (["--to", "580"], ["--to", "'580'", "535.104.05"]),
    (["--to", "580.95.05", "--release", "nope"], ["--release", "'nope'", "chat, trainer, legacy"]),
    (["--to", "580.95.05", "--canary", "gpu-c-01"], ["--canary", "gpu-c-01", "gpu-a-01"]),
])
def test_cli_plan_bad_input(fleet, capsys, argv, needles):
    rc, out, err = run_cli([*argv, "--inventory", str(fleet)], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    for needle in needles:
        assert needle in err


@pytest.mark.parametrize(("content", "needles"), [
    (None, ["--inventory", "cannot read file"]),
    ("nodes: [unclosed\n", ["--inventory", "not valid YAML"]),
    ("inventory: []\n", ["unknown top-level key", "'inventory'"]),
])
def test_cli_plan_bad_inventory_file(tmp_path, capsys, content, needles):
    path = tmp_path / "inv.yaml"
    if content is not None:
        path.write_text(content)
    rc, out, err = run_cli(["--to", "580.95.05", "--inventory", str(path)], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for needle in needles:
        assert needle in err
