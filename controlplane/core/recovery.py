"""Graduated recovery, pure (docs/architecture.md §3, §5): the traffic steps and their guard.

A region in RECOVERED gets its new-session weight back one increment per
``step_interval_s`` (``config.RecoveryConfig``; with a degradation ladder, the file's
``recovery`` section and ``baseline``). Each tick :func:`next_recovery_move` reads the
region's ``RecoveryProgress``, health verdict and signals and returns at most one move,
checked in this order:

* **steps before traffic** (the recovery pre-warm, :func:`pending_recovery_steps`):
  nothing moves until the orchestrator records them; one that has no result
  ``prewarm_budget_s + PREWARM_GRACE_S`` after recovery began is given up (recorded,
  audited) so that a stuck pre-warm never blocks recovery;
* **health** not HEALTHY: the weights hold where they are (an UNHEALTHY verdict fails
  the region over again; that is the caller's, as before);
* **the guard**, once traffic is home (step 1 or later, or the guard engaged before): a
  breach of any guard threshold over the region's signals (``ttft_p99_s`` over a multiple
  of the baseline, ``error_rate``, ...) steps the weight back one increment, re-applying
  the step before the last, and pauses. Never below 0, where the region keeps the whole
  failed-over routing, and never a failover by itself. At most one step back per
  interval: a breach that lasts, or comes back, an interval after the last step back
  steps back once more;
* **calm** again (no breach) for one interval after the guard engaged: the next step
  forward, and the guard disengages;
* otherwise the next step once the interval has passed since the last; the last step
  completes recovery (RECOVERED -> NORMAL).

Before the first step no user traffic is home: its signals then come from the
pre-warm's own replays, so the guard does not read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from controlplane.kernel.config import RecoveryConfig
from controlplane.kernel.ladder.model import (
    AUTH_ERROR_SIGNAL,
    ERROR_SIGNAL,
    HEADROOM_SIGNAL,
    QUEUE_SIGNAL,
    TTFT_SIGNAL,
    with_headroom,
)
from controlplane.kernel.model import Frozen, Health, RecoveryProgress, RecoveryStep

PREWARM_GRACE_S = 15.0  # past the pre-warm budget: the agent's grace and the writes


class MoveKind(StrEnum):
    NONE = "none"  # nothing to write
    WAIT = "wait"  # steps before traffic are pending: the orchestrator runs them
    ABANDON = "abandon"  # a pending step ran out of time: recorded as given up
    HOLD = "hold"  # health not HEALTHY: paused where it is (written once)
    GUARD = "guard"  # a breach: weight stepped back one increment (or paused at 0)
    SPIKE = "spike"  # a breach again within the interval of the last step back
    CALM = "calm"  # the guard's breach is over: resume due one interval from now
    STEP = "step"  # one increment more home
    COMPLETE = "complete"  # the last increment: back to NORMAL


class GuardBreach(Frozen):
    signal: str
    value: float
    threshold: float
    text: str


class RecoveryMove(Frozen):
    kind: MoveKind
    progress: RecoveryProgress  # the record's new recovery progress
    fraction_home: float | None = None  # the new home weight, when routing changes
    reason: str = ""
    breaches: tuple[GuardBreach, ...] = ()

    @property
    def writes(self) -> bool:
        return self.kind not in (MoveKind.NONE, MoveKind.WAIT)


def pending_recovery_steps(progress: RecoveryProgress | None) -> tuple[RecoveryStep, ...]:
    """Steps planned before the first traffic step and not yet recorded, in order."""
    if progress is None or progress.step > 0 or progress.guard_at is not None:
        return ()
    return tuple(s for s in progress.planned if s not in progress.done)


def guard_breaches(
    cfg: RecoveryConfig, region: str, signals: Mapping[str, float], capacity_rps: float
) -> tuple[GuardBreach, ...]:
    """The guard thresholds the region's signals breach; a missing signal is no
    evidence. The first-token threshold is relative to the region's baseline and
    unguarded without one."""
    sig = with_headroom(signals, capacity_rps)
    out: list[GuardBreach] = []

    def over(signal: str, limit: float | None, text: str) -> None:
        v = sig.get(signal)
        if limit is not None and v is not None and v > limit:
            out.append(GuardBreach(signal=signal, value=v, threshold=limit, text=text.format(v)))

    base = cfg.baseline_for(region)
    k = cfg.guard_ttft_p99_over_baseline
    if k is not None and base is not None:
        over(TTFT_SIGNAL, k * base, f"ttft p99 {{:.3g}}s > {k:g} x baseline {base:g}s")
    e, a = cfg.guard_error_rate_over, cfg.guard_auth_error_rate_over
    over(ERROR_SIGNAL, e, f"error rate {{:.2%}} > {e or 0:.2%}")
    over(AUTH_ERROR_SIGNAL, a, f"auth error rate {{:.2%}} > {a or 0:.2%}")
    over(
        QUEUE_SIGNAL,
        cfg.guard_queue_depth_over,
        f"queue depth {{:g}} > {cfg.guard_queue_depth_over}",
    )
    room, h = sig.get(HEADROOM_SIGNAL), cfg.guard_headroom_under
    if h is not None and room is not None and room < h:
        out.append(
            GuardBreach(
                signal=HEADROOM_SIGNAL,
                value=room,
                threshold=h,
                text=f"headroom {room:.0%} < {h:.0%}",
            )
        )
    return tuple(out)


class RecoveryPhase(StrEnum):
    """Where a RECOVERED region's recovery is, read from its ``RecoveryProgress``."""

    WARMING = "warming"  # steps before traffic pending (the recovery pre-warm)
    STEPPING = "stepping"  # one increment home per interval
    GUARDED = "guarded"  # the guard stepped the weight back; its signals still breach
    CALMING = "calming"  # the breach is over: one interval calm, then the next step


