"""``failoverctl doctor``'s questions, decided. PURE: no I/O, no clock.

The on-call engineer's self-check (issue 32, item 4): ten questions, each answered
from what the command already read from the live system (the control plane's
``GetStatus``, ``GetCapacity``, ``GetScale``, ``GetReadiness``, ``ListDrills`` and
``GetCost`` answers, the shipped alert rules, the repository when it is present) and
the time ``now`` it read them at. Each answer is one :class:`Line`: PASS, FAIL or UNKNOWN, the
evidence, and what to do.

UNKNOWN is never a PASS in disguise: a question whose data does not exist yet (no RPC
gives it, nothing measures it) says so and names what is missing. :func:`exit_code`
makes the command's exit code of the lines: 0 only when every line passes.

The I/O is ``controlplane/cli/doctor_cmd.py``'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import yaml
from pydantic import ValidationError
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.core.cold_start import ColdStart
from controlplane.core.spend import CostReport, PoolCost, ScopeCost, allowed_scopes
from controlplane.kernel.capacity.record import CapacityRecord, critical_hit_rate
from controlplane.kernel.drills import CAPACITY_PROBE
from controlplane.kernel.pool.members import ACTIVATION_SPAN_SIGNAL, ACTIVATION_WAKES_SIGNAL
from controlplane.kernel.pool.scale import (
    ACTIVATION_RATE_SIGNAL,
    ACTIVATION_SIGNAL,
    GuardLesson,
    ScaleRecord,
)
from controlplane.kernel.pool.sizing import BurstProfile, check_pool

DRILL_WINDOW_S = 7 * 86400.0  # a failover drill per region within this
HORIZON_S, HORIZON_TOLERANCE_S = 30.0, 5.0
# the forecasts' recent relative miss a horizon later (ScaleRecord.forecast_error, the
# EWMA of |rate then - forecast| / max(rate then, 10 rps)): a P90 band of about +25% covers
# a miss up to this, so the scaler's sizing holds
FORECAST_ERROR_MAX = 0.25
# forecasts scored before the error is an answer (one per horizon / 6: 5 s at 30 s, so
# about 55 s of reports after the first)
FORECAST_ERROR_SAMPLES = 5
ACTIVATION_SLO_SHARE = 1 / 3  # a wake's p95 within a third of the first-token SLO
# A hit-rate alert fires this far above the hit rate at which capacity meets load
# (so that it fires before the region is past what it bears).
HIT_RATE_MARGIN = 0.1
WAKES_KEPT = 32  # the agent's p95 is of its last wakes (regions/agent/warm_pool.py)
# the drill criteria question 5 asks to be recorded (chaos/drills/measure.py)
DRILL_CRITERIA = ("prewarm_attainment", "degradation_order", "session_consistency")


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


_WORST = {Verdict.PASS: 0, Verdict.UNKNOWN: 1, Verdict.FAIL: 2}


@dataclass(frozen=True)
class Line:
    """One question's answer: ``todo`` is empty when it passes."""

    id: int
    question: str
    verdict: Verdict
    evidence: str
    todo: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "question": self.question,
            "verdict": self.verdict.value,
            "evidence": self.evidence,
            "todo": self.todo,
        }


@dataclass(frozen=True)
class Finding:
    """One unit's (or one part's) answer to a question."""

    verdict: Verdict
    text: str


@dataclass(frozen=True)
class SizingInputs:
    """What the sizing formula (``controlplane/kernel/pool/sizing.py``) needs of one pool, each
    only when measured (None: not measured, or no RPC gives it)."""

    warm_now: int | None = None  # WARM replicas standing by (the agent's replicas_warm)
    activation_s: float | None = None  # Ta: the agent's wake p95
    activation_rate: float | None = None  # a: wakes per second its batches achieved
    replica_rps: float | None = None  # c: one replica's measured capacity
    burst_rps: float | None = None  # R: the burst the pool plans for
    cold_start_s: float | None = None  # Tc: COLD -> WARM
    budget_s: float | None = None  # B: the burst absorbed within this


# Why an input is missing when nothing measures it or no RPC gives it.
SIZING_MISSING = {
    "warm_now": "WARM now (no replicas_warm from the pool's agent)",
    "activation_s": "activation time (no wake measured by the pool's agent yet)",
    "activation_rate": "activation rate (no batch of 2 or more wakes measured by the pool's "
    "agent yet: the typed scaling.activation_rate does not count)",
    "replica_rps": "per-replica capacity (no fresh capacity probe: the scaler sizes on "
    "the typed capacity_rps)",
    "burst_rps": "burst load (scaling.standby_rps is typed, and no RPC returns it)",
    "cold_start_s": "cold start COLD -> WARM (nothing measures it)",
    "budget_s": "absorption budget (the horizon, not in any RPC's answer)",
}


@dataclass(frozen=True)
class RepoFacts:
    """The repository, as the command read it (``doctor_cmd.read_repo``)."""

    root: str
    order_test: str | None  # tests/test_degradation_order.py's text; None: absent
    ci_script: str | None  # scripts/test.sh's text (what .ci/run runs); None: absent
    ci_entry: str | None  # .ci/run's text; None: absent
    testpaths: tuple[str, ...]  # pyproject's [tool.pytest.ini_options] testpaths
    ladder_steps: tuple[str, ...] | None  # runbooks/degradation.yaml's, in order
    ladder_error: str = ""  # why the ladder file did not load
    ladder_sha256: str = ""  # its digest as loaded (Ladder.digest); "" when it did not load


@dataclass(frozen=True)
class PromActivation:
    """One unit's wakes as Prometheus holds them (``doctor --prometheus``): the p95 over
    up to 90 days (None: no wake in what it holds), how many wakes, and how far back its
    samples go (seconds; None: not known)."""

    p95_s: float | None
    wakes: float
    seen_s: float | None


@dataclass(frozen=True)
class PromBudget:
    """One scope's highest budget utilisation in the last 7 days as Prometheus holds it,
    and how far back its samples go (seconds; None: not known)."""

    max_utilisation: float
    seen_s: float | None
    # the highest while no lift or failover's allowance let it spend past its budget
    # (the leader's tectonic_budget_allowed); None: not known (a leader older than the
    # gauge), so the peak counts as not allowed
    max_unallowed: float | None = None


@dataclass(frozen=True)
class PromFacts:
    """What ``doctor --prometheus URL`` read (``controlplane/cli/doctor_prom.py``); a
    ``str`` in place of a part says why Prometheus did not answer it."""

    url: str
    activation: dict[str, PromActivation] | str  # by unit (the agent's region label)
    budget: dict[tuple[str, str], PromBudget] | str  # by (scope, name)


