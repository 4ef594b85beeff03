"""OpenTelemetry tracing of rollouts: one trace per rollout, spans per stage and per analysis look.

Span tree (names and the attributes the controller sets; durations are the spans' own)::

    rollout                    rollout.id, rollout.version, rollout.stages, rollout.state, rollout.exit_code,
    |                          rollout.reason (root; on `resume`: "rollout.resume", same trace)
    +- rollout.gate            gate.name (compat | error-budget), gate.stage, gate.outcome, gate.detail
    +- rollout.stage           stage.index (1-based), stage.kind (canary | promote), stage.nodes, stage.hosts,
    |  |                       stage.share, stage.status, stage.verdict, stage.looks; events "deploy"
    |  +- rollout.analysis     canary.look, canary.verdict, canary.final, canary.time_fraction, canary.window_s,
    |                          canary.<metric>.class / .effect / .ci_low / .ci_high / .n_canary
    +- rollout.rollback        rollback.target, rollback.reason, rollback.nodes

Export (https://opentelemetry.io/docs/specs/otel/protocol/exporter/): spans leave the process only
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, through the
OTLP/HTTP protobuf exporter (``POST <endpoint>/v1/traces``), which also honours the standard
``OTEL_EXPORTER_OTLP_HEADERS``/``_TIMEOUT``/``_COMPRESSION`` variables. Otherwise spans are
created (the controller still records trace ids) and dropped: no outbound call is made. Tests pass
their own exporter (the SDK's ``InMemorySpanExporter``).

The trace survives a killed controller: the root span's ids are stored in SQLite, and ``resume``
opens ``rollout.resume`` as a child of that (remote) span context, so every span of one rollout
shares one trace id. The root span of a killed process is never exported; viewers show its
children under a missing parent.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags

from gpuobs.core.otel import ENDPOINT_VARS, Tracing, clean_attrs, otlp_endpoint, resource  # noqa: F401  (re-exported)
from gpuobs.core.otel import setup as otel_setup

SERVICE_NAME = "gpuobs-rollout"

def setup(exporter: SpanExporter | None = None, *, env: dict[str, str] | None = None,
          service_name: str = SERVICE_NAME) -> Tracing:
    """The rollout controller's :class:`Tracing` (:func:`gpuobs.core.otel.setup`, scope
    ``gpuobs.rollout.controller``): spans go to ``exporter`` synchronously when given (tests), else to a
    batching OTLP/HTTP exporter when the environment names an endpoint, else nowhere."""
    return otel_setup(exporter, env=env, service_name=service_name, scope="gpuobs.rollout.controller")


def noop() -> Tracing:
    """A :class:`Tracing` that records nothing and exports nothing."""
    return setup(None, env={})


def span_ids(span: Span) -> dict[str, str]:
    """``{"trace_id", "span_id"}`` as hex strings, for persisting a span context."""
    ctx = span.get_span_context()
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}


def remote_parent(ids: dict[str, str]) -> Context | None:
    """A context whose current span is the persisted (remote) span ``ids``; None if ids are missing."""
    try:
        ctx = SpanContext(int(ids["trace_id"], 16), int(ids["span_id"], 16), is_remote=True,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
    except (KeyError, TypeError, ValueError):
        return None
    return trace.set_span_in_context(NonRecordingSpan(ctx)) if ctx.is_valid else None


def verdict_attrs(verdict: Any) -> dict[str, Any]:
    """Span attributes of a canary :class:`~gpuobs.canary.verdict.Verdict`: verdict, timing, per-metric
    class, effect and interval (relative effects as fractions: +0.2 = +20%)."""
    attrs: dict[str, Any] = {"canary.verdict": verdict.verdict, "canary.final": bool(verdict.final),
                             "canary.time_fraction": float(verdict.time_fraction),
                             "canary.window_s": float(verdict.end - verdict.start)}
    for m in verdict.metrics:
        p = f"canary.{m.name}"
        attrs[f"{p}.class"] = m.classification
        attrs[f"{p}.effect"] = m.effect
        if m.interval is not None:
            attrs[f"{p}.ci_low"], attrs[f"{p}.ci_high"] = m.interval
        attrs[f"{p}.n_canary"] = float(m.n_canary)
    return clean_attrs(attrs)
