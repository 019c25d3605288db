"""Drill scenarios as data: ``chaos/scenarios/*.yaml``, loaded and validated here.

A scenario says what "healthy" means before and after (the steady-state hypothesis,
with tolerances), which real faults to inject and when, what must be undone whatever
happens (rollbacks), what to measure and the thresholds of the verdict, and when to
give up early (abort conditions). ``{region}`` in any string is the drill's target
region, chosen when the drill runs (default: the scenario's ``region``).

    .venv/bin/python -m chaos.drills.scenario check chaos/scenarios/*.yaml
    .venv/bin/python -m chaos.drills.scenario schema > chaos/scenarios/scenario.schema.json
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from controlplane.kernel.config import ConfigError, describe_errors, read_yaml
from controlplane.kernel.model import Frozen

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"
NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"


class FaultKind(StrEnum):
    """What the runner can do to a deployment. Every kind is a method of the runner's
    DrillTarget (chaos/drills/runner.py; the lab's LocalDeployment implements it), acting on real
    processes or the simulator's fault endpoint; a file cannot invent one."""

    STOP_REGION = "stop_region"  # SIGKILL every vLLM server of the region
    START_REGION = "start_region"  # start the region's stopped vLLM servers again
    KILL_REPLICAS = "kill_replicas"  # SIGKILL `count` of the region's vLLM servers
    INJECT = "inject"  # simulator fault on every server of the region (`fault`)
    CLEAR_FAULTS = "clear_faults"  # clear injected faults on the region's servers
    KILL_LEADER = "kill_leader"  # SIGKILL the control-plane replica holding `leader`
    START_CONTROLPLANES = "start_controlplanes"  # restart killed control-plane replicas
    KILL_ETCD_MEMBER = "kill_etcd_member"  # SIGKILL one etcd member (not the leader)
    START_ETCD_MEMBERS = "start_etcd_members"  # restart killed etcd members
    FLAP_REGION = "flap_region"  # stop and start the region's servers every `period_s`
    # raise the drill's own offered load into the region's data plane: `rate` times the
    # base over `ramp_s`, held `duration_s`, back down over `ramp_s` (the runner's
    # traffic generator, not the target: the load is what a surge is)
    SURGE = "surge"


class SimFault(Frozen):
    """The simulator's ``/_sim/fault`` body (regions/simulator/faults.py)."""

    error_rate: float = Field(0.0, ge=0.0, le=1.0)
    unavailable_rate: float = Field(0.0, ge=0.0, le=1.0)
    added_latency_s: float = Field(0.0, ge=0.0, le=600.0)
    hang: bool = False
    health_down: bool = False
    stream_error_after: int | None = Field(None, ge=0)  # tokens, then vLLM's in-band error


class Condition(Frozen):
    """Wait until a region is in ``state`` (and, with ``step``, that failover step is
    recorded done): how a fault is timed to land mid-failover."""

    region: str = "{region}"
    state: Literal["NORMAL", "DEGRADED", "FAILING_OVER", "RECOVERED"]
    step: Literal["prewarm", "routing"] | None = None
    within_s: float = Field(60.0, gt=0, le=600)


class Fault(Frozen):
    action: FaultKind
    region: str = "{region}"
    at_s: float = Field(0.0, ge=0, le=3600, description="seconds after the faults phase starts")
    when: Condition | None = Field(None, description="wait for this before acting (after at_s)")
    fault: SimFault | None = None
    count: int = Field(1, ge=1, le=64)
    period_s: float = Field(2.0, gt=0, le=60)
    duration_s: float = Field(0.0, ge=0, le=600)
    rate: float | None = Field(
        None, gt=1, le=100, allow_inf_nan=False, description="surge: peak ÷ base offered load"
    )
    ramp_s: float = Field(0.0, ge=0, le=600, description="surge: seconds up (and down)")

    @model_validator(mode="after")
    def _fits(self) -> Fault:
        if self.action is FaultKind.INJECT and self.fault is None:
            raise ValueError("inject needs `fault` (error_rate, unavailable_rate, ...)")
        if self.action is not FaultKind.INJECT and self.fault is not None:
            raise ValueError(f"`fault` is only for inject, not {self.action.value}")
        if self.action is FaultKind.FLAP_REGION and self.duration_s <= 0:
            raise ValueError("flap_region needs duration_s > 0")
        if self.action is FaultKind.SURGE:
            if self.rate is None:
                raise ValueError(
                    "surge needs `rate`: the peak load as a multiple of the base (> 1)"
                )
            if self.duration_s <= 0:
                raise ValueError("surge needs duration_s > 0: how long the peak is held")
        elif self.rate is not None or self.ramp_s:
            raise ValueError(f"`rate` and `ramp_s` are only for surge, not {self.action.value}")
        return self

    @property
    def surge_s(self) -> float:
        """A surge's whole length: up, held, down."""
        return 2 * self.ramp_s + self.duration_s


class Probe(Frozen):
    """One clause of the steady-state hypothesis."""

    probe: Literal[
        "leader",
        "regions_healthy",
        "region_state",
        "regions_state",
        "ladder_clear",
        "error_rate",
        "first_token_p99_s",
    ]
    region: str = "{region}"
    state: Literal["NORMAL", "DEGRADED", "FAILING_OVER", "RECOVERED"] = "NORMAL"
    max: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="tolerance for error_rate / first_token_p99_s"
    )

    @model_validator(mode="after")
    def _tolerance(self) -> Probe:
        if self.probe in ("error_rate", "first_token_p99_s") and self.max <= 0:
            raise ValueError(f"probe {self.probe} needs a tolerance `max` > 0")
        return self