@dataclass(frozen=True)
class Facts:
    """Everything doctor read; a ``str`` in place of an answer says why it could not be
    read (that RPC failed, or is not there)."""

    now: float
    status: pb.StatusResponse
    capacity: pb.CapacityResponse | str
    scale: pb.ScaleResponse | str
    readiness: pb.ReadinessResponse | str
    drills: pb.DrillsResponse | str
    cost: pb.CostResponse | str = "not read"  # GetCost's answer (question 8)
    rules: str | None = None  # the alert rules file's text; None: not found
    rules_source: str = ""  # where it was read from (or looked for)
    repo: RepoFacts | None = None
    region: str = ""  # only this region (its pools too); "" every one
    sizing: dict[str, SizingInputs] = field(default_factory=dict)  # by unit
    prom: PromFacts | None = None  # --prometheus's history; None: not asked


# ---- helpers ---------------------------------------------------------------------------
def age_text(now: float, ts: float) -> str:
    if ts <= 0:
        return "at an unrecorded time"
    return f"{span_text(now - ts)} ago"


def span_text(s: float | None) -> str:
    """A duration, as how far back a history goes."""
    if s is None:
        return "an unknown span"
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    if s < 2 * 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _in_region(name: str, region: str) -> bool:
    """Whether unit or region ``name`` is ``region`` or one of its pools."""
    return not region or name == region or name.startswith(region + ".")


def units(f: Facts) -> list[pb.RegionStatus]:
    """The failover units asked about: every one, or ``f.region``'s (itself, or its
    pools)."""
    return [r for r in f.status.regions if not f.region or f.region in (r.name, r.pool_of)]


def regions(f: Facts) -> list[str]:
    """The regions asked about (a pool's region once)."""
    return sorted({r.pool_of or r.name for r in units(f)})


def _line(
    qid: int,
    question: str,
    findings: Sequence[Finding],
    todo: Callable[[Verdict], str],
    none: str = "nothing to check: no region in the answer",
) -> Line:
    if not findings:
        return Line(qid, question, Verdict.UNKNOWN, none, todo(Verdict.UNKNOWN))
    verdict = max((x.verdict for x in findings), key=_WORST.__getitem__)
    evidence = "; ".join(x.text for x in findings)
    return Line(qid, question, verdict, evidence, "" if verdict is Verdict.PASS else todo(verdict))


def _unreadable(qid: int, question: str, what: str, why: str, todo: str) -> Line:
    return Line(qid, question, Verdict.UNKNOWN, f"{what} could not be read: {why}", todo)


def _scale_record(p: pb.PoolScale) -> ScaleRecord | str:
    if not p.record_json:
        return "no scale record yet"
    try:
        return ScaleRecord.model_validate_json(p.record_json)
    except ValidationError as exc:
        return f"scale record unreadable here ({exc.error_count()} problems)"


def _capacity_records(f: Facts) -> dict[str, CapacityRecord]:
    out: dict[str, CapacityRecord] = {}
    if isinstance(f.capacity, str):
        return out
    for e in f.capacity.regions:
        if e.record_json:
            try:
                out[e.region] = CapacityRecord.model_validate_json(e.record_json)
            except ValidationError:
                continue
    return out


def _record_for(records: dict[str, CapacityRecord], u: pb.RegionStatus) -> CapacityRecord | None:
    return records.get(u.name) or (records.get(u.pool_of) if u.pool_of else None)


# ---- 1. WARM standby >= the sizing formula ----------------------------------------------
def sizing_inputs(u: pb.RegionStatus, scale: ScaleRecord | None) -> SizingInputs:
    """What the live system measures of ``u``'s sizing inputs today: WARM now, the
    wake p95 and the activation rate its batches of wakes achieved (the agent's
    signals), one replica's capacity when the scaler sized on a measured probe. The
    burst, the cold start and the budget are measured nowhere (or typed and in no RPC's
    answer): None."""
    warm = u.signals.get("replicas_warm")
    per = None
    if scale is not None and scale.capacity == "measured" and scale.per_replica_rps:
        per = scale.per_replica_rps
    return SizingInputs(
        warm_now=None if warm is None else int(warm),
        activation_s=u.signals.get(ACTIVATION_SIGNAL),
        activation_rate=u.signals.get(ACTIVATION_RATE_SIGNAL),
        replica_rps=per,
    )


def _sizing_finding(unit: str, s: SizingInputs) -> Finding:
    missing = [SIZING_MISSING[k] for k, v in vars(s).items() if v is None]
    if (
        s.warm_now is None
        or s.activation_s is None
        or s.replica_rps is None
        or s.burst_rps is None
        or s.cold_start_s is None
        or s.budget_s is None
        or s.activation_rate is None
    ):
        have = []
        if s.warm_now is not None:
            have.append(f"{s.warm_now} WARM now")
        if s.activation_s is not None:
            have.append(f"wake p95 {s.activation_s:.1f} s")
        if s.activation_rate is not None:
            have.append(f"activation rate {s.activation_rate:.2f} replicas/s (measured)")
        if s.replica_rps is not None:
            have.append(f"{s.replica_rps:.1f} rps per replica (measured)")
        has = f" (has {', '.join(have)})" if have else ""
        return Finding(Verdict.UNKNOWN, f"{unit}: not measured: {', '.join(missing)}{has}")
    report = check_pool(
        BurstProfile(
            burst_rps=s.burst_rps,
            replica_rps=s.replica_rps,
            cold_start_s=s.cold_start_s,
            activation_s=s.activation_s,
            budget_s=s.budget_s,
            activation_rate=s.activation_rate,
        ),
        s.warm_now,
    )
    ok = not report.too_small and report.feasible
    return Finding(
        Verdict.PASS if ok else Verdict.FAIL,
        f"{unit}: {report.reason} (activation rate {s.activation_rate:.2f} replicas/s, measured)",
    )


