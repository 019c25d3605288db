"""What the code exports to Prometheus, and PromQL read against it, for the alert
tests (tests/unit/test_alert_*.py).

``EXPORTED``: every series name the code exports, with its real suffix (counters
``_total``, histograms ``_bucket`` / ``_sum`` / ``_count``) and the labels it carries.
The names come from the real registries (``ControlPlaneMetrics``, ``GatewayMetrics``, the
endpoint picker's ``DataPlaneMetrics``, ``AgentMetrics``), exercised so that labelled
series exist; etcd's own metrics that rules read (``ETCD_METRICS``) are added.
``check_promql`` names what an expression queries that is not there: unknown metrics,
functions, labels or enum values.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from controlplane.core.actions import TickResult
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, WorkloadProfile
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.model import (
    Decision,
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    Health,
    Readiness,
    RegionHealth,
    RegionRecord,
    RegionState,
    Routing,
)
from controlplane.kernel.pool.cost import BudgetNote, CostPolicy, Prices
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.metrics import ControlPlaneMetrics
from regions.agent.metrics import AgentMetrics
from regions.agent.probe_vllm import ReplicaProbe
from regions.dataplane.failures import ErrorKind
from regions.dataplane.metrics import DataPlaneMetrics
from regions.gateway.metrics import GatewayMetrics

TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series
# etcd's own metrics that rules read (scraped from every member, not exported by
# Tectonic): name -> its labels besides the target's. Gauges since etcd 3.4;
# test_etcd_exports_the_metrics_the_rules_read (test_alert_rules.py) checks them on the
# installed etcd.
ETCD_METRICS: dict[str, set[str] | None] = {
    "etcd_mvcc_db_total_size_in_bytes": set(),  # the database file, what the quota counts
    "etcd_server_quota_backend_bytes": set(),  # --quota-backend-bytes in effect
}


def capacity_topology(names: tuple[str, ...] = ("east", "west", "north")) -> Topology:
    return parse_topology(
        {
            "cluster": "alerts",
            "regions": [
                {"name": n, "zone": "us", "agent": "127.0.0.1:1", "capacity_rps": 50} for n in names
            ],
        }
    )


def capacity_record(region: str, measured_at: float, r_base: float = 10.0) -> CapacityRecord:
    probe = HitProbe(hit_rate=0.0, baseline_p99_s=0.1, ultimate_rps=r_base, ultimate_bounded=True)
    return CapacityRecord(
        region=region,
        measured_at=measured_at,
        engine_version="0.11.0",
        replica=f"http://{region}-0:8000",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=2.0,
        probes=(probe,),
        r_base_rps=r_base,
        beta=0.5,
        profile=WorkloadProfile(
            prompt_tokens_p50=500, prompt_tokens_p90=2000, output_tokens=64, shared_prefix_share=0.5
        ),
    )


# ---- what the code exports -----------------------------------------------------------


def _exercised_registries() -> list[CollectorRegistry]:
    """The real registries, with a child of every labelled metric created by the code
    paths that create them (a labelled family without children has no samples)."""
    priced = capacity_topology(("east", "west")).model_copy(  # the cost series too
        update={
            "cost": CostPolicy(prices=Prices(active=4, warm=1), pool_budgets={"east": 9}),
            "scaling": ScalingPolicy(standby_rps=30.0),  # the cold-start series too
        }
    )
    cp = ControlPlaneMetrics(["east", "west"], priced)
    plan = FailoverPlan(source="east", targets={"west": 1.0}, reason="down", actor="cp")
    progress = FailoverProgress(
        plan=plan, started_at=10.0, prewarm_result={"prefixes_total": 4, "prefixes_warmed": 3}
    )
    east = RegionView(
        name="east",
        record=RegionRecord(region="east", state=RegionState.FAILING_OVER, epoch=1),
        # a load and a hit rate: the hit-rate series (served, critical) too
        health=RegionHealth(
            region="east",
            verdict=Health.UNHEALTHY,
            signals={"load_rps": 5.0, "prefix_hit_rate": 0.5},
        ),
        readiness=Readiness(passed=False, drill="blackout", at=5.0),
        routing=Routing(targets={"west": 1.0}, epoch=1),
        capacity=capacity_record("east", measured_at=10.0),
    )
    west = RegionView(
        name="west", record=RegionRecord(region="west"), health=RegionHealth(region="west")
    )
    sized = ScaleRecord(
        unit="east",
        active=2,
        warm=1,
        decided_at=20.0,
        changed_at=20.0,
        load_rps=10.0,
        forecast_rps=12.0,
        upper_rps=15.0,
        per_replica_rps=8.0,
        budget=BudgetNote(spend_per_hour=9.0, short=1),
    )
    east = east.model_copy(update={"scale": sized, "active_replicas": 2, "activation_p95_s": 0.2})
    cp.tick_done(
        leader=True,
        snapshot=Snapshot(now=20.0, regions={"east": east, "west": west}),
        result=TickResult(now=20.0, sizes={"east": sized}),
    )
    cp.transitioned(
        Decision(
            region="east",
            from_state=RegionState.NORMAL,
            to_state=RegionState.FAILING_OVER,
            trigger="fail_over",
            reason="down",
            actor="cp",
            at=10.0,
            epoch=1,
        )
    )
    cp.failover_step_done("east", FailoverStep.SWITCH, progress, at=11.0)
    cp.failover_step_done("east", FailoverStep.PREWARM, progress, at=12.0)
    cp.tick_timed(0.02)

    gw = GatewayMetrics({"east": "us", "west": "us"})
    # The endpoint picker: the gateway's series (less continuations) under its prefix.
    picker = DataPlaneMetrics({"east": "us", "west": "us"}, component="picker")
    for data_plane in (gw, picker):
        data_plane.request("east", 200)
        data_plane.error("east", ErrorKind.CONNECT)
        data_plane.first_byte("east", 0.1)
        data_plane.retry("east")
        data_plane.degrade("east", "shed")
        data_plane.spill("east", "west")
        data_plane.admitted("east", "batch")
        data_plane.admission_refused("east", "batch", "queue_full")
    gw.continuation("east", "failed")

    agent = AgentMetrics("east", ["http://e1:8000"], pool=True)
    agent.probed([ReplicaProbe(url="http://e1:8000", up=False)], at=20.0)
    agent.activated("wake", False, 1.0)
    agent.pool_shortfall.labels("east").set(1)
    return [cp.registry, gw.registry, picker.registry, agent.registry]


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}


def exported_metrics() -> dict[str, set[str] | None]:
    """Every series name the code exports -> its label names (None: not known, because
    the family had no sample to read them from)."""
    out: dict[str, set[str] | None] = {}
    for registry in _exercised_registries():
        for family in registry.collect():
            if family.samples:
                for s in family.samples:
                    labels = out.setdefault(s.name, set())
                    assert labels is not None
                    labels.update(s.labels)
            else:
                for suffix in _SUFFIXES.get(family.type, ("",)):
                    out.setdefault(family.name + suffix, None)
    return out


EXPORTED = {**exported_metrics(), **ETCD_METRICS}

# ---- PromQL: the metric names, selectors and groupings of an expression ---------------

PROMQL_FUNCTIONS = {
    # aggregations
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    # functions
    "abs",
    "absent",
    "absent_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "histogram_count",
    "histogram_sum",
    "histogram_fraction",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "predict_linear",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
    "present_over_time",
}
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
}

_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_STRINGS = re.compile(_STRING)
_SELECTOR = re.compile(rf"([A-Za-z_:][\w:]*)?\s*\{{((?:[^{{}}\"']|{_STRING})*)\}}")
_MATCHER = re.compile(rf"([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*({_STRING})")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GRAFANA_VAR = re.compile(r"\$\{?\w+\}?")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")


_NAME_MATCHER = re.compile(r'__name__\s*=~?\s*"([^"\\]*)"')
_ALTERNATION = re.compile(r"([\w:]*)\(([\w:|]+)\)([\w:]*)")


def expand_name(pattern: str) -> list[str]:
    """The metric names a ``__name__`` matcher's value stands for: a plain name, or one
    group of alternatives (``tectonic_(gateway|picker)_requests_total``, how the rules
    read a series that both data planes export); anything else is returned as it is
    (and then reported as not exported)."""
    if (m := _ALTERNATION.fullmatch(pattern)) is None:
        return [pattern]
    return [m.group(1) + alt + m.group(3) for alt in m.group(2).split("|")]


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) in a PromQL expression, including those a
    ``{__name__=~"..."}`` selector names; Grafana's ``$variables`` may appear where
    PromQL allows a literal."""
    by_matcher = {n for m in _NAME_MATCHER.finditer(expr) for n in expand_name(m.group(1))}
    e = _STRINGS.sub('""', expr)
    e = _GRAFANA_VAR.sub("1", e)
    e = _RANGE.sub("", e)
    e = _GROUPING.sub(" ", e)
    e = re.sub(r"\{[^{}]*\}", "", e)
    metrics: set[str] = set()
    functions: set[str] = set()
    for m in _IDENT.finditer(e):
        name, call = m.group(1), m.group(2)
        if name in PROMQL_KEYWORDS:
            continue
        (functions if call else metrics).add(name)
    return metrics | by_matcher, functions