def phase_of(progress: RecoveryProgress) -> RecoveryPhase:
    if pending_recovery_steps(progress):
        return RecoveryPhase.WARMING
    if progress.guard_at is None:
        return RecoveryPhase.STEPPING
    return RecoveryPhase.GUARDED if progress.calm_since is None else RecoveryPhase.CALMING


P, M = RecoveryPhase, MoveKind
# The whole graph: (phase, move) -> the phase after it; anything else is a bug. A HOLD
# keeps the phase (a flag on the progress); COMPLETE ends recovery (None).
EDGES: Mapping[tuple[RecoveryPhase, MoveKind], RecoveryPhase | None] = {
    (P.WARMING, M.WAIT): P.WARMING,
    (P.WARMING, M.ABANDON): P.STEPPING,
    **{(ph, M.NONE): ph for ph in (P.STEPPING, P.GUARDED, P.CALMING)},
    **{(ph, M.HOLD): ph for ph in (P.STEPPING, P.GUARDED, P.CALMING)},
    **{(ph, M.GUARD): P.GUARDED for ph in (P.STEPPING, P.GUARDED, P.CALMING)},
    (P.GUARDED, M.CALM): P.CALMING,
    (P.CALMING, M.SPIKE): P.GUARDED,
    **{(ph, M.STEP): P.STEPPING for ph in (P.STEPPING, P.CALMING)},
    **{(ph, M.COMPLETE): None for ph in (P.STEPPING, P.CALMING)},
}


def next_recovery_move(
    progress: RecoveryProgress,
    cfg: RecoveryConfig,
    *,
    region: str,
    verdict: Health,
    signals: Mapping[str, float],
    capacity_rps: float,
    now: float,
    began_at: float,
    prewarm_budget_s: float,
) -> RecoveryMove:
    """One tick of a RECOVERED region's graduated recovery (see the module doc).
    ``began_at``: when the region entered RECOVERED."""
    phase = phase_of(progress)
    if phase is RecoveryPhase.WARMING:
        return _warming(progress, now - began_at, prewarm_budget_s)
    if verdict is not Health.HEALTHY:
        return _hold(progress, verdict)
    # Before the first step no user traffic is home: the guard has nothing to read.
    guarded = progress.step > 0 or phase is not RecoveryPhase.STEPPING
    breaches = guard_breaches(cfg, region, signals, capacity_rps) if guarded else ()
    if breaches:
        return _breach(progress, phase, breaches, cfg.step_interval_s, now)
    return _calm(progress, phase, cfg.step_interval_s, now)


