"""The logwatch benchmark runs and prints its table (tiny burst, one round; no timing is asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_logwatch_smoke(capsys):
    spec = importlib.util.spec_from_file_location("bench_logwatch", ROOT / "bench" / "bench_logwatch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--mib", "0.02", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| incident") or line.startswith("| mixed")]
    assert len(rows) == 6
    assert {r.split("|")[4].strip() for r in rows} == {"re baseline", "gpuobs parser", "agent end to end"}