def check_warm_standby(f: Facts) -> Line:
    q = "WARM standby >= the sizing formula (measured inputs)"

    def todo(v: Verdict) -> str:
        if v is Verdict.FAIL:
            return (
                "raise the pool's WARM standby (scaling.burst_warm / standby_rps) to what it lacks"
            )
        return (
            "measure the missing inputs (a wake p95 comes with the first wakes; a capacity "
            "probe: failoverctl capacity probe REGION -r WHY; an activation rate with the "
            "first batch of 2 or more wakes, e.g. a scale-up); the burst and cold start are "
            "not measured by Tectonic yet"
        )

    if isinstance(f.scale, str):
        scale_by_unit: dict[str, ScaleRecord | str] = {}
        checked: dict[str, ColdStart] = {}
    else:
        scale_by_unit = {p.unit: _scale_record(p) for p in f.scale.pools}
        checked = {p.unit: c for p in f.scale.pools if (c := _cold_start(p)) is not None}
    findings = []
    for u in units(f):
        if u.name not in f.sizing and (c := checked.get(u.name)) is not None:
            findings.append(_checked_finding(u.name, c))
            continue
        rec = scale_by_unit.get(u.name)
        inputs = f.sizing.get(u.name) or sizing_inputs(
            u, rec if isinstance(rec, ScaleRecord) else None
        )
        findings.append(_sizing_finding(u.name, inputs))
    return _line(1, q, findings, todo)


# the leader's cold-start check's inputs, as doctor names them
_CHECKED_INPUTS = {
    "activation_s": "activation time",
    "activation_rate": "activation rate",
    "replica_rps": "per-replica capacity",
}


def _cold_start(p: pb.PoolScale) -> ColdStart | None:
    """The leader's cold-start check of the pool (GetScale), when it sized it: None
    without one (no scaler record with a capacity yet, or an older control plane)."""
    if not p.cold_start_json:
        return None
    try:
        c = ColdStart(**json.loads(p.cold_start_json))
    except (ValueError, TypeError):
        return None
    return c if c.warm_needed is not None else None


def _checked_finding(unit: str, c: ColdStart) -> Finding:
    """Q1 from the leader's own check (core/cold_start.py): the burst planned for
    (``standby_rps`` or the forecast's band) beyond what ACTIVE bears, within the
    scaler's horizon, every replica from WARM; PASS or FAIL only with all three inputs
    measured."""
    typed = [name for k, name in _CHECKED_INPUTS.items() if not c.measured.get(k)]
    figures = (
        f"{c.warm_now} WARM now, {c.warm_needed} needed for a burst of "
        f"{c.burst_rps or 0.0:.3g} rps beyond ACTIVE"
        + (f", activation rate {c.activation_rate:.3g} replicas/s" if c.activation_rate else "")
    )
    if typed:
        return Finding(
            Verdict.UNKNOWN,
            f"{unit}: not measured: {', '.join(typed)} (the leader's check stands in a "
            f"typed value: {figures})",
        )
    if c.feasible is False:
        return Finding(
            Verdict.FAIL,
            f"{unit}: the wakes cannot finish within the horizon at the measured rate "
            f"({figures}, all measured)",
        )
    verdict = Verdict.FAIL if c.short or c.warm_now is None else Verdict.PASS
    return Finding(verdict, f"{unit}: {figures} (all three inputs measured)")


# ---- 2. activation p95 <= first-token SLO / 3 -------------------------------------------
# The agent keeps its last wakes only; 90 days of them are Prometheus's.
WAKES_HISTORY = (
    f"the agent keeps its last {WAKES_KEPT} wakes since it started; 90 days are "
    "Prometheus's: histogram_quantile(0.95, sum by (le, region) "
    '(increase(tectonic_agent_pool_activation_duration_seconds_bucket{kind="wake"}[90d]))), '
    "or "
    "failoverctl doctor --prometheus URL"
)
# what --prometheus's answer is (doctor_prom.ACTIVATION_P95, in short)
PROM_ACTIVATION_QUERY = (
    "histogram_quantile(0.95) of increase(tectonic_agent_pool_activation_duration_seconds"
    '_bucket{kind="wake"}[90d]) by region'
)


def _leader_budgets(f: Facts) -> dict[str, float]:
    """Each pool's cold-start budget as the leader computes it (GetScale's cold-start
    check: a third of the topology's first-token SLO), by unit."""
    if isinstance(f.scale, str):
        return {}
    out = {}
    for p in f.scale.pools:
        if not p.cold_start_json:
            continue
        try:
            out[p.unit] = float(json.loads(p.cold_start_json)["budget_s"])
        except (ValueError, TypeError, KeyError):
            continue
    return out


def _seen(u: pb.RegionStatus, now: float) -> str:
    """How far back the agent's p95 sees: its wakes' count and the oldest one's age."""
    n, span = u.signals.get(ACTIVATION_WAKES_SIGNAL), u.signals.get(ACTIVATION_SPAN_SIGNAL)
    if n is None or span is None:
        return "over its last wakes (how many and since when not reported)"
    return f"over its last {n:.0f} wake(s), the oldest {age_text(now, now - span)}"


def _activation_bound(
    u: pb.RegionStatus, budgets: dict[str, float], records: dict[str, CapacityRecord]
) -> tuple[float, float] | None:
    """(bound, SLO) of ``u``'s wakes: the leader's budget (the topology's SLO, as its
    alert judges), else a third of the SLO the unit's capacity probe was run under;
    None: no SLO known."""
    if u.name in budgets:
        return budgets[u.name], budgets[u.name] / ACTIVATION_SLO_SHARE
    rec = _record_for(records, u)
    if rec is None:
        return None
    return rec.slo.ttft_p99_s * ACTIVATION_SLO_SHARE, rec.slo.ttft_p99_s


_NO_SLO = "no first-token SLO known (no cold-start check in GetScale, no capacity probe record)"


def _agent_activation(u: pb.RegionStatus, bound: tuple[float, float] | None, now: float) -> Finding:
    """``u``'s wake p95 as its agent reports it: of its last wakes only."""
    p95 = u.signals.get(ACTIVATION_SIGNAL)
    if p95 is None:
        return Finding(Verdict.UNKNOWN, f"{u.name}: no wake measured yet")
    if bound is None:
        return Finding(Verdict.UNKNOWN, f"{u.name}: wake p95 {p95:.2f} s, but {_NO_SLO}")
    limit, slo = bound
    ok = p95 <= limit
    return Finding(
        Verdict.PASS if ok else Verdict.FAIL,
        f"{u.name}: wake p95 {p95:.2f} s {'<=' if ok else '>'} {limit:.2f} s "
        f"(SLO {slo:g} s / 3) {_seen(u, now)}",
    )


PROM_ACTIVATION_DAYS = 90  # the window question 2 asks about


