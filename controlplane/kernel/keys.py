"""The etcd key layout (docs/architecture.md §2), one prefix per deployment.

All keys are text; values are JSON of the models in ``controlplane.kernel.model``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    cluster: str = "default"

    @property
    def root(self) -> str:
        return f"/tectonic/{self.cluster}/"

    def leader(self) -> str:
        return self.root + "leader"

    def control(self) -> str:
        return self.root + "control"

    def spec(self) -> str:
        """The cluster spec (``ClusterSpec``): what every process's topology must agree
        on, as the leader last published it; no lease."""
        return self.root + "spec"

    def regions_prefix(self) -> str:
        return self.root + "regions/"

    def region_state(self, region: str) -> str:
        return f"{self.root}regions/{region}/state"

    def region_health(self, region: str) -> str:
        return f"{self.root}regions/{region}/health"

    def region_hold(self, unit: str) -> str:
        """An operator's hold on one unit's automation (``RegionHold``); read with the
        region's other keys, so a hold costs the tick no extra read."""
        return f"{self.root}regions/{unit}/hold"

    def budget_lift(self, unit: str) -> str:
        """An operator's lift of one pool's budget (``BudgetLift``), a hold's twin: read
        with the region's other keys, ended by the leader at its ``until``."""
        return f"{self.root}regions/{unit}/budget-lift"

    def readiness(self, region: str) -> str:
        return f"{self.root}regions/{region}/readiness"

    def reports_prefix(self, region: str | None = None) -> str:
        """Raw health reports, one key per (region, observer); overwritten, not appended."""
        return f"{self.root}reports/" + (f"{region}/" if region else "")

    def report(self, region: str, observer: str) -> str:
        return f"{self.reports_prefix(region)}{observer}"

    def routing_prefix(self) -> str:
        return self.root + "routing/"

    def routing(self, region: str) -> str:
        return f"{self.root}routing/{region}"

    def sessions_prefix(self) -> str:
        return self.root + "sessions/"

    def session(self, session_id: str, family: str = "") -> str:
        """A session's pin; with a model pool's ``family`` (docs/models.md), the pin of
        its conversation with that pool's models: a session id holds no '/', so the
        two never meet."""
        key = f"{self.root}sessions/{session_id}"
        return f"{key}/{family}" if family else key

    def session_moves_prefix(self) -> str:
        return self.root + "session-moves/"

    def session_moves(self, region: str) -> str:
        """A gateway's notice that it moved sessions off ``region`` (a spill): other
        gateways re-read their cached pins of it."""
        return f"{self.root}session-moves/{region}"

    def session_lease(self, bucket: int) -> str:
        """The lease shared by every session written in time bucket ``bucket``."""
        return f"{self.root}session-leases/{bucket}"

    def degradation_prefix(self) -> str:
        return self.root + "degradation/"

    def degradation(self, region: str) -> str:
        return f"{self.root}degradation/{region}"

    def prefixes(self, region: str) -> str:
        """The leader's merged catalog of ``region``'s top prefixes."""
        return f"{self.root}prefixes/{region}"

    def prefix_wanted_prefix(self) -> str:
        return self.root + "prefix-wanted/"

    def prefix_wanted(self, region: str) -> str:
        """Keys the leader wants payloads for: seen from K sessions only once merged."""
        return f"{self.root}prefix-wanted/{region}"

    def prefix_exports_prefix(self) -> str:
        return self.root + "prefix-exports/"

    def prefix_export(self, gateway: str) -> str:
        """One gateway's tracker export, on that gateway's lease (gone when it dies)."""
        return f"{self.root}prefix-exports/{gateway}"

    def scale_prefix(self) -> str:
        return self.root + "scale/"

    def scale(self, unit: str) -> str:
        """A pool's desired size (``ScaleRecord``), written by the leader's scaler with an
        audit entry when it changes; the unit's agent follows it level-triggered."""
        return f"{self.root}scale/{unit}"

    def wake_prefix(self) -> str:
        return self.root + "wake/"

    def wake(self, unit: str) -> str:
        """A data plane's request to wake a pool at zero (``WakeRequest``): the leader's
        scaler reads it as demand; a plain put, coalesced by its writers."""
        return f"{self.root}wake/{unit}"

    def pools_prefix(self) -> str:
        return self.root + "pools/"

    def pool(self, region: str) -> str:
        """The region's warm-pool members (``PoolMembers``: the ACTIVE replicas gateways
        route to) as its agent last published them; no lease, the replicas outlive it."""
        return f"{self.root}pools/{region}"

    def capacity_prefix(self) -> str:
        return self.root + "capacity/"

    def capacity(self, region: str) -> str:
        """The region's measured bearing capacity (``CapacityRecord``), written with an
        audit entry by the capacity probe; no lease: it is kept until the next probe."""
        return f"{self.root}capacity/{region}"

    def pool_loans_prefix(self, region: str | None = None) -> str:
        return self.root + "pool-loans/" + (f"{region}/" if region else "")

    def pool_loan(self, region: str, loan_id: str) -> str:
        """A replica of the region's warm pool lent out of rotation (``PoolLoan``), on
        the borrower's lease: if the borrower dies, the loan ends and the agent puts
        the replica back to sleep."""
        return f"{self.root}pool-loans/{region}/{loan_id}"

    def intents_prefix(self) -> str:
        return self.root + "intents/"

    def intent(self, intent_id: str) -> str:
        return f"{self.root}intents/{intent_id}"

    def intent_claims_prefix(self) -> str:
        return self.root + "intent-claims/"

    def intent_claim(self, region: str) -> str:
        """The region's pending operator intent (``Intent``), created with it if absent and
        deleted when the leader resolves it: one pending intent per region at a time."""
        return f"{self.root}intent-claims/{region}"

    def intent_outcomes_prefix(self) -> str:
        return self.root + "intent-outcomes/"

    def intent_outcome(self, intent_id: str) -> str:
        """What the leader did with an intent (``IntentOutcome``), on a lease (a day)."""
        return f"{self.root}intent-outcomes/{intent_id}"

    def audit_prefix(self) -> str:
        return self.root + "audit/"

    def audit(self, sortable_id: str) -> str:
        return f"{self.root}audit/{sortable_id}"

    def drill_lock(self) -> str:
        """Held (on the holder's lease) by the drill runner running a drill: never two
        drills at once in one deployment, whichever process starts them."""
        return self.root + "drills/lock"

    def drill_progress(self) -> str:
        """The running drill's latest step, one line (a capacity probe's), overwritten
        at each step: what ``failoverctl capacity probe`` shows while it waits."""
        return self.root + "drills/progress"

    def drill_history_prefix(self) -> str:
        return self.root + "drills/history/"

    def drill_history(self, sortable_id: str) -> str:
        """One finished drill's summary (``DrillSummary``), kept for the history."""
        return f"{self.root}drills/history/{sortable_id}"

    def drill_requests_prefix(self) -> str:
        return self.root + "drills/requests/"

    def drill_request(self, request_id: str) -> str:
        """An operator's request for a drill (``DrillRequest``), until the service runs it."""
        return f"{self.root}drills/requests/{request_id}"

    def drill_catalog(self) -> str:
        """What the drill service can run and will run (``DrillCatalog``)."""
        return self.root + "drills/catalog"

    def region_of(self, key: str, prefix: str) -> str:
        """The first path segment after ``prefix`` (e.g. the region of a routing key)."""
        return key[len(prefix) :].split("/", 1)[0]
