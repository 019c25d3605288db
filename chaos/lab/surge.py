"""A lab whose pools the scaler sizes under load: warm pools of slowed-down simulators,
and each unit's capacity as a probe would have measured it.

The lab runs no capacity probe, and without a record the scaler divides the typed
``capacity_rps`` by the replicas serving now (it sizes in proportion and never back):
so the surge drills and ``python -m bench surge`` write ``capacity/<unit>`` from the
simulator's own service model first (``write_capacity``). The simulators are slowed
(few slots, slow decode) so that a replica carries a few requests/s: a surge the lab's
two cores can offer is then more than two replicas carry, and less than a full pool.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass

from chaos.lab.spec import DeploymentSpec, WarmPoolSpec
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, WorkloadProfile
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.port import Store


@dataclass(frozen=True)
class SlowSimulator:
    """The simulator's service model, slowed: ``max_num_seqs`` slots, prefill and decode
    rates (regions/simulator)."""

    max_num_seqs: int = 2
    decode_tokens_per_s: float = 8.0
    prefill_tokens_per_s: float = 1000.0

    def args(self) -> tuple[str, ...]:
        return (
            *("--max-num-seqs", str(self.max_num_seqs)),
            *("--decode-tokens-per-s", str(self.decode_tokens_per_s)),
            *("--prefill-tokens-per-s", str(self.prefill_tokens_per_s)),
            *("--log-level", "WARNING"),
        )

    def replica_rps(self, prompt_tokens: int, max_tokens: int) -> float:
        """What one replica sustains: its slots over one request's service time."""
        service = prompt_tokens / self.prefill_tokens_per_s + max_tokens / self.decode_tokens_per_s
        return self.max_num_seqs / service


def capacity_record(
    unit: str,
    replica_rps: float,
    *,
    active: int,
    prompt_tokens: int,
    max_tokens: int,
    factor_of_safety: float = 1.0,
    prober: str = "modelled",
) -> CapacityRecord:
    """``unit``'s capacity record as a probe would write it, from a modelled rate."""
    probe = HitProbe(
        hit_rate=0.0, baseline_p99_s=0.1, ultimate_rps=replica_rps, ultimate_bounded=True
    )
    return CapacityRecord(
        region=unit,
        measured_at=time.time(),
        engine_version="",
        replica="modelled",
        slo=CapacitySLO(ttft_p99_s=1.5),
        factor_of_safety=factor_of_safety,
        probes=(probe,),
        r_base_rps=replica_rps,
        beta=0.0,
        active_replicas=active,
        profile=WorkloadProfile(
            prompt_tokens_p50=prompt_tokens,
            prompt_tokens_p90=prompt_tokens,
            output_tokens=max_tokens,
            shared_prefix_share=0.5,
        ),
        prober=prober,
    )


async def write_capacity(store: Store, keys: Keys, records: Iterable[CapacityRecord]) -> None:
    """Each record at its unit's ``capacity/<unit>``."""
    for rec in records:
        await store.put(keys.capacity(rec.region), encode(rec))


# ---- the surge drills' lab ----------------------------------------------------------------
SURGE_SIMULATOR = SlowSimulator()
# The drill traffic's requests: a system prompt (~100 tokens at four characters each) and
# 4 tokens out, streamed or not (lab_traffic's stream_tokens, set to 4 on this lab).
SURGE_PROMPT_TOKENS, SURGE_MAX_TOKENS = 110, 4
# Two sessions per region, one request a second each: a base the slowed pools carry on
# two ACTIVE replicas with room; the surge multiplies it.
SURGE_SESSIONS, SURGE_INTERVAL_S = 6, 1.0
# The scaler's stable window, compressed further than the lab's 30 s, so that a drill
# sees the extra replicas go within a test's time (production: 300 s).
SURGE_STABLE_WINDOW_S = 10.0


def surge_spec(base: DeploymentSpec | None = None) -> DeploymentSpec:
    """``base`` (the lab's defaults) with slowed simulators in warm pools of 2 ACTIVE,
    2 WARM and 6 slots, and the shorter stable window."""
    base = base or DeploymentSpec()
    return dataclasses.replace(
        base,
        sim_args=(*base.sim_args, *SURGE_SIMULATOR.args()),
        warm_pool=base.warm_pool or WarmPoolSpec(active=2, warm=2, size=6),
        scaling_overrides=(("stable_window_s", SURGE_STABLE_WINDOW_S), *base.scaling_overrides),
    )


def surge_capacity(spec: DeploymentSpec) -> list[CapacityRecord]:
    """Every unit's modelled capacity on the surge lab."""
    rps = SURGE_SIMULATOR.replica_rps(SURGE_PROMPT_TOKENS, SURGE_MAX_TOKENS)
    active = spec.warm_pool.active if spec.warm_pool else spec.replicas_per_region
    return [
        capacity_record(
            unit,
            rps,
            active=active,
            prompt_tokens=SURGE_PROMPT_TOKENS,
            max_tokens=SURGE_MAX_TOKENS,
            prober="lab (modelled)",
        )
        for unit in spec.units
    ]
