"""Each failover as one OpenTelemetry trace, when tracing is on (``--otlp-endpoint``,
controlplane/kernel/tracing.py): a root span ``failover <region>`` when the leader
records the transition to FAILING_OVER, and under it the decision (trigger, cause,
reason, targets), each failover step as it is recorded (switch, pre-warm) and the
pre-warm job itself (how long it ran, what it attained). A leader that takes over a
failover half-way starts a root of its own for the rest. I/O only: the decision is the
core's, this names what the orchestrator carried out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry.trace import Span, SpanContext

from controlplane.core.actions import Write
from controlplane.kernel import tracing
from controlplane.kernel.model import RegionState

TRACER = "tectonic.controlplane"


class FailoverTraces:
    def __init__(self) -> None:
        self._roots: dict[str, SpanContext] = {}  # region -> its failover's root span

    def written(self, w: Write) -> None:
        """Spans for what a landed write recorded: a failover's start and its steps."""
        if not tracing.enabled():
            return
        d = w.decision
        if d is not None and d.to_state is RegionState.FAILING_OVER:
            fo = w.record.failover
            targets = ",".join(sorted(fo.plan.targets)) if fo is not None else ""
            with tracing.start(TRACER, f"failover {w.region}") as root:
                assert root is not None
                self._roots[w.region] = root.get_span_context()
                attrs: dict[str, str | int] = {
                    "tectonic.region": w.region,
                    "tectonic.trigger": str(d.trigger),
                    "tectonic.cause": str(d.cause),
                    "tectonic.reason": d.reason,
                    "tectonic.targets": targets,
                    "tectonic.epoch": d.epoch,
                }
                root.set_attributes(attrs)
                with tracing.start(TRACER, "decision", attributes=attrs):
                    pass
        for step in w.failover_steps:
            with self.child(w.region, f"step {step.value}"):
                pass
        if d is not None and d.to_state is RegionState.NORMAL:
            self._roots.pop(w.region, None)  # home again: the next failover is a new trace

    @contextlib.contextmanager
    def child(
        self, region: str, name: str, attributes: Mapping[str, str | int] | None = None
    ) -> Iterator[Span | None]:
        """A span under ``region``'s failover (a root of its own when this leader did not
        see it start)."""
        if not tracing.enabled():
            yield None
            return
        root = self._roots.get(region)
        if root is None:
            with tracing.start(TRACER, f"failover {region}") as span:
                assert span is not None
                self._roots[region] = root = span.get_span_context()
        attrs = {"tectonic.region": region, **(attributes or {})}
        with tracing.start(TRACER, name, parent=root, attributes=attrs) as span:
            yield span
