"""What the pools spend and what the budget lets the scaler buy (docs/scaling.md, "Cost").
PURE.

- Spend: dollars per hour of each pool's replicas by state (the topology's ``cost:``
  prices; COLD costs nothing), summed per residency zone and for the fleet; budget
  utilisation is spend / budget per scope; a pool's efficiency is its served load over
  the capacity it pays for (every paid replica at the hit rate now).
- The constraint (:meth:`Budget.constrain`): the most ACTIVE, then WARM, a pool may
  have given what the other pools of each scope are committed to. A scale-up it stops
  is capped and says ``budget binds: ...``; the replicas the forecast needed beyond it
  are the record's ``short``, which puts the ladder to shedding (``core/ladder_tick``)
  instead of scaling past the budget. An operator's lift, or a failover target within
  ``failover_allowance_s`` of the failover's start, is exempt.
- Under ``low_utilisation`` for ``low_window_s`` WARM shrinks to its floor (burst_warm
  plus what the forecast needs); over ``high_utilisation`` WARM grows only to that floor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.kernel.config import Topology
from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.cost import BudgetLift, BudgetNote, CostPolicy, Prices
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.snapshot import Snapshot

_EPS = 1e-9  # so that $40 of room at $10 a replica buys 4, not 3, after float rounding
FLEET = "fleet"


@dataclass(frozen=True, slots=True)
class Scope:
    """One budget a pool spends against: its name (``pool``, ``zone:<z>``, ``fleet``),
    the budget and what the scope's other pools are committed to, in $/h."""

    name: str
    budget: float
    others: float

    def utilisation(self, mine: float) -> float:
        return (self.others + mine) / self.budget if self.budget > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Budget:
    """What one pool may spend this tick: its prices, its scopes, the thresholds, and
    why it is exempt ("" when it is not)."""

    prices: Prices
    scopes: tuple[Scope, ...]
    policy: CostPolicy
    exempt: str = ""
    lapsed: str = ""  # an exemption that ended (a failover's allowance): said in reasons

    def tightest(self, active: int, warm: int) -> tuple[float | None, str]:
        """The highest utilisation over the scopes at these sizes, and its scope."""
        mine = self.prices.per_hour(active, warm)
        best = max(self.scopes, key=lambda s: s.utilisation(mine), default=None)
        return (None, "") if best is None else (best.utilisation(mine), best.name)

    def constrain(
        self,
        *,
        active: int,
        warm: int,
        floor_warm: int,
        base: ScaleRecord,
        min_active: int,
        now: float,
        reasons: list[str],
    ) -> tuple[int, int, BudgetNote]:
        """ACTIVE and WARM within the budget; ``floor_warm``: the WARM the forecast needs
        (with burst_warm), what the utilisation rules shrink or hold WARM to; ``base``:
        the last decision (its sizes are the spend now, its note the low window)."""
        if self.lapsed:
            reasons.append(self.lapsed)
        last = base.budget
        now_util, _ = self.tightest(base.active, base.warm)
        low_since = None
        if now_util is not None and now_util < self.policy.low_utilisation:
            low_since = last.low_since if last and last.low_since is not None else now
            if now - low_since >= self.policy.low_window_s and warm > floor_warm:
                reasons.append(
                    f"budget utilisation {now_util:.0%} < {self.policy.low_utilisation:.0%} "
                    f"for {now - low_since:.0f} s: WARM {warm} -> its floor {floor_warm}"
                )
                warm = floor_warm
        elif now_util is not None and now_util > self.policy.high_utilisation:
            held = max(base.warm, floor_warm)
            if warm > held:
                reasons.append(
                    f"budget utilisation {now_util:.0%} > {self.policy.high_utilisation:.0%}: "
                    f"WARM grows only as the forecast needs, {warm} -> {held}"
                )
                warm = held
        short = 0
        binds = ""
        if self.exempt:
            reasons.append(f"budget exempt: {self.exempt}")
        elif self.scopes:
            active, warm, short, binds = self._cap(active, warm, min_active)
            if binds:
                reasons.append(binds)
        util, scope = self.tightest(active, warm)
        note = BudgetNote(
            spend_per_hour=self.prices.per_hour(active, warm),
            utilisation=util,
            scope=scope,
            binds=binds,
            short=short,
            exempt=self.exempt,
            low_since=low_since,
        )
        return active, warm, note

    def _cap(self, active: int, warm: int, min_active: int) -> tuple[int, int, int, str]:
        """The sizes the tightest scope's room buys, ACTIVE first (serving comes before
        standby); never fewer ACTIVE than ``min_active`` (a floor, as the SLO is)."""
        scope = min(self.scopes, key=lambda s: s.budget - s.others)
        room = max(0.0, scope.budget - scope.others)
        most_active = _most(room, self.prices.active)
        short, why = 0, []
        if active > most_active:
            capped = max(min_active, most_active)
            short = active - capped
            why.append(f"{active} ACTIVE -> {capped}")
            active = capped
        most_warm = _most(room - self.prices.active * active, self.prices.warm)
        if warm > most_warm:
            why.append(f"{warm} WARM -> {most_warm}")
            warm = most_warm
        if not why:
            return active, warm, 0, ""
        binds = (
            f"budget binds: {scope.name} ${scope.budget:g}/h, ${scope.others:.4g}/h spent by "
            f"its other pools: {', '.join(why)}"
        )
        if short:
            binds += f"; {short} short of the forecast: the ladder sheds instead"
        return active, warm, short, binds