def _prom_activation(
    u: pb.RegionStatus, bound: tuple[float, float] | None, a: PromActivation | None
) -> Finding:
    """``u``'s wake p95 over up to 90 days from Prometheus's histogram, with how far back
    its samples go; UNKNOWN where it holds no wake of the unit (never a pass)."""
    if a is None:
        return Finding(
            Verdict.UNKNOWN,
            f"{u.name}: Prometheus holds no tectonic_agent_pool_activation_duration_seconds "
            "of it (is its agent scraped? a unit without a warm pool has none)",
        )
    seen = f"the {span_text(a.seen_s)} Prometheus holds (of {PROM_ACTIVATION_DAYS}d asked)"
    if a.p95_s is None or a.wakes <= 0:
        return Finding(Verdict.UNKNOWN, f"{u.name}: no wake in {seen}")
    if bound is None:
        return Finding(Verdict.UNKNOWN, f"{u.name}: wake p95 {a.p95_s:.2f} s, but {_NO_SLO}")
    limit, slo = bound
    ok = a.p95_s <= limit
    return Finding(
        Verdict.PASS if ok else Verdict.FAIL,
        f"{u.name}: wake p95 {a.p95_s:.2f} s {'<=' if ok else '>'} {limit:.2f} s "
        f"(SLO {slo:g} s / 3) over {a.wakes:.0f} wake(s) in {seen}",
    )


def check_activation(f: Facts) -> Line:
    """Question 2. Without Prometheus: the agents' last wakes, and the query for 90 days.
    With it: its histogram over up to 90 days, saying how far back it could see. A
    Prometheus that did not answer leaves a pass on the agents' last wakes UNKNOWN (not
    the 90 days asked) and a fail a fail (the wakes measured are over the budget)."""
    q = "cold-start (activation) p95 <= first-token SLO / 3"
    records = _capacity_records(f)
    budgets = _leader_budgets(f)
    prom = f.prom
    findings = []
    for u in units(f):
        bound = _activation_bound(u, budgets, records)
        if prom is not None and not isinstance(prom.activation, str):
            findings.append(_prom_activation(u, bound, prom.activation.get(u.name)))
            continue
        found = _agent_activation(u, bound, f.now)
        if prom is not None and found.verdict is Verdict.PASS:
            found = Finding(Verdict.UNKNOWN, f"{found.text}, not {PROM_ACTIVATION_DAYS} days")
        findings.append(found)
    line = _line(
        2,
        q,
        findings,
        lambda v: (
            "find why wakes are slow (runbooks/data-plane.md): vLLM sleep level, host memory "
            "bandwidth, wakes sharing a host"
            if v is Verdict.FAIL
            else "wake a WARM replica (a failover drill or a capacity probe does); with "
            "scaling off, run a capacity probe so that an SLO is on record"
            + ("; make --prometheus answer (and scrape the agents)" if prom is not None else "")
        ),
    )
    if prom is None:
        history = WAKES_HISTORY
    elif isinstance(prom.activation, str):
        history = f"Prometheus at {prom.url} could not answer: {prom.activation}"
    else:
        history = f"from Prometheus at {prom.url}: {PROM_ACTIVATION_QUERY}"
    return Line(line.id, line.question, line.verdict, f"{line.evidence}; {history}", line.todo)


# ---- 3. the hit-rate alert --------------------------------------------------------------
def alert_rules(text: str) -> list[tuple[str, str]]:
    """(alert, expr) of every alerting rule in a Prometheus rules file."""
    data = yaml.safe_load(text) or {}
    out = []
    for group in data.get("groups") or []:
        for rule in group.get("rules") or []:
            if isinstance(rule, dict) and "alert" in rule:
                out.append((str(rule["alert"]), str(rule.get("expr", ""))))
    return out


def unit_critical_hit_rate(
    u: pb.RegionStatus, record: CapacityRecord | None
) -> tuple[float | None, str]:
    """The hit rate under which ``u`` bears less than its load now (kernel/capacity:
    ``critical_hit_rate``, as the leader exports it), by its last probe's measured beta,
    fresh or stale (whether the probe is current is question 7's), and what it stands
    on; None, with why, without a probe record."""
    b = u.capacity
    if record is None:
        return None, f"no capacity probe record, so no measured beta ({b.source})"
    n = b.active_replicas if b.HasField("active_replicas") else record.active_replicas
    h = critical_hit_rate(record, n, b.load_rps)
    stale = " (a stale probe's: see question 7)" if b.source == "stale" else ""
    return h, f"beta {record.beta:.2f}{stale}, {n} ACTIVE"


_THRESHOLD = re.compile(r"<=?\s*([0-9]*\.?[0-9]+)")
# A rule that follows the leader's critical hit rate: "hit_rate < critical + margin"
CRITICAL_SERIES = "tectonic_region_critical_hit_rate"
_TRACKS = re.compile(CRITICAL_SERIES + r"\b[^+<>]*\+\s*([0-9]*\.?[0-9]+)")


def hit_rate_rules(text: str) -> tuple[list[str], list[float], list[tuple[str, float]]]:
    """The alerting rules on the hit rate in a rules file: their names, the fixed
    thresholds they fire under, and those that follow the leader's critical hit rate
    with their margin above it."""
    hit = [(a, e) for a, e in alert_rules(text) if re.search(r"hit", e, re.IGNORECASE)]
    tracking = [(a, float(m.group(1))) for a, e in hit if (m := _TRACKS.search(e))]
    fixed = [float(m) for a, e in hit if CRITICAL_SERIES not in e for m in _THRESHOLD.findall(e)]
    return [a for a, _ in hit], fixed, tracking


def _hit_rate_finding(
    u: pb.RegionStatus,
    h: float,
    basis: str,
    rules: tuple[list[str], list[float], list[tuple[str, float]]],
    source: str,
) -> Finding:
    b = u.capacity
    if h <= 0:
        return Finding(
            Verdict.PASS,
            f"{u.name}: bears its {b.load_rps:.1f} rps even fully cold ({basis}): no "
            "hit-rate drop takes it below load",
        )
    want = h + HIT_RATE_MARGIN
    where = (
        f"{u.name}: below hit rate {h:.2f} (now {b.hit_rate:.2f}; {basis}) it bears less "
        f"than its {b.load_rps:.1f} rps"
    )
    names, fixed, tracking = rules
    followed = [(a, m) for a, m in tracking if m >= HIT_RATE_MARGIN]
    if followed:
        a, m = followed[0]
        return Finding(Verdict.PASS, f"{where}; {a} fires below it + {m:g} ({want:.2f})")
    if fixed and max(fixed) >= want:
        return Finding(Verdict.PASS, f"{where}; an alert fires below {max(fixed):g}")
    if tracking or fixed:
        said = [f"{a}: critical + {m:g}" for a, m in tracking] + [f"below {x:g}" for x in fixed]
        return Finding(
            Verdict.FAIL, f"{where}; the hit-rate alert fires {', '.join(said)}, under {want:.2f}"
        )
    if names:
        return Finding(Verdict.UNKNOWN, f"{where}; rule(s) {', '.join(names)}: threshold not read")
    return Finding(Verdict.FAIL, f"{where}; no rule in {source} watches the hit rate")


