"""The gateway's Prometheus metrics: the data plane's (``regions/dataplane/metrics.py``,
which the endpoint picker exports too) and what only the gateway's forwarding counts,
the continuations of cut streams (``resume.py``). Warm first adds its own series on
the same registry (``warmth.py``)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter

from regions.dataplane.metrics import CONTENT_TYPE, DataPlaneMetrics, start_at_zero

__all__ = ["CONTENT_TYPE", "CONTINUATION_OUTCOMES", "GatewayMetrics", "start_at_zero"]

CONTINUATION_OUTCOMES = ("continued", "ended", "refused", "failed")


class GatewayMetrics(DataPlaneMetrics):
    def __init__(
        self, zones: Mapping[str, str] | None = None, *, component: str = "gateway"
    ) -> None:
        """As ``DataPlaneMetrics``; the continuations' series start at 0 for ``zones``'
        regions too."""
        super().__init__(zones, component=component)
        self.continuations = Counter(
            "tectonic_gateway_stream_continuations",
            "Streams whose replica failed after the first byte, by region and outcome: "
            "continued (elsewhere, the client saw one stream), ended (the whole answer "
            "had been sent: only [DONE] was added), refused (not continuable: tool calls, "
            "structured output, more than one choice, turned off), failed (no replica "
            "took the continuation before its deadline: the cut is visible)",
            ["region", "outcome"],
            registry=self.registry,
        )
        if zones:
            start_at_zero(
                self.continuations, [(r, o) for r in zones for o in CONTINUATION_OUTCOMES]
            )

    def continuation(self, region: str, outcome: str) -> None:
        self.continuations.labels(region, outcome).inc()