class SteadyState(Frozen):
    """Holds when every probe holds at once, checked every sample, within ``within_s``."""

    probes: tuple[Probe, ...] = Field(min_length=1)
    within_s: float = Field(60.0, gt=0, le=900)
    hold_s: float = Field(2.0, ge=0, le=120, description="must hold this long in a row")


class Measurements(Frozen):
    """The verdict's criteria; a criterion left out is not judged."""

    prewarm_attainment: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="least attained fraction of the failover's pre-warm"
    )
    prewarm_within_s: float = Field(30.0, gt=0, description="pre-warm must finish this soon")
    degradation_order: bool = Field(
        False, description="ladder steps applied in the file's order, restored in reverse"
    )
    min_degradation_steps: int = Field(0, ge=0, description="at least this many steps applied")
    max_consistency_failure_rate: float | None = Field(0.001, ge=0, le=1)
    max_rto_s: float | None = Field(None, gt=0)
    expect_states: tuple[str, ...] = Field(
        (), description="states the target region must pass through, in this order"
    )
    forbid_states: tuple[str, ...] = Field(
        (), description="states the target region must never enter (e.g. no failover)"
    )
    max_failovers: int | None = Field(None, ge=0, description="failovers of the target region")
    max_error_rate: float | None = Field(
        None, gt=0, le=1, description="share of client requests failed over the whole drill"
    )
    # The scaler's criteria (docs/scaling.md), over the surge faults' windows.
    max_ttft_p99_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="first-token p99 of the requests sent into the surged region during a surge",
    )
    ttft_slo_s: float = Field(
        1.5, gt=0, allow_inf_nan=False, description="the first-token SLO slo_attainment counts"
    )
    min_slo_attainment: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="least share of those requests answered within ttft_slo_s"
    )
    scale_audited: bool = Field(
        False, description="every change of a pool's desired size (scale/<unit>) is audited"
    )
    scaled_back_within_s: float | None = Field(
        None,
        gt=0,
        le=1800,
        description="the surged pools' ACTIVE back at their pre-surge count this soon after "
        "the surge ends (the drill watches until then)",
    )

    @property
    def needs_surge(self) -> bool:
        return (
            self.max_ttft_p99_s is not None
            or self.min_slo_attainment is not None
            or self.scaled_back_within_s is not None
        )


class Abort(Frozen):
    """Stop early (rollbacks still run) when the drill hurts more than it may."""

    max_duration_s: float = Field(300.0, gt=0, le=3600)
    max_error_rate: float = Field(0.5, gt=0, le=1, description="over `window_s`")
    window_s: float = Field(10.0, gt=0, le=600)


class Scenario(Frozen):
    name: Annotated[str, Field(pattern=NAME)]
    title: str = Field(min_length=1, max_length=120)
    description: str = ""
    region: str = Field(min_length=1, description="default target region")
    etcd_members: int = Field(1, ge=1, le=5, description="etcd members the lab must run")
    steady_state: SteadyState
    faults: tuple[Fault, ...] = Field(min_length=1)
    rollbacks: tuple[Fault, ...] = ()
    observe_s: float = Field(20.0, ge=0, le=1800, description="watch this long after faults")
    observe_until: Condition | None = Field(
        None, description="and until this holds (bounded by its within_s)"
    )
    steady_state_after: SteadyState | None = Field(
        None, description="defaults to steady_state: what must hold after rollbacks"
    )
    measure: Measurements = Field(default_factory=Measurements)
    abort: Abort = Field(default_factory=Abort)
    sample_s: float = Field(1.0, ge=0.1, le=30)

    @model_validator(mode="after")
    def _rollbacks_undo(self) -> Scenario:
        # A fault that leaves something broken must have its undo in rollbacks.
        undo = {
            FaultKind.STOP_REGION: FaultKind.START_REGION,
            FaultKind.KILL_REPLICAS: FaultKind.START_REGION,
            FaultKind.FLAP_REGION: FaultKind.START_REGION,
            FaultKind.INJECT: FaultKind.CLEAR_FAULTS,
            FaultKind.KILL_LEADER: FaultKind.START_CONTROLPLANES,
            FaultKind.KILL_ETCD_MEMBER: FaultKind.START_ETCD_MEMBERS,
        }
        have = {r.action for r in self.rollbacks}
        if any(r.action is FaultKind.SURGE for r in self.rollbacks):
            raise ValueError("surge is a fault, not a rollback (a surge ends by itself)")
        if self.measure.needs_surge and not self.surges:
            raise ValueError(
                "max_ttft_p99_s, min_slo_attainment and scaled_back_within_s are measured "
                "over a surge: the scenario needs a surge fault"
            )
        for f in self.faults:
            need = undo.get(f.action)
            if need is not None and need not in have:
                raise ValueError(
                    f"fault {f.action.value} needs a rollback {need.value} (rollbacks always "
                    "run, even after an abort)"
                )
        return self

    def bind(self, region: str | None = None) -> Scenario:
        """This scenario with ``{region}`` replaced by ``region`` (default its own)."""
        target = region or self.region
        text = self.model_dump_json().replace("{region}", target)
        bound = Scenario.model_validate_json(text)
        return bound.model_copy(update={"region": target})

    @property
    def after(self) -> SteadyState:
        return self.steady_state_after or self.steady_state

    @property
    def surges(self) -> tuple[Fault, ...]:
        """Its surge faults: a lab runs them on warm pools under the scaler."""
        return tuple(f for f in self.faults if f.action is FaultKind.SURGE)


