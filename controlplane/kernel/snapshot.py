"""The full picture one reconcile tick decides on: read at once, decided on purely."""

from __future__ import annotations

from pydantic import Field

from controlplane.kernel.capacity.record import CapacityRecord
from controlplane.kernel.cluster_spec import ClusterSpec
from controlplane.kernel.drills import DrillLock
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import (
    ControlFlags,
    Frozen,
    Health,
    HealthReport,
    Intent,
    Readiness,
    RegionHealth,
    RegionHold,
    RegionRecord,
    RegionState,
    Routing,
    default_routing,
)
from controlplane.kernel.pool.cost import BudgetLift
from controlplane.kernel.pool.scale import ScaleRecord


class RegionView(Frozen):
    name: str
    record: RegionRecord
    record_rev: int = 0  # mod_revision of regions/<r>/state; 0 = not yet written
    health: RegionHealth
    readiness: Readiness | None = None
    routing: Routing | None = None
    routing_rev: int = 0
    degradation: tuple[str, ...] = ()  # ladder steps applied now, in order (degradation/<r>)
    # degradation/<r> itself and its mod revision; None with a revision: unreadable.
    ladder: DegradationRecord | None = None
    ladder_rev: int = 0
    # The last capacity probe (capacity/<r>), and how many replicas serve now: the
    # warm pool's ACTIVE ones (pools/<r>), else the topology's static list (None: none).
    capacity: CapacityRecord | None = None
    active_replicas: int | None = None
    # scale/<r>, the scaler's last record, and its mod revision (read only when the
    # topology has scaling: on); None with a revision: unreadable.
    scale: ScaleRecord | None = None
    scale_rev: int = 0
    # wake/<r>: the newest request to wake this pool from zero, its wall-clock time
    # (None: none; read only with scaling on)
    wake_at: float | None = None
    # regions/<r>/hold, an operator's hold on this unit, and its mod revision.
    hold: RegionHold | None = None
    hold_rev: int = 0
    # regions/<r>/budget-lift, an operator's lift of this pool's budget, and its revision;
    # and the pool's WARM (with IDLE) and LENT replicas now (pools/<r>), for its spend.
    lift: BudgetLift | None = None
    lift_rev: int = 0
    warm_replicas: int = 0
    lent_replicas: int = 0
    # of warm_replicas, the IDLE ones (awake, priced as IDLE) and the WARM ones the pool
    # may not stop now (dwell); the replicas being launched (in no other count): what
    # the pool pays for beside them (pools/<r>), for the cost guardrail
    idle_replicas: int = 0
    warm_kept_replicas: int = 0
    launching_replicas: int = 0
    # the p95 of the pool's last wakes as its agent publishes it (pools/<r>), seconds;
    # None: none measured (the cold-start budget, docs/scaling.md)
    activation_p95_s: float | None = None
    # the replicas per second its batches of wakes achieved, as its agent publishes it
    # (pools/<r>); None: none measured (the typed scaling.activation_rate stands in)
    activation_rate: float | None = None

    def lifted(self, now: float) -> BudgetLift | None:
        """The budget lift in force at ``now``."""
        return self.lift if self.lift is not None and self.lift.in_force(now) else None

    def held(self, now: float) -> RegionHold | None:
        """The hold in force at ``now`` (one past its ``until`` is not)."""
        return self.hold if self.hold is not None and self.hold.in_force(now) else None

    @property
    def barred(self) -> bool:
        """A failed last drill bars the region, unless an operator overrode it."""
        r = self.readiness
        return r is not None and not r.passed and not r.override_reason

    @property
    def in_service(self) -> bool:
        """May take traffic, as the leader judges it: not failed over and not confirmed
        down (what sessions follow is ``sessions.self_routed``)."""
        return (
            self.record.state is not RegionState.FAILING_OVER
            and self.health.verdict is not Health.UNHEALTHY
        )

    def effective_routing(self) -> Routing:
        return self.routing or default_routing(self.name)


class IntentClaim(Frozen):
    """A region's claim (``intent-claims/<r>``): the intent holding it (None: the value is
    unreadable) and the claim's mod revision."""

    holder: str | None
    rev: int


class Snapshot(Frozen):
    now: float
    revision: int = 0
    regions: dict[str, RegionView]
    reports: tuple[HealthReport, ...] = ()
    intents: tuple[Intent, ...] = ()
    claims: dict[str, IntentClaim] = Field(default_factory=dict)  # by region
    control: ControlFlags = Field(default_factory=ControlFlags)
    control_rev: int = 0  # ``control``'s mod revision (0: absent)
    leader: str = ""
    # The published cluster spec (``spec``) and its mod revision; None with a
    # revision: unreadable.
    spec: ClusterSpec | None = None
    spec_rev: int = 0
    drill: DrillLock | None = None  # ``drills/lock``: the drill running now, if any

    @property
    def paused(self) -> bool:
        """Automation is paused now (a pause past its ``until`` is not)."""
        return self.control.in_force(self.now)

    def with_record(self, record: RegionRecord) -> Snapshot:
        """This snapshot with ``record`` for its region, as later decisions of the same
        tick must see it: a region failed over a moment ago is no longer a target, nor
        counted as serving."""
        view = self.regions[record.region].model_copy(update={"record": record})
        return self.model_copy(update={"regions": {**self.regions, record.region: view}})

    def claim_to_free(self, intent: Intent) -> int:
        """The revision of ``intent``'s region claim when resolving the intent frees it
        (held by this intent, or unreadable, which would block the region forever);
        0 when it stays (absent, or another intent's)."""
        claim = self.claims.get(intent.region)
        return claim.rev if claim is not None and claim.holder in (intent.id, None) else 0

    def routings(self) -> dict[str, Routing]:
        return {n: v.effective_routing() for n, v in self.regions.items()}