def check_hit_rate_alert(f: Facts) -> Line:
    q = "hit-rate alert set where a hit-rate drop takes capacity below load"

    def todo(v: Verdict) -> str:
        if v is Verdict.FAIL:
            return (
                f"load the alert TectonicHitRateNearCritical (hit rate < critical + "
                f"{HIT_RATE_MARGIN:g}, runbooks/alerts/tectonic-alerts.yaml) in Prometheus"
            )
        return "run a capacity probe for a measured beta (failoverctl capacity probe REGION -r WHY)"

    if f.rules is None:
        return Line(
            3,
            q,
            Verdict.UNKNOWN,
            f"no alert rules file found ({f.rules_source})",
            "pass --rules PATH (the rules Prometheus loads)",
        )
    try:
        rules = hit_rate_rules(f.rules)
    except yaml.YAMLError as exc:
        return Line(
            3, q, Verdict.UNKNOWN, f"{f.rules_source}: not YAML: {exc}", todo(Verdict.UNKNOWN)
        )
    records = _capacity_records(f)
    findings = []
    for u in units(f):
        h, basis = unit_critical_hit_rate(u, _record_for(records, u))
        if h is None:
            findings.append(Finding(Verdict.UNKNOWN, f"{u.name}: {basis}"))
        else:
            findings.append(_hit_rate_finding(u, h, basis, rules, f.rules_source))
    return _line(3, q, findings, todo)


# ---- 4. the forecast horizon and the forecaster's error --------------------------------
_HORIZON = re.compile(r" in ([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?) s(?: \([^)]*\))? at hit rate")


def horizon_of(r: ScaleRecord) -> float | None:
    """The horizon the scaler forecast over, as its first reason says (None: a record
    that did not forecast: a dark signal, a hold)."""
    m = _HORIZON.search(r.reasons[0]) if r.reasons else None
    return float(m.group(1)) if m else None


def forecast_error_finding(unit: str, r: ScaleRecord) -> Finding:
    """The forecasts' recent miss a horizon later against ``FORECAST_ERROR_MAX``; UNKNOWN
    with fewer than ``FORECAST_ERROR_SAMPLES`` scored."""
    band = ""
    if r.forecast_rps and r.upper_rps is not None:
        band = f" (its P90 band is +{(r.upper_rps - r.forecast_rps) / r.forecast_rps:.0%})"
    n = r.forecast_error_samples
    if r.forecast_error is None or n < FORECAST_ERROR_SAMPLES:
        return Finding(
            Verdict.UNKNOWN,
            f"{unit}: forecast error: {n} of {FORECAST_ERROR_SAMPLES} forecasts scored yet",
        )
    ok = r.forecast_error <= FORECAST_ERROR_MAX
    return Finding(
        Verdict.PASS if ok else Verdict.FAIL,
        f"{unit}: forecast error {r.forecast_error:.0%} {'<=' if ok else '>'} "
        f"{FORECAST_ERROR_MAX:.0%} (recent mean miss a horizon later, {n} scored){band}",
    )


def check_forecast(f: Facts) -> Line:
    q = (
        f"forecast horizon {HORIZON_S:g} s +- {HORIZON_TOLERANCE_S:g} s, and the "
        "forecaster's recent error"
    )

    def todo(v: Verdict) -> str:
        if v is Verdict.FAIL:
            return (
                f"a horizon off {HORIZON_S:g} s: set scaling.horizon_s to {HORIZON_S:g} (a "
                "longer one is the measured wake p95: make wakes faster); an error over "
                f"{FORECAST_ERROR_MAX:.0%}: the load moves faster than the forecaster follows "
                "(steps, not ramps): keep standby_rps for them (docs/scaling.md)"
            )
        return (
            "let the scaler run on agent reports for a minute or more: each forecast is scored "
            "one horizon later (failoverctl scale show, column forecast error)"
        )

    if isinstance(f.scale, str):
        return _unreadable(4, q, "the scaler's records (GetScale)", f.scale, todo(Verdict.UNKNOWN))
    if not f.scale.scaling:
        return Line(
            4,
            q,
            Verdict.UNKNOWN,
            "scaling is off in this topology (no scaling: section): no forecaster runs",
            "add a scaling: section (docs/scaling.md) if the pools should be sized",
        )
    wanted = {u.name for u in units(f)}
    findings = []
    for p in f.scale.pools:
        if p.unit not in wanted:
            continue
        r = _scale_record(p)
        if isinstance(r, str):
            findings.append(Finding(Verdict.UNKNOWN, f"{p.unit}: {r}"))
            continue
        h = horizon_of(r)
        if h is None:
            findings.append(
                Finding(
                    Verdict.UNKNOWN,
                    f"{p.unit}: no forecast in its last record ({'; '.join(r.reasons[:1])})",
                )
            )
            continue
        ok = abs(h - HORIZON_S) <= HORIZON_TOLERANCE_S
        findings.append(Finding(Verdict.PASS if ok else Verdict.FAIL, f"{p.unit}: horizon {h:g} s"))
        findings.append(forecast_error_finding(p.unit, r))
    return _line(4, q, findings, todo, none="no pool has a scale record")


# ---- 5. a failover drill per region in the last 7 days ----------------------------------
def _drill_runs(f: Facts, drills: pb.DrillsResponse, region: str) -> list[pb.DrillRun]:
    """``region``'s failover drills (its pools' too) that ended in the window: real
    runs, not dry, not aborted, not capacity probes; newest first."""
    since = f.now - DRILL_WINDOW_S
    runs = [
        r
        for r in drills.runs
        if r.region
        and _in_region(r.region, region)
        and not r.dry_run
        and not r.aborted
        and r.scenario != CAPACITY_PROBE
        and (r.ended_at or r.started_at) >= since
    ]
    return sorted(runs, key=lambda r: r.ended_at or r.started_at, reverse=True)


