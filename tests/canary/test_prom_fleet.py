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


VM_CASES = {**CASES,
            "big_start": "_ _ _ _ _ 5000 5003 5009 5012 5020 5031 5040",  # a counter older than its first sample
            "partial_reset": "800 810 820 790 800 815 830 835 840 850 860 870",  # a drop under 1/8: partial reset
            "gap": "100 110 _ _ _ _ _ _ _ 170 180 190"}  # a window after a gap: realPrevValue


def test_fake_increase_vm_matches_victoriametrics(tmp_path):
    """The fake's MetricsQL ``increase()`` (``increase_vm``) agrees with the real VictoriaMetrics
    (Debian's v1.79 binary, started here on a free loopback port with its own storage, stopped after):
    the same samples imported through ``/api/v1/import``, every case at every window, ``nocache=1``."""
    import json
    import time

    import requests

    from gpuobs.stack.ports import free_port_range
    from tests.fakes.prom_fleet import increase_vm

    binary = shutil.which("victoria-metrics")
    assert binary, "victoria-metrics is required (make binaries)"
    port = free_port_range(1)
    base_ms = (int(time.time()) - 3 * 3600) // 60 * 60 * 1000  # 3 h old: past -search.latencyOffset
    proc = subprocess.Popen([binary, f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
                             "-retentionPeriod=1", "-search.disableCache"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(url + "/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "victoria-metrics did not start"
            time.sleep(0.2)
        lines = []
        for name, text in VM_CASES.items():
            t, v = _values(text)
            lines.append(json.dumps({"metric": {"__name__": "c", "case": name}, "values": [float(x) for x in v],
                                     "timestamps": [base_ms + int(x * 1000) for x in t]}))
        assert requests.post(url + "/api/v1/import", data="\n".join(lines), timeout=10).status_code == 204
        requests.get(url + "/internal/force_flush", timeout=10)
        checked = 0
        for name, text in VM_CASES.items():
            t, v = _values(text)
            for at, rng in WINDOWS + [(165, 80), (75, 30)]:
                want = increase_vm(t, v, at - rng, at)
                got = None
                for _ in range(50):  # imported rows become searchable within a second or so
                    r = requests.get(url + "/api/v1/query", params={
                        "query": f'increase(c{{case="{name}"}}[{rng}s])', "time": (base_ms / 1000) + at,
                        "nocache": "1"}, timeout=10).json()["data"]["result"]
                    got = float(r[0]["value"][1]) if r else None
                    if got is not None or want is None:
                        break
                    time.sleep(0.1)
                assert (got is None) == (want is None), (name, at, rng, got, want)
                if want is not None:
                    assert got == pytest.approx(float(want), abs=1e-9), (name, at, rng, got, want)
                checked += 1
        assert checked == len(VM_CASES) * (len(WINDOWS) + 2)
    finally:
        proc.kill()  # a test server with a throwaway storage directory: no clean shutdown needed
        proc.wait()
