"""The verdict of a drill, from what was observed: pure functions, no I/O.

Each criterion compares a figure measured from the system's own record (the audit
log's transitions and ladder steps, the failover record's pre-warm result) or from
the synthetic sessions' answers (which region served each request, which failed)
against the scenario's threshold. A criterion the scenario does not ask for is not
judged.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from chaos.drills.measure_scaling import (
    RequestLog,
    ScaleEvent,
    SurgeWindow,
    in_surges,
    surge_criteria,
    ttft_p99_s,
)
from chaos.drills.result import Criterion, LadderEvent, Sample, Transition
from chaos.drills.scenario import Fault, Measurements, Probe, Scenario, SteadyState
from controlplane.kernel.model import AuditAction, AuditEntry, LadderChange, PrewarmFigures


@dataclass(frozen=True)
class SessionLog:
    """One synthetic session: its home region, and per request (drill time, serving
    region or "" when it failed)."""

    sid: str
    home: str
    answers: tuple[tuple[float, str], ...]


@dataclass(frozen=True)
class Observed:
    """Everything the verdict is computed from. ``units``: the failover units the
    target names (docs/models.md): the region itself, or every pool of a region with
    model pools; each is judged, and a criterion holds when it holds for each."""

    region: str
    fault_t: float | None  # drill time of the first fault; None when none was injected
    samples: Sequence[Sample]
    transitions: Sequence[Transition]
    ladder: Sequence[LadderEvent]
    sessions: Sequence[SessionLog]
    prewarm: PrewarmFigures | None = None  # the failover's, from its ``prewarm`` audit entry
    gateway_violations: float = 0.0  # the gateways' own counter, over the drill
    streams_continued: float = 0.0  # the gateways' continuations of cut streams
    reference_ladder: Sequence[str] = ()  # step names in runbooks/degradation.yaml order
    steady_before: tuple[bool, str] = (True, "")
    steady_after: tuple[bool, str] = (True, "")
    aborted: str = ""
    extra: Mapping[str, float] = field(default_factory=dict)
    units: tuple[str, ...] = ()
    prewarms: Mapping[str, PrewarmFigures | None] = field(default_factory=dict)  # per unit
    # the scaler's drills: every synthetic request, the surges, the scale audit entries
    requests: Sequence[RequestLog] = ()
    surges: Sequence[SurgeWindow] = ()
    scale_events: Sequence[ScaleEvent] = ()

    @property
    def targets(self) -> tuple[str, ...]:
        return self.units or (self.region,)

    def one(self, unit: str) -> Observed:
        """What is observed of ``unit`` alone."""
        return replace(self, region=unit, units=(), prewarm=self.prewarms.get(unit, self.prewarm))


# ---- steady state -------------------------------------------------------------------------
def probes_hold(
    hyp: SteadyState, s: Sample, units: Mapping[str, Sequence[str]] | None = None
) -> tuple[bool, str]:
    """Whether every probe of ``hyp`` holds in sample ``s``; the first that does not.
    ``units``: a region with model pools -> its pools' units, each of which a probe of
    the region must hold for."""
    for p in hyp.probes:
        for unit in (units or {}).get(p.region, (p.region,)):
            ok, why = _probe_holds(p.model_copy(update={"region": unit}), s)
            if not ok:
                return ok, why
    return True, ""


def _probe_holds(p: Probe, s: Sample) -> tuple[bool, str]:
    if p.probe == "leader" and not s.leader:
        return False, "no control-plane leader"
    if p.probe == "regions_healthy":
        bad = [f"{r} {v.health}" for r, v in s.regions.items() if v.health != "HEALTHY"]
        if bad or not s.regions:
            return False, "not every region HEALTHY: " + (", ".join(bad) or "no state")
    if p.probe == "region_state":
        got = s.regions.get(p.region)
        if got is None or got.state != p.state:
            return False, f"{p.region} is {got.state if got else 'unknown'}, not {p.state}"
    if p.probe == "regions_state":
        bad = [f"{r} {v.state}" for r, v in s.regions.items() if v.state != p.state]
        if bad or not s.regions:
            return False, f"not every region {p.state}: " + (", ".join(bad) or "no state")
    if p.probe == "ladder_clear":
        got = s.regions.get(p.region)
        if got is None or got.ladder_steps:
            steps = ", ".join(got.ladder_steps) if got else "unknown"
            return False, f"{p.region} still has degradation steps applied: {steps}"
    if p.probe == "error_rate" and s.error_rate is not None and s.error_rate > p.max:
        return False, f"error rate {s.error_rate:.3f} > {p.max:g}"
    if (
        p.probe == "first_token_p99_s"
        and s.first_token_p99_s is not None
        and s.first_token_p99_s > p.max
    ):
        return False, f"first-token p99 {s.first_token_p99_s:.3f}s > {p.max:g}s"
    return True, ""


# ---- session consistency ---------------------------------------------------------------------
def consistency_violations(sessions: Sequence[SessionLog], moved_homes: set[str]) -> int:
    """Requests served outside the session's region. A session may move once, and only
    when its home region's traffic moved (``moved_homes``); after its move every
    answer must come from the region it moved to. Anything else (a second move, a
    bounce back, a move of a session whose home never moved) counts every request
    served elsewhere."""
    bad = 0
    for s in sessions:
        served = [r for _, r in s.answers if r]
        if not served:
            continue
        first = served[0]
        change = next((i for i, r in enumerate(served) if r != first), None)
        if change is None:
            continue
        if s.home not in moved_homes:
            bad += sum(1 for r in served if r != first)
            continue
        moved_to = served[change]
        bad += sum(1 for r in served[change:] if r != moved_to)
    return bad


def rto_s(
    sessions: Sequence[SessionLog], region: str | Collection[str], fault_t: float | None
) -> float:
    """From the first fault until the sessions homed in ``region`` (or in any of a
    region's pools) are answered again: the first answer after the last failed request
    (0 when none failed)."""
    if fault_t is None:
        return 0.0
    homes = {region} if isinstance(region, str) else set(region)
    answers = sorted(a for s in sessions if s.home in homes for a in s.answers)
    failed = [t for t, r in answers if not r and t >= fault_t]
    if not failed:
        return 0.0
    last = max(failed)
    back = next((t for t, r in answers if r and t > last), None)
    return round((back if back is not None else last) - fault_t, 3)


# ---- ladder order ---------------------------------------------------------------------------
def ladder_order_problem(events: Sequence[LadderEvent], reference: Sequence[str]) -> str:
    """'' when the steps were applied in the file's order, never skipping, and
    restored in reverse (a guard's re-apply puts back the step restored last);
    otherwise the first deviation, in words."""
    on: list[str] = []
    for e in events:
        if e.action in (LadderChange.APPLY, LadderChange.REAPPLY):
            want = reference[len(on)] if len(on) < len(reference) else None
            if e.step != want:
                return (
                    f"t={e.t:.1f}s {e.action} {e.step!r} while the file's next step is "
                    f"{want!r} (on: {on or 'none'})"
                )
            on.append(e.step)
        elif e.action is LadderChange.RESTORE:
            if not on or e.step != on[-1]:
                return f"t={e.t:.1f}s restored {e.step!r} while the last applied is {on[-1:]}"
            on.pop()
    return ""


# ---- the verdict ----------------------------------------------------------------------------
def judge(m: Measurements, o: Observed) -> list[Criterion]:
    """The drill's criteria, in the report's order: the steady state before, no abort,
    the region's path through the states, pre-warm and the ladder, what the synthetic
    sessions saw, the steady state after. A criterion the scenario does not set is
    absent, not passed. A target of several units (a region's model pools) is judged
    unit by unit, each criterion holding only if it holds for each."""
    paths = {u: [t.to_state for t in o.transitions if t.region == u] for u in o.targets}
    if len(o.targets) == 1:  # a region, or a region with one model pool
        units = _unit_criteria(m, o.one(o.targets[0]), paths[o.targets[0]])
    else:
        units = _each(o.targets, [_unit_criteria(m, o.one(u), paths[u]) for u in o.targets])
    return [
        Criterion(
            name="steady_state_before",
            passed=o.steady_before[0],
            measured="held" if o.steady_before[0] else o.steady_before[1],
            required="the steady-state hypothesis holds before any fault",
        ),
        Criterion(
            name="not_aborted",
            passed=not o.aborted,
            measured=o.aborted or "ran to the end",
            required="no abort condition met",
        ),
        *units,
        *_session_criteria(m, o, paths),
        *surge_criteria(m, o.samples, o.requests, o.surges, o.scale_events),
        Criterion(
            name="steady_state_after",
            passed=o.steady_after[0],
            measured="held" if o.steady_after[0] else o.steady_after[1],
            required="the steady-state hypothesis holds again after the rollbacks",
        ),
    ]


def _unit_criteria(m: Measurements, o: Observed, path: list[str]) -> list[Criterion]:
    """What one failover unit must show: its state path, its pre-warm, its ladder."""
    return [
        *_path_criteria(m, o.region, path),
        *([_prewarm(m, o.prewarm)] if m.prewarm_attainment is not None else []),
        *([_ladder(m, o)] if m.degradation_order else []),
    ]


def _each(units: Sequence[str], per_unit: Sequence[Sequence[Criterion]]) -> list[Criterion]:
    """One criterion per name, from each unit's: passed when each passed, measured
    unit by unit."""
    names = list(dict.fromkeys(c.name for cs in per_unit for c in cs))
    out = []
    for name in names:
        got = [(u, c) for u, cs in zip(units, per_unit, strict=True) for c in cs if c.name == name]
        out.append(
            Criterion(
                name=name,
                passed=len(got) == len(units) and all(c.passed for _, c in got),
                measured="; ".join(f"{u}: {c.measured}" for u, c in got),
                required=got[0][1].required + " (each pool)",
                detail="; ".join(f"{u}: {c.detail}" for u, c in got if c.detail),
            )
        )
    return out


def _path_criteria(m: Measurements, region: str, path: list[str]) -> list[Criterion]:
    """What the target region's state path must (``expect_states``) and must not
    (``forbid_states``, more than ``max_failovers`` failovers) be."""
    out = []
    if m.expect_states:
        out.append(_expect_states(m.expect_states, path))
    if m.forbid_states:
        entered = [s for s in m.forbid_states if s in path]
        out.append(
            Criterion(
                name="forbidden_states",
                passed=not entered,
                measured=f"entered {', '.join(entered)}" if entered else "none entered",
                required=f"{region} never enters {', '.join(m.forbid_states)}",
                detail=" → ".join(path),
            )
        )
    if m.max_failovers is not None:
        n = path.count("FAILING_OVER")
        out.append(
            Criterion(
                name="failovers",
                passed=n <= m.max_failovers,
                measured=str(n),
                required=f"≤ {m.max_failovers}",
                detail=" → ".join(path),
            )
        )
    return out


def _session_criteria(
    m: Measurements, o: Observed, paths: Mapping[str, list[str]]
) -> list[Criterion]:
    """What the synthetic sessions saw: consistency (each answered in one region, or
    in a second only after its one move), the RTO and the error rate."""
    out = []
    requests = sum(len(s.answers) for s in o.sessions)
    if m.max_consistency_failure_rate is not None:
        moved = {u for u, path in paths.items() if "FAILING_OVER" in path or _routing_moved(o, u)}
        bad = consistency_violations(o.sessions, moved) + int(o.gateway_violations)
        rate = bad / requests if requests else 0.0
        out.append(
            Criterion(
                name="session_consistency",
                passed=requests > 0 and rate < m.max_consistency_failure_rate,
                measured=f"{rate:.4%} ({bad} of {requests} requests)",
                required=f"< {m.max_consistency_failure_rate:.2%}",
                detail="requests served outside the session's region, or by a second "
                "region after its one move; plus the gateways' own violation counter"
                + ("" if requests else "; no synthetic request was sent"),
            )
        )
    if m.max_rto_s is not None:
        rto = rto_s(o.sessions, o.targets, o.fault_t)
        out.append(
            Criterion(
                name="rto",
                passed=rto <= m.max_rto_s,
                measured=f"{rto:.1f}s",
                required=f"≤ {m.max_rto_s:g}s",
                detail=f"from the first fault until {o.region}'s sessions are answered again",
            )
        )
    if m.max_error_rate is not None:
        failed = sum(1 for s in o.sessions for _, r in s.answers if not r)
        rate = failed / requests if requests else 0.0
        out.append(
            Criterion(
                name="error_rate",
                passed=rate <= m.max_error_rate,
                measured=f"{rate:.2%} ({failed} of {requests})",
                required=f"≤ {m.max_error_rate:.0%}",
            )
        )
    return out


def _routing_moved(o: Observed, unit: str) -> bool:
    """The unit's traffic was routed elsewhere in some sample."""
    for s in o.samples:
        r = s.regions.get(unit)
        if r is not None and r.routing and r.routing.get(unit, 0.0) < 1.0:
            return True
    return False


def _expect_states(expected: Sequence[str], path: Sequence[str]) -> Criterion:
    it = iter(path)
    ok = all(any(p == want for p in it) for want in expected)  # an ordered subsequence
    return Criterion(
        name="state_path",
        passed=ok,
        measured=" → ".join(path) or "no transition",
        required="passes through " + " → ".join(expected),
    )


def _prewarm(m: Measurements, pre: PrewarmFigures | None) -> Criterion:
    required = f"≥ {m.prewarm_attainment:.0%} of the chosen prefixes within {m.prewarm_within_s:g}s"
    if pre is None or not pre.prefixes_total:
        return Criterion(
            name="prewarm_attainment",
            passed=False,
            measured="no pre-warm recorded" if pre is None or not pre.flat() else "nothing to warm",
            required=required,
            detail="the failover record holds no pre-warm result with prefixes",
        )
    frac = pre.attained_fraction or 0.0
    elapsed = pre.elapsed_s or 0.0
    assert m.prewarm_attainment is not None
    return Criterion(
        name="prewarm_attainment",
        passed=frac >= m.prewarm_attainment and elapsed <= m.prewarm_within_s,
        measured=f"{frac:.0%} in {elapsed:.2f}s "
        f"({pre.prefixes_warmed or 0:g} of {pre.prefixes_total:g} prefixes)",
        required=required,
        detail=f"hit rate of a second send: {pre.verified_hit_rate or 0.0:.0%}"
        if pre.verified
        else "",
    )


def _ladder(m: Measurements, o: Observed) -> Criterion:
    mine = [e for e in o.ladder if e.region == o.region]
    problem = ladder_order_problem(mine, o.reference_ladder)
    applied = [e.step for e in mine if e.action is LadderChange.APPLY]
    few = len(set(applied)) < m.min_degradation_steps
    return Criterion(
        name="degradation_order",
        passed=not problem and not few,
        measured=", ".join(f"{e.action} {e.step}" for e in mine) or "no ladder step",
        required="the file's order: "
        + " → ".join(o.reference_ladder)
        + (f"; at least {m.min_degradation_steps} steps" if m.min_degradation_steps else ""),
        detail=problem or (f"only {len(set(applied))} steps applied" if few else ""),
    )


# ---- what the runner reports besides the criteria ---------------------------------------
def faults_criterion(faults: Sequence[Fault], problems: list[str]) -> Criterion:
    return Criterion(
        name="faults_injected",
        passed=not problems,
        measured=f"{len(faults) - len(problems)} of {len(faults)}",
        required="every fault injected",
        detail="; ".join(problems),
    )


def abort_reason(s: Scenario, samples: Sequence[Sample], t: float) -> str:
    if t > s.abort.max_duration_s:
        return f"the drill ran {t:.0f}s, over max_duration_s {s.abort.max_duration_s:g}"
    window = [x for x in samples if x.t >= t - s.abort.window_s]
    requests = sum(x.requests for x in window)
    errors = sum(x.errors for x in window)
    if requests >= 20 and errors / requests > s.abort.max_error_rate:
        return (
            f"error rate {errors / requests:.0%} over the last {s.abort.window_s:g}s "
            f"> {s.abort.max_error_rate:.0%}"
        )
    return ""


def last_prewarm(entries: Sequence[AuditEntry], region: str) -> PrewarmFigures | None:
    found = [e for e in entries if e.action is AuditAction.PREWARM and e.region == region]
    return PrewarmFigures.from_details(found[-1].details) if found else None


def regions_judged(region: str | Sequence[str], samples: Sequence[Sample]) -> list[str]:
    """The target region (or its pools' units) and every region that took its traffic
    during the drill."""
    units = [region] if isinstance(region, str) else list(region)
    took = {
        r
        for x in samples
        for unit in units
        if (v := x.regions.get(unit)) is not None
        for r, w in v.routing.items()
        if w > 0
    }
    return [*units, *sorted(took - set(units))]


def figures(
    o: Observed, sessions: Sequence[SessionLog], prewarm: PrewarmFigures | None
) -> dict[str, float]:
    requests = sum(len(x.answers) for x in sessions)
    failed = sum(1 for x in sessions for _, r in x.answers if not r)
    p99 = [x.first_token_p99_s for x in o.samples if x.first_token_p99_s is not None]
    hits = [x.prefix_hit_rate for x in o.samples if x.prefix_hit_rate is not None]
    targets = set(o.targets)
    figures: dict[str, float] = {
        "rto_s": rto_s(sessions, o.targets, o.fault_t),
        "requests": float(requests),
        "requests_failed": float(failed),
        "streams_continued": o.streams_continued,
        "samples": float(len(o.samples)),
        "transitions": float(len([t for t in o.transitions if t.region in targets])),
        "ladder_events": float(len([e for e in o.ladder if e.region in targets])),
    }
    if p99:
        figures["first_token_p99_max_s"] = round(max(p99), 4)
    if hits:
        figures["prefix_hit_rate_min"] = round(min(hits), 4)
    if o.surges:  # the requests sent into a surged region while it surged
        during = in_surges(o.requests, o.surges)
        figures["surge_requests"] = float(len(during))
        figures["surge_requests_failed"] = float(sum(r.first_byte_s is None for r in during))
        if (p99_surge := ttft_p99_s(during)) is not None:
            figures["surge_ttft_p99_s"] = round(p99_surge, 4)
        figures["scale_changes"] = float(len(o.scale_events))
    if prewarm is not None:
        for k, v in (
            ("attained_fraction", prewarm.attained_fraction),
            ("elapsed_s", prewarm.elapsed_s),
            ("prefixes_warmed", prewarm.prefixes_warmed),
            ("verified_hit_rate", prewarm.verified_hit_rate),
        ):
            if v is not None:
                figures[f"prewarm_{k}"] = v
    down = next(
        (t.t for t in o.transitions if t.region in targets and t.to_state == "FAILING_OVER"),
        None,
    )
    if down is not None and o.fault_t is not None:
        figures["failover_after_fault_s"] = round(down - o.fault_t, 3)
    return figures
