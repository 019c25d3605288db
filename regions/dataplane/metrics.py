"""A data plane's Prometheus metrics, the gateway's (``tectonic_gateway_*``) and the
endpoint picker's (the same series under its own prefix, ``tectonic_picker_*``; in
0.1.0 the picker exported the gateway's names, so the shipped rules and dashboard match
both: ``{__name__=~"tectonic_(gateway|picker)_..."}``), on a registry of its own (never
the process-wide default, so two data planes in one test process do not share counters).
What only the gateway's forwarding counts (stream continuations) is added by
``regions/gateway/metrics.py``, warm first's series by ``regions/gateway/warmth.py``.

Label children are cached here: ``labels()`` takes a lock and builds a tuple per
call, which adds up on a path that handles every request.

Every series whose labels are known at start (the topology's regions and zones, the
error kinds, statuses and degradation actions below) exists from the start at 0: a
series born at its first event hides that event, and a whole burst inside one scrape,
from ``increase()`` and ``rate()``. Except the spills between the regions of a zone,
which grow as regions² / zones (65,024 pairs at 512 regions in 4 zones: 0.46 s to build,
three quarters of a 14 MB scrape): those pairs start at 0 only while there are at most
``SPILL_PAIRS_AT_ZERO`` of them; beyond, a pair's series is born at its first spill
(so the series are the pairs that spilled). What that hides is one pair's first
spill, from ``rate()``: the spilling page (``TectonicGatewaySpilling``) wants 5 minutes
of spills and is at most a scrape later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controlplane.kernel.metric_labels import exposition
from controlplane.kernel.version import build_info
from regions.dataplane.actuators import Action
from regions.dataplane.admission_limit import PRIORITIES, REFUSAL_REASONS
from regions.dataplane.failures import NO_REGION_KINDS, REGION_KINDS, ErrorKind

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# First-token latency spans sub-millisecond (cached, simulator) to tens of seconds
# (long prefill under load).
FIRST_TOKEN_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
COMPONENTS = ("gateway", "picker")  # the data planes, each with its metrics' prefix
NO_REGION = "none"  # the region label of requests refused before a region was chosen
# Statuses counted from the start for every region: 200, and each 5xx a gateway answers
# with: a replica's own after the retries (regions/gateway/proxy.py RETRYABLE_STATUS),
# 502 for a stream cut after its first byte (regions/gateway/resume.py
# STREAM_BROKEN_STATUS), 503 when nothing takes a request.
REGION_CODES = (200, 500, 502, 503, 504)
NO_REGION_CODES = (400, 503)  # refused before a region was chosen: bad request, no region
# Above this many same-zone region pairs, spill series are born at their first spill
# (the module's docstring): 32 regions in 4 zones (224 pairs) still start at 0.
SPILL_PAIRS_AT_ZERO = 1024


def start_at_zero(metric: Counter | Histogram, label_sets: Iterable[Sequence[str]]) -> None:
    """Create the children of ``metric`` for ``label_sets`` now, at 0."""
    for values in label_sets:
        metric.labels(*values)


def spill_pairs_at_zero(zones: Mapping[str, str]) -> list[tuple[str, str]]:
    """The (from, to) pairs of regions of one zone, when there are at most
    ``SPILL_PAIRS_AT_ZERO``; else none. Counted per zone first: O(regions)."""
    by_zone: dict[str, list[str]] = {}
    for region, zone in zones.items():
        by_zone.setdefault(zone, []).append(region)
    if sum(len(g) * (len(g) - 1) for g in by_zone.values()) > SPILL_PAIRS_AT_ZERO:
        return []
    return [(a, b) for g in by_zone.values() for a in g for b in g if a != b]


class DataPlaneMetrics:
    def __init__(
        self, zones: Mapping[str, str] | None = None, *, component: str = "gateway"
    ) -> None:
        """``zones``: the topology's region -> zone (its regions, and the spills they
        may make while there are at most ``SPILL_PAIRS_AT_ZERO`` pairs, start at 0);
        none: every series appears at its first event.
        ``component``: ``gateway``, or ``picker`` for the endpoint picker: the metrics'
        prefix (``tectonic_<component>_``) and ``tectonic_build_info``'s label."""
        if component not in COMPONENTS:
            raise ValueError(f"component must be one of {COMPONENTS}, not {component!r}")
        p = f"tectonic_{component}_"
        self.registry = CollectorRegistry(auto_describe=True)
        self.pool_models: Mapping[str, str] = {}  # unit -> model label (docs/models.md)
        r = self.registry
        build_info(r, component)
        self.requests = Counter(
            p + "requests",
            "Requests answered, by serving region and HTTP status, counted when the answer "
            "ends; a stream cut after its first byte counts as 502 (its in-band error event "
            'says 502; errors_total{kind="stream_broken"} counts it too)',
            ["region", "code"],
            registry=r,
        )
        self.errors = Counter(
            p + "errors",
            "Failures seen by the gateway (connect, upstream 5xx, broken stream, no replica, "
            "no region, bad request; client_gone: the client closed before it had the whole "
            "answer), by region",
            ["region", "kind"],
            registry=r,
        )
        self.first_token = Histogram(
            p + "first_token_seconds",
            "From request arrival to the first response byte sent to the client",
            ["region"],
            buckets=FIRST_TOKEN_BUCKETS,
            registry=r,
        )
        # scale to zero (regions/dataplane/wake.py): requests that found their pool at
        # zero and woke it, and how long each was held (result: served, refused)
        self.wakes = Counter(
            p + "pool_wakes",
            "Requests that found their pool at zero (scale to zero) and asked the leader "
            "to wake it, by region",
            ["region"],
            registry=r,
        )
        self.wake_wait = Histogram(
            p + "pool_wake_wait_seconds",
            "How long a request for a pool at zero was held for a replica to wake, by "
            "region and result (served: one woke within the hold; refused: 503 Retry-After)",
            ["region", "result"],
            buckets=FIRST_TOKEN_BUCKETS,
            registry=r,
        )
        self.session_moves = Counter(
            p + "session_moves",
            "Sessions this gateway re-pinned to another region, or whose pin it changed to "
            "etcd's answer after serving from its cache during an etcd outage",
            registry=r,
        )
        self.consistency_violations = Counter(
            p + "consistency_violations",
            "Sessions found served outside their pinned region: this gateway's cached pin "
            "named another region than etcd's while both still served (should stay 0)",
            registry=r,
        )
        self.retries = Counter(
            p + "retries",
            "Attempts retried on another replica before the first byte",
            ["region"],
            registry=r,
        )
        self.fail_static = Counter(
            p + "fail_static",
            "Sessions resolved from the local cache because etcd was unavailable",
            registry=r,
        )
        self.pending_pins = Gauge(
            p + "pending_pins",
            "Pins made while etcd was unavailable, not yet written to etcd",
            registry=r,
        )
        self.store_up = Gauge(
            p + "store_up",
            "1 while etcd answers the gateway, 0 while it serves from its cache",
            registry=r,
        )
        self.routing_revision = Gauge(
            p + "routing_revision",
            "etcd revision of the routing the gateway follows",
            registry=r,
        )
        self.spills = Counter(
            p + "spills",
            "Requests sent to another region of the zone because no replica of theirs "
            "answered before the first byte (their session moved with them), by region",
            ["from_region", "to_region"],
            registry=r,
        )
        self.move_notices = Counter(
            p + "session_move_notices",
            "Notices from other gateways that they moved sessions off a region (no replica "
            "answered: a spill); this gateway's cached pins of it were re-read from etcd",
            ["region"],
            registry=r,
        )
        self.degraded = Counter(
            p + "degraded",
            "Requests a degradation actuator acted on, by serving region and action "
            "(shed, context_rejected, context_truncated, parallel_tool_calls_off)",
            ["region", "action"],
            registry=r,
        )
        self.prefix_payloads_dropped = Counter(
            p + "prefix_payloads_dropped",
            "Replay payloads of shared prefixes that the size cut of this gateway's prefix "
            "export (prefixes.export_max_bytes) left out, summed over the exports written; "
            "a failover cannot pre-warm a prefix whose payload never reached the leader",
            registry=r,
        )
        self._admission(r, p)
        self._requests: dict[tuple[str, int], Counter] = {}
        self._errors: dict[tuple[str, ErrorKind], Counter] = {}
        self._first: dict[str, Histogram] = {}
        self._retries: dict[str, Counter] = {}
        if zones:
            self._start_at_zero(zones)

    def _admission(self, r: CollectorRegistry, p: str) -> None:
        """Admission control's series (admission_gate.py); they start at 0 only on a
        data plane that runs it (``admission_started``)."""
        self.admission_admitted_total = Counter(
            p + "admission_admitted",
            "Requests admission control let through to a replica, by region and priority "
            "partition (interactive, batch), whether they waited first or not",
            ["region", "priority"],
            registry=r,
        )
        self.admission_queued_total = Counter(
            p + "admission_queued",
            "Requests that found every replica of their region at its in-flight limit and "
            "waited (then admitted, or refused on timeout or eviction)",
            ["region", "priority"],
            registry=r,
        )
        self.admission_refused_total = Counter(
            p + "admission_refused",
            "Requests answered 429 with Retry-After by admission control, by region, "
            "priority and reason (queue_full, timeout: waited the queue's wait, evicted: a "
            "batch waiter dropped for an interactive arrival)",
            ["region", "priority", "reason"],
            registry=r,
        )
        self.admission_limit_gauge = Gauge(
            p + "admission_limit",
            "Each replica's current in-flight limit (adaptive: grows while first tokens "
            "come within the target, shrinks when they do not); endpoint: the replica's URL",
            ["region", "endpoint"],
            registry=r,
        )
        self._admission_counts: dict[tuple[str, ...], Counter] = {}  # (kind, *labels)
        self._admission_limits: dict[tuple[str, str], Gauge] = {}

    def admission_started(self, regions: Iterable[str]) -> None:
        regions = list(regions)
        for counter in (self.admission_admitted_total, self.admission_queued_total):
            start_at_zero(counter, [(g, p.value) for g in regions for p in PRIORITIES])
        start_at_zero(
            self.admission_refused_total,
            [(g, p.value, why) for g in regions for p in PRIORITIES for why in REFUSAL_REASONS],
        )

    def _admission_count(self, kind: str, counter: Counter, *labels: str) -> None:
        child = self._admission_counts.get((kind, *labels))
        if child is None:
            child = self._admission_counts[kind, *labels] = counter.labels(*labels)
        child.inc()

    def admitted(self, region: str, priority: str) -> None:
        self._admission_count("admitted", self.admission_admitted_total, region, priority)

    def admission_queued(self, region: str, priority: str) -> None:
        self._admission_count("queued", self.admission_queued_total, region, priority)

    def admission_refused(self, region: str, priority: str, reason: str) -> None:
        self._admission_count("refused", self.admission_refused_total, region, priority, reason)

    def admission_limit(self, region: str, replica: str, limit: float) -> None:
        child = self._admission_limits.get((region, replica))
        if child is None:
            child = self._admission_limits[region, replica] = self.admission_limit_gauge.labels(
                region, replica
            )
        child.set(round(limit, 2))

    def admission_replica_gone(self, region: str, replica: str) -> None:
        """A replica that left its region: its limit's series goes with it."""
        self._admission_limits.pop((region, replica), None)
        with contextlib.suppress(KeyError):
            self.admission_limit_gauge.remove(region, replica)

    def _start_at_zero(self, zones: Mapping[str, str]) -> None:
        regions = list(zones)
        for region in regions:
            for code in REGION_CODES:
                self._requests[region, code] = self.requests.labels(region, str(code))
            for kind in REGION_KINDS:
                self._errors[region, kind] = self.errors.labels(region, kind.value)
            self._first[region] = self.first_token.labels(region)
            self._retries[region] = self.retries.labels(region)
        for code in NO_REGION_CODES:
            self._requests[NO_REGION, code] = self.requests.labels(NO_REGION, str(code))
        for kind in NO_REGION_KINDS:
            self._errors[NO_REGION, kind] = self.errors.labels(NO_REGION, kind.value)
        start_at_zero(self.move_notices, [(r,) for r in regions])
        start_at_zero(self.degraded, [(r, a.value) for r in regions for a in Action])
        start_at_zero(self.spills, spill_pairs_at_zero(zones))

    def request(self, region: str, code: int) -> None:
        child = self._requests.get((region, code))
        if child is None:
            child = self._requests[region, code] = self.requests.labels(region, str(code))
        child.inc()

    def spill(self, from_region: str, to_region: str) -> None:
        self.spills.labels(from_region, to_region).inc()

    def error(self, region: str, kind: ErrorKind) -> None:
        child = self._errors.get((region, kind))
        if child is None:
            child = self._errors[region, kind] = self.errors.labels(region, kind.value)
        child.inc()

    def first_byte(self, region: str, seconds: float) -> None:
        child = self._first.get(region)
        if child is None:
            child = self._first[region] = self.first_token.labels(region)
        child.observe(seconds)

    def retry(self, region: str) -> None:
        child = self._retries.get(region)
        if child is None:
            child = self._retries[region] = self.retries.labels(region)
        child.inc()

    def degrade(self, region: str, action: str) -> None:
        # Only degraded requests get here: labels() without a child cache is fine.
        self.degraded.labels(region, action).inc()

    def render(self) -> bytes:
        """The exposition; with model pools, each pool's series with its ``model`` label
        (``pool_models``, set from the topology)."""
        return exposition(self.registry, self.pool_models)