def _most(room: float, price: float) -> int:
    if price <= 0:
        return 1 << 30  # free: the budget never binds it
    return max(0, math.floor(room / price + _EPS))


def committed(policy: CostPolicy, unit: str, active: int, warm: int, lent: int = 0) -> float:
    """A pool's $/h at these counts."""
    return policy.prices_of(unit).per_hour(active, warm, lent)


def budget_for(
    policy: CostPolicy,
    unit: str,
    zones: Mapping[str, str],
    spend: Mapping[str, float],
    *,
    exempt: str = "",
    lapsed: str = "",
) -> Budget:
    """The budget ``unit`` sizes against: its own, its zone's and the fleet's, each with
    what the scope's other pools are committed to (``spend``: $/h by unit; ``zones``:
    each unit's zone)."""
    others = {u: s for u, s in spend.items() if u != unit}
    scopes = []
    if (own := policy.pool_budgets.get(unit)) is not None:
        scopes.append(Scope("pool", own, 0.0))
    zone = zones[unit]
    if (zb := policy.zone_budgets.get(zone)) is not None:
        same = sum(s for u, s in others.items() if zones.get(u) == zone)
        scopes.append(Scope(f"zone:{zone}", zb, same))
    if policy.fleet_budget is not None:
        scopes.append(Scope(FLEET, policy.fleet_budget, sum(others.values())))
    return Budget(
        prices=policy.prices_of(unit),
        scopes=tuple(scopes),
        policy=policy,
        exempt=exempt,
        lapsed=lapsed,
    )


@dataclass(frozen=True, slots=True)
class Line:
    """One scope's spend: $/h, its budget (None: none) and utilisation."""

    scope: str  # pool, zone or fleet
    name: str
    dollars_per_hour: float
    budget: float | None

    @property
    def utilisation(self) -> float | None:
        if self.budget is None:
            return None
        return self.dollars_per_hour / self.budget if self.budget > 0 else math.inf


def spend_lines(
    policy: CostPolicy, zones: Mapping[str, str], spend: Mapping[str, float]
) -> tuple[Line, ...]:
    """Every pool's, zone's and the fleet's spend against its budget."""
    lines = [Line("pool", u, s, policy.pool_budgets.get(u)) for u, s in spend.items()]
    by_zone: dict[str, float] = {}
    for u, s in spend.items():
        by_zone[zones[u]] = by_zone.get(zones[u], 0.0) + s
    lines += [Line("zone", z, s, policy.zone_budgets.get(z)) for z, s in sorted(by_zone.items())]
    lines.append(Line(FLEET, FLEET, sum(spend.values()), policy.fleet_budget))
    return tuple(lines)


def efficiency(record: ScaleRecord, paid: int) -> float | None:
    """Served load over the capacity paid for (``paid`` replicas, at the hit rate the
    record sized at); None without a load or a capacity."""
    per = record.per_replica_rps
    if record.load_rps is None or per is None or per <= 0 or paid <= 0:
        return None
    return record.load_rps / (per * paid)


class PoolCost(Frozen):
    """One pool's line of ``failoverctl cost show`` and the metrics."""

    unit: str
    zone: str
    active: int  # replicas by state now (pools/<unit>, else the topology's list)
    warm: int
    lent: int
    dollars_per_hour: float
    budget: float | None
    utilisation: float | None
    efficiency: float | None  # served load / capacity paid for (None: no load or capacity)
    binds: str = ""  # the scaler's last word on the budget, when it stopped a scale-up
    short: int = 0
    exempt: str = ""
    lift: BudgetLift | None = None  # in force now


class ScopeCost(Frozen):
    scope: str  # zone or fleet
    name: str
    dollars_per_hour: float
    budget: float | None
    utilisation: float | None


class CostReport(Frozen):
    """What every pool, zone and the fleet spend now against their budgets."""

    at: float
    pools: tuple[PoolCost, ...]
    scopes: tuple[ScopeCost, ...]


def cost_report(snap: Snapshot, topology: Topology) -> CostReport | None:
    """Spend now from the replicas each pool runs (None without ``cost:``)."""
    policy = topology.cost
    if policy is None:
        return None
    zones = {r.name: r.zone for r in topology.regions}
    spend: dict[str, float] = {}
    pools = []
    for name, view in snap.regions.items():
        active = view.active_replicas or 0
        paid = active + view.warm_replicas + view.lent_replicas
        spend[name] = committed(policy, name, active, view.warm_replicas, view.lent_replicas)
        note = view.scale.budget if view.scale is not None else None
        line = Line("pool", name, spend[name], policy.pool_budgets.get(name))
        pools.append(
            PoolCost(
                unit=name,
                zone=zones[name],
                active=active,
                warm=view.warm_replicas,
                lent=view.lent_replicas,
                dollars_per_hour=spend[name],
                budget=line.budget,
                utilisation=line.utilisation,
                efficiency=None if view.scale is None else efficiency(view.scale, paid),
                binds=note.binds if note else "",
                short=note.short if note else 0,
                exempt=note.exempt if note else "",
                lift=view.lifted(snap.now),
            )
        )
    scopes = tuple(
        ScopeCost(
            scope=x.scope,
            name=x.name,
            dollars_per_hour=x.dollars_per_hour,
            budget=x.budget,
            utilisation=x.utilisation,
        )
        for x in spend_lines(policy, zones, spend)
        if x.scope != "pool"
    )
    return CostReport(at=snap.now, pools=tuple(pools), scopes=scopes)
