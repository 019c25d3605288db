"""The cold-start budget of each pool (issue 32, item 3): PURE.

Two comparisons, exported by the leader (``controlplane/metrics.py``) and alerted on
(TectonicColdStartOverBudget, TectonicWarmStandbyShort; runbooks/cold-start-budget.md):

- **Activation p95 against its budget.** A wake (WARM -> ACTIVE) must fit a third of the
  pool's first-token SLO: S_cold <= L_p99 / 3. The p95 is what the pool's agent measures
  of its last wakes and publishes in ``pools/<unit>`` (``activation_p95_s``); the SLO is
  the unit's ``slo.ttft_p99_s`` in the topology (a pool's own, else its region's).
- **WARM standby against the sizing formula.** The WARM replicas standing by now
  (``pools/<unit>``: WARM with IDLE) against what ``kernel/pool/sizing.py`` needs for the
  burst the pool plans for, beyond what its ACTIVE replicas serve now: the larger of
  ``scaling.standby_rps`` and the forecast's upper band (``scale/<unit>``). Its inputs
  are the measured ones where Tectonic measures them: the activation time (the agent's
  wake p95), the activation rate (what the pool's batches of two or more wakes achieved,
  ``activation_rate`` in ``pools/<unit>``: ``regions/pool/wake_rate.py``), one
  replica's capacity (the capacity probe's record, when the scaler sized on it). Each
  input says whether it was measured (``ColdStart.measured``); a typed one
  (``scaling.activation_s``, ``scaling.activation_rate``, ``capacity_rps``) stands in
  for one not measured. The budget the
  burst is absorbed within is the scaler's horizon; cold starts (COLD -> WARM) are not
  counted on (nothing measures them), so every replica the burst needs must be WARM.

No clock is read: everything is of the snapshot and the scaler's records of one tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.kernel.config import Topology
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from controlplane.kernel.pool.sizing import BurstProfile, check_pool
from controlplane.kernel.snapshot import RegionView, Snapshot

ACTIVATION_SLO_SHARE = 1 / 3  # a wake's p95 within a third of the first-token SLO
# The sizing formula's inputs that may be measured, as the metric's ``input`` label.
SIZING_INPUTS = ("activation_s", "activation_rate", "replica_rps")


@dataclass(frozen=True)
class ColdStart:
    """One pool's cold-start figures (None: not known this tick)."""

    unit: str
    activation_p95_s: float | None  # measured wake p95 (None: no wake measured yet)
    budget_s: float  # first-token SLO x ACTIVATION_SLO_SHARE
    warm_now: int | None = None  # WARM (with IDLE) standing by; None: not sized
    warm_needed: int | None = None  # the sizing formula's W; None: not sized
    burst_rps: float | None = None  # the burst beyond ACTIVE now it was sized for
    feasible: bool | None = None  # False: the wakes cannot all finish within the horizon
    measured: dict[str, bool] = field(default_factory=dict)  # SIZING_INPUTS -> measured
    activation_rate: float | None = None  # replicas/s the formula took (measured or typed)

    @property
    def over_budget(self) -> bool:
        return self.activation_p95_s is not None and self.activation_p95_s > self.budget_s

    @property
    def short(self) -> int:
        """WARM replicas missing (0 when the standby is big enough or not sized)."""
        if self.warm_now is None or self.warm_needed is None:
            return 0
        return max(0, self.warm_needed - self.warm_now)


def budget_of(topology: Topology, unit: str) -> float:
    """S_cold: a third of the unit's first-token SLO, seconds."""
    return topology.region(unit).slo.ttft_p99_s * ACTIVATION_SLO_SHARE


def burst_beyond_active(policy: ScalingPolicy, rec: ScaleRecord, active_now: int) -> float:
    """The burst the standby must carry, requests/s: the larger of the configured
    ``standby_rps`` and the forecast's upper band, less what ACTIVE serves now."""
    per = rec.per_replica_rps or 0.0
    planned = max(policy.standby_rps, rec.upper_rps or 0.0)
    return max(0.0, planned - active_now * per)


def pool_cold_start(
    view: RegionView,
    topology: Topology,
    rec: ScaleRecord | None,
) -> ColdStart:
    """The cold-start figures of one pool; the WARM comparison only with the scaler on
    and a record of it with one replica's capacity."""
    unit = view.name
    base = ColdStart(
        unit=unit, activation_p95_s=view.activation_p95_s, budget_s=budget_of(topology, unit)
    )
    policy = topology.scaling
    if policy is None or rec is None or not rec.per_replica_rps:
        return base
    measured = {
        "activation_s": view.activation_p95_s is not None,
        "activation_rate": view.activation_rate is not None,
        "replica_rps": rec.capacity == "measured",
    }
    activation = view.activation_p95_s if view.activation_p95_s is not None else policy.activation_s
    rate = view.activation_rate if view.activation_rate is not None else policy.activation_rate
    burst = burst_beyond_active(policy, rec, view.active_replicas or 0)
    report = check_pool(
        BurstProfile(
            burst_rps=burst,
            replica_rps=rec.per_replica_rps,
            cold_start_s=math.inf,  # not counted on: nothing measures COLD -> WARM
            activation_s=activation,
            budget_s=policy.horizon,
            activation_rate=rate,
        ),
        view.warm_replicas,
        cold_slots=0,
    )
    return ColdStart(
        unit=unit,
        activation_p95_s=view.activation_p95_s,
        budget_s=base.budget_s,
        warm_now=view.warm_replicas,
        warm_needed=report.needed_warm,
        burst_rps=burst,
        feasible=report.feasible,
        measured=measured,
        activation_rate=rate,
    )


def cold_starts(
    snap: Snapshot, topology: Topology, sizes: Mapping[str, ScaleRecord]
) -> tuple[ColdStart, ...]:
    """Every pool's cold-start figures, in the snapshot's order; ``sizes``: the scaler's
    newest record of each pool it sizes (this tick's, written or not)."""
    return tuple(
        pool_cold_start(view, topology, sizes.get(name))
        for name, view in snap.regions.items()
        if name in topology.names
    )
