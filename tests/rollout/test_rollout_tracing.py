"""OpenTelemetry spans of the rollout controller: in-memory exporter, and a real OTLP/HTTP round trip
to a receiver on 127.0.0.1 that decodes the protobuf (ExportTraceServiceRequest)."""

from __future__ import annotations

import gzip
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from gpuobs.rollout import tracing
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.store import RolloutStore
from tests.fakes.rollout import Crash, rig, spec


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def test_one_trace_per_rollout_with_stage_and_analysis_spans(tmp_path):
    mem = InMemorySpanExporter()
    tr = tracing.setup(mem)
    r = rig(tmp_path, {1: ["HOLD", "PROMOTE"], 2: ["PROMOTE"]}, tracer=tr)
    rec = r.controller.run(r.controller.create(spec()).id)
    tr.shutdown()
    spans = mem.get_finished_spans()
    (root,) = by_name(spans, "rollout")
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert format(root.context.trace_id, "032x") == rec.trace["trace_id"]
    assert root.attributes["rollout.state"] == "Succeeded" and root.attributes["rollout.exit_code"] == 0
    assert root.attributes["rollout.version"] == "1.5.0" and list(root.attributes["rollout.stages"]) == [1, 2, 3]
    stages = by_name(spans, "rollout.stage")
    assert [(s.attributes["stage.index"], s.attributes["stage.kind"], s.attributes["stage.nodes"],
             s.attributes["stage.status"]) for s in stages] == [
        (1, "canary", 1, "passed"), (2, "canary", 2, "passed"), (3, "promote", 3, "passed")]
    assert all(s.parent.span_id == root.context.span_id for s in stages)
    assert stages[0].attributes["stage.share"] == pytest.approx(1 / 3)
    assert [e.attributes["host"] for e in stages[0].events if e.name == "deploy"] == ["gpu-node-00"]
    looks = by_name(spans, "rollout.analysis")
    assert [(a.attributes["canary.look"], a.attributes["canary.verdict"]) for a in looks] == [
        (1, "HOLD"), (2, "PROMOTE"), (1, "PROMOTE")]
    assert looks[0].parent.span_id == stages[0].context.span_id
    assert looks[1].attributes["canary.ttft.effect"] == pytest.approx(-0.02)
    assert looks[1].attributes["canary.ttft.ci_high"] == pytest.approx(0.03)
    assert looks[1].attributes["canary.ttft.class"] == "Pass"
    assert looks[1].attributes["canary.time_fraction"] == pytest.approx(20 / 60)
    gates = [(g.attributes["gate.name"], g.attributes["gate.outcome"]) for g in by_name(spans, "rollout.gate")]
    assert gates == [("compat", "passed"), ("error-budget", "open"), ("error-budget", "open"), ("error-budget", "open")]


def test_rollback_span_and_error_status(tmp_path):
    mem = InMemorySpanExporter()
    tr = tracing.setup(mem)
    r = rig(tmp_path, {1: ["ROLLBACK"]}, tracer=tr)
    r.controller.run(r.controller.create(spec()).id)
    tr.shutdown()
    spans = mem.get_finished_spans()
    (root,) = by_name(spans, "rollout")
    assert root.status.status_code == StatusCode.ERROR and root.attributes["rollout.state"] == "RolledBack"
    (rb,) = by_name(spans, "rollout.rollback")
    assert rb.attributes["rollback.target"] == "RolledBack"
    assert list(rb.attributes["rollback.nodes"]) == ["gpu-node-00 (1.5.0 -> 1.4.0)"]
    (look,) = by_name(spans, "rollout.analysis")
    assert look.attributes["canary.verdict"] == "ROLLBACK"
    assert look.attributes["canary.ttft.effect"] == pytest.approx(0.2)