def describe_fault(f: Fault) -> str:
    what = {
        FaultKind.STOP_REGION: f"stop every vLLM server of {f.region} (SIGKILL)",
        FaultKind.START_REGION: f"start {f.region}'s vLLM servers",
        FaultKind.KILL_REPLICAS: f"SIGKILL {f.count} vLLM server(s) of {f.region}",
        FaultKind.INJECT: f"inject {f.fault.model_dump(exclude_defaults=True) if f.fault else {}} "
        f"on {f.region}'s servers",
        FaultKind.CLEAR_FAULTS: f"clear injected faults on {f.region}",
        FaultKind.KILL_LEADER: "SIGKILL the control-plane leader",
        FaultKind.START_CONTROLPLANES: "start the killed control-plane replicas",
        FaultKind.KILL_ETCD_MEMBER: "SIGKILL one etcd member",
        FaultKind.START_ETCD_MEMBERS: "restart the killed etcd members",
        FaultKind.FLAP_REGION: f"flap {f.region}: down/up every {f.period_s:g}s for "
        f"{f.duration_s:g}s",
        FaultKind.SURGE: f"surge {f.region}'s offered load to {f.rate or 0:g}x over "
        f"{f.ramp_s:g}s, held {f.duration_s:g}s, down over {f.ramp_s:g}s",
    }[f.action]
    when = f" when {describe_condition(f.when)}" if f.when else ""
    return f"{what}{f' at +{f.at_s:g}s' if f.at_s else ''}{when}"


def describe_condition(c: Condition) -> str:
    return f"{c.region} is {c.state}" + (f" with step {c.step} done" if c.step else "")


def load_scenario(path: str | Path) -> Scenario:
    """A validated scenario; ConfigError naming the file and each bad field."""
    data = read_yaml(path, "scenario")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a scenario is a mapping (name, title, faults, ...)")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path} is not a valid scenario:\n{describe_errors(e)}") from None


def find_scenario(name_or_path: str, directory: Path = SCENARIO_DIR) -> Scenario:
    """By file path, or by name from ``directory``; ConfigError listing what exists."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return load_scenario(p)
    for scenario in load_all(directory):
        if scenario.name == name_or_path:
            return scenario
    known = ", ".join(s.name for s in load_all(directory)) or "none"
    raise ConfigError(f"no scenario {name_or_path!r} in {directory} (known: {known})")


def load_all(directory: Path = SCENARIO_DIR) -> list[Scenario]:
    """Every scenario in ``directory``, sorted by name; names must be unique."""
    out: dict[str, Scenario] = {}
    for path in sorted(directory.glob("*.yaml")):
        s = load_scenario(path)
        if s.name in out:
            raise ConfigError(f"{path}: scenario name {s.name!r} is used twice")
        out[s.name] = s
    return [out[k] for k in sorted(out)]


def schema() -> dict[str, object]:
    return Scenario.model_json_schema()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["schema"]:
        print(json.dumps(schema(), indent=2))
        return 0
    if args[:1] == ["check"] and len(args) > 1:
        bad = 0
        for path in args[1:]:
            try:
                s = load_scenario(path)
                print(
                    f"{path}: ok ({s.name}: {len(s.faults)} faults, {len(s.rollbacks)} rollbacks)"
                )
            except ConfigError as e:
                print(str(e), file=sys.stderr)
                bad += 1
        return 2 if bad else 0
    print("usage: python -m chaos.drills.scenario schema | check FILE...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
