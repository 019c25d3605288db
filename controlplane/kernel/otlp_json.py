"""An OpenTelemetry span exporter that speaks OTLP/HTTP with JSON bodies (the OTLP
specification's JSON encoding: hex trace and span ids, enums as numbers, 64-bit
integers as strings), to any collector's ``/v1/traces``.

Why not the SDK's own OTLP exporter: it needs ``opentelemetry-proto``, whose generated
modules share their file paths with the older copies ``xds-protos`` (Envoy's ext_proc
API, which the endpoint picker needs) ships, so whichever pip installs last wins and the
other breaks. JSON needs no generated code.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.types import Attributes

log = logging.getLogger("tectonic.tracing")
TIMEOUT_S = 5.0


def _value(v: object) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attributes(attrs: Attributes | Mapping[str, object] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in (attrs or {}).items()]


def _span(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.context
    assert ctx is not None
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id:032x}",
        "spanId": f"{ctx.span_id:016x}",
        "name": s.name,
        "kind": s.kind.value + 1,  # OTLP counts from UNSPECIFIED = 0
        "startTimeUnixNano": str(s.start_time or 0),
        "endTimeUnixNano": str(s.end_time or 0),
        "attributes": _attributes(s.attributes),
        "status": {"code": s.status.status_code.value, "message": s.status.description or ""},
    }
    if s.parent is not None:
        out["parentSpanId"] = f"{s.parent.span_id:016x}"
    return out


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """An ``ExportTraceServiceRequest`` in OTLP JSON: spans grouped by resource and scope."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
    for s in spans:
        resource = s.resource
        _, scopes = by_resource.setdefault(id(resource), (resource, {}))
        scope = s.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        scopes.setdefault(key, []).append(_span(s))
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource.attributes)},
                "scopeSpans": [
                    {"scope": {"name": name, "version": version}, "spans": items}
                    for (name, version), items in scopes.items()
                ],
            }
            for resource, scopes in by_resource.values()
        ]
    }
    return json.dumps(body).encode()


class OtlpJsonExporter(SpanExporter):
    """POSTs each batch to ``endpoint`` (a collector's ``/v1/traces``); a failed export
    is logged and dropped (tracing never holds up the process)."""

    def __init__(self, endpoint: str, timeout_s: float = TIMEOUT_S) -> None:
        self.endpoint, self.timeout_s = endpoint, timeout_s

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        req = urllib.request.Request(
            self.endpoint,
            data=encode(spans),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
        except OSError as e:  # URLError, HTTPError and timeouts are OSErrors
            log.warning("%d spans not exported to %s: %s", len(spans), self.endpoint, e)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass
