"""``make drill-<name>``: a usage error (an unknown drill, no running stack) stops at its one error line
and exits 2; the report step runs only when the drill ran (issue 29's rough edge: it ran anyway and
printed two usage errors and an empty ``report:`` line)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None or not (ROOT / ".venv" / ".installed").exists(),
                    reason="needs make and the repository's .venv (make venv)")
@pytest.mark.parametrize("target", ["drill-no-such-drill", "drill-xid"])
def test_a_drill_that_cannot_run_prints_one_error_and_no_report(tmp_path, target):
    r = subprocess.run(["make", "-s", target, f"RUN_DIR={tmp_path / 'run'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "report:" not in out and out.count("gpuobs drill: error:") == 1, out
    assert "gpuobs report" not in out
