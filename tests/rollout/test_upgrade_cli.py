"""``gpuobs upgrade run``'s usage errors over real simulated nodes (an H100 and an L40S behind their
admin API): each is one ``error:`` line naming the flag, exit 2, no plan printed, no record written."""

from __future__ import annotations

import json
import threading

import pytest

from gpuobs.cli import run
from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim.gpu import L40S
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.rollout.driver import parse_batches
from gpuobs.rollout.model import UsageError, parse_stages
from gpuobs.stack.render import write_targets
from tests.conftest import TOKEN
from tests.fakes.driver_fleet import mixed_models


@pytest.fixture
def mixed_run(tmp_path):
    """A run dir whose stack.json points at three H100 and one L40S serving node (real admin APIs)."""
    nodes = [Node(NodeConfig(index=i, gpus=2, seed=i, model=L40S if i == 3 else NodeConfig.model)) for i in range(4)]
    servers = []
    for node in nodes:
        srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node))
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
    hosts = [n.hostname for n in nodes]
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    stack = {"run_dir": str(tmp_path), "nodes": 4, "training_nodes": 0, "hostnames": hosts,
             "token_file": str(tmp_path / "admin-token"), "components": {"exporter": {"pid": 1, "argv": ["x"]}},
             "gpu_models": {n.hostname: n.cfg.model.name for n in nodes},
             "urls": {"prometheus": "http://127.0.0.1:9", "alertmanager": "http://127.0.0.1:9",
                      "pager": "http://127.0.0.1:9",
                      "nodes": [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in servers]}}
    (tmp_path / "stack.json").write_text(json.dumps(stack))
    write_targets(tmp_path, "dcgm", [(h, 9400 + i, {}) for i, h in enumerate(hosts)])
    try:
        yield tmp_path, nodes
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


def _usage(capsys, run_dir, *argv):
    rc = run(["upgrade", "run", "--run-dir", str(run_dir), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv,needle", [
    (["--driver", "999.99.99"], "--driver: unknown driver version '999.99.99'; known: 550.54.15, 570.172.08"),
    (["--driver", " 570.172.08"], "--driver: unknown driver version ' 570.172.08'"),
    (["--driver", "550.54.15"], "--driver: every serving node already runs driver 550.54.15"),
    (["--driver", "570.172.08", "--batch-timeout", "xyz"], "--batch-timeout: 'xyz' is not valid"),
    (["--driver", "570.172.08", "--batches", "inf%"], "--batches: 'inf%' is not a node count"),
    (["--driver", "570.172.08", "--fleet", "/nonexistent/fleet.yaml"], "--fleet"),
    (["--driver", "570.172.08", "--config", "/nonexistent/metrics.yaml"], "--config: '/nonexistent/metrics.yaml'"),
    (["--driver", "570.172.08", "--prometheus", "notaurl"], "--prometheus: Prometheus URL must start with http"),
    (["--driver", "570.172.08", "--exclude", "gpu-node-09"],
     "--exclude: 'gpu-node-09' is not a serving node; serving nodes: gpu-node-00, gpu-node-01, gpu-node-02, "
     "gpu-node-03"),
    (["--driver", "570.172.08", "--exclude", "gpu-node-00,gpu-node-01,gpu-node-02,gpu-node-03"],
     "--exclude leaves no serving node to upgrade"),
])
def test_run_usage_errors_are_one_line_exit_2_and_write_nothing(mixed_run, capsys, argv, needle):
    run_dir, nodes = mixed_run
    rc, out, err = _usage(capsys, run_dir, *argv)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "upgrade plan" not in out and "Traceback" not in err
    assert not (run_dir / "upgrade.sqlite").exists()
    assert all(not n.cordons and n.installed_driver == "550.54.15" for n in nodes)


def test_the_default_batches_fit_a_small_mixed_fleet():
    # canary (2 nodes: one per model) then 25% of 4 = 1 node: the share falls inside the canary batch
    hosts, counts = parse_batches("canary,25%,50%,100%", mixed_models(3, 1))
    assert counts == [2, 4] and hosts[0] == "gpu-node-03"
    with pytest.raises(UsageError, match="below the previous stage"):  # explicit counts still must not decrease
        parse_batches("3,2", mixed_models(3, 1))


@pytest.mark.parametrize("text", ["inf%", "1e400%", "-inf%", "nan%"])
def test_parse_stages_rejects_non_finite_shares(text):
    with pytest.raises(UsageError, match="not a node count"):
        parse_stages(text, 4)


def test_the_driver_is_checked_against_the_stacks_own_driver_catalogue(mixed_run, capsys):
    run_dir, nodes = mixed_run
    cat = run_dir / "drivers.yaml"
    cat.write_text('default: "550.54.15"\ndrivers:\n  "550.54.15": {cuda: "12.4"}\n  "570.172.08": {cuda: "12.8"}\n')
    doc = json.loads((run_dir / "stack.json").read_text())
    (run_dir / "stack.json").write_text(json.dumps({**doc, "drivers_file": str(cat)}))
    rc, out, err = _usage(capsys, run_dir, "--driver", "570.195.03")
    assert rc == 2 and "--driver: unknown driver version '570.195.03'; known: 550.54.15, 570.172.08\n" in err


def _driver_fleet(run_dir):
    from gpuobs.rollout.adapters.drivers import StackDriverFleet
    from gpuobs.stack.state import StackState

    return StackDriverFleet(StackState.from_dict(json.loads((run_dir / "stack.json").read_text())), reload_s=0.0,
                            poll_s=0.02, drain_timeout_s=30.0, reload_timeout_s=30.0)


