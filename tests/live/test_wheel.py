"""An installed gpuobs works outside a checkout (issue 9): a wheel built from this checkout, installed in a
new virtualenv in another directory, runs ``gpuobs rules xid``, ``gpuobs stack up`` / ``stack down`` and
``gpuobs canary analyze`` with their defaults (rule files, Alertmanager config, runbooks, metrics config
and data tables all come from the package).

The new virtualenv gets the dependencies from this test run's environment through a ``.pth`` path line
(no download; the project's own editable install is not on that path, so only the wheel's gpuobs is
importable), and every command runs with a temporary directory as its working directory.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from gpuobs.stack.ports import free_port_range

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, gpuobs script, a work directory outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                        str(ROOT)], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    wheel = next(dist.glob("gpuobs-*.whl"))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "zz_gpuobs_test_deps.pth").write_text("\n".join(deps) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", purelib, str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    script = env_dir / "bin" / "gpuobs"
    script.write_text(f"#!{py}\nimport sys\nfrom gpuobs.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    work = tmp / "elsewhere"
    work.mkdir()
    return py, script, work


def run(installed, *argv, timeout=120):
    py, script, work = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUOBS_", "PYTHON"))}
    env["PATH"] = f"{script.parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=timeout, cwd=work, env=env)


def test_the_wheel_is_what_runs_and_carries_its_assets(installed):
    py, _, work = installed
    r = subprocess.run([str(py), "-c", "import gpuobs, gpuobs.core.assets as a; print(gpuobs.__file__); print(a.root())"],
                       capture_output=True, text=True, cwd=work, env={"PATH": os.environ["PATH"]})
    module, root = r.stdout.split()
    assert str(ROOT) not in module, module
    assert root.endswith("gpuobs/_assets") and (Path(root) / "runbooks" / "xid.md").is_file()
    # the recommended exporter profile serves the shipped counters file
    assert (Path(root) / "deploy" / "dcgm-exporter" / "recommended.csv").read_text() == (
        ROOT / "deploy" / "dcgm-exporter" / "recommended.csv").read_text()


def test_rules_xid_with_defaults(installed):
    r = run(installed, "rules", "xid")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (ROOT / "prometheus" / "rules" / "gpu-xid.yml").read_text()
    r = run(installed, "rules", "slo")
    assert r.returncode == 0 and r.stdout == (ROOT / "prometheus" / "rules" / "slo.yml").read_text(), r.stderr


def test_stack_up_down_and_canary_analyze_with_defaults(installed, tmp_path):
    base = free_port_range(16)
    run_dir = tmp_path / "x"
    flags = ["--run-dir", str(run_dir), "--nodes", "2", "--gpus", "1", "--training-nodes", "0",
             "--prometheus-port", str(base), "--alertmanager-port", str(base + 1), "--pager-port", str(base + 2),
             "--base-port", str(base + 3), "--engine-base-port", str(base + 8), "--grafana-port", str(base + 12)]
    up = run(installed, "stack", "up", *flags, timeout=180)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert (run_dir / "prometheus" / "rules" / "gpu-xid.yml").is_file()
        analyze = run(installed, "canary", "analyze", "--prometheus", f"http://127.0.0.1:{base}",
                      "--canary", 'track="canary"', "--baseline", 'track="baseline"', "--window", "1m")
        assert analyze.returncode in (0, 1, 3), analyze.stdout + analyze.stderr  # a verdict, not a usage error
        assert "verdict" in analyze.stdout.lower() or "HOLD" in analyze.stdout, analyze.stdout
    finally:
        down = run(installed, "stack", "down", "--run-dir", str(run_dir), timeout=120)
    assert down.returncode == 0 and "stack down" in down.stdout, down.stdout + down.stderr
    status = run(installed, "stack", "status", "--run-dir", str(run_dir))
    assert status.returncode == 1 and "stopped" not in status.stdout.replace("no stack", "")
