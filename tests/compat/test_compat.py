"""Compatibility gate: version parsing, GPU/engine lookup, rules and the ``compat check`` CLI."""

from __future__ import annotations

import argparse
import json

import pytest

from gpuobs.cli import run as cli_run
from gpuobs.cli.compat import register
from gpuobs.compat.gate import (
    COMPATIBLE,
    COMPATIBLE_WITH_WARNINGS,
    INCOMPATIBLE,
    check,
    forward_compat_eligible,
    resolve_engine,
)
from gpuobs.reference.compat import (
    CompatInputError,
    CudaVersion,
    lookup_cuda,
    parse_cuda,
    parse_driver,
    resolve_gpu,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-32GB"
B200 = "NVIDIA B200"
NOTES = "NVIDIA 13.2.2 release notes Table 3"
MATRIX = "NVIDIA architecture matrix"

# (id, driver, gpu, cuda, kwargs, verdict, failed rules, rules that must warn, source substring)
CASES = [
    ("at-toolkit-min", "550.54.14", H100, "12.4", {}, COMPATIBLE, [], [],
     f"cuda_driver_min.csv [CUDA 12.4 GA] {NOTES}"),
    ("at-toolkit-min-13.0.2", "580.95.05", H100, "13.0.2", {}, COMPATIBLE, [], [], "[CUDA 13.0 Update 2]"),
    ("at-12x-floor", "525.60.13", "NVIDIA L4", "12.0", {}, COMPATIBLE, [], [], "[CUDA 12.0 GA]"),
    ("patch-below-toolkit-min", "550.54.13", H100, "12.4", {}, COMPATIBLE_WITH_WARNINGS, [],
     ["toolkit-min-driver", "ptx-jit"], f"[CUDA 12.4 GA] {NOTES}"),
    ("patch-below-with-ptx-jit", "550.54.13", H100, "12.4", {"ptx_jit": True}, INCOMPATIBLE, ["ptx-jit"],
     ["toolkit-min-driver"], f"[CUDA 12.4 GA] {NOTES}"),
    ("patch-below-12x-floor", "525.60.12", "NVIDIA L4", "12.0", {}, INCOMPATIBLE,
     ["toolkit-min-driver", "minor-version-compat", "forward-compat"], [], "[CUDA 12.0 GA]"),
    ("11x-on-12x-era-driver", "535.104.05", A100, "11.8", {}, COMPATIBLE, [], [], "[CUDA 11.8 GA]"),
    ("11.4-on-12x-era-driver", "535.104.05", A100, "11.4.4", {}, COMPATIBLE, [], [], "[CUDA 11.4 Update 4]"),
    ("12x-via-mvc", "535.104.05", H100, "12.4", {}, COMPATIBLE_WITH_WARNINGS, [],
     ["toolkit-min-driver", "ptx-jit"], "[CUDA 12.4 GA]"),
    ("13x-on-570", "570.124.06", H100, "13.0", {}, INCOMPATIBLE,
     ["toolkit-min-driver", "minor-version-compat", "forward-compat"], [], "[CUDA 13.0 GA]"),
    ("13x-on-570-cuda-compat", "570.124.06", H100, "13.0", {"cuda_compat": True}, COMPATIBLE_WITH_WARNINGS, [],
     ["toolkit-min-driver", "minor-version-compat", "forward-compat"], "gpuobs/reference/data/README.md driver branches"),
    ("13x-on-570-cuda-compat-ptx", "570.124.06", H100, "13.0", {"cuda_compat": True, "ptx_jit": True},
     COMPATIBLE_WITH_WARNINGS, [], ["forward-compat"], "[CUDA 13.0 GA]"),
    ("13x-on-570-cuda-compat-geforce", "570.124.06", "NVIDIA GeForce RTX 4090", "13.0", {"cuda_compat": True},
     INCOMPATIBLE, ["toolkit-min-driver", "minor-version-compat", "forward-compat"], [], MATRIX),
    ("13x-on-R550-cuda-compat", "550.54.15", H100, "13.0", {"cuda_compat": True}, INCOMPATIBLE,
     ["toolkit-min-driver", "minor-version-compat", "forward-compat"], [], "[CUDA 13.0 GA]"),
    ("13x-cuda-compat-sm86-unknown-class", "570.124.06", "sm_86", "13.0", {"cuda_compat": True}, INCOMPATIBLE,
     ["toolkit-min-driver", "minor-version-compat", "forward-compat"], [], "[A10 / A40 / A16 / A2"),
    ("v100-cuda13", "580.95.05", V100, "13.0", {}, INCOMPATIBLE, ["gpu-arch"], [], "vllm PR #39878"),
    ("v100-cuda12.9", "580.95.05", V100, "12.9", {}, COMPATIBLE, [], [], "[Tesla V100 / V100S]"),
    ("v100-driver-R595", "595.45.04", V100, "12.4", {}, INCOMPATIBLE, ["gpu-driver-branch"], [], MATRIX),
    ("b200-cuda12.6", "570.124.06", B200, "12.6", {}, INCOMPATIBLE, ["gpu-arch"], [],
     f"gpu_compute_capability.csv [B200 / B100 / GB200] {MATRIX}"),
    ("b200-cuda12.8", "570.124.06", B200, "12.8", {}, COMPATIBLE, [], [], "[CUDA 12.8 GA]"),
    ("b200-driver-R535", "535.104.05", B200, "12.8", {}, INCOMPATIBLE, ["gpu-driver-branch"],
     ["toolkit-min-driver"], "[B200 / B100 / GB200]"),
    ("k80-cuda12-on-R470", "470.82.01", "Tesla K80", "12.0", {}, INCOMPATIBLE,
     ["gpu-arch", "toolkit-min-driver", "minor-version-compat", "forward-compat"], [], "[Tesla K80 / K40]"),
    ("k80-R535", "535.104.05", "Tesla K80", "11.8", {}, INCOMPATIBLE, ["gpu-driver-branch"], [], "[Tesla K80 / K40]"),
    ("sm90-form", "550.54.15", "sm_90", "12.4.1", {}, COMPATIBLE, [], [], "[CUDA 12.4 Update 1]"),
    ("cc-form", "550.54.15", "9.0", "12.4", {}, COMPATIBLE, [], [], MATRIX),
    ("provisional-13.3", "610.43.02", H100, "13.3", {}, COMPATIBLE_WITH_WARNINGS, [], ["data-provenance"],
     "third-party copy of CUDA 13.3 release notes"),
    ("vllm-0.6.3-cu121", "535.104.05", H100, "12.1", {"engine": "vllm==0.6.3"}, COMPATIBLE, [], [],
     "engine_requirements.csv [vllm <=0.6.3.x] https://docs.vllm.ai/en/v0.6.3"),
    ("vllm-0.6.3-cu124-not-built", "550.54.15", H100, "12.4", {"engine": "vllm==0.6.3"}, COMPATIBLE_WITH_WARNINGS,
     [], ["engine-build"], "[vllm <=0.6.3.x]"),
    ("vllm-0.6.3-cuda13", "580.95.05", H100, "13.0", {"engine": "vllm==0.6.3"}, INCOMPATIBLE, ["engine-build"], [],
     "[vllm <=0.6.3.x]"),
    ("vllm-0.8.5-via-torch-pin", "550.54.15", H100, "12.4", {"engine": "vllm==0.8.5"}, COMPATIBLE, [], [],
     "[pytorch 2.6] pytorch RELEASE.md matrix"),
    ("pytorch-2.7-cu128-experimental", "570.124.06", B200, "12.8", {"engine": "pytorch==2.7"},
     COMPATIBLE_WITH_WARNINGS, [], ["engine-build"], "[pytorch 2.7]"),
    ("tensorrt-dropped-11x", "535.104.05", A100, "11.8", {"engine": "tensorrt==10.13.2"}, INCOMPATIBLE,
     ["engine-build"], [], "TensorRT 10.13.2 release notes"),
    ("trtllm-1.2.0rc6-cu130", "580.95.05", H100, "13.0", {"engine": "tensorrt-llm==1.2.0rc6"}, COMPATIBLE, [], [],
     "NVIDIA/TensorRT-LLM PR #11224"),
]


@pytest.mark.parametrize(("driver", "gpu", "cuda", "kwargs", "verdict", "failed", "warned", "source"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_table(driver, gpu, cuda, kwargs, verdict, failed, warned, source):
    v = check(driver, gpu, cuda, **kwargs)
    assert v.verdict == verdict
    assert v.failed() == failed
    statuses = {r.rule: r.status for r in v.rules}
    for rule in warned:
        assert statuses[rule] == "warn", (rule, v.rules)
    assert any(source in r.source for r in v.rules), [r.source for r in v.rules]
    assert v.exit_code == (1 if verdict == INCOMPATIBLE else 0)
    assert all(r.source and r.message for r in v.rules)


def test_every_core_rule_is_reported_once():
    v = check("550.54.15", H100, "12.4", engine="vllm==0.6.3")
    assert [r.rule for r in v.rules] == ["gpu-arch", "gpu-driver-branch", "toolkit-min-driver",
                                         "minor-version-compat", "ptx-jit", "forward-compat", "engine-build"]


def test_messages_carry_the_numbers():
    v = check("570.124.06", H100, "13.0")
    msgs = {r.rule: r.message for r in v.rules}
    assert "580.65.06" in msgs["toolkit-min-driver"]
    assert ">= 580" in msgs["minor-version-compat"]
    assert "--cuda-compat" in msgs["forward-compat"]
    assert "R570 PB" in msgs["forward-compat"]


@pytest.mark.parametrize(("text", "parts"), [
    ("535.104.05", (535, 104, 5)), ("580.95.05", (580, 95, 5)), ("525.60.13", (525, 60, 13)),
    ("570.26", (570, 26, 0)), (" 550.54.15 ", (550, 54, 15)),
])
def test_parse_driver_ok(text, parts):
    assert parse_driver(text).parts == parts


@pytest.mark.parametrize("text", ["535", "535.104.05.1", "r535.104", "535.104.x", "53.104.05", "", "535..05", None])
def test_parse_driver_rejects(text):
    with pytest.raises(CompatInputError) as err:
        parse_driver(text)
    assert "--driver" in str(err.value) and "535.104.05" in str(err.value)


def test_driver_ordering_is_numeric():
    assert parse_driver("570.26") < parse_driver("570.124.06")
    assert parse_driver("570.26") == parse_driver("570.26.0")


@pytest.mark.parametrize(("text", "want"), [("12.4", CudaVersion(12, 4)), ("12.4.1", CudaVersion(12, 4, 1)),
                                           ("11.8", CudaVersion(11, 8))])
def test_parse_cuda_ok(text, want):
    assert parse_cuda(text) == want


@pytest.mark.parametrize("text", ["12", "cu124", "12.4.x", "v12.4", "12.4.1.1", "twelve"])
def test_parse_cuda_rejects(text):
    with pytest.raises(CompatInputError, match="--cuda"):
        parse_cuda(text)


def test_cuda_lookup_reads_short_form_as_ga_and_never_rounds():
    assert lookup_cuda(parse_cuda("12.4")).release == "CUDA 12.4 GA"
    assert lookup_cuda(parse_cuda("13.4.1")).release.startswith("CUDA 13.4")
    with pytest.raises(CompatInputError, match="12.4.1, 12.4.0"):
        lookup_cuda(parse_cuda("12.4.9"))


@pytest.mark.parametrize(("name", "arch", "dc"), [
    (H100, "Hopper", True), ("NVIDIA H200", "Hopper", True), ("nvidia   h100-pcie", "Hopper", True),
    (A100, "Ampere", True), ("NVIDIA A100 80GB PCIe", "Ampere", True), (V100, "Volta", True),
    ("Tesla V100S-PCIE-32GB", "Volta", True), (B200, "Blackwell", True), ("NVIDIA L4", "Ada Lovelace", True),
    ("NVIDIA L40S", "Ada Lovelace", True), ("NVIDIA A10", "Ampere (GA10x)", True), ("Tesla T4", "Turing", True),
    ("NVIDIA GeForce RTX 4090", "Ada Lovelace", False), ("NVIDIA RTX 6000 Ada Generation", "Ada Lovelace", False),
    ("Quadro RTX 6000", "Turing", False), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "Blackwell (GB20x)", True),
    ("sm_90", "Hopper", True), ("sm_100", "Blackwell", True), ("SM_89", "Ada Lovelace", None),
    ("9.0", "Hopper", True), ("12.1", "Blackwell (GB10)", False), ("hopper", "Hopper", True),
])
def test_resolve_gpu(name, arch, dc):
    gpu = resolve_gpu(name)
    assert gpu.row.architecture == arch
    assert gpu.data_center is dc


@pytest.mark.parametrize(("name", "problem"), [
    ("NVIDIA A10G", "unknown GPU"), ("NVIDIA H999", "unknown GPU"), ("sm_72", "sm target sm_72"),
    ("7.2", "compute capability 7.2"), ("Ampere", "ambiguous"), ("Blackwell", "ambiguous"), ("", "unknown GPU"),
])
def test_resolve_gpu_never_guesses(name, problem):
    with pytest.raises(CompatInputError) as err:
        resolve_gpu(name)
    assert problem in str(err.value)
    assert "NVIDIA H100 80GB HBM3" in err.value.accepted and "sm_90" in err.value.accepted


@pytest.mark.parametrize(("text", "row"), [
    ("vllm==0.6.3", "<=0.6.3.x"), ("vllm==0.6.3.post1", "<=0.6.3.x"), ("vllm==0.7.2", "0.6.4-0.7.x"),
    ("vllm==0.9.2", "0.9.x"), ("vllm==0.10.1.1", "0.10.0-0.10.1"), ("pytorch==2.7", "2.7"), ("torch==2.7.1", "2.7"),
    ("tensorrt-llm==1.2.0rc6", "1.2.0rc6"), ("trtllm==1.2.1", "1.2.x (docs 'latest' at crawl)"),
    ("vllm==main", "main (snapshot)"), ("triton-trtllm-backend==25.06", "NGC 25.06 base"),
])
def test_resolve_engine(text, row):
    assert resolve_engine(text).row.version_spec == row


@pytest.mark.parametrize(("text", "problem"), [
    ("sglang==0.4.0", "unknown engine"), ("vllm==0.8.0", "no vllm release 0.8.0"),
    ("vllm 0.6.3", "not ENGINE==VERSION"),
    ("torch==2.7.1+cu126", "not ENGINE==VERSION"), ("pytorch==2.3", "no pytorch release"),
])
def test_resolve_engine_rejects(text, problem):
    with pytest.raises(CompatInputError) as err:
        resolve_engine(text)
    assert problem in str(err.value)


def test_forward_compat_needs_ltsb_or_pb():
    h100 = resolve_gpu(H100)
    assert forward_compat_eligible(h100, parse_driver("535.104.05"))[0]
    ok, why = forward_compat_eligible(h100, parse_driver("610.43.02"))
    assert not ok and "NFB" in why
    ok, why = forward_compat_eligible(resolve_gpu("NVIDIA GeForce RTX 4090"), parse_driver("570.124.06"))
    assert not ok and "not a data-center GPU" in why


# ---- CLI through register() --------------------------------------------------------------------

def run_cli(argv, capsys):
    rc = cli_run(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_check_text(capsys):
    rc, out, err = run_cli(["compat", "check", "--driver", "580.95.05", "--gpu", V100, "--cuda", "13.0"], capsys)
    assert rc == 1 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("INCOMPATIBLE: CUDA 13.0 (CUDA 13.0 GA) on driver 580.95.05")
    assert any(ln.strip().startswith("FAIL gpu-arch:") and "[source: gpu_compute_capability.csv [Tesla V100" in ln
               for ln in lines)
    assert len(lines) == 1 + 6


def test_cli_check_json(capsys):
    rc, out, _ = run_cli(["compat", "check", "--driver", "570.124.06", "--gpu", H100, "--cuda", "13.0",
                          "--cuda-compat", "--engine", "tensorrt-llm==1.2.0rc6", "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["verdict"] == COMPATIBLE_WITH_WARNINGS and doc["exit_code"] == 0
    rules = {r["rule"]: r for r in doc["rules"]}
    assert set(rules["forward-compat"]) == {"rule", "status", "message", "source"}
    assert rules["forward-compat"]["status"] == "warn"
    assert rules["engine-build"]["status"] == "pass"
    assert "NVIDIA/TensorRT-LLM PR #11224" in rules["engine-build"]["source"]


@pytest.mark.parametrize(("argv", "needles"), [
    (["--driver", "535.104", "--gpu", H100, "--cuda", "12.4x"], ["--cuda", "12.4x", "12.4.1"]),
    (["--driver", "535", "--gpu", H100, "--cuda", "12.4"], ["--driver", "'535'", "535.104.05"]),
    (["--driver", "535.104.05.7", "--gpu", H100, "--cuda", "12.4"], ["--driver", "535.104.05.7"]),
    (["--driver", "535.104.05", "--gpu", "NVIDIA A10G", "--cuda", "12.4"], ["--gpu", "A10G", "unknown GPU", "sm_90"]),
    (["--driver", "535.104.05", "--gpu", "sm_72", "--cuda", "12.4"], ["--gpu", "sm_72"]),
    (["--driver", "535.104.05", "--gpu", H100, "--cuda", "12.4", "--engine", "sglang==0.4.0"],
     ["--engine", "sglang", "unknown engine", "vllm==0.6.3"]),
    (["--driver", "535.104.05", "--gpu", H100, "--cuda", "12.4", "--engine", "vllm==0.8.0"],
     ["--engine", "0.8.0", "0.8.5"]),
    (["--driver", "535.104.05", "--gpu", H100, "--cuda", "12.10"], ["--cuda", "12.10", "no CUDA 12.10 release"]),
])
def test_cli_bad_input_exits_2_with_one_line(argv, needles, capsys):
    rc, out, err = run_cli(["compat", "check", *argv], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("gpuobs compat: error: check: invalid ")
    for needle in needles:
        assert needle in err


def test_cli_requires_a_subcommand(capsys):
    parser = argparse.ArgumentParser(prog="gpuobs")
    register(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["compat"])
    assert exc.value.code == 2