def _drill_finding(f: Facts, region: str, runs: Sequence[pb.DrillRun]) -> Finding:
    """The newest drill of the window, and each criterion question 5 asks for from the
    newest drill that recorded it (ListDrills: ``criteria`` judged, ``failed``)."""
    last = runs[0]

    def said(r: pb.DrillRun) -> str:
        return f"drill {r.id} ({r.scenario}, {age_text(f.now, r.ended_at or r.started_at)})"

    outcome = "passed" if last.passed else f"failed ({', '.join(last.failed) or '?'})"
    head = f"{region}: {said(last)} {outcome}"
    missing, failed, passed = [], [], []
    for c in DRILL_CRITERIA:
        # a failed criterion was judged, also in a row recorded before ``criteria`` was
        src = next((r for r in runs if c in r.criteria or c in r.failed), None)
        where = "" if src is last or src is None else f" (in {said(src)})"
        if src is None:
            missing.append(c)
        elif c in src.failed:
            failed.append(c + where)
        else:
            passed.append(c + where)
    if failed:
        return Finding(Verdict.FAIL, f"{head}; failed {', '.join(failed)}")
    if missing and not any(r.criteria for r in runs):
        return Finding(
            Verdict.UNKNOWN,
            f"{head}; no drill of the week says which criteria it judged (recorded by a "
            "drill service older than the criteria list)",
        )
    if missing:
        return Finding(Verdict.FAIL, f"{head}; no drill of the week measured {', '.join(missing)}")
    return Finding(Verdict.PASS, f"{head}; recorded and passed: {', '.join(passed)}")


def check_drills(f: Facts) -> Line:
    q = (
        "a failover drill per region in the last 7 days, its pre-warm, ladder order and "
        "consistency recorded"
    )

    def todo(v: Verdict) -> str:
        if v is Verdict.FAIL:
            return (
                "run drills that measure them (no shipped scenario measures all three: "
                "region-blackout the pre-warm and consistency, latency-injection the ladder's "
                "order): failoverctl drill run SCENARIO --region REGION -r WHY "
                "(runbooks/region-barred.md)"
            )
        return (
            "read the drill's report (failoverctl drill show ID), or upgrade the drill "
            "service so that its history says which criteria it judged"
        )

    if isinstance(f.drills, str):
        return _unreadable(5, q, "the drill history (ListDrills)", f.drills, todo(Verdict.UNKNOWN))
    findings = []
    for region in regions(f):
        runs = _drill_runs(f, f.drills, region)
        if not runs:
            findings.append(
                Finding(Verdict.FAIL, f"{region}: no failover drill in the last 7 days")
            )
        else:
            findings.append(_drill_finding(f, region, runs))
    return _line(5, q, findings, todo)


# ---- 6. the degradation-order test in CI, its ladder the deployed one ------------------
def check_ladder_ci(f: Facts) -> Line:
    q = "degradation-order test in CI, and its ladder file the one deployed"
    repo = f.repo
    if repo is None:
        return Line(
            6,
            q,
            Verdict.UNKNOWN,
            "no Tectonic repository here (run from a checkout, or --repo PATH)",
            "run failoverctl doctor from the repository's checkout",
        )
    findings = []
    if repo.order_test is None:
        findings.append(Finding(Verdict.FAIL, "tests/test_degradation_order.py is missing"))
    elif "degradation.yaml" not in repo.order_test:
        findings.append(
            Finding(
                Verdict.FAIL,
                "tests/test_degradation_order.py does not read runbooks/degradation.yaml",
            )
        )
    elif repo.ci_entry is None or "scripts/test.sh" not in repo.ci_entry:
        findings.append(
            Finding(Verdict.FAIL, ".ci/run (CI's entry point) does not run scripts/test.sh")
        )
    elif repo.ci_script is None or "pytest" not in repo.ci_script:
        findings.append(Finding(Verdict.FAIL, "scripts/test.sh does not run pytest"))
    elif "tests" not in repo.testpaths:
        findings.append(
            Finding(Verdict.FAIL, f"pytest's testpaths {list(repo.testpaths)} leave tests/ out")
        )
    else:
        findings.append(
            Finding(
                Verdict.PASS,
                "tests/test_degradation_order.py runs in CI (.ci/run -> scripts/test.sh -> "
                "pytest tests/)",
            )
        )
    findings.append(_deployed_ladder(f, repo))
    return _line(
        6,
        q,
        findings,
        lambda v: (
            "restore the test in CI, and deploy the ladder from this checkout"
            if v is Verdict.FAIL
            else "compare the leader's ladder file with runbooks/degradation.yaml by hand "
            "(sha256sum)"
        ),
    )


def _deployed_ladder(f: Facts, repo: RepoFacts) -> Finding:
    """The checkout's ladder file against the one the answering control-plane replica
    runs (GetStatus: its steps and digest), and the steps the leader applies now."""
    if repo.ladder_steps is None:
        why = repo.ladder_error
        return Finding(Verdict.FAIL, f"runbooks/degradation.yaml does not load: {why}")
    mine = " > ".join(repo.ladder_steps)
    applied = {s for u in units(f) for s in u.degradation_steps}
    foreign = sorted(applied - set(repo.ladder_steps))
    if foreign:
        return Finding(
            Verdict.FAIL,
            f"the leader applies step(s) {', '.join(foreign)} that the repository's ladder "
            "lacks: the deployed ladder differs",
        )
    deployed, who = f.status.ladder_sha256, f.status.responder or "the control plane"
    if not deployed:
        return Finding(
            Verdict.UNKNOWN,
            f"the repository's ladder is {mine}; {who} reports no ladder (it runs none, or "
            "is older than the ladder in GetStatus), so not compared",
        )
    if deployed != repo.ladder_sha256:
        theirs = " > ".join(f.status.ladder_steps)
        return Finding(
            Verdict.FAIL,
            f"{who} runs another ladder than runbooks/degradation.yaml (sha256 {deployed[:12]} "
            f"vs {repo.ladder_sha256[:12]}; steps {theirs} vs {mine})",
        )
    return Finding(
        Verdict.PASS,
        f"{who} runs the checkout's runbooks/degradation.yaml ({mine}; sha256 {deployed[:12]})",
    )


# ---- 7. capacity measured and fresh, of the engine running ------------------------------
def _capacity_finding(f: Facts, u: pb.RegionStatus) -> Finding:
    """Measured (fresh, of the engine and serving configuration the region runs: the
    leader's bearing) and the probe's engine the one its replicas run now."""
    b = u.capacity
    if b.source != "measured":
        return Finding(Verdict.FAIL, f"{u.name}: {b.source or 'no source'}: {b.reason}")
    when = age_text(f.now, b.measured_at) if b.HasField("measured_at") else "?"
    running = running_engine(u)
    if not b.engine_version:
        return Finding(
            Verdict.UNKNOWN,
            f"{u.name}: measured {when}, but the probe recorded no engine version: not "
            "compared with the one running",
        )
    if not running:
        return Finding(
            Verdict.UNKNOWN,
            f"{u.name}: measured {when} on engine {b.engine_version}, but its agent reports "
            "no engine version running: not compared",
        )
    if running != b.engine_version:  # the leader would call it stale; "a, b": mid-upgrade
        return Finding(
            Verdict.FAIL,
            f"{u.name}: measured {when} on engine {b.engine_version}, it runs {running}",
        )
    lesson = _guard_lesson(f, u.name)
    if lesson is not None and (not b.HasField("measured_at") or lesson.at > b.measured_at):
        return Finding(
            Verdict.FAIL,
            f"{u.name}: measured {when}, but since then the scaler's guard found "
            f"{lesson.active} ACTIVE short at {lesson.load_rps:.3g} rps right after a "
            f"scale-down ({age_text(f.now, lesson.at)}): a replica bears less than the "
            "record says",
        )
    return Finding(
        Verdict.PASS, f"{u.name}: measured {when} on engine {b.engine_version}, the one it runs"
    )


