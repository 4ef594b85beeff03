"""``GPUOBS_*`` variables are checked like the flags they default (one line naming the variable, the flag
and what is allowed, exit 2, nothing written), and a subcommand's unknown argument is that subcommand's
usage error, not the top level's (issue 29)."""

from __future__ import annotations

import pytest
import yaml

from gpuobs.cli import run as cli_run

#: (variable, bad value, what the error must list as allowed)
STACK_UP = [
    ("GPUOBS_NODES", "abc", "1..256"),
    ("GPUOBS_GPUS", "0", "1..16"),
    ("GPUOBS_PROMETHEUS_PORT", "70000", "1..65535"),
    ("GPUOBS_ALERTMANAGER_PORT", "x", "1..65535"),
    ("GPUOBS_PAGER_PORT", "-1", "1..65535"),
    ("GPUOBS_REMEDIATE_PORT", "9o98", "1..65535"),
    ("GPUOBS_BASE_PORT", "0", "1..65535"),
    ("GPUOBS_ENGINE_BASE_PORT", "80.5", "1..65535"),
    ("GPUOBS_GRAFANA_PORT", "", "1..65535"),
    ("GPUOBS_RATE", "-1", "positive number"),
    ("GPUOBS_TRAINING_NODES", "many", "0..255"),
    ("GPUOBS_HA_BASE_PORT", "-5", "0..65535"),
    ("GPUOBS_PROFILE", "fast", "default, drill"),
    ("GPUOBS_TOPOLOGY", "mesh", "single, ha"),
    ("GPUOBS_LOG_LEVEL", "loud", "debug, info, warning, error"),
    ("GPUOBS_REMEDIATE", "bogus", "off, observe, dry-run, enforce"),
    ("GPUOBS_EXPORTER_PROFILE", "full", "stock, helm, recommended"),
    ("GPUOBS_HOST_LABEL_MODE", "fqdn", "Hostname, hostname, localhost, pod, none"),
    ("GPUOBS_SCRAPE_MODE", "podmonitor", "file_sd, servicemonitor"),
    ("GPUOBS_GPU_MODELS", "A100:3", "H100, L40S"),
    ("GPUOBS_GPU_MODELS", "H100:1", "expected 3"),
]

#: (variable, bad value, argv, what the error must say is allowed)
OTHERS = [
    ("GPUOBS_CANARY_PORT", "x", ["canary", "serve"], "integer"),
    ("GPUOBS_CANARY_LOOK_DEADLINE", "soon", ["canary", "serve", "--port", "0"], "30s, 5m"),
    ("GPUOBS_PROMETHEUS_URL", "prometheus:9090", ["canary", "analyze", "--canary", 'track="c"', "--baseline",
                                                  'track="b"'], "http:// or https://"),
    ("GPUOBS_PROMETHEUS_URL", "prometheus:9090", ["remediate", "serve", "--no-auth"], "http:// or https://"),
    ("GPUOBS_PAGER_URL", "garbage", ["incident", "list"], "http:// or https://"),
    ("GPUOBS_ALERTMANAGER_URL", "garbage", ["incident", "silences"], "http:// or https://"),
    ("GPUOBS_LOG_LEVEL", "loud", ["doctor", "--prometheus", "http://127.0.0.1:1"], "debug, info, warning, error"),
]


def _one_line(err: str) -> None:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    for raw in ("Traceback", "usage:", "HTTPConnectionPool", "Invalid URL"):
        assert raw not in err, err


@pytest.mark.parametrize("var,value,allowed", STACK_UP, ids=[f"{v[0]}={v[1]}" for v in STACK_UP])
def test_a_bad_stack_variable_is_one_line_and_nothing_is_written(var, value, allowed, tmp_path, monkeypatch,
                                                                 capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, value)
    run_dir = tmp_path / "run"
    assert cli_run(["stack", "up", "--run-dir", str(run_dir)]) == 2
    out = capsys.readouterr()
    _one_line(out.err)
    assert var in out.err and allowed in out.err and repr(value) in out.err, out.err
    assert out.out == "" and not run_dir.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("var,value,argv,allowed", OTHERS, ids=[f"{v[0]}-{v[2][0]}-{v[2][1]}" for v in OTHERS])
def test_a_bad_variable_of_other_commands_is_one_line(var, value, argv, allowed, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, value)
    monkeypatch.setenv("GPUOBS_RUN_DIR", str(tmp_path / "run"))
    assert cli_run(argv) == 2
    err = capsys.readouterr().err
    _one_line(err)
    assert var in err and allowed in err, err
    assert not (tmp_path / "run").exists()


def test_a_good_variable_is_used_like_its_flag(monkeypatch):
    from gpuobs.cli import build_parser

    monkeypatch.setenv("GPUOBS_NODES", "7")
    monkeypatch.setenv("GPUOBS_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("GPUOBS_PROFILE", "drill")
    monkeypatch.setenv("GPUOBS_RUNBOOK_BASE", "http://runbooks.example")
    args = build_parser().parse_args(["stack", "up"])
    assert (args.nodes, args.log_level, args.profile) == (7, "debug", "drill")
    # a plain str once parsed: it ends up in YAML configs, which refuse str subclasses
    assert type(args.runbook_base) is str and type(args.profile) is str
    yaml.safe_dump({"runbook_base": args.runbook_base})
    assert build_parser().parse_args(["stack", "up", "--nodes", "3"]).nodes == 3  # the flag wins


@pytest.mark.parametrize("argv,prog", [
    (["drill", "xid", "--bogus"], "gpuobs drill"),
    (["stack", "up", "--bogus"], "gpuobs stack"),
    (["incident", "list", "--bogus", "x"], "gpuobs incident list"),
    (["fault", "inject", "--node", "0", "xid", "--code", "48", "--bogus"], "gpuobs fault inject xid"),
    (["canary", "analyze", "--canary", 'a="b"', "--baseline", 'a="c"', "extra"], "gpuobs canary analyze"),
])
def test_an_unknown_argument_is_the_subcommands_usage_error(argv, prog, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_run(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: {prog} " in err and f"{prog}: error: unrecognized arguments: " in err, err
    assert "gpuobs: error" not in err and "usage: gpuobs [-h]" not in err
