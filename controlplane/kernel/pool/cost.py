"""What pools cost and what they may spend: the topology's ``cost:`` section, an
operator's lift of a pool's budget (``regions/<unit>/budget-lift``) and what the scaler
records of the budget in ``scale/<unit>`` (docs/scaling.md, "Cost"). PURE.

Prices are dollars per replica-hour per replica state (a COLD replica costs nothing);
budgets are dollars per hour, per pool (a failover unit), per residency zone and for the
fleet. The scaler keeps every scope within its budget; an operator may lift one pool's
for a while, and a failover target may exceed it for ``failover_allowance_s`` (the
budget binds again ``failover_wind_down_s`` before its end, so that the pool is back
within it when the allowance ends).
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen, RegionHold

_Dollars = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# a budget of 0 would buy nothing and divide by nothing: unset it instead
_Budget = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Prices(Frozen):
    """Dollars per replica-hour in each state a replica costs something in: awake
    (ACTIVE, IDLE, LENT: a GPU held) or asleep (WARM: the host kept, the GPU lighter).
    IDLE (awake, drained) has its own price, ACTIVE's unless set; a replica being
    launched (COLD -> WARM: the machine billed while the model loads) costs ACTIVE's."""

    active: Annotated[_Dollars, Field(description="$ per ACTIVE replica-hour")]
    idle: Annotated[
        _Dollars | None, Field(description="$ per IDLE replica-hour; unset: active's")
    ] = None
    warm: Annotated[_Dollars, Field(description="$ per WARM (asleep) replica-hour")]
    lent: Annotated[
        _Dollars | None, Field(description="$ per LENT replica-hour; unset: active's")
    ] = None

    @property
    def idle_price(self) -> float:
        return self.active if self.idle is None else self.idle

    @property
    def lent_price(self) -> float:
        return self.active if self.lent is None else self.lent

    def per_hour(
        self, active: int, warm: int, lent: int = 0, idle: int = 0, launching: int = 0
    ) -> float:
        """Dollars per hour of replicas in these states (COLD ones cost nothing; one being
        launched holds its machine: ACTIVE's price)."""
        if min(active, warm, lent, idle, launching) < 0:
            raise ValueError(
                f"replica counts must be >= 0, got active={active} warm={warm} lent={lent} "
                f"idle={idle} launching={launching}"
            )
        return (
            (active + launching) * self.active
            + idle * self.idle_price
            + warm * self.warm
            + lent * self.lent_price
        )


class CostPolicy(Frozen):
    """The topology's ``cost:`` section: unset, nothing is priced and no budget binds."""

    prices: Annotated[
        Prices, Field(description="$ per replica-hour per state, for every pool not in pool_prices")
    ]
    pool_prices: Annotated[
        dict[str, Prices],
        Field(description="a pool's own prices, by failover unit (region, or <region>.<pool>)"),
    ] = {}
    pool_budgets: Annotated[
        dict[str, _Budget],
        Field(description="$ per hour a pool may spend, by failover unit; unset: no pool budget"),
    ] = {}
    zone_budgets: Annotated[
        dict[str, _Budget],
        Field(description="$ per hour a residency zone's pools may spend together"),
    ] = {}
    fleet_budget: Annotated[
        _Budget | None, Field(description="$ per hour every pool may spend together; unset: none")
    ] = None
    target_utilisation: Annotated[
        float, Field(gt=0, le=1, description="the budget utilisation (spend / budget) aimed at")
    ] = 0.70
    low_utilisation: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="under this for low_window_s, a pool's WARM shrinks toward its floor "
            "(burst_warm plus what the forecast needs): standby_rps's extras go",
        ),
    ] = 0.50
    high_utilisation: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="over this, WARM grows only for what the forecast needs (no standby "
            "extras), and never past the budget",
        ),
    ] = 0.85
    low_window_s: Annotated[
        float, Field(ge=0, description="how long utilisation stays under low before WARM shrinks")
    ] = 600.0
    failover_allowance_s: Annotated[
        float,
        Field(
            ge=0,
            description="how long a failover target may spend past its budgets; then the "
            "budget binds again and the degradation ladder sheds",
        ),
    ] = 1800.0
    failover_wind_down_s: Annotated[
        float,
        Field(
            ge=0,
            description="of failover_allowance_s, the last seconds in which the budget binds "
            "again already, so that the replicas it cuts are stopped by the allowance's "
            "end: the pool's scaled IDLE dwell (10 s), a sleep and a stop (an over-budget "
            "pool stops WARM without its WARM dwell)",
        ),
    ] = 30.0

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.low_utilisation < self.target_utilisation < self.high_utilisation:
            raise ValueError(
                "cost: low_utilisation < target_utilisation < high_utilisation must hold, "
                f"got {self.low_utilisation:g}, {self.target_utilisation:g}, "
                f"{self.high_utilisation:g}"
            )
        return self

    def prices_of(self, unit: str) -> Prices:
        return self.pool_prices.get(unit, self.prices)

    def check_names(self, units: tuple[str, ...], zones: tuple[str, ...]) -> None:
        """Every pool and zone named is the topology's: a typo would leave a budget unset."""
        for what, named, known in (
            ("pool_prices", self.pool_prices, units),
            ("pool_budgets", self.pool_budgets, units),
            ("zone_budgets", self.zone_budgets, zones),
        ):
            unknown = sorted(set(named) - set(known))
            if unknown:
                raise ValueError(
                    f"cost.{what} names unknown {'zones' if what[0] == 'z' else 'pools'} "
                    f"{unknown}; known: {sorted(known)}"
                )


class BudgetLift(RegionHold):
    """Value of ``regions/<unit>/budget-lift``: an operator lifts one pool's budget (its
    own, and its share of its zone's and the fleet's) until ``until``, as a hold holds a
    unit's automation: audited, shown in status, ended by the leader at ``until``."""

    def describe(self) -> str:
        return f"budget lifted by {self.actor or 'an operator'}: {self.reason}"


class BudgetNote(Frozen):
    """What the scaler's last decision made of the budget (``ScaleRecord.budget``)."""

    spend_per_hour: float = Field(ge=0)  # of the sizes decided
    utilisation: float | None = None  # the tightest scope's spend / budget (None: no budget)
    scope: str = ""  # which scope that is: pool, zone:<z> or fleet
    binds: str = ""  # why the budget stopped a scale-up ("" it did not)
    short: int = Field(0, ge=0)  # ACTIVE replicas the forecast needed beyond the budget
    exempt: str = ""  # why the budget did not apply (a lift, a failover's allowance)
    low_since: float | None = None  # since when utilisation has been under low, unbroken
    # An exemption with an end (a failover's allowance less its wind-down, a lift's
    # until): when the budget binds again, and the ACTIVE replicas it would cut then, as
    # it stands now: the ladder degrades the pool before that (core/ladder_tick), so
    # that it sheds by the time the capacity goes
    ends_at: float | None = None
    short_at_end: int = Field(0, ge=0)
    # not exempt, and what the pool holds now spends more than the budget: its agent
    # stops WARM beyond the sizes without their WARM dwell (PoolTarget.over_budget)
    over: bool = False