def _warming(p: RecoveryProgress, waited: float, budget_s: float) -> RecoveryMove:
    if waited < budget_s + PREWARM_GRACE_S:
        return RecoveryMove(kind=MoveKind.WAIT, progress=p, reason="pre-warm pending")
    done = p.model_copy(
        update={
            "done": (*p.done, *pending_recovery_steps(p)),
            "prewarm_result": p.prewarm_result.model_copy(
                update={"abandoned": True, "waited_s": round(waited, 3)}
            ),
        }
    )
    return RecoveryMove(
        kind=MoveKind.ABANDON,
        progress=done,
        reason=f"no pre-warm result {waited:.0f}s after recovery began; going on without",
    )


def _hold(p: RecoveryProgress, verdict: Health) -> RecoveryMove:
    """Health not HEALTHY: the weights stay where they are (written once)."""
    if p.held:
        return RecoveryMove(kind=MoveKind.NONE, progress=p)
    return RecoveryMove(
        kind=MoveKind.HOLD,
        progress=p.model_copy(update={"held": True}),
        reason=f"health {verdict.value} during recovery",
    )


def _breach(
    p: RecoveryProgress,
    phase: RecoveryPhase,
    breaches: tuple[GuardBreach, ...],
    interval: float,
    now: float,
) -> RecoveryMove:
    """Step back one increment, at most once per interval; a breach within the interval
    of the last step back only restarts the calm."""
    why = "; ".join(b.text for b in breaches)
    if p.guard_at is None or now - p.guard_at >= interval:
        return _step_back(p, why, breaches, now)
    if phase is RecoveryPhase.CALMING:
        return RecoveryMove(
            kind=MoveKind.SPIKE,
            reason=f"recovery guard: {why} again",
            progress=p.model_copy(update={"calm_since": None}),
            breaches=breaches,
        )
    return RecoveryMove(kind=MoveKind.NONE, progress=p, breaches=breaches)


def _step_back(
    p: RecoveryProgress, why: str, breaches: tuple[GuardBreach, ...], now: float
) -> RecoveryMove:
    back = max(0, p.step - 1)
    new = p.model_copy(
        update={
            "step": back,
            "held": True,
            "guard_at": now,
            "calm_since": None,
            "last_step_at": now,
        }
    )
    if back == p.step:
        reason = f"recovery guard: {why}; paused at 0 % home (nothing left to step back)"
        return RecoveryMove(kind=MoveKind.GUARD, progress=new, reason=reason, breaches=breaches)
    reason = (
        f"recovery guard: {why}; stepped back to step {back}/{p.steps} "
        f"({back / p.steps:.0%} of new sessions home) and paused"
    )
    return RecoveryMove(
        kind=MoveKind.GUARD,
        progress=new,
        fraction_home=back / p.steps,
        reason=reason,
        breaches=breaches,
    )


def _calm(p: RecoveryProgress, phase: RecoveryPhase, interval: float, now: float) -> RecoveryMove:
    """No breach: the guard's calm starts or runs its interval; otherwise the next step
    once the interval since the last has passed."""
    if phase is RecoveryPhase.GUARDED:
        return RecoveryMove(
            kind=MoveKind.CALM,
            progress=p.model_copy(update={"calm_since": now}),
            reason="guard signals calm again",
        )
    if phase is RecoveryPhase.CALMING:
        assert p.calm_since is not None
        if now - p.calm_since < interval:
            return RecoveryMove(kind=MoveKind.NONE, progress=p)
        return _step(p, now, f"; resumed after {now - p.calm_since:.0f}s calm")
    if now - p.last_step_at < interval:
        return RecoveryMove(kind=MoveKind.NONE, progress=p)
    return _step(p, now, "")


def _step(p: RecoveryProgress, now: float, resumed: str) -> RecoveryMove:
    step = p.step + 1
    new = p.model_copy(
        update={
            "step": step,
            "last_step_at": now,
            "held": False,
            "guard_at": None,
            "calm_since": None,
        }
    )
    kind = MoveKind.COMPLETE if step >= p.steps else MoveKind.STEP
    reason = f"step {step}/{p.steps}: {step / p.steps:.0%} of new sessions home{resumed}"
    return RecoveryMove(
        kind=kind, progress=new, fraction_home=min(1.0, step / p.steps), reason=reason
    )
