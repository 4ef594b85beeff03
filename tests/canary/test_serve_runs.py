"""Serve-level verdict semantics (gpuobs/canary/runs.py): settle rules, durable store, per-look deadline,
spans per look and the OpenTelemetry environment."""

from __future__ import annotations

import threading
import time

import pytest
import requests
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuobs.canary import runs as R
from gpuobs.canary.config import load_config
from gpuobs.canary.serve import CanaryServer, parse_ok_query
from gpuobs.core import otel as tracing
from gpuobs.promapi.prometheus import PromClient
from tests.fakes.canary_traffic import Traffic
from tests.fakes.prometheus import FakePrometheus

T0 = 1_800_000_000.0
SEL = {"canary": 'track="canary"', "baseline": 'track="baseline"', "run": "abc", "step": "1"}


def _doc(verdict: str, frac: float, classes: list[str], critical: bool = True) -> dict:
    return {"verdict": verdict, "time_fraction": frac, "reasons": [], "final": False, "exit_code": 3,
            "metrics": [{"name": f"m{i}", "critical": critical, "classification": c} for i, c in enumerate(classes)]}


def test_settle_rules():
    assert R.settle(_doc("PROMOTE", 0.5, ["Pass", "Pass"]))["verdict"] == "PROMOTE"
    # a config whose metrics are all advisory, or a critical metric without data, never promotes
    assert R.settle(_doc("PROMOTE", 0.5, ["NoData"], critical=False))["verdict"] == "HOLD"
    assert R.settle(_doc("PROMOTE", 0.5, ["Pass", "NoData"]))["verdict"] == "HOLD"
    held = R.settle(_doc("HOLD", 1.02, ["Inconclusive"]))
    assert held["verdict"] == "INCONCLUSIVE" and held["final"] and held["exit_code"] == 3
    assert R.settle(_doc("HOLD", 0.9, ["Inconclusive"]))["final"] is False
    assert R.settle(_doc("ROLLBACK", 1.5, ["High"]))["verdict"] == "ROLLBACK"


def test_store_is_durable_and_keyed_by_step(tmp_path):
    store = R.RunStore(tmp_path)
    k1, k2 = R.run_key("abc", "1", "a", "b"), R.run_key("abc", "2", "a", "b")
    store.put(R.RunRecord(k1, "1", 10.0, 11.0, looks=3, state={"looks": {"ttft": [[0.1, 5.0]]}},
                          decision="PROMOTE", decided_at=11.0, answer={"verdict": "PROMOTE"}))
    store.close()
    again = R.RunStore(tmp_path)
    rec = again.get(k1)
    assert rec.start == 10.0 and rec.looks == 3 and rec.answer == {"verdict": "PROMOTE"}
    assert rec.state["looks"]["ttft"] == [[0.1, 5.0]] and again.get(k2) is None
    assert again.latest(R.run_key("abc", "", "", "")[:6]).key == k1
    again.close()


@pytest.fixture
def server(tmp_path):
    started = []

    def make(traffic, **kw):
        fake = FakePrometheus(traffic).__enter__()
        clock = type("C", (), {"t": T0, "__call__": lambda self: self.t})()
        exporter = InMemorySpanExporter()
        srv = CanaryServer(("127.0.0.1", 0), PromClient(fake.url, retries=0), load_config(None), clock=clock,
                           store=R.RunStore(tmp_path / f"s{len(started)}"),
                           tracing=tracing.setup(exporter, env={}, service_name="gpuobs-canary", scope="test"), **kw)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        started.append((srv, fake))
        return f"http://127.0.0.1:{srv.server_address[1]}", clock, exporter

    yield make
    for srv, fake in started:
        srv.shutdown()
        srv.server_close()
        fake.__exit__()


def test_deadline_answers_504_and_a_busy_run_answers_at_once(server):
    url, clock, spans = server(Traffic(T0, fault=lambda t: "slow", slow_s=1.5), look_deadline_s=0.3)
    requests.get(f"{url}/api/v1/analysis", params=SEL, timeout=5)  # registers the run
    clock.t += 30
    t = time.monotonic()
    r = requests.get(f"{url}/api/v1/analysis", params=SEL, timeout=5)
    assert r.status_code == 504 and "deadline" in r.json()["error"] and time.monotonic() - t < 1.2
    clock.t += 30
    t = time.monotonic()
    busy = requests.get(f"{url}/api/v1/analysis", params=SEL, timeout=5)
    assert busy.status_code == 504 and "still running" in busy.json()["error"] and time.monotonic() - t < 0.3
    assert [s.attributes.get("canary.error") for s in spans.get_finished_spans()] == ["deadline"]


