"""The fake TSDB (tests/fakes/prometheus.py SeriesSet) answers doctor's queries exactly as real Prometheus does.

The label sets of two scenarios (stock file_sd with MIG and pod-name Hostname; ServiceMonitor without node) are
backfilled into a TSDB with ``promtool tsdb create-blocks-from openmetrics`` and served by the real Prometheus
binary (2.42, `make binaries`); every query doctor sends must get the same answer from both, and doctor's
report must be the same. Skipped only when the binaries are not installed.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import requests

from gpuobs.doctor import run
from gpuobs.stack.ports import free_port_range
from tests.doctor.labelsets import fleet
from tests.fakes.prometheus import FakePrometheus

pytestmark = pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                reason="prometheus/promtool not installed (make binaries)")

SCENARIOS = {
    "stock-mig-podname": (dict(profile="stock", host="pod", mig={1: 2}, xid={0: 48}, down=(3,)), {}),
    "servicemonitor-no-node": (dict(profile="helm", scrape="servicemonitor", node_label=False),
                               {"dcgm_selector": 'job="nvidia-dcgm-exporter"'}),
}


def _om_escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(ts, at: float) -> str:
    lines = []
    for labels, value in ts.samples:
        name = labels["__name__"]
        body = ",".join(f'{k}="{_om_escape(v)}"' for k, v in sorted(labels.items()) if k != "__name__")
        lines.append(f"{name}{{{body}}} {value} {at:.3f}")
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Start one real Prometheus per scenario on its backfilled TSDB; yields {scenario: url}."""
    procs, urls = [], {}
    base = free_port_range(len(SCENARIOS))  # one block: each Prometheus binds later, so ask once for all
    try:
        for i, (name, (kw, _)) in enumerate(SCENARIOS.items()):
            d = tmp_path_factory.mktemp(name)
            (d / "in.om").write_text(openmetrics(fleet(**kw), time.time() - 30))
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(d / "in.om"),
                            str(d / "data")], check=True, capture_output=True, timeout=60)
            (d / "prometheus.yml").write_text("global: {}\n")
            port = base + i
            procs.append(subprocess.Popen(
                ["prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls[name] = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        for proc, url in zip(procs, urls.values()):
            while True:
                assert proc.poll() is None, f"Prometheus for {url} exited with {proc.returncode}"
                try:
                    if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                assert time.time() < deadline, "Prometheus did not become ready"
                time.sleep(0.2)
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _rows(result):
    return sorted((tuple(sorted(r["metric"].items())), r["value"][1]) for r in result)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_fake_answers_every_doctor_query_like_prometheus(prometheus, scenario):
    kw, doctor_kw = SCENARIOS[scenario]
    ts = fleet(**kw)
    with FakePrometheus(ts) as fake:
        fake_report = run(fake.url, retries=0, **doctor_kw)
        queries = [r["params"]["query"][0] for r in fake.requests]
    real = prometheus[scenario]
    assert len(queries) >= 8
    answered = 0
    for q in queries:
        body = requests.post(f"{real}/api/v1/query", data={"query": q}, timeout=10).json()
        assert body["status"] == "success", (q, body)
        expected = [{"metric": labels, "value": [0, str(int(v)) if v == int(v) else str(v)]}
                    for labels, v in ts.evaluate(q)]
        assert _rows(body["data"]["result"]) == _rows(expected), q
        answered += bool(expected)
    assert answered >= 5  # the scenarios exercise the queries, not empty answers
    real_report = run(real, retries=0, **doctor_kw)
    assert real_report.to_dict() | {"prometheus": ""} == fake_report.to_dict() | {"prometheus": ""}
