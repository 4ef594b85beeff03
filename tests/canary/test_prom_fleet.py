"""The benchmark's fake ``increase()`` agrees with the real Prometheus 2.42 engine (promtool).

tests/fakes/prom_fleet.py reimplements only what the canary benchmark needs of ``increase()``; here
promtool evaluates the same expressions on the same samples and must return the fake's values:
edges inside and outside 1.1 sample intervals, a counter starting near zero (zero-point clip), a
counter reset, a series starting inside the window, and fewer than two samples (no result).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from tests.fakes.prom_fleet import FakeSession, Pod, increase

CASES = {  # name: values every 15 s from t=0 ('_' = no sample)
    "steady": "1000 1010 1025 1031 1050 1062 1070 1085 1101 1110 1122 1130",
    "from_zero": "0 3 9 14 20 31 35 40 52 60 61 70",
    "reset": "100 120 140 5 25 40 60 75 90 110 130 150",
    "late_start": "_ _ _ _ _ 2 8 15 20 29 33 41",
}
WINDOWS = [(165, 65), (165, 100), (150, 30), (120, 45), (165, 165), (90, 20)]  # (eval time, range), seconds


def _values(text: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(15.0 * i, float(v)) for i, v in enumerate(text.split()) if v != "_"]
    return np.array([p[0] for p in pts]), np.array([p[1] for p in pts])


def test_fake_increase_matches_promtool(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (make binaries)"
    exprs = []
    for name, text in CASES.items():
        t, v = _values(text)
        for at, rng in WINDOWS:
            got = increase(t, v, at - rng, at)
            samples = "[]" if got is None else f"[{{labels: '{{case=\"{name}\"}}', value: {float(got)!r}}}]"
            exprs.append(f"      - expr: increase(c{{case=\"{name}\"}}[{rng}s])\n        eval_time: {at}s\n"
                         f"        exp_samples: {samples}\n")
    series = "".join(f"      - series: 'c{{case=\"{n}\"}}'\n        values: '{v}'\n" for n, v in CASES.items())
    # evaluation_interval 15s: promtool loads input samples up to the last evaluation tick
    doc = "evaluation_interval: 15s\ntests:\n  - interval: 15s\n    input_series:\n" + series + "    promql_expr_test:\n" + "".join(exprs)
    (tmp_path / "fake.test.yml").write_text(doc)
    r = subprocess.run([promtool, "test", "rules", "fake.test.yml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(exprs) == len(CASES) * len(WINDOWS)


def test_fake_session_answers_the_analyzer_queries():
    t = np.arange(0.0, 120.0, 15.0)
    cum = np.cumsum(np.ones((t.size, 3)), 0)
    pods = [Pod({"job": "vllm", "track": tr, "instance": f"{tr}-0"}, t, cum, cum[:, :2], (0.1, 1.0))
            for tr in ("canary", "baseline")]
    fs = FakeSession(pods, metric="m", errors_metric="e", gap_at=frozenset({100.0}))
    got = fs.evaluate('sum by (le, instance) (increase(m_bucket{job="vllm",track="canary"}[60s]))', 100.0)
    assert {r[0]["le"] for r in got} == {"0.1", "1.0", "+Inf"} and all(r[0]["instance"] == "canary-0" for r in got)
    assert fs.evaluate('min(count_over_time(m_count{track="baseline"}[60s]))', 100.0) == [({}, 4.0)]
    assert fs.evaluate('sum(increase(e{track="canary",finished_reason="error"}[60s]))', 100.0) == []
    assert fs.missing
    assert fs.evaluate('sum(increase(e{track="baseline",finished_reason="error"}[60s]))', 100.0)[0][1] > 0
    with pytest.raises(AssertionError):
        fs.evaluate("rate(m[1m])", 100.0)
