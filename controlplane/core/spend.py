"""What the pools spend and what the budget lets the scaler buy (docs/scaling.md, "Cost").
PURE.

- Spend: dollars per hour of each pool's replicas by state (the topology's ``cost:``
  prices; COLD costs nothing), summed per residency zone and for the fleet; budget
  utilisation is spend / budget per scope; a pool's efficiency is its served load over
  the capacity it pays for (every paid replica at the hit rate now).
- The constraint (:meth:`Budget.constrain`): the most ACTIVE, then WARM, a pool may
  have given what the other pools of each scope are committed to and what the pool
  holds now (:class:`Held`, ``pools/<unit>``): replicas being launched, IDLE and LENT
  ones stay paid for whatever the scaler asks (dwell rules, loans), so the spend the
  planner reaches from there (:meth:`Held.after`) must fit, not the sizes asked for
  alone; a replica launched is priced as ACTIVE while it loads. A scale-up it stops
  is capped and says ``budget binds: ...``; the replicas the forecast needed beyond it
  are the record's ``short``, which puts the ladder to shedding (``core/ladder_tick``)
  instead of scaling past the budget. An operator's lift, or a failover target within
  ``failover_allowance_s`` of the failover's start (less ``failover_wind_down_s``), is
  exempt. An exemption with an end says in the note when the budget binds again and
  how many ACTIVE it would cut then (``ends_at``, ``short_at_end``): the ladder sheds
  before the cut, not after it.
- Over the budget (not exempt, and what the pool holds spends more than the room: the
  end of an exemption, a budget lowered): the note's ``over``, on which the agent's
  planner stops WARM beyond the sizes without their WARM dwell (``PoolTarget.over_budget``):
  the dwell guards against launch churn, and a pool paying past its budget for
  standby it was told to let go is not churn. Within the budget the dwell holds as
  always (a budget that merely caps a scale-up stops nothing early).
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
from controlplane.kernel.snapshot import RegionView, Snapshot

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
class Held:
    """What a pool holds now, as its agent publishes it (``pools/<unit>``): ACTIVE, IDLE
    (awake, drained), WARM (asleep; ``warm_kept`` of them may not be stopped now: in
    their WARM dwell, or static), LENT, and slots being launched (COLD -> WARM)."""

    active: int = 0
    idle: int = 0
    warm: int = 0
    lent: int = 0
    launching: int = 0
    warm_kept: int = 0

    def __post_init__(self) -> None:
        counts = (self.active, self.idle, self.warm, self.lent, self.launching, self.warm_kept)
        if min(counts) < 0:
            raise ValueError(f"held replica counts must be >= 0, got {self}")
        if self.warm_kept > self.warm:
            raise ValueError(f"warm_kept {self.warm_kept} > warm {self.warm}: it is part of it")

    @classmethod
    def of(cls, view: RegionView) -> Held:
        """From the snapshot's view of ``pools/<unit>`` (its WARM count includes IDLE)."""
        idle = min(view.idle_replicas, view.warm_replicas)
        asleep = view.warm_replicas - idle
        return cls(
            active=view.active_replicas or 0,
            idle=idle,
            warm=asleep,
            lent=view.lent_replicas,
            launching=view.launching_replicas,
            warm_kept=min(view.warm_kept_replicas, asleep),
        )

    def per_hour(self, prices: Prices) -> float:
        return prices.per_hour(self.active, self.warm, self.lent, self.idle, self.launching)

    def asleep_after(self, active: int) -> int:
        """WARM left asleep once ``active`` is reached (IDLE resumed first, then WARM
        woken)."""
        more = max(0, active - self.active)
        return self.warm - min(max(0, more - self.idle), self.warm)

    def after(self, prices: Prices, active: int, warm: int) -> float:
        """$/h once the agent's planner (regions/pool/planner.py) acts on ``active`` and
        ``warm`` from here: scale-up resumes IDLE, then wakes WARM, then launches; ACTIVE
        beyond the ask drains only after its anti-flap dwell (and IDLE costs as much
        by default), IDLE sleeps only after its dwell, launches and loans run on: all
        held. WARM beyond the ask is stopped, but only those past their WARM dwell (the
        planner wakes the longest WARM first: those); an over-budget pool's agent stops
        the rest too, and its next report shows them gone (priced as kept until then:
        the cap errs on the budget's side for a tick). Launches are what the planner
        starts: the WARM asked and the ACTIVE it could not bring up, less the standby
        it has (WARM, IDLE, launching)."""
        more = max(0, active - self.active)
        resumed = min(more, self.idle)
        woken = min(more - resumed, self.warm)
        up = more - resumed - woken  # launched now, woken by a later plan
        idle, asleep = self.idle - resumed, self.warm - woken
        free = max(0, asleep - self.warm_kept)  # stoppable now
        launches = max(0, warm + up - (asleep + idle + self.launching))
        return prices.per_hour(
            active=self.active + resumed + woken,
            warm=asleep - min(max(0, asleep - warm), free),
            lent=self.lent,
            idle=idle,
            launching=self.launching + launches,
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """What one pool may spend this tick: its prices, its scopes, the thresholds, and
    why it is exempt ("" when it is not)."""

    prices: Prices
    scopes: tuple[Scope, ...]
    policy: CostPolicy
    exempt: str = ""
    lapsed: str = ""  # an exemption that ended (a failover's allowance): said in reasons
    # what the pool holds now (pools/<unit>); None: unknown, the sizes asked are priced
    held: Held | None = None
    ends_at: float | None = None  # when an exemption ends (None: none, or no end known)

    def spend_at(self, active: int, warm: int) -> float:
        """$/h of the pool once it is sized ``active``/``warm`` from what it holds."""
        if self.held is None:
            return self.prices.per_hour(active, warm)
        return self.held.after(self.prices, active, warm)

    def tightest(self, active: int, warm: int) -> tuple[float | None, str]:
        """The highest utilisation over the scopes at these sizes, and its scope."""
        return self._tightest(self.spend_at(active, warm))

    def _tightest(self, mine: float) -> tuple[float | None, str]:
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
        the last decision (its note the low window; its sizes the spend now when what
        the pool holds is unknown)."""
        if self.lapsed:
            reasons.append(self.lapsed)
        last = base.budget
        if self.held is None:
            now_util, _ = self.tightest(base.active, base.warm)
        else:
            now_util, _ = self._tightest(self.held.per_hour(self.prices))
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
            # grows: past the WARM the pool has asleep now (known), else the last ask;
            # asking fewer would stop standby already paid for, to launch it again later
            has = base.warm if self.held is None else max(base.warm, self.held.warm)
            kept = max(has, floor_warm)
            if warm > kept:
                reasons.append(
                    f"budget utilisation {now_util:.0%} > {self.policy.high_utilisation:.0%}: "
                    f"WARM grows only as the forecast needs, {warm} -> {kept}"
                )
                warm = kept
        short = at_end = 0
        binds = ""
        over = False
        if self.exempt:
            reasons.append(f"budget exempt: {self.exempt}")
            at_end = self._short_at_end(active, warm, min_active, now, reasons)
        elif self.scopes:
            over = self._over(now_util, reasons)
            active, warm, short, binds = self._cap(active, warm, min_active)
            if binds:
                reasons.append(binds)
        util, scope = self.tightest(active, warm)
        note = BudgetNote(
            spend_per_hour=self.spend_at(active, warm),
            utilisation=util,
            scope=scope,
            binds=binds,
            short=short,
            exempt=self.exempt,
            low_since=low_since,
            ends_at=self.ends_at if self.exempt else None,
            short_at_end=at_end,
            over=over,
        )
        return active, warm, note

    def _short_at_end(
        self, active: int, warm: int, min_active: int, now: float, reasons: list[str]
    ) -> int:
        """While exempt, with an end: the ACTIVE replicas the budget would cut were it
        binding now (0 without an end or a budget). The ladder reads it to be shedding
        by the time they go, rather than starting its steps at the cut."""
        if self.ends_at is None or not self.scopes:
            return 0
        bound, _, short, _ = self._cap(active, warm, min_active)
        if short:
            reasons.append(
                f"the budget binds again in {max(0.0, self.ends_at - now):.0f} s: it buys "
                f"{bound} of these {active} ACTIVE ({short} short: the ladder sheds by then)"
            )
        return short

    def _over(self, now_util: float | None, reasons: list[str]) -> bool:
        """Whether what the pool holds now spends past the tightest scope's budget (known
        only with ``held``): its agent then stops WARM beyond the sizes without their
        WARM dwell, instead of paying for them until it ends."""
        if self.held is None or now_util is None or now_util <= 1.0 + _EPS:
            return False
        reasons.append(
            f"over its budget now ({now_util:.0%}): WARM beyond the sizes stops without "
            "its WARM dwell"
        )
        return True

    def _cap(self, active: int, warm: int, min_active: int) -> tuple[int, int, int, str]:
        """The sizes the tightest scope's room buys from what the pool holds, ACTIVE
        first (serving comes before standby); never fewer ACTIVE than ``min_active`` (a
        floor, as the SLO is). When what it holds spends the room already, no scale-up:
        ACTIVE is asked down to what the room buys once the rest is let go."""
        scope = min(self.scopes, key=lambda s: s.budget - s.others)
        room = max(0.0, scope.budget - scope.others)

        def fits(a: int, w: int) -> bool:
            return self.spend_at(a, w) <= room + _EPS * max(1.0, room)

        short, why = 0, []
        if not fits(active, 0):
            # largest first: a price sheet with IDLE over ACTIVE makes a resume save
            capped = next((a for a in range(active - 1, -1, -1) if fits(a, 0)), None)
            if capped is None and self.held is not None:
                # held over the room at any size: ACTIVE the room buys once the rest is
                # let go, brought up only from what is paid for already (IDLE resumed,
                # launches landing): no scale-up adds to the spend
                paid = self.spend_at(self.held.active, 0) + _EPS
                free = next(a for a in range(active, -1, -1) if self.spend_at(a, 0) <= paid)
                capped = min(active, free, _most(room, self.prices.active))
            capped = max(min_active, capped or 0)
            if capped < active:
                short = active - capped
                why.append(f"{active} ACTIVE -> {capped}")
                active = capped
        if not fits(active, warm):
            most_warm = next((w for w in range(warm - 1, -1, -1) if fits(active, w)), None)
            if most_warm is None:
                # held over the room at any WARM: keep the standby the room buys once the
                # rest is let go, launching none (asking 0 would stop WARM past its dwell
                # only for the forecast to launch it again, at ACTIVE's price while loading)
                asleep = warm if self.held is None else self.held.asleep_after(active)
                steady = _most(room - self.prices.active * active, self.prices.warm)
                most_warm = min(warm, asleep, steady)
            if most_warm < warm:
                why.append(f"{warm} WARM -> {most_warm}")
                warm = most_warm
        if not why:
            return active, warm, 0, ""
        binds = (
            f"budget binds: {scope.name} ${scope.budget:g}/h, ${scope.others:.4g}/h spent by "
            f"its other pools: {', '.join(why)}"
        )
        if self.held is not None and (kept := self._kept()):
            binds += f"; held now: {kept}"
        if short:
            binds += f"; {short} short of the forecast: the ladder sheds instead"
        return active, warm, short, binds

    def _kept(self) -> str:
        """What the pool pays for that the scaler's ask does not release at once."""
        h = self.held
        if h is None:
            return ""
        parts = [
            f"{n} {what}"
            for n, what in (
                (h.launching, "launching"),
                (h.idle, "IDLE"),
                (h.warm_kept, "WARM in their dwell"),
                (h.lent, "LENT"),
            )
            if n
        ]
        return ", ".join(parts)