def _guard_lesson(f: Facts, unit: str) -> GuardLesson | None:
    """The guard's lesson in ``unit``'s scale record (core/guard_lesson.py), if any."""
    if isinstance(f.scale, str):
        return None
    for p in f.scale.pools:
        if p.unit == unit and not isinstance(r := _scale_record(p), str):
            return r.lesson
    return None


def check_capacity(f: Facts) -> Line:
    q = "capacity measured and fresh for every region, of the engine running"
    return _line(
        7,
        q,
        [_capacity_finding(f, u) for u in units(f)],
        lambda v: "probe it: failoverctl capacity probe REGION -r WHY (runbooks/capacity-stale.md)",
    )


# ---- 8. budget utilisation --------------------------------------------------------------
# the alerts the cost guardrail ships (runbooks/alerts/tectonic-alerts.yaml, docs/scaling.md)
BUDGET_ALERTS = ("TectonicBudgetBinding", "TectonicPoolEfficiencyLow")
# GetCost answers the utilisation now; the week's is the leader's gauge, kept by Prometheus
BUDGET_HISTORY = (
    "the last week's utilisation is not in any RPC's answer: the evidence is the "
    "utilisation now; the week's is Prometheus's "
    "max_over_time(tectonic_budget_utilisation[7d])"
)


def _cost_report(f: Facts) -> CostReport | str | None:
    """GetCost's report; None: no ``cost:`` section; a str: why it could not be read."""
    if isinstance(f.cost, str):
        return f"the cost report (GetCost) could not be read: {f.cost}"
    if not f.cost.report_json:
        return None
    try:
        return CostReport.model_validate_json(f.cost.report_json)
    except ValidationError as exc:
        return f"the cost report is unreadable here ({exc.error_count()} problems)"


def _budget_alerts(f: Facts) -> Finding:
    if f.rules is None:
        return Finding(Verdict.UNKNOWN, f"no alert rules file found ({f.rules_source})")
    try:
        names = {a for a, _ in alert_rules(f.rules)}
    except yaml.YAMLError as exc:
        return Finding(Verdict.UNKNOWN, f"{f.rules_source}: not YAML: {exc}")
    missing = [a for a in BUDGET_ALERTS if a not in names]
    if missing:
        return Finding(Verdict.FAIL, f"{f.rules_source} lacks {', '.join(missing)}")
    return Finding(Verdict.PASS, f"alerts {', '.join(BUDGET_ALERTS)} in {f.rules_source}")


def _spend(name: str, dollars: float, budget: float | None, util: float | None) -> str:
    if budget is None or util is None:
        return f"{name}: ${dollars:,.2f}/h, no budget"
    return f"{name}: ${dollars:,.2f}/h of ${budget:,.2f}/h ({util:.0%})"


def budget_findings(report: CostReport, wanted: set[str]) -> list[Finding]:
    """Each pool in ``wanted``, its zones' and the fleet's utilisation now: over 1 fails
    unless a lift or a failover's allowance covers it (for a zone or the fleet: one of
    its pools')."""
    allowed = allowed_scopes(report)
    findings = []
    pools = [p for p in report.pools if p.unit in wanted]
    lines: list[tuple[str, str, str, PoolCost | ScopeCost]]
    lines = [(p.unit, "pool", p.unit, p) for p in pools]
    zones = {p.zone for p in pools}
    lines += [
        (s.name if s.scope == s.name else f"{s.scope} {s.name}", s.scope, s.name, s)  # "zone us"
        for s in report.scopes
        if s.budget is not None and (s.scope != "zone" or s.name in zones)
    ]
    for label, scope, name, line in lines:
        text = _spend(label, line.dollars_per_hour, line.budget, line.utilisation)
        over = line.utilisation is not None and line.utilisation > 1
        why = allowed.get((scope, name), ())
        if over and not why:
            findings.append(Finding(Verdict.FAIL, f"{text}: over budget"))
        else:
            findings.append(Finding(Verdict.PASS, text + (f" ({'; '.join(why)})" if over else "")))
    return findings


PROM_BUDGET_DAYS = 7  # the window question 8 asks about
PROM_BUDGET_QUERY = (
    "max_over_time(tectonic_budget_utilisation[7d]) by scope and name, and the same "
    "unless tectonic_budget_allowed == 1"
)


def week_findings(
    report: CostReport, wanted: set[str], week: dict[tuple[str, str], PromBudget]
) -> list[Finding]:
    """The highest utilisation in the last 7 days of each budgeted scope question 8
    judges now (``wanted``'s pools, their zones, the fleet), as Prometheus holds it,
    with how far back it could see. Over 1 (spend over the budget) fails, as it does
    now, unless a lift or a failover's allowance let it then (the leader's
    ``tectonic_budget_allowed``): the evidence then says the peak was allowed. A scope
    with a budget that Prometheus holds nothing of is UNKNOWN (the leader is not
    scraped, or is older)."""
    pools = [p for p in report.pools if p.unit in wanted]
    scopes = [("pool", p.unit) for p in pools if p.budget is not None]
    zones = {p.zone for p in pools}
    scopes += [
        (s.scope, s.name)
        for s in report.scopes
        if s.budget is not None and (s.scope != "zone" or s.name in zones)
    ]
    findings = []
    for scope, name in scopes:
        label = name if scope in ("pool", name) else f"{scope} {name}"
        b = week.get((scope, name))
        if b is None:
            findings.append(
                Finding(
                    Verdict.UNKNOWN,
                    f"{label}: Prometheus holds no tectonic_budget_utilisation"
                    f'{{scope="{scope}",name="{name}"}} (is the leader scraped?)',
                )
            )
            continue
        seen = f"the {span_text(b.seen_s)} Prometheus holds (of {PROM_BUDGET_DAYS}d asked)"
        unallowed = b.max_utilisation if b.max_unallowed is None else b.max_unallowed
        text = f"{label}: at most {b.max_utilisation:.0%} of its budget in {seen}"
        if unallowed > 1:
            why = (
                f"{unallowed:.0%} with no lift or failover's allowance"
                if b.max_unallowed is not None
                else "no tectonic_budget_allowed (an older leader): a lift or a failover's "
                "allowance then is not known"
            )
            findings.append(Finding(Verdict.FAIL, f"{text}: over budget, {why}"))
        elif b.max_utilisation > 1:
            findings.append(
                Finding(
                    Verdict.PASS,
                    f"{text}: over budget only under a lift or a failover's allowance "
                    f"(at most {unallowed:.0%} otherwise)",
                )
            )
        else:
            findings.append(Finding(Verdict.PASS, text))
    return findings


