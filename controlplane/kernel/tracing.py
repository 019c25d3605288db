"""OpenTelemetry traces, opt-in: ``--otlp-endpoint URL`` (or ``$TECTONIC_OTLP_ENDPOINT``)
sends a process's spans over OTLP/HTTP (JSON, ``otlp_json.py``) to a collector, e.g.
``http://otel-collector:4318/v1/traces``. Without it nothing is traced and ``start`` costs
one check: the gateway's hot path stays as it was.

The gateway traces each request (admission, routing, each upstream attempt, a stream's
continuation) as children of the caller's ``traceparent`` when it sent one, and passes
its own on to the model server (vLLM's ``--otlp-traces-endpoint`` makes its spans
children of it); the leader traces each failover (controlplane/failover_traces.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Mapping, MutableSequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind

from controlplane.kernel.otlp_json import OtlpJsonExporter
from controlplane.kernel.version import VERSION

ENDPOINT_ENV = "TECTONIC_OTLP_ENDPOINT"
_state: dict[str, TracerProvider] = {}  # the process's provider, once configured


def reset() -> None:
    """Tracing off again (tests that configured it with an exporter of their own)."""
    _state.clear()


def configure_tracing(
    component: str, endpoint: str, exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """Trace this process when ``endpoint`` (or ``exporter``, for tests) is given;
    returns the provider (``shutdown()`` flushes), None when tracing stays off."""
    if not endpoint and exporter is None:
        return None
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": f"tectonic-{component}", "service.version": VERSION}
        )
    )
    provider.add_span_processor(BatchSpanProcessor(exporter or OtlpJsonExporter(endpoint)))
    _state["provider"] = provider
    return provider


def enabled() -> bool:
    return "provider" in _state


_OFF: contextlib.nullcontext[None] = contextlib.nullcontext(None)  # reusable, no generator


def start(
    tracer: str,
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    carrier: Mapping[str, str] | None = None,
    parent: SpanContext | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> contextlib.AbstractContextManager[Span | None]:
    """A span, current while the block runs (children started in it hang under it);
    its parent: the ``traceparent`` of ``carrier`` (headers), else ``parent`` (a span
    ended before, e.g. a failover's root), else the current span. None when off, at the
    cost of one dict lookup: the gateway opens several per request."""
    provider = _state.get("provider")
    if provider is None:
        return _OFF
    context: Context | None = None
    if carrier is not None:
        context = propagate.extract(carrier)
    elif parent is not None:
        context = trace.set_span_in_context(NonRecordingSpan(parent))
    return provider.get_tracer(tracer, VERSION).start_as_current_span(
        name, context=context, kind=kind, attributes=dict(attributes or {})
    )


def inject(headers: MutableSequence[tuple[str, str]]) -> None:
    """Add the current span's ``traceparent`` (W3C) to outgoing ``headers``."""
    if not enabled():
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    # the caller's traceparent is this span's parent: it goes no further
    headers[:] = [(k, v) for k, v in headers if k.lower() not in carrier]
    headers.extend(carrier.items())


def current_span() -> Span | None:
    """The span of the block running now, when tracing is on (to add attributes)."""
    return trace.get_current_span() if enabled() else None


def add_otlp_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--otlp-endpoint",
        default=os.environ.get(ENDPOINT_ENV, ""),
        metavar="URL",
        help="send OpenTelemetry traces over OTLP/HTTP to this collector URL, e.g. "
        f"http://otel-collector:4318/v1/traces (default: ${ENDPOINT_ENV}; none: off)",
    )
