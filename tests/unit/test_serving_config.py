"""A capacity record knows the serving configuration it measured under
(controlplane/kernel/capacity/serving.py): what is read of a replica, the fingerprint,
the region's merge of its replicas', and a record made stale by a changed one (as by
another engine) in the planner's resolve, the leader's fold, the report's validation
and the gateway's admission bound. Pure."""

from __future__ import annotations

import json

import pytest

from controlplane.core.health import fold_health
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    Bearing,
    CapacityPolicy,
    CapacityRecord,
    CapacitySource,
    HitProbe,
    WorkloadProfile,
    resolve,
)
from controlplane.kernel.capacity.serving import (
    MAX_FINGERPRINT,
    ServingConfig,
    cache_info,
    clean_fingerprint,
    differences,
    merge_fingerprints,
    models_entry,
    parse_fingerprint,
    scheduler_info,
    serving_config,
)
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import load_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health, HealthReport, ObserverKind, RegionHealth
from controlplane.kernel.store.memory import MemoryStore
from controlplane.reports import BadReport, validate_report
from regions.agent.engine_version import EngineVersions
from regions.agent.probe_vllm import ReplicaProbe
from regions.dataplane.admission_bound import InflightBound
from regions.dataplane.admission_gate import AdmissionGates, AdmissionOptions
from regions.dataplane.capacity_bounds import CapacityBounds, region_bound
from regions.dataplane.metrics import DataPlaneMetrics
from regions.simulator.admin import vllm_config
from regions.simulator.engine import Engine, EngineConfig
from tests.unit import test_admission_bound as ab
from tests.unit.world import topology

# vLLM 0.32's gauge (labels are CacheConfig's fields), one engine.
METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
    'engine="0",gpu_memory_utilization="0.9",kv_offloading_size="None",'
    'num_cpu_blocks="None",num_gpu_blocks="27000",prefix_caching_hash_algo="sha256"} 1.0\n'
    'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
)
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}
SERVER_INFO = {"vllm_config": {"scheduler_config": {"max_num_seqs": 256}}, "vllm_env": {}}
NOW = 1_000_000.0


def rec(serving: ServingConfig | None, engine: str = "0.32.0") -> CapacityRecord:
    probe = HitProbe(hit_rate=0.0, baseline_p99_s=0.1, ultimate_rps=10.0, ultimate_bounded=True)
    return CapacityRecord(
        region="us-east",
        measured_at=NOW - 3600,
        engine_version=engine,
        replica="http://us-east-0:8000",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=2.0,
        probes=(probe,),
        r_base_rps=10.0,
        beta=0.0,
        profile=WorkloadProfile(
            prompt_tokens_p50=500, prompt_tokens_p90=2000, output_tokens=64, shared_prefix_share=0.5
        ),
        serving=serving,
    )


def bearing(record: CapacityRecord, serving: str | None, engine: str | None = "0.32.0") -> Bearing:
    return resolve(
        "us-east",
        record,
        capacity_rps=3.0,
        policy=CapacityPolicy(),
        now=NOW,
        active_replicas=1,
        engine_version=engine,
        serving_config=serving,
    )


def test_what_a_replica_says_of_its_configuration_is_read() -> None:
    assert models_entry(MODELS) == ("m", 4096)
    assert models_entry(MODELS, "m") == ("m", 4096)
    assert models_entry(MODELS, "other") is None
    assert models_entry({"data": [{"id": "x"}]}) == ("x", None)  # no max_model_len: unknown
    assert models_entry({"data": []}) is None and models_entry(None) is None
    assert cache_info(METRICS) == {
        "block_size": "16",
        "num_gpu_blocks": "27000",
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
    }  # "None" values and labels that do not bear on capacity are left out
    assert cache_info("vllm:num_requests_running 0\n") == {}
    assert scheduler_info(SERVER_INFO) == {"max_num_seqs": 256}
    # The text form (the default config_format) carries it as key=value
    assert scheduler_info({"vllm_config": "model='m', max_num_seqs=64, x=1"}) == {
        "max_num_seqs": 64
    }
    assert scheduler_info(None) == {} and scheduler_info({"detail": "Not Found"}) == {}
    config = serving_config("m", 4096, METRICS, SERVER_INFO)
    assert config.fingerprint() == (
        "model=m;max_model_len=4096;max_num_seqs=256;block_size=16;num_gpu_blocks=27000;"
        "cache_dtype=auto;enable_prefix_caching=True"
    )
    assert serving_config("", None).fingerprint() == ""  # nothing said: nothing judged