def promql_selectors(expr: str) -> list[tuple[str | None, dict[str, str]]]:
    """Each ``name{label op "value", ...}`` of the expression: (name, {label: value});
    a selector by ``__name__`` gives one entry per name it stands for."""
    out: list[tuple[str | None, dict[str, str]]] = []
    for m in _SELECTOR.finditer(expr):
        labels = {lm.group(1): lm.group(3)[1:-1] for lm in _MATCHER.finditer(m.group(2))}
        if "__name__" in labels:
            names: list[str | None] = list(expand_name(labels.pop("__name__")))
        else:
            names = [m.group(1)]
        out += [(name, dict(labels)) for name in names]
    return out


def promql_grouping_labels(expr: str) -> set[str]:
    e = _STRINGS.sub('""', expr)
    return {
        label.strip()
        for m in _GROUPING.finditer(e)
        for label in m.group(2).split(",")
        if label.strip()
    }


def check_promql(expr: str, where: str) -> list[str]:
    """Problems with ``expr``: unknown metrics, functions, labels or enum values."""
    problems = []
    metrics, functions = promql_names(expr)
    if not metrics:
        problems.append(f"{where}: no metric in {expr!r}")
    for name in sorted(metrics - EXPORTED.keys()):
        problems.append(f"{where}: {name} is not exported by the code")
    for name in sorted(functions - PROMQL_FUNCTIONS):
        problems.append(f"{where}: {name}() is not a PromQL function")
    known_labels = set(TARGET_LABELS)
    for name in metrics & EXPORTED.keys():
        known_labels |= EXPORTED[name] or set()
    for selected, labels in promql_selectors(expr):
        have = EXPORTED.get(selected) if selected else None
        allowed = (have | TARGET_LABELS) if have is not None else known_labels
        for label, value in labels.items():
            if label not in allowed:
                problems.append(f"{where}: {selected or 'selector'} has no label {label!r}")
            enum = {"state": RegionState, "verdict": Health}.get(label)
            if enum is not None and "$" not in value:
                for v in re.split(r"\|", value):
                    if v not in {e.value for e in enum}:
                        problems.append(f"{where}: {label}={v!r} is not a {enum.__name__}")
    for label in sorted(promql_grouping_labels(expr) - known_labels):
        problems.append(f"{where}: grouping by {label!r}, which no metric here carries")
    return problems