def check_budget(f: Facts) -> Line:
    q = "budget utilisation alerts configured, and the last week's utilisation"

    def todo(v: Verdict) -> str:
        if v is Verdict.FAIL:
            return (
                "restore the alerts TectonicBudgetBinding and TectonicPoolEfficiencyLow in the "
                "rules Prometheus loads; for a scope over budget see runbooks/budget-binding.md "
                "(raise the budget, or failoverctl cost lift POOL -r WHY); a peak over the "
                "budget in the last week: the audit log says what spent it"
            )
        return "pass --rules PATH (the rules Prometheus loads), and check GetCost answers" + (
            "; make --prometheus answer (and scrape the leader)" if f.prom is not None else ""
        )

    report = _cost_report(f)
    if report is None:
        return Line(
            8,
            q,
            Verdict.UNKNOWN,
            "no cost: section in this topology: nothing is priced, so no budget to alert on",
            "add a cost: section (prices and budgets: docs/scaling.md, Cost) if spend should "
            "be bounded",
        )
    if isinstance(report, str):
        return Line(8, q, Verdict.UNKNOWN, report, todo(Verdict.UNKNOWN))
    wanted = {u.name for u in units(f)}
    findings = [_budget_alerts(f)]
    findings += budget_findings(report, wanted)
    prom = f.prom
    if prom is None:
        history = BUDGET_HISTORY
    elif isinstance(prom.budget, str):
        findings.append(
            Finding(
                Verdict.UNKNOWN,
                f"the last week's utilisation: Prometheus at {prom.url} could not answer: "
                f"{prom.budget}",
            )
        )
        history = ""
    else:
        findings += week_findings(report, wanted, prom.budget)
        history = f"the week's from Prometheus at {prom.url}: {PROM_BUDGET_QUERY}"
    line = _line(8, q, findings, todo)
    evidence = f"{line.evidence}; {history}" if history else line.evidence
    return Line(line.id, q, line.verdict, evidence, line.todo)


# ---- 9. readiness and overrides ---------------------------------------------------------
def check_readiness(f: Facts) -> Line:
    q = "every region's readiness (drill verdict), and any override in force"

    def todo(v: Verdict) -> str:
        return "run a passing drill (failoverctl drill run ...); see runbooks/region-barred.md"

    if isinstance(f.readiness, str):
        return _unreadable(9, q, "readiness (GetReadiness)", f.readiness, todo(Verdict.UNKNOWN))
    wanted = set(regions(f)) | {u.name for u in units(f)}
    findings = []
    for r in f.readiness.regions:
        if r.region not in wanted:
            continue
        if not r.has_verdict:
            findings.append(Finding(Verdict.FAIL, f"{r.region}: never drilled"))
        elif r.barred:
            findings.append(
                Finding(
                    Verdict.FAIL,
                    f"{r.region}: BARRED by failed drill {r.drill} ({age_text(f.now, r.at)})",
                )
            )
        elif not r.passed:
            findings.append(
                Finding(
                    Verdict.FAIL,
                    f"{r.region}: drill {r.drill} failed ({age_text(f.now, r.at)}); override in "
                    f"force by "
                    f"{r.override_actor} ({age_text(f.now, r.override_at)}): {r.override_reason}",
                )
            )
        else:
            findings.append(
                Finding(
                    Verdict.PASS, f"{r.region}: passed drill {r.drill} ({age_text(f.now, r.at)})"
                )
            )
    return _line(9, q, findings, todo)


# ---- 10. one engine version per pool ----------------------------------------------------
_RUNS = re.compile(r"the region runs '([^']*)'")


def running_engine(u: pb.RegionStatus) -> str:
    """What ``u``'s up replicas run: its agent's latest fresh report (GetStatus's
    ``engine_version``, "a, b" while they differ), else what a stale capacity probe's
    reason names; "" when neither says."""
    if u.engine_version:
        return u.engine_version
    m = _RUNS.search(u.capacity.reason)
    return m.group(1) if m else ""


def check_engine(f: Facts) -> Line:
    q = "the same engine version across a pool's replicas"
    findings = []
    for u in units(f):
        running = running_engine(u)
        if not running:
            findings.append(
                Finding(
                    Verdict.UNKNOWN,
                    f"{u.name}: its agent reports no engine version (no up replica answered "
                    "GET /version, or no fresh agent report)",
                )
            )
        elif ", " in running:
            findings.append(Finding(Verdict.FAIL, f"{u.name}: its replicas run {running}"))
        else:
            findings.append(Finding(Verdict.PASS, f"{u.name}: every up replica runs {running}"))
    return _line(
        10,
        q,
        findings,
        lambda v: (
            "finish (or roll back) the rolling upgrade"
            if v is Verdict.FAIL
            else "check the pool's agent reports (tectonic-agent logs 'engine: A -> B'), or "
            "compare the replicas' GET /version by hand"
        ),
    )


CHECKS: tuple[Callable[[Facts], Line], ...] = (
    check_warm_standby,
    check_activation,
    check_hit_rate_alert,
    check_forecast,
    check_drills,
    check_ladder_ci,
    check_capacity,
    check_budget,
    check_readiness,
    check_engine,
)


def diagnose(f: Facts) -> list[Line]:
    """Every question's line, in order."""
    return [check(f) for check in CHECKS]


def exit_code(lines: Iterable[Line], allow_unknown: bool = False) -> int:
    """0 when every line passes (with ``allow_unknown``, UNKNOWN lines count as passing);
    1 otherwise. (3, the control plane unreachable, is the command's.)"""
    ok = {Verdict.PASS, Verdict.UNKNOWN} if allow_unknown else {Verdict.PASS}
    return 0 if all(x.verdict in ok for x in lines) else 1