def test_the_simulator_answers_server_info_as_vllm_does() -> None:
    engine = Engine(EngineConfig(max_num_seqs=4, max_model_len=2048))
    body = json.loads(json.dumps({"vllm_config": vllm_config(engine)}))
    assert scheduler_info(body) == {"max_num_seqs": 4}


def test_fingerprints_merge_and_differ_only_where_both_know() -> None:
    a = "model=m;max_model_len=4096;max_num_seqs=8;block_size=16"
    b = "model=m;max_model_len=4096;max_num_seqs=16;block_size=16"
    assert merge_fingerprints([a, a]) == a
    # A key on which the replicas differ names each value: no probe's single one matches.
    both = merge_fingerprints([a, b, ""])
    assert parse_fingerprint(both)["max_num_seqs"] == "16|8"
    assert differences(a, both) == ["max_num_seqs 8 -> 16|8"]
    assert differences(a, b) == ["max_num_seqs 8 -> 16"]
    assert differences(a, "model=m") == []  # max_num_seqs unknown now: not judged
    assert differences("model=m", b) == []  # unknown when measured: not judged
    assert merge_fingerprints([]) == ""
    # Cleaned to what the control plane takes: printable, bounded, whole entries.
    long = ";".join(f"k{i}={'v' * 50}" for i in range(40)) + "\x07"
    cleaned = clean_fingerprint(long)
    assert len(cleaned) <= MAX_FINGERPRINT and cleaned.isprintable()
    assert all(len(v) == 50 for v in parse_fingerprint(cleaned).values())


def test_a_changed_max_num_seqs_makes_the_record_stale_as_another_engine_does() -> None:
    measured = serving_config("m", 4096, METRICS, SERVER_INFO)
    record = rec(measured)
    same = bearing(record, measured.fingerprint())
    assert same.source is CapacitySource.MEASURED
    changed = measured.model_copy(update={"max_num_seqs": 128}).fingerprint()
    stale = bearing(record, changed)
    assert stale.source is CapacitySource.STALE and stale.stale
    assert stale.allowed(0.0) == 3.0  # the typed capacity
    assert "max_num_seqs 256 -> 128" in stale.reason
    # Not known (no agent said), or a record from before it was kept: not judged.
    assert bearing(record, None).source is CapacitySource.MEASURED
    assert bearing(record, "").source is CapacitySource.MEASURED
    assert bearing(rec(None), changed).source is CapacitySource.MEASURED
    # Another engine is said first, as before.
    other = bearing(record, changed, engine="0.33.0")
    assert other.stale and "'0.33.0'" in other.reason


def test_a_record_without_a_serving_config_still_loads_and_one_with_it_round_trips() -> None:
    old = json.loads(encode(rec(None)))
    assert "serving" not in old and "max_prompt_tokens" not in old["profile"]
    assert "workload_errors" not in old
    assert decode(CapacityRecord, json.dumps(old).encode()).serving is None
    record = rec(serving_config("m", 4096, METRICS, SERVER_INFO))
    assert decode(CapacityRecord, encode(record)) == record