def _most(room: float, price: float) -> int:
    if price <= 0:
        return 1 << 30  # free: the budget never binds it
    return max(0, math.floor(room / price + _EPS))


def committed(policy: CostPolicy, unit: str, active: int, warm: int, lent: int = 0) -> float:
    """A pool's $/h at these counts."""
    return policy.prices_of(unit).per_hour(active, warm, lent)


def held_spend(policy: CostPolicy, view: RegionView) -> float:
    """A pool's $/h for what it holds now (``pools/<unit>``: IDLE at IDLE's price, a
    launch at ACTIVE's)."""
    return Held.of(view).per_hour(policy.prices_of(view.name))


def budget_for(
    policy: CostPolicy,
    unit: str,
    zones: Mapping[str, str],
    spend: Mapping[str, float],
    *,
    exempt: str = "",
    lapsed: str = "",
    held: Held | None = None,
    ends_at: float | None = None,
) -> Budget:
    """The budget ``unit`` sizes against: its own, its zone's and the fleet's, each with
    what the scope's other pools are committed to (``spend``: $/h by unit; ``zones``:
    each unit's zone); ``held``: what the pool holds now (None: unknown); ``ends_at``:
    when ``exempt`` ends (None: no end known)."""
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
        held=held,
        ends_at=ends_at,
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
    warm: int  # asleep or IDLE, as pools/<unit> counts them
    lent: int
    dollars_per_hour: float
    budget: float | None
    utilisation: float | None
    efficiency: float | None  # served load / capacity paid for (None: no load or capacity)
    binds: str = ""  # the scaler's last word on the budget, when it stopped a scale-up
    short: int = 0
    exempt: str = ""
    lift: BudgetLift | None = None  # in force now
    idle: int = 0  # of warm, the IDLE ones (awake, drained: IDLE's price)
    launching: int = 0  # being launched: priced as ACTIVE
    # the scaler's last word (BudgetNote): over the budget now (its WARM stops without
    # the dwell), and when an exemption with an end stops, with the ACTIVE cut then
    over: bool = False
    ends_at: float | None = None
    short_at_end: int = 0

    def allowance(self) -> str:
        """Why this pool may spend past its budgets now ("": it may not): an operator's
        lift, or a failover target within ``failover_allowance_s`` (the scaler's note)."""
        return self.lift.describe() if self.lift is not None else self.exempt


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