@pytest.mark.parametrize("by,reason", [("gpuobs", "remediation: quarantine (Xid 79 on GPU 1)"),
                                       ("human", "disk check")])
def test_a_node_held_by_someone_else_mid_procedure_is_not_returned_to_service(mixed_run, by, reason):
    from gpuobs.rollout.interfaces import FleetError

    run_dir, nodes = mixed_run
    fleet = _driver_fleet(run_dir)
    fleet.sleep = lambda s: [n.advance(5.0) for n in nodes]  # simulated time: the drain completes
    real = fleet._action
    held = nodes[0]

    def action(host, name, **params):  # the remediation controller (or a person) cordons during the install
        out = real(host, name, **params)
        if host == held.hostname and name == "install-driver":
            held.cordon(by, reason)
        return out

    fleet._action = action
    with pytest.raises(FleetError, match=f"{held.hostname} .*not returned to service"):
        fleet.upgrade([held.hostname, nodes[3].hostname], "570.172.08")
    assert held.cordons and by in held.cordons and held.cordon_reason == reason  # still held
    assert held.installed_driver == "570.172.08"
    assert not nodes[3].cordons and nodes[3].installed_driver == "570.172.08"  # the other node is back


@pytest.mark.parametrize("target", ["570.172.08", "575.57.08"])
def test_a_node_left_mid_reload_by_a_killed_controller_is_completed_without_a_second_install(mixed_run, target):
    # the killed controller had cordoned, drained and started the install of 570.172.08; its reload is
    # still running when the procedure is run again: to the same driver (resume) or another (rollback)
    run_dir, nodes = mixed_run
    node = nodes[0]  # an H100: 575.57.08 passes its health check
    node.cordon("gpuobs", "driver upgrade to 570.172.08")
    node.drain("driver upgrade to 570.172.08")
    for _ in range(100):
        node.advance(1.0)
    node.install_driver("570.172.08", reload_s=20.0)
    assert node.status()["reloading_driver"]
    fleet = _driver_fleet(run_dir)
    fleet.sleep = lambda s: node.advance(5.0)
    res = fleet.upgrade([node.hostname], target)[node.hostname]
    assert not res.failures and node.installed_driver == target and not node.cordons
    loads = [line for line in node.kernel_log if "NVRM: loading" in line]
    assert [line.split("Module  ")[1].split()[0] for line in loads] == list(dict.fromkeys(["570.172.08", target]))
    assert res.installed == (target != "570.172.08")  # the killed controller's install is not made again


@pytest.mark.parametrize("cmd", [["status"], ["abort"], ["resume"], ["pause", "--reason", "x"],
                                 ["promote", "--reason", "x"]])
def test_an_unknown_id_names_the_flag_and_the_kind(tmp_path, capsys, cmd):
    from gpuobs.rollout.store import RolloutStore

    RolloutStore(tmp_path / "upgrade.sqlite").close()
    rc = run(["upgrade", *cmd, "--run-dir", str(tmp_path), "--id", "nope"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().splitlines() == [
        f"gpuobs upgrade: error: --id: no driver upgrade 'nope' in {tmp_path / 'upgrade.sqlite'}"], err


def test_exclude_leaves_a_node_out_of_every_batch_and_the_baseline(mixed_run, capsys):
    """`--exclude` is how a node an operator holds is left out (the procedure refuses to touch it and
    says so): the plan has no batch with it and says it is left out."""
    from gpuobs.cli import build_parser
    from gpuobs.cli.upgrade import _plan

    run_dir, nodes = mixed_run
    args = build_parser().parse_args(["upgrade", "run", "--run-dir", str(run_dir), "--driver", "570.172.08",
                                      "--exclude", " gpu-node-01 ", "--batches", "canary,100%"])
    spec = _plan(args, 15.0)
    out = capsys.readouterr().out
    assert "gpu-node-01" not in spec.hosts and set(spec.hosts) == {"gpu-node-00", "gpu-node-02", "gpu-node-03"}
    assert spec.stages[-1] == 3
    assert out.strip().endswith("; left out (--exclude): gpu-node-01"), out
    assert all(not n.cordons for n in nodes)


def test_a_node_an_operator_cordoned_is_refused_at_the_plan_and_can_be_left_out(mixed_run, capsys):
    """An operator's cordon wins: the upgrade does not start (exit 2, one line naming the node, its
    reason and the --exclude that leaves it out, nothing recorded, nothing cordoned by gpuobs)
    rather than abort at that node's batch; with --exclude the plan goes ahead without it."""
    from gpuobs.cli import build_parser
    from gpuobs.cli.upgrade import _plan

    run_dir, nodes = mixed_run
    nodes[1].cordon("human", "RMA ticket 7")
    rc, out, err = _usage(capsys, run_dir, "--driver", "570.172.08")
    assert rc == 2 and "upgrade plan" not in out
    assert err.strip().splitlines() == [
        "gpuobs upgrade: error: gpu-node-01 is cordoned by an operator (RMA ticket 7): uncordon or leave out "
        "(--exclude gpu-node-01)"], err
    assert not (run_dir / "upgrade.sqlite").exists()
    assert all("gpuobs" not in n.cordons for n in nodes) and "human" in nodes[1].cordons
    args = build_parser().parse_args(["upgrade", "run", "--run-dir", str(run_dir), "--driver", "570.172.08",
                                      "--exclude", "gpu-node-01"])
    assert "gpu-node-01" not in _plan(args, 15.0).hosts