def test_the_agents_word_on_the_configuration_is_validated_and_folded() -> None:
    topo = topology()

    def report(serving: str, observer: str = "agent:a", at: float = 99.0) -> HealthReport:
        return validate_report(
            topo,
            region="us-east",
            observer=observer,
            kind=ObserverKind.AGENT,
            health=Health.HEALTHY,
            signals={},
            detail="",
            now=at,
            engine_version="0.32.0",
            serving_config=serving,
        )

    with pytest.raises(BadReport, match="serving_config"):
        report("x" * (MAX_FINGERPRINT + 1))
    with pytest.raises(BadReport, match="serving_config"):
        report("max_num_seqs=8\n")
    T = topo.timing
    prev = RegionHealth(region="us-east", verdict=Health.HEALTHY)
    votes = [
        report("max_num_seqs=8", "agent:a", 99.0),
        report("max_num_seqs=16", "agent:b", 99.5),  # the later word wins
        report("", "agent:c", 99.8),  # one that does not know says nothing
    ]
    folded = fold_health(prev, votes, 100.0, T)
    assert folded.serving_config == "max_num_seqs=16"
    assert folded.engine_version == "0.32.0"
    assert fold_health(prev, votes, 100.0 + T.report_stale_s + 1, T).serving_config == ""


async def test_the_gateway_unbounds_a_region_whose_configuration_changed() -> None:
    """The gateway's admission bound follows the same rule: a record of another serving
    configuration than the leader's regions/<r>/health says does not bound."""
    topo = load_topology(ab.TOPOLOGY)
    measured = serving_config("m", 4096, METRICS, SERVER_INFO)
    fresh = ab.record((ab.COLD, ab.WARM)).model_copy(update={"serving": measured})
    fp = measured.fingerprint()
    assert isinstance(
        region_bound("us-east", fresh, topo, ab.NOW, serving_config=fp), InflightBound
    )
    changed = measured.model_copy(update={"max_num_seqs": 8}).fingerprint()
    other = region_bound("us-east", fresh, topo, ab.NOW, serving_config=changed)
    assert isinstance(other, str) and "stale" in other and "max_num_seqs 256 -> 8" in other

    store, keys = MemoryStore(), Keys(topo.cluster)
    zones = {r.name: r.zone for r in topo.regions}
    gates = AdmissionGates(AdmissionOptions(enabled=True), topo, DataPlaneMetrics(zones))
    bounds = CapacityBounds(store, keys, topo, gates, wall=lambda: ab.NOW)
    gate = gates.gate("us-east")
    assert gate is not None
    await store.put(
        keys.region_health("us-east"), encode(RegionHealth(region="us-east", serving_config=fp))
    )
    await bounds.read_engines()
    bounds.apply_bound("us-east", fresh)
    assert gate.limiter.config.max_limit == 8
    health = RegionHealth(region="us-east", serving_config=changed)
    await store.put(keys.region_health("us-east"), encode(health))
    await bounds.read_engines()
    assert bounds.serving == {"us-east": changed}
    bounds.apply_bound("us-east", fresh)
    assert gate.limiter.config.max_limit is None


def test_the_agent_keeps_each_replicas_configuration_and_rereads_a_partial_one() -> None:
    a, b = ReplicaProbe(url="a", up=True), ReplicaProbe(url="b", up=True)
    v = EngineVersions(refresh_s=300, retry_s=30)
    v.record("a", "0.32.0", 0, "model=m;max_num_seqs=8")
    # /server_info did not answer in time (vLLM's first one collects its environment)
    v.record("b", "0.32.0", 0, "model=m", whole=False)
    assert v.region_serving([a, b]) == "model=m;max_num_seqs=8"
    assert v.due([a, b], now=29) == [] and v.due([a, b], now=30) == ["b"]
    v.record("b", "0.32.0", 30, "model=m;max_num_seqs=16")
    assert v.region_serving([a, b]) == "model=m;max_num_seqs=16|8"
    assert v.region_serving([ReplicaProbe(url="a", up=False), b]) == "model=m;max_num_seqs=16"
    # Seen down: forgotten, read again when it is back (a restart may change it).
    assert v.due([ReplicaProbe(url="b", up=False), a], now=40) == []
    assert v.region_serving([a, b]) == "model=m;max_num_seqs=8"
