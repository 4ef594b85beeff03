"""OpenTelemetry plumbing shared by every traced gpuobs component (rollout controller, canary serve).

:func:`setup` builds a tracer on its own provider (never the global one): spans go to a given exporter
synchronously (tests), else over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, else nowhere (no outbound call). :func:`resource` applies
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``service.version``
(https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


@dataclass
class Tracing:
    """A tracer with its own provider (never the global one); call :meth:`shutdown` to flush."""

    tracer: trace.Tracer
    provider: TracerProvider
    exporter: SpanExporter | None

    def shutdown(self) -> None:
        """Flush pending spans to the exporter and stop it (idempotent)."""
        self.provider.force_flush()
        self.provider.shutdown()


def otlp_endpoint(env: dict[str, str] | None = None) -> str | None:
    """The configured OTLP endpoint, or None when neither standard variable is set (non-empty)."""
    env = os.environ if env is None else env
    return next((env[v] for v in ENDPOINT_VARS if env.get(v)), None)


def _version() -> str:
    """The installed gpuobs distribution's version (core imports nothing else of gpuobs)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuobs")
    except PackageNotFoundError:
        return "unknown"


def resource(service_name: str, env: dict[str, str] | None = None) -> Resource:
    """The OTel resource: ``service.name`` from ``OTEL_SERVICE_NAME``, else ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES``, else ``service_name``; the other ``OTEL_RESOURCE_ATTRIBUTES``; and
    ``service.version`` (the gpuobs version unless the attributes set one). OTEL_SERVICE_NAME wins over
    OTEL_RESOURCE_ATTRIBUTES, as the SDK environment specification says."""
    env = os.environ if env is None else env
    attrs: dict[str, str] = {}
    for item in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip():
            attrs[k.strip()] = unquote(v.strip())
    attrs.setdefault("service.name", service_name)
    if env.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = env["OTEL_SERVICE_NAME"]
    attrs.setdefault("service.version", _version())
    # Resource(...) rather than Resource.create(...): the attributes above already apply the environment
    return Resource.create({}).merge(Resource(attrs)) if env is os.environ else Resource(attrs)


def setup(exporter: SpanExporter | None = None, *, env: dict[str, str] | None = None,
          service_name: str, scope: str) -> Tracing:
    """Build a :class:`Tracing` named ``scope`` (the instrumentation scope).

    ``exporter`` given: spans go to it synchronously (tests). Else, with an OTLP endpoint in the
    environment: a batching OTLP/HTTP exporter. Else: no exporter at all.
    """
    provider = TracerProvider(resource=resource(service_name, env))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif otlp_endpoint(env) is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider.get_tracer(scope), provider, exporter)


def clean_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes OTel accepts: drop None and non-finite floats, stringify everything exotic."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        if isinstance(v, (list, tuple)):  # OTel arrays must be homogeneous primitives
            kinds = {type(x) for x in v}
            out[k] = list(v) if len(kinds) == 1 and kinds <= {bool, int, float, str} else [str(x) for x in v]
        elif isinstance(v, (bool, int, float, str)):
            out[k] = v
        else:
            out[k] = str(v)
    return out
