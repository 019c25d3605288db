"""The region agent's Prometheus metrics (regions/agent/metrics.py), read back from
the exposition text: series known in advance exist at 0 from the start, probe rounds
set up/down and drop replicas no longer probed, pool snapshots count states, pre-warm
outcomes are classified and counted."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from controlplane.kernel.model import Health
from regions.agent.metrics import AgentMetrics, prewarm_result
from regions.agent.prewarm_executor import PrewarmOutcome
from regions.agent.probe_vllm import ReplicaProbe
from regions.pool.snapshot import PoolSnapshot
from regions.pool.states import PoolTarget, Replica, ReplicaState

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(m: AgentMetrics) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(m.render().decode())
        for s in family.samples
    }


def value(m: AgentMetrics, name: str, **labels: str) -> float | None:
    return samples(m).get((name, frozenset({"region": "eu", **labels}.items())))


def outcome(total: int, warmed: int, failed: int = 0, elapsed: float = 1.5) -> PrewarmOutcome:
    return PrewarmOutcome(
        total=total,
        warmed=warmed,
        failed=failed,
        elapsed_s=elapsed,
        attainment=warmed / total if total else 1.0,
        prompt_tokens=0,
    )


def test_series_known_in_advance_start_at_zero() -> None:
    m = AgentMetrics("eu", ("http://a", "http://b"), pool=True)
    for url in ("http://a", "http://b"):
        for result in ("up", "down"):
            assert value(m, "tectonic_agent_probes_total", endpoint=url, result=result) == 0
    assert value(m, "tectonic_agent_region_health", verdict="UNKNOWN") == 1
    assert value(m, "tectonic_agent_region_health", verdict="HEALTHY") == 0
    for result in ("accepted", "failed"):
        assert value(m, "tectonic_agent_reports_total", result=result) == 0
    for state in ReplicaState:
        assert value(m, "tectonic_agent_pool_replicas", state=state.value) == 0
    for kind, result in (("wake", "ok"), ("wake", "failed"), ("resume", "ok")):
        assert value(m, "tectonic_agent_pool_activations_total", kind=kind, result=result) == 0
    assert value(m, "tectonic_agent_pool_activation_duration_seconds_count", kind="wake") == 0
    for o in ("complete", "partial", "failed"):
        assert value(m, "tectonic_agent_prewarm_runs_total", outcome=o) == 0
    for result in ("warmed", "failed", "skipped"):
        assert value(m, "tectonic_agent_prewarm_prefixes_total", result=result) == 0
    assert value(m, "tectonic_agent_prewarm_duration_seconds_count") == 0
    assert value(m, "tectonic_agent_prewarm_running") == 0


def test_an_agent_without_a_pool_exports_no_pool_series() -> None:
    names = {name for name, _ in samples(AgentMetrics("eu", ("http://a",)))}
    assert not {n for n in names if n.startswith("tectonic_agent_pool_")}


def test_probe_rounds_set_up_down_and_drop_replicas_no_longer_probed() -> None:
    m = AgentMetrics("eu", ("http://a",), pool=True)
    m.probed([ReplicaProbe(url="http://a", up=True), ReplicaProbe(url="http://b", up=False)], 100)
    assert value(m, "tectonic_agent_replica_up", endpoint="http://a") == 1
    assert value(m, "tectonic_agent_replica_up", endpoint="http://b") == 0
    assert (
        value(m, "tectonic_agent_replica_last_probe_timestamp_seconds", endpoint="http://b") == 100
    )
    assert value(m, "tectonic_agent_probes_total", endpoint="http://b", result="down") == 1
    assert value(m, "tectonic_agent_probes_total", endpoint="http://b", result="up") == 0

    m.probed([ReplicaProbe(url="http://a", up=False)], 101)  # b drained from the pool
    assert value(m, "tectonic_agent_replica_up", endpoint="http://a") == 0
    assert value(m, "tectonic_agent_probes_total", endpoint="http://a", result="up") == 1
    assert value(m, "tectonic_agent_probes_total", endpoint="http://a", result="down") == 1
    assert not {labels for _, labels in samples(m) if ("endpoint", "http://b") in labels}


def test_verdict_and_reports() -> None:
    m = AgentMetrics("eu")
    m.viewed(Health.UNHEALTHY)
    assert value(m, "tectonic_agent_region_health", verdict="UNHEALTHY") == 1
    assert value(m, "tectonic_agent_region_health", verdict="UNKNOWN") == 0
    m.reported(True)
    m.reported(False)
    m.reported(False)
    assert value(m, "tectonic_agent_reports_total", result="accepted") == 1
    assert value(m, "tectonic_agent_reports_total", result="failed") == 2


def test_pool_snapshot_counts_replicas_per_state() -> None:
    m = AgentMetrics("eu", pool=True)
    snap = PoolSnapshot(
        replicas=(
            Replica(name="r0", url="http://a", state=ReplicaState.ACTIVE),
            Replica(name="r1", url="http://b", state=ReplicaState.WARM),
            Replica(name="r2", url="http://c", state=ReplicaState.WARM),
            Replica(name="r3"),
        ),
        target=PoolTarget(active=2, warm=1),
        shortfall=1,
    )
    m.pool_snapshot(snap)
    counts = {
        s.value: value(m, "tectonic_agent_pool_replicas", state=s.value) for s in ReplicaState
    }
    assert counts == {"COLD": 1, "WARM": 2, "ACTIVE": 1, "IDLE": 0, "LENT": 0}
    assert value(m, "tectonic_agent_pool_shortfall") == 1


def test_activations_count_both_results_and_time_the_successful_ones() -> None:
    m = AgentMetrics("eu", pool=True)
    m.activated("wake", True, 0.3)
    m.activated("wake", False, 5.0)
    m.activated("resume", True, 0.0)
    assert value(m, "tectonic_agent_pool_activations_total", kind="wake", result="ok") == 1
    assert value(m, "tectonic_agent_pool_activations_total", kind="wake", result="failed") == 1
    assert value(m, "tectonic_agent_pool_activation_duration_seconds_count", kind="wake") == 1
    assert value(m, "tectonic_agent_pool_activation_duration_seconds_sum", kind="wake") == 0.3
    assert value(m, "tectonic_agent_pool_activation_duration_seconds_count", kind="resume") == 1


def test_prewarm_outcomes() -> None:
    assert prewarm_result(outcome(4, 4), crashed=False) == "complete"
    assert prewarm_result(outcome(0, 0), crashed=False) == "complete"  # nothing to warm
    assert prewarm_result(outcome(4, 3, failed=1), crashed=False) == "partial"
    assert prewarm_result(outcome(4, 0, failed=4), crashed=False) == "failed"
    assert prewarm_result(outcome(4, 4), crashed=True) == "failed"


def test_prewarm_runs_are_counted_with_duration_and_prefixes() -> None:
    m = AgentMetrics("eu")
    m.prewarm_started()
    assert value(m, "tectonic_agent_prewarm_running") == 1
    m.prewarm_done(outcome(10, 6, failed=1, elapsed=2.0))  # 3 cut by the budget
    assert value(m, "tectonic_agent_prewarm_running") == 0
    assert value(m, "tectonic_agent_prewarm_runs_total", outcome="partial") == 1
    assert value(m, "tectonic_agent_prewarm_duration_seconds_sum") == 2.0
    prefixes = {
        r: value(m, "tectonic_agent_prewarm_prefixes_total", result=r)
        for r in ("warmed", "failed", "skipped")
    }
    assert prefixes == {"warmed": 6, "failed": 1, "skipped": 3}
