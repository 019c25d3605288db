"""The verdict of a drill, from what was observed: pure functions, no I/O.

Each criterion compares a figure measured from the system's own record (the audit
log's transitions and ladder steps, the failover record's pre-warm result) or from
the synthetic sessions' answers (which region served each request, which failed)
against the scenario's threshold. A criterion the scenario does not ask for is not
judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from chaos.drills.result import Criterion, LadderEvent, Sample, Transition
from chaos.drills.scenario import Fault, Measurements, Scenario, SteadyState
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
    """Everything the verdict is computed from."""

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


# ---- steady state -------------------------------------------------------------------------
def probes_hold(hyp: SteadyState, s: Sample) -> tuple[bool, str]:
    """Whether every probe of ``hyp`` holds in sample ``s``; the first that does not."""
    for p in hyp.probes:
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


def rto_s(sessions: Sequence[SessionLog], region: str, fault_t: float | None) -> float:
    """From the first fault until the sessions homed in ``region`` are answered again:
    the first answer after the last failed request (0 when none failed)."""
    if fault_t is None:
        return 0.0
    answers = sorted(a for s in sessions if s.home == region for a in s.answers)
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
    absent, not passed."""
    mine = [t for t in o.transitions if t.region == o.region]
    path = [t.to_state for t in mine]
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
        *_path_criteria(m, o.region, path),
        *([_prewarm(m, o.prewarm)] if m.prewarm_attainment is not None else []),
        *([_ladder(m, o)] if m.degradation_order else []),
        *_session_criteria(m, o, path),
        Criterion(
            name="steady_state_after",
            passed=o.steady_after[0],
            measured="held" if o.steady_after[0] else o.steady_after[1],
            required="the steady-state hypothesis holds again after the rollbacks",
        ),
    ]


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


def _session_criteria(m: Measurements, o: Observed, path: list[str]) -> list[Criterion]:
    """What the synthetic sessions saw: consistency (each answered in one region, or
    in a second only after its one move), the RTO and the error rate."""
    out = []
    requests = sum(len(s.answers) for s in o.sessions)
    if m.max_consistency_failure_rate is not None:
        moved = {o.region} if "FAILING_OVER" in path or _routing_moved(o) else set()
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
        rto = rto_s(o.sessions, o.region, o.fault_t)
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


def _routing_moved(o: Observed) -> bool:
    """The target region's traffic was routed elsewhere in some sample."""
    for s in o.samples:
        r = s.regions.get(o.region)
        if r is not None and r.routing and r.routing.get(o.region, 0.0) < 1.0:
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


def regions_judged(region: str, samples: Sequence[Sample]) -> list[str]:
    """The target region and every region that took its traffic during the drill."""
    took = {
        r
        for x in samples
        if (v := x.regions.get(region)) is not None
        for r, w in v.routing.items()
        if w > 0
    }
    return [region, *sorted(took - {region})]


def figures(
    o: Observed, sessions: Sequence[SessionLog], prewarm: PrewarmFigures | None
) -> dict[str, float]:
    requests = sum(len(x.answers) for x in sessions)
    failed = sum(1 for x in sessions for _, r in x.answers if not r)
    p99 = [x.first_token_p99_s for x in o.samples if x.first_token_p99_s is not None]
    hits = [x.prefix_hit_rate for x in o.samples if x.prefix_hit_rate is not None]
    figures: dict[str, float] = {
        "rto_s": rto_s(sessions, o.region, o.fault_t),
        "requests": float(requests),
        "requests_failed": float(failed),
        "streams_continued": o.streams_continued,
        "samples": float(len(o.samples)),
        "transitions": float(len([t for t in o.transitions if t.region == o.region])),
        "ladder_events": float(len([e for e in o.ladder if e.region == o.region])),
    }
    if p99:
        figures["first_token_p99_max_s"] = round(max(p99), 4)
    if hits:
        figures["prefix_hit_rate_min"] = round(min(hits), 4)
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
        (t.t for t in o.transitions if t.region == o.region and t.to_state == "FAILING_OVER"), None
    )
    if down is not None and o.fault_t is not None:
        figures["failover_after_fault_s"] = round(down - o.fault_t, 3)
    return figures