def test_resume_joins_the_same_trace(tmp_path):
    mem = InMemorySpanExporter()
    tr = tracing.setup(mem)
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["CRASH", "PROMOTE"]}, tracer=tr)
    rid = r.controller.create(spec()).id
    with pytest.raises(Crash):
        r.controller.run(rid)
    stored = r.store.get(rid).trace
    ctl2 = Controller(RolloutStore(tmp_path / "rollout.sqlite", clock=r.clock), r.fleet, r.signals, r.analyzers,
                      clock=r.clock, sleep=r.clock.sleep, out=r.lines.append, tracer=tr)
    assert ctl2.run(rid).state == "Succeeded"
    tr.shutdown()
    spans = mem.get_finished_spans()
    (resumed,) = by_name(spans, "rollout.resume")
    assert format(resumed.context.trace_id, "032x") == stored["trace_id"]
    assert format(resumed.parent.span_id, "016x") == stored["span_id"] and resumed.parent.is_remote
    assert {format(s.context.trace_id, "032x") for s in spans} == {stored["trace_id"]}


def test_no_exporter_without_an_endpoint():
    assert tracing.setup(env={}).exporter is None
    assert tracing.otlp_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) is None
    assert tracing.otlp_endpoint({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"}) == \
        "http://x:4318/v1/traces"


class _Receiver(ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, ExportTraceServiceRequest]] = []


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        enc = self.headers.get("Content-Encoding", "")
        body = gzip.decompress(body) if enc == "gzip" else zlib.decompress(body) if enc == "deflate" else body
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        self.server.requests.append((self.path, self.headers.get("Content-Type", ""), req))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def _attr(kv):
    return _value(kv.value)


def test_otlp_http_round_trip_to_a_real_receiver(tmp_path, monkeypatch):
    srv = _Receiver()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{srv.server_address[1]}")
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
        tr = tracing.setup()
        assert type(tr.exporter).__name__ == "OTLPSpanExporter"
        r = rig(tmp_path, {1: ["ROLLBACK"]}, tracer=tr)
        rec = r.controller.run(r.controller.create(spec(version="1.6.0")).id)
        tr.shutdown()  # flushes the batch processor
    finally:
        srv.shutdown()
        srv.server_close()
    assert srv.requests and {p for p, _, _ in srv.requests} == {"/v1/traces"}
    assert {ct for _, ct, _ in srv.requests} == {"application/x-protobuf"}
    spans, resources = [], []
    for _, _, req in srv.requests:
        for rs in req.resource_spans:
            resources.append({a.key: _attr(a) for a in rs.resource.attributes})
            spans += [sp for ss in rs.scope_spans for sp in ss.spans]
    assert {r["service.name"] for r in resources} == {"gpuobs-rollout"}
    names = sorted(s.name for s in spans)
    assert names == ["rollout", "rollout.analysis", "rollout.gate", "rollout.gate", "rollout.rollback",
                     "rollout.stage"]
    assert {s.trace_id.hex() for s in spans} == {rec.trace["trace_id"]}
    root = next(s for s in spans if s.name == "rollout")
    attrs = {a.key: _attr(a) for a in root.attributes}
    assert attrs["rollout.version"] == "1.6.0" and attrs["rollout.state"] == "RolledBack"
    assert attrs["rollout.exit_code"] == 1 and attrs["rollout.stages"] == [1, 2, 3]
    look = next(s for s in spans if s.name == "rollout.analysis")
    la = {a.key: _attr(a) for a in look.attributes}
    assert la["canary.verdict"] == "ROLLBACK" and la["canary.ttft.class"] == "High"
    assert la["canary.ttft.effect"] == pytest.approx(0.2) and la["canary.ttft.ci_low"] == pytest.approx(0.12)
    assert look.parent_span_id == next(s for s in spans if s.name == "rollout.stage").span_id


def test_analysis_spans_do_not_include_the_wait_before_a_look(tmp_path):
    """The controller sleeps until a look is due outside the look's span: a span is the look itself."""
    from opentelemetry import trace as otel_trace

    mem = InMemorySpanExporter()
    tr = tracing.setup(mem)
    r = rig(tmp_path, {1: ["HOLD", "PROMOTE"], 2: ["PROMOTE"]}, tracer=tr)
    during: list[str] = []
    real_sleep = r.controller.sleep

    def sleep(s: float) -> None:
        during.append(getattr(otel_trace.get_current_span(), "name", ""))
        real_sleep(s)

    r.controller.sleep = sleep
    r.controller.run(r.controller.create(spec()).id)
    tr.shutdown()
    assert during and "rollout.analysis" not in during
    assert len(by_name(mem.get_finished_spans(), "rollout.analysis")) == 3