def allowed_scopes(report: CostReport) -> dict[tuple[str, str], tuple[str, ...]]:
    """Each budgeted scope, (scope, name) as the metrics label it, and what lets it
    spend past its budget now: its pool's allowance; a zone's or the fleet's, those of
    its pools ("<unit>: <why>"). Empty: nothing does."""
    out: dict[tuple[str, str], tuple[str, ...]] = {
        ("pool", p.unit): (p.allowance(),) if p.allowance() else ()
        for p in report.pools
        if p.budget is not None
    }
    for s in report.scopes:
        if s.budget is not None:
            out[(s.scope, s.name)] = tuple(
                f"{p.unit}: {p.allowance()}"
                for p in report.pools
                if p.allowance() and (s.scope != "zone" or p.zone == s.name)
            )
    return out


def cost_report(snap: Snapshot, topology: Topology) -> CostReport | None:
    """Spend now from the replicas each pool runs (None without ``cost:``)."""
    policy = topology.cost
    if policy is None:
        return None
    zones = {r.name: r.zone for r in topology.regions}
    spend: dict[str, float] = {}
    pools = []
    for name, view in snap.regions.items():
        held = Held.of(view)
        paid = held.active + held.idle + held.warm + held.lent + held.launching
        spend[name] = held.per_hour(policy.prices_of(name))
        note = view.scale.budget if view.scale is not None else None
        line = Line("pool", name, spend[name], policy.pool_budgets.get(name))
        pools.append(
            PoolCost(
                unit=name,
                zone=zones[name],
                active=held.active,
                warm=held.warm + held.idle,
                lent=held.lent,
                idle=held.idle,
                launching=held.launching,
                dollars_per_hour=spend[name],
                budget=line.budget,
                utilisation=line.utilisation,
                efficiency=None if view.scale is None else efficiency(view.scale, paid),
                binds=note.binds if note else "",
                short=note.short if note else 0,
                exempt=note.exempt if note else "",
                lift=view.lifted(snap.now),
                over=note.over if note else False,
                ends_at=note.ends_at if note else None,
                short_at_end=note.short_at_end if note else 0,
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
