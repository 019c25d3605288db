"""A failover as one OpenTelemetry trace (controlplane/failover_traces.py), from the
leader's real orchestrator over the in-memory store (tests/unit/world.py), exported
to the SDK's in-memory exporter: the root ``failover <region>``, and under it the
decision, each step and the pre-warm job, linked by their parent ids."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.kernel import tracing
from controlplane.kernel.model import Health, Intent, IntentKind, PrewarmFigures
from tests.unit.world import World

REGIONS = ("us-east", "us-west", "us-central", "eu-west")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = tracing.configure_tracing("controlplane", "", exporter=exporter)
    assert provider is not None and tracing.enabled()
    try:
        yield exporter
    finally:
        provider.shutdown()
        tracing.reset()


def run(w: World, ticks: int, down: str = "") -> None:
    for _ in range(ticks):
        for r in REGIONS:
            w.all_report(r, Health.UNHEALTHY if r == down else Health.HEALTHY)
        w.tick()


def finished(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    provider = tracing._state["provider"]
    provider.force_flush()
    return list(exporter.get_finished_spans())


def test_an_automatic_failover_is_one_trace_decision_steps_and_prewarm(
    spans: InMemorySpanExporter,
) -> None:
    w = World(failover_result=PrewarmFigures(attained_fraction=0.8))
    run(w, 3)
    assert finished(spans) == []  # nothing happened, nothing traced
    run(w, 3, down="us-east")
    assert w.state("us-east") == "FAILING_OVER"
    got = {s.name: s for s in finished(spans)}
    assert {"failover us-east", "decision", "step switch", "prewarm", "step prewarm"} <= set(got)
    root = got["failover us-east"]
    assert root.parent is None and root.context is not None and root.attributes is not None
    assert root.attributes["tectonic.cause"] == "automatic"
    assert root.attributes["tectonic.targets"] == "us-central,us-west"
    for name in ("decision", "step switch", "prewarm", "step prewarm"):
        child = got[name]
        assert child.parent is not None and child.context is not None, name
        assert child.parent.span_id == root.context.span_id, name
        assert child.context.trace_id == root.context.trace_id, name
    assert got["prewarm"].attributes is not None
    assert got["prewarm"].attributes["tectonic.attained_fraction"] == 0.8


def test_an_operators_failover_is_its_own_trace_and_says_manual(
    spans: InMemorySpanExporter,
) -> None:
    w = World()
    run(w, 2, down="")
    w.intents["i1"] = Intent(
        id="i1",
        kind=IntentKind.FAILOVER,
        region="us-west",
        targets=("us-central",),
        reason="drain",
        actor="alice",
        created_at=w.now,
    )
    run(w, 2)
    roots = [s for s in finished(spans) if s.name.startswith("failover ")]
    assert [r.name for r in roots] == ["failover us-west"]
    assert roots[0].attributes is not None and roots[0].attributes["tectonic.cause"] == "manual"


def test_off_by_default_nothing_is_traced() -> None:
    assert not tracing.enabled()
    with tracing.start("t", "x") as span:
        assert span is None
    headers: list[tuple[str, str]] = [("a", "b")]
    tracing.inject(headers)
    assert headers == [("a", "b")]