def test_a_span_per_computed_look_with_verdict_and_effects(server):
    traffic = Traffic(T0, ttft_mult=1.4)
    url, clock, spans = server(traffic)
    requests.get(f"{url}/api/v1/analysis", params=SEL, timeout=5)  # registers the run
    computed = 0
    for _ in range(6):  # +40%: decided within a few looks (how many depends on the sequential boundary)
        clock.t += 30
        doc = requests.get(f"{url}/api/v1/analysis", params=SEL, timeout=5).json()
        computed += 1
        if doc["verdict"] != "HOLD":
            break
    assert doc["verdict"] == "ROLLBACK"
    queries = traffic.queries
    for _ in range(2):
        clock.t += 30
        again = requests.get(f"{url}/api/v1/analysis", params=SEL, timeout=5).json()
        assert again["verdict"] == "ROLLBACK" and again["run"]["sticky"]
    assert traffic.queries == queries  # the sticky answers query nothing...
    done = spans.get_finished_spans()
    assert len(done) == computed  # ...and make no span: one span per computed look, the deciding one last
    assert [s.attributes.get("canary.verdict") for s in done] == ["HOLD"] * (computed - 1) + ["ROLLBACK"]
    a = done[-1].attributes
    assert a["canary.verdict"] == "ROLLBACK" and a["canary.run"] == "abc" and a["canary.step"] == "1"
    assert a["canary.ttft.class"] == "High" and a["canary.ttft.effect"] > 0.2
    assert done[-1].resource.attributes["service.name"] == "gpuobs-canary"


def test_otel_environment_names_the_service():
    res = tracing.resource("gpuobs-canary", {"OTEL_SERVICE_NAME": "canary-prod",
                                             "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=p-1,service.name=x"})
    assert res.attributes["service.name"] == "canary-prod" and res.attributes["k8s.pod.name"] == "p-1"
    assert res.attributes["service.version"] == __import__("gpuobs").__version__
    res = tracing.resource("gpuobs-canary", {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,service.version=9"})
    assert res.attributes["service.name"] == "from-attrs" and res.attributes["service.version"] == "9"
    assert tracing.resource("gpuobs-canary", {}).attributes["service.name"] == "gpuobs-canary"


def test_flagger_hooks_before_the_analysis_starts_and_bad_metric_queries(server):
    url, clock, _ = server(Traffic(T0))
    payload = {"name": "vllm", "namespace": "serving", "phase": "Waiting", "checksum": "c1",
               "metadata": {"canary": 'track="canary"', "baseline": 'track="baseline"'}}
    assert requests.post(f"{url}/flagger/rollback", json=payload, timeout=5).status_code == 403
    assert requests.get(f"{url}/healthz", timeout=5).json()["runs"] == 0
    assert requests.post(f"{url}/flagger/nope", json=payload, timeout=5).status_code == 404
    with pytest.raises(ValueError, match="namespace"):
        parse_ok_query('gpuobs_canary_ok{name="vllm"}')
    labels = parse_ok_query('gpuobs_canary_ok{namespace="s",name="v",canary="pod=~\\"v-.*\\""}')
    assert labels["canary"] == 'pod=~"v-.*"'


def test_serve_cli_rejects_bad_deadline_and_unusable_state_dir(tmp_path, capsys):
    from gpuobs.cli import run as cli

    assert cli(["canary", "serve", "--port", "0", "--look-deadline", "soon"]) == 2
    assert "--look-deadline" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli(["canary", "serve", "--port", "0", "--state-dir", str(blocker / "sub")]) == 1
    assert "state-dir" in capsys.readouterr().err


def test_leans_harmful_reads_the_harm_side_of_each_direction():
    from gpuobs.canary.runs import leans_harmful

    def doc(direction, z, kind="histogram", critical=True):
        return {"metrics": [{"name": "m", "kind": kind, "critical": critical, "direction": direction,
                             "classification": "Inconclusive", "evidence": {},
                             "tests": [{"test": "location", "classification": "Inconclusive", "z": z}]}]}

    assert leans_harmful(doc("increase", 2.3)) == ["m: z=+2.30 (harm side >= 2)"]
    assert leans_harmful(doc("increase", -3.0)) == []
    assert leans_harmful(doc("decrease", -2.5)) == ["m: z=-2.50 (harm side <= -2)"]
    assert leans_harmful(doc("either", -2.5)) and leans_harmful(doc("either", 2.5))
    assert leans_harmful(doc("increase", 5.0, critical=False)) == []
    assert leans_harmful(doc("increase", None)) == [] and leans_harmful(doc("increase", float("nan"))) == []
    errors = {"metrics": [{"name": "error_ratio", "kind": "errors", "critical": True, "classification": "Inconclusive",
                           "evidence": {"log_e": 3.5}}]}
    assert leans_harmful(errors) == ["error_ratio: e=33.1 >= 20"]
