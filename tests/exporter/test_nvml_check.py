"""The device check's comparison logic, fed a fake-NVML page and fake nvidia-smi output; and the
whole check end to end with a fake ``pynvml`` and a fake ``nvidia-smi`` on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuobs.exporter.exposition import render
from gpuobs.exporter.nvml import check as nvml_check
from gpuobs.exporter.nvml.source import NvmlCollector
from tests.fakes import pynvml as fake

REPO = Path(__file__).resolve().parents[2]
UUID0 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
UUID1 = "GPU-0a1b2c3d-0000-4000-8000-000000000002"
# What nvidia-smi would print for the fake GPUs (readings taken a moment apart, inside the tolerances).
SMI_OK = (f"0, {UUID0}, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 550.54.15, 49, 380.12, 1965, 2619, 85, "
          "40010, 41013, 81559\n"
          f"1, {UUID1}, 00000000:2A:00.0, NVIDIA H100 80GB HBM3, 550.54.15, 39, 70.00, 360, 2619, 0, 1, 81023, 81559\n")


def fake_page() -> str:
    mod, _ = fake.make_fake_pynvml()
    return render(NvmlCollector(mod, hostname="h").collect())


def results(rows: list[nvml_check.Row]) -> dict[tuple[str, str], bool]:
    return {(r.gpu, r.field): r.ok for r in rows}


def test_matching_gpus_pass_every_check():
    rows = nvml_check.compare(SMI_OK, fake_page())
    assert all(r.ok for r in rows), nvml_check.table(rows)
    res = results(rows)
    for gpu in ("0", "1"):
        for field in ("UUID", "pci_bus_id", "modelName", "DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_GPU_TEMP",
                      "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
                      "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "FB_USED+FREE+RESERVED"):
            assert (gpu, field) in res
    assert res[("-", "gpuobs_exporter_collector_success")]


@pytest.mark.parametrize("column,bad,field", [
    (5, "51", "DCGM_FI_DEV_GPU_TEMP"),          # 47 C on the page: 4 C off, tolerance 3
    (6, "420.00", "DCGM_FI_DEV_POWER_USAGE"),   # 351.2 W: 16.4 % off, tolerance 15 %
    (7, "2230", "DCGM_FI_DEV_SM_CLOCK"),        # 1980 MHz: 11.2 % off, tolerance 10 %
    (10, "42500", "DCGM_FI_DEV_FB_USED"),       # 40000 MiB: 5.9 % off, tolerance 5 %
    (2, "00000000:19:00.0", "pci_bus_id"),
    (3, "NVIDIA H200", "modelName"),
    (4, "550.54.14", "DCGM_FI_DRIVER_VERSION"),
    (6, "[N/A]", "DCGM_FI_DEV_POWER_USAGE"),    # one side has a value, the other not
])
def test_each_mismatch_is_caught(column, bad, field):
    lines = SMI_OK.splitlines()
    cells = lines[0].split(", ")
    cells[column] = bad
    smi = "\n".join([", ".join(cells)] + lines[1:]) + "\n"
    rows = nvml_check.compare(smi, fake_page())
    assert [(r.gpu, r.field) for r in rows if not r.ok] == [("0", field)]
    assert "MISMATCH" in nvml_check.table(rows)


def test_gpu_missing_from_page_and_bad_csv():
    smi = SMI_OK + "2, GPU-ffffffff-0000-4000-8000-000000000009, 00000000:3B:00.0, NVIDIA H100 80GB HBM3, " \
                   "550.54.15, 40, 70.0, 345, 2619, 0, 0, 81023, 81559\n"
    rows = nvml_check.compare(smi, fake_page())
    assert [(r.gpu, r.field) for r in rows if not r.ok] == [("2", "present")]
    rows = nvml_check.compare(SMI_OK.splitlines()[0] + "\n", fake_page())
    assert [(r.gpu, r.field, r.page) for r in rows if not r.ok] == [("?", "present", UUID1)]
    with pytest.raises(ValueError):
        nvml_check.parse_smi("0, GPU-x, 00000000:18:00.0\n")


def test_coverage_lists_fields_not_supported_per_gpu():
    text = nvml_check.coverage(fake_page())
    gpu1 = next(ln for ln in text.splitlines() if ln.startswith("gpu 1:"))
    assert "DCGM_FI_DEV_MEMORY_TEMP" in gpu1 and "DCGM_FI_DEV_ENC_UTIL" in gpu1
    assert "gpuobs_exporter_collector_success" in text


def test_parse_page_keeps_label_order_and_unescapes():
    samples = nvml_check.parse_page('m{b="x\\"y",a="1\\\\2\\nz"} 3.500000\nplain 7\n')
    assert samples == [("m", {"b": 'x"y', "a": "1\\2\nz"}, "3.500000"), ("plain", {}, "7")]
    assert list(samples[0][1]) == ["b", "a"]


def _fake_environment(tmp_path: Path, smi_csv: str | None) -> dict[str, str]:
    """PYTHONPATH with a ``pynvml`` shim over the fake module; NVIDIA_SMI a fake printing ``smi_csv``
    (a path that does not exist when None)."""
    shim = tmp_path / "shim"
    shim.mkdir(parents=True)
    (shim / "pynvml.py").write_text("import sys\nfrom tests.fakes.pynvml import make_fake_pynvml\n"
                                    "sys.modules[__name__] = make_fake_pynvml()[0]\n")
    smi = tmp_path / "nvidia-smi"
    if smi_csv is not None:
        (tmp_path / "smi.csv").write_text(smi_csv)
        smi.write_text(f"#!/bin/sh\ncat '{tmp_path / 'smi.csv'}'\n")
        smi.chmod(0o755)
    return dict(os.environ, PYTHONPATH=f"{shim}{os.pathsep}{REPO}", OUT=str(tmp_path / "out"),
                PYTHON=sys.executable, NVIDIA_SMI=str(smi))


def run_script(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts/nvml-device-check.sh")], env=env, capture_output=True, text=True,
                          timeout=120)


def test_device_script_end_to_end_with_fakes(tmp_path):
    res = run_script(_fake_environment(tmp_path, SMI_OK))
    assert res.returncode == 0, res.stdout + res.stderr
    report = (tmp_path / "out/nvml-check.txt").read_text()
    assert "RESULT: PASS" in report and "MISMATCH" not in report
    assert "DCGM_FI_DEV_GPU_TEMP{" in (tmp_path / "out/nvml-page.txt").read_text()


def test_device_script_fails_on_mismatch(tmp_path):
    res = run_script(_fake_environment(tmp_path, SMI_OK.replace(", 49, ", ", 60, ")))
    assert res.returncode == 1 and "RESULT: FAIL" in res.stdout
    assert "MISMATCH" in (tmp_path / "out/nvml-check.txt").read_text()


def test_device_script_is_inconclusive_without_nvidia_smi(tmp_path):
    res = run_script(_fake_environment(tmp_path, None))
    assert res.returncode == 3 and "nvidia-smi not found" in res.stdout
