"""The degradation ladder as data: the model of ``runbooks/degradation.yaml``
(docs/architecture.md §5).

Pure: no file or clock here (``controlplane.kernel.ladder.file`` loads the YAML, the executor
in ``controlplane.core.ladder_executor`` walks the ladder). Validation rejects a file
that degrades a protected feature, repeats a step or an actuator, or names an actuator
the gateways and agents do not implement; every message names the field and the fix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Annotated, ClassVar, Literal, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from controlplane.kernel.ladder.record import FeatureFlags
from controlplane.kernel.model import Frozen

# docs/architecture.md §5 promises these are never degraded; a file may add to the set, not
# shrink it.
PROTECTED_FEATURES = ("basic_chat", "first_token_latency", "token_rate")

# Signal names the conditions read (as the agent and gateways report them, docs/architecture.md §3).
TTFT_SIGNAL = "ttft_p99_s"
ERROR_SIGNAL = "error_rate"
AUTH_ERROR_SIGNAL = "auth_error_rate"
QUEUE_SIGNAL = "queue_depth"
LOAD_SIGNAL = "load_rps"  # requests per second the region serves now, from its agent
HEADROOM_SIGNAL = "headroom_fraction"  # derived: (capacity - load) / capacity, see with_headroom
CBU_SIGNAL = "capacity_utilization"  # derived: load / capacity (CBU), see with_headroom

NAME = r"^[a-z][a-z0-9_-]{0,62}$"


def headroom_fraction(capacity_rps: float, load_rps: float) -> float:
    """Spare capacity as a fraction of capacity (negative when over capacity)."""
    return (capacity_rps - load_rps) / capacity_rps if capacity_rps > 0 else 0.0


def with_headroom(signals: Mapping[str, float], capacity_rps: float) -> dict[str, float]:
    """The region's signals plus ``headroom_fraction`` and ``capacity_utilization``
    against ``capacity_rps`` (what the region bears now: ``core.bearing.allowed_now``);
    both left out without a load."""
    out = dict(signals)
    if LOAD_SIGNAL in signals:
        load = signals[LOAD_SIGNAL]
        out[HEADROOM_SIGNAL] = headroom_fraction(capacity_rps, load)
        out[CBU_SIGNAL] = load / capacity_rps if capacity_rps > 0 else float("inf")
    return out


# -- actuators: each kind is code in a gateway or agent; the file only chooses among them --


class _Actuator(Frozen):
    feature: ClassVar[str]  # what it degrades: the step's `degrades` must say the same
    where: ClassVar[str]  # who carries it out, for the runbook and the report

    def apply(self, flags: FeatureFlags) -> FeatureFlags:
        raise NotImplementedError


class SpeculativeDecodingOff(_Actuator):
    """Region agent: serve from replicas without a draft model."""

    feature: ClassVar[str] = "speculative_decoding"
    where: ClassVar[str] = "agent"
    kind: Literal["speculative_decoding_off"]

    def apply(self, flags: FeatureFlags) -> FeatureFlags:
        return flags.model_copy(update={"speculative_decoding": False})


class ContextCap(_Actuator):
    """Gateway: requests longer than the cap are rejected (4xx) or truncated."""

    feature: ClassVar[str] = "long_context"
    where: ClassVar[str] = "gateway"
    kind: Literal["context_cap"]
    max_context_tokens: Annotated[int, Field(ge=1024, le=1_048_576)]
    mode: Literal["reject", "truncate"] = "reject"

    def apply(self, flags: FeatureFlags) -> FeatureFlags:
        cap = self.max_context_tokens
        if flags.max_context_tokens is not None:  # never loosen a tighter cap
            cap = min(cap, flags.max_context_tokens)
        return flags.model_copy(update={"max_context_tokens": cap, "context_cap_mode": self.mode})


class ParallelToolCallsOff(_Actuator):
    """Gateway: force ``parallel_tool_calls: false`` on every request."""

    feature: ClassVar[str] = "parallel_tool_calls"
    where: ClassVar[str] = "gateway"
    kind: Literal["parallel_tool_calls_off"]

    def apply(self, flags: FeatureFlags) -> FeatureFlags:
        return flags.model_copy(update={"parallel_tool_calls": False})


class ShedLowPriority(_Actuator):
    """Gateway: refuse requests whose priority is below ``below_priority``."""

    feature: ClassVar[str] = "low_priority_requests"
    where: ClassVar[str] = "gateway"
    kind: Literal["shed_low_priority"]
    # 0 sheds batch traffic only (x-priority: batch, or a negative priority); 1 and up
    # also sheds unmarked requests (priority 0).
    below_priority: Annotated[int, Field(ge=0, le=1000)]

    def apply(self, flags: FeatureFlags) -> FeatureFlags:
        below = max(self.below_priority, flags.shed_priority_below or 0)
        return flags.model_copy(update={"shed_priority_below": below})


Actuator = Annotated[
    SpeculativeDecodingOff | ContextCap | ParallelToolCallsOff | ShedLowPriority,
    Field(discriminator="kind"),
]
ACTUATORS: dict[str, type[_Actuator]] = {
    "speculative_decoding_off": SpeculativeDecodingOff,
    "context_cap": ContextCap,
    "parallel_tool_calls_off": ParallelToolCallsOff,
    "shed_low_priority": ShedLowPriority,
}


# -- conditions: a trigger or a guard fires when ANY of its conditions holds --


class Conditions(Frozen):
    """Thresholds over the region's signals; a missing signal is no evidence, so its
    condition does not hold."""

    ttft_p99_over_baseline: Annotated[
        float | None, Field(gt=1, le=100, description="ttft_p99_s > this x baseline")
    ] = None
    error_rate_over: Annotated[float | None, Field(gt=0, lt=1, description="5xx share")] = None
    auth_error_rate_over: Annotated[
        float | None, Field(gt=0, lt=1, description="401/403 share")
    ] = None
    headroom_under: Annotated[
        float | None, Field(gt=0, lt=1, description="(capacity - load) / capacity below this")
    ] = None
    queue_depth_over: Annotated[float | None, Field(gt=0, description="waiting requests")] = None
    cbu_over: Annotated[
        float | None, Field(gt=0, le=10, description="capacity utilisation (load / capacity)")
    ] = None

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if all(v is None for v in self.model_dump().values()):
            raise ValueError(
                "no condition set; give at least one of " + ", ".join(type(self).model_fields)
            )
        return self

    def holding(self, signals: Mapping[str, float], baseline_ttft_s: float) -> tuple[str, ...]:
        """The conditions that hold, as readable reasons; empty when none does."""
        out = []
        ttft, errors = signals.get(TTFT_SIGNAL), signals.get(ERROR_SIGNAL)
        auth, room = signals.get(AUTH_ERROR_SIGNAL), signals.get(HEADROOM_SIGNAL)
        queue, cbu = signals.get(QUEUE_SIGNAL), signals.get(CBU_SIGNAL)
        if (k := self.ttft_p99_over_baseline) and ttft is not None and ttft > k * baseline_ttft_s:
            out.append(f"ttft p99 {ttft:.3g}s > {k:g} x baseline {baseline_ttft_s:g}s")
        if (e := self.error_rate_over) and errors is not None and errors > e:
            out.append(f"error rate {errors:.2%} > {e:.2%}")
        if (a := self.auth_error_rate_over) and auth is not None and auth > a:
            out.append(f"auth error rate {auth:.2%} > {a:.2%}")
        if (h := self.headroom_under) and room is not None and room < h:
            out.append(f"headroom {room:.0%} < {h:.0%}")
        if (q := self.queue_depth_over) and queue is not None and queue > q:
            out.append(f"queue depth {queue:g} > {q:g}")
        if (c := self.cbu_over) and cbu is not None and cbu > c:
            out.append(f"capacity utilisation {cbu:.2f} > {c:g}")
        return tuple(out)


class Saves(Frozen):
    description: Annotated[str, Field(min_length=10, description="what the step frees, why")]
    capacity_gain_percent: Annotated[
        float, Field(gt=0, le=100, description="expected extra capacity, % of the region's")
    ]


class Step(Frozen):
    name: Annotated[str, Field(pattern=NAME)]
    degrades: Annotated[str, Field(pattern=NAME, description="the feature switched off")]
    actuator: Actuator
    trigger: Conditions
    saves: Saves

    @field_validator("actuator", mode="before")
    @classmethod
    def _known_kind(cls, v: object) -> object:
        kind = v.get("kind") if isinstance(v, Mapping) else getattr(v, "kind", None)
        if not isinstance(kind, str) or kind not in ACTUATORS:  # a list is unhashable
            raise ValueError(
                f"kind {kind!r} is not a known actuator; use one of {sorted(ACTUATORS)} "
                "(an actuator is code in the gateway or agent, so a new kind ships there first)"
            )
        return v

    @field_validator("degrades")
    @classmethod
    def _not_protected(cls, v: str) -> str:
        if v in PROTECTED_FEATURES:
            raise ValueError(
                f"{v!r} is never degraded (docs/architecture.md §5: "
                f"{', '.join(PROTECTED_FEATURES)}); "
                "remove this step or have it degrade another feature"
            )
        return v

    @model_validator(mode="after")
    def _degrades_what_actuator_does(self) -> Self:
        if self.degrades != self.actuator.feature:
            raise ValueError(
                f"degrades is {self.degrades!r} but actuator {self.actuator.kind} degrades "
                f"{self.actuator.feature!r}; write degrades: {self.actuator.feature}"
            )
        return self


class Baseline(Frozen):
    """Where "normal" first-token latency comes from: one figure for the file,
    overridable per region (a region with longer prompts has a higher normal)."""

    ttft_p99_s: Annotated[float, Field(gt=0, le=60)]
    per_region: dict[Annotated[str, Field(pattern=NAME)], Annotated[float, Field(gt=0, le=60)]] = (
        Field(default_factory=dict)
    )

    def for_region(self, region: str) -> float:
        return self.per_region.get(region, self.ttft_p99_s)


class Degrade(Frozen):
    step_interval_s: Annotated[
        float, Field(ge=1, le=600, description="at least this long between two steps applied")
    ] = 10.0


class Recovery(Frozen):
    step_interval_s: Annotated[float, Field(ge=1, le=600)] = 10.0
    step_percent: Annotated[
        float, Field(gt=0, le=100, description="new-session weight sent home per step")
    ] = 10.0
    guard: Conditions = Conditions(ttft_p99_over_baseline=1.5, error_rate_over=0.02)

    @property
    def steps(self) -> int:
        """Traffic steps, as ``config.RecoveryConfig.steps`` counts them."""
        return max(1, round(100 / self.step_percent))

    @property
    def duration_s(self) -> float:
        return self.steps * self.step_interval_s


class Ladder(Frozen):
    version: Literal[1] = 1
    never_degraded: tuple[Annotated[str, Field(pattern=NAME)], ...] = PROTECTED_FEATURES
    baseline: Baseline
    degrade: Degrade = Degrade()
    recovery: Recovery = Recovery()
    steps: Annotated[tuple[Step, ...], Field(json_schema_extra={"minItems": 1})]

    @field_validator("never_degraded")
    @classmethod
    def _keeps_protected(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        missing = [f for f in PROTECTED_FEATURES if f not in v]
        if missing:
            raise ValueError(f"must keep {missing} (docs/architecture.md §5); add them back")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: tuple[Step, ...], info: ValidationInfo) -> tuple[Step, ...]:
        if not v:
            raise ValueError("the ladder has no steps; list at least one, cheapest first")
        problems = []
        never = info.data.get("never_degraded", PROTECTED_FEATURES)
        for i, s in enumerate(v):
            if s.degrades in never:
                problems.append(
                    f"steps[{i}].degrades {s.degrades!r} is in never_degraded; remove the step "
                    "or the name from never_degraded"
                )
        for field in ("name", "kind"):
            seen: dict[str, int] = {}
            for i, s in enumerate(v):
                key = s.name if field == "name" else s.actuator.kind
                if key in seen:
                    where = "name" if field == "name" else "actuator.kind"
                    problems.append(
                        f"steps[{i}].{where} {key!r} repeats steps[{seen[key]}]; "
                        "each step and each actuator appears once in the ladder"
                    )
                seen.setdefault(key, i)
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    @property
    def digest(self) -> str:
        """sha256 of the ladder as loaded (its canonical JSON, defaults filled in): two
        files that load to the same ladder have one digest, whatever their comments,
        order of keys or spelling of numbers. The control plane reports its own
        (GetStatus), ``failoverctl doctor`` compares it with the checkout's file."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r} in the ladder; steps are {list(self.names)}")


def flags_for(ladder: Ladder, applied: Iterable[str]) -> FeatureFlags:
    """The effective flags once the named steps are applied (in any order: each
    actuator only ever tightens). Raises KeyError for a name the ladder lacks."""
    flags = FeatureFlags()
    for name in applied:
        flags = ladder.step(name).actuator.apply(flags)
    return flags
