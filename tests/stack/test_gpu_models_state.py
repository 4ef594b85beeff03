"""Mixed fleets in the native stack: `gpuobs stack up --gpu-models` is checked before anything starts,
reaches the exporter's command line, and stack.json records each host's GPU model."""

from __future__ import annotations

import json

import pytest

from gpuobs.cli import run as cli_run
from gpuobs.stack import state as state_file
from gpuobs.stack.state import DEFAULT_GPU_MODEL, StackState, StackUrls
from gpuobs.stack.supervisor import StackConfig, StackError, check_config, fleet_parts, host_models


def test_host_models_follow_the_spec_and_training_nodes_are_h100():
    cfg = StackConfig(nodes=4, training_nodes=1, gpu_models="H100:2,L40S:1")
    assert host_models(cfg) == {"gpu-node-00": "NVIDIA H100 80GB HBM3", "gpu-node-01": "NVIDIA H100 80GB HBM3",
                                "gpu-node-02": "NVIDIA L40S", "gpu-node-03": "NVIDIA H100 80GB HBM3"}
    assert set(host_models(StackConfig(nodes=3, training_nodes=0)).values()) == {DEFAULT_GPU_MODEL}


@pytest.mark.parametrize("spec, fragment", [
    ("H100:2", "--gpu-models (GPUOBS_GPU_MODELS) 'H100:2': counts sum to 2, expected 3"),
    ("H100:2,B200:1", "unknown GPU model 'B200'; known: H100, L40S"),
])
def test_check_config_refuses_a_bad_spec_with_exit_2(tmp_path, spec, fragment):
    with pytest.raises(StackError) as err:
        check_config(StackConfig(run_dir=tmp_path / "run", nodes=4, training_nodes=1, gpu_models=spec))
    assert err.value.exit_code == 2 and fragment in str(err.value)


def test_cli_flag_error_is_one_line_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_run(["stack", "up", "--run-dir", str(run), "--nodes", "4", "--gpu-models", "H100:1,L40S:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpu-models" in err and "counts sum to 2, expected 3" in err
    assert not run.exists()
    assert cli_run(["stack", "up", "--check", "--run-dir", str(run), "--nodes", "4", "--gpu-models",
                    "H100:2,L40S:1"]) == 0


def test_the_exporter_gets_the_spec(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = StackConfig(run_dir=run, nodes=4, training_nodes=1, gpu_models="H100:2,L40S:1", logwatch=False)
    argv = fleet_parts(cfg, run, "http://127.0.0.1:1").specs["exporter"]
    assert argv[argv.index("--gpu-models") + 1] == "H100:2,L40S:1"
    plain = fleet_parts(StackConfig(run_dir=run, nodes=4, logwatch=False), run, "http://127.0.0.1:1").specs["exporter"]
    assert "--gpu-models" not in plain


def _state(run, **kw) -> StackState:
    urls = StackUrls(prometheus="http://p", alertmanager="http://a", pager="http://g", nodes=["http://n/metrics"] * 3)
    return StackState(run_dir=str(run), urls=urls, hostnames=["gpu-node-00", "gpu-node-01", "gpu-node-02"],
                      token_file=str(run / "admin-token"), nodes=3, training_nodes=1, **kw)


def test_stack_json_records_models_and_the_accessors_read_them(tmp_path):
    models = {"gpu-node-00": "NVIDIA H100 80GB HBM3", "gpu-node-01": "NVIDIA L40S", "gpu-node-02": DEFAULT_GPU_MODEL}
    state_file.save(_state(tmp_path, gpu_models=models))
    doc = json.loads((tmp_path / "stack.json").read_text())
    assert doc["gpu_models"] == models
    back = state_file.load(tmp_path)
    assert back.gpu_model("gpu-node-01") == "NVIDIA L40S"
    assert back.hosts_by_model() == {DEFAULT_GPU_MODEL: ["gpu-node-00", "gpu-node-02"], "NVIDIA L40S": ["gpu-node-01"]}
    with pytest.raises(KeyError, match="unknown host 'gpu-node-09'"):
        back.gpu_model("gpu-node-09")


def test_a_stack_json_without_models_reads_as_all_h100(tmp_path):
    state_file.save(_state(tmp_path))
    doc = json.loads((tmp_path / "stack.json").read_text())
    del doc["gpu_models"]
    (tmp_path / "stack.json").write_text(json.dumps(doc))
    back = state_file.load(tmp_path)
    assert back.gpu_models == {} and back.gpu_model("gpu-node-02") == DEFAULT_GPU_MODEL
