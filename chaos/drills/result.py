"""What a drill records: its journal, the timeline it observed, and its verdict.

These are plain data, shared by the runner (which fills them), the measurements
(which judge them), the reports (which draw them) and the CLI (which lists them).
Times are seconds since the drill started (``t``) unless named ``*_at`` (Unix time).
"""

from __future__ import annotations

from pydantic import Field

from controlplane.kernel.drills import DrillSummary
from controlplane.kernel.model import Frozen, LadderChange

__all__ = ["DrillResult", "DrillSummary", "summarize"]


class JournalEntry(Frozen):
    """One line of the append-only journal: every action the runner took, and when."""

    at: float  # Unix time
    t: float  # seconds since the drill started
    phase: str  # steady_before | faults | observe | rollback | steady_after | verdict
    kind: str  # phase | fault | rollback | probe | abort | measure | note | error
    action: str = ""
    detail: dict[str, str] = Field(default_factory=dict)
    ok: bool = True


class RegionSample(Frozen):
    state: str
    health: str
    routing: dict[str, float] = Field(default_factory=dict)
    ladder_steps: tuple[str, ...] = ()  # degradation steps applied now, in order
    # a warm pool's (None: no record): ACTIVE replicas its agent publishes in pools/<r>,
    # and the leader's desired ACTIVE and WARM in scale/<r>
    active: int | None = None
    desired_active: int | None = None
    desired_warm: int | None = None


class Sample(Frozen):
    """What the system's own metrics and etcd said at ``t``. Rates are over the window
    since the previous sample; ``None`` when nothing was measured in it."""

    t: float
    leader: str = ""
    regions: dict[str, RegionSample] = Field(default_factory=dict)
    requests: int = 0  # answered by the gateways in the window, any status
    errors: int = 0  # of those, 5xx (incl. the gateway's own 503 when no region serves)
    error_rate: float | None = None
    first_token_p99_s: float | None = None  # gateways' first-byte histogram, merged
    prefix_hit_rate: float | None = None  # vLLM prefix_cache hits / queries, all replicas


class Transition(Frozen):
    """A state change of a region, from the leader's audit log."""

    t: float
    region: str
    from_state: str
    to_state: str
    reason: str = ""


class LadderEvent(Frozen):
    """A degradation step applied, restored or re-applied, from the audit log."""

    t: float
    region: str
    action: LadderChange
    step: str


class Criterion(Frozen):
    """One line of the verdict: what was measured against what was required."""

    name: str
    passed: bool
    measured: str
    required: str
    detail: str = ""


class DrillResult(Frozen):
    id: str
    scenario: str
    title: str
    region: str
    started_at: float
    ended_at: float
    dry_run: bool = False
    aborted: str = ""  # why the drill stopped early; "" when it did not
    passed: bool
    criteria: tuple[Criterion, ...] = ()
    samples: tuple[Sample, ...] = ()
    transitions: tuple[Transition, ...] = ()
    ladder: tuple[LadderEvent, ...] = ()
    figures: dict[str, float] = Field(default_factory=dict)  # rto_s, requests, ...
    readiness_written: tuple[str, ...] = ()  # regions whose readiness this drill set
    journal_path: str = ""
    report_path: str = ""

    @property
    def duration_s(self) -> float:
        return self.ended_at - self.started_at

    def failed_criteria(self) -> list[str]:
        return [c.name for c in self.criteria if not c.passed]


def summarize(result: DrillResult, trigger: str = "manual", request_id: str = "") -> DrillSummary:
    """The history row of ``result``."""
    return DrillSummary(
        id=result.id,
        scenario=result.scenario,
        region=result.region,
        started_at=result.started_at,
        ended_at=result.ended_at,
        passed=result.passed,
        dry_run=result.dry_run,
        aborted=result.aborted,
        failed=tuple(result.failed_criteria()),
        criteria=tuple(c.name for c in result.criteria),
        trigger=trigger,
        report_path=result.report_path,
        request_id=request_id,
    )
