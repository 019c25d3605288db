"""Walks the degradation ladder: one decision per tick, pure (docs/architecture.md §5, §7.1).

``next_ladder_action`` reads the region's ``DegradationRecord``, its signals and the
mode, and returns at most one change with the new record for ``degradation/<region>``.
The rules, in the order they are checked:

Degrading (DEGRADED, or a failover target short of headroom):
  * the next step is the first ladder step not applied; it is applied only when ITS
    trigger fires. A later step whose trigger fires does not pull it forward and is
    never applied ahead of it: the ladder holds and says so (keep triggers monotonic,
    each step's thresholds looser than the next's, so that pressure walks it in order);
  * at most one change per ``degrade.step_interval_s``.
Recovering (NORMAL or RECOVERED with steps applied):
  * guard: while a step is applied, or within one interval of the last restore, a guard
    condition (first-token p99 or error spike) pauses recovery and re-applies the last
    restored step, once; recovery stays paused while the guard holds;
  * the last applied step is restored first, one per ``recovery.step_interval_s``,
    and not while its own trigger still fires.
Frozen (the region itself is failing over: its traffic is elsewhere): no change.

A record naming steps the file lacks (the file changed while degraded) is held as it
is: features stay degraded, which is safe, and the reason tells the operator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from controlplane.kernel.ladder.model import Ladder, flags_for
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import Frozen, LadderChange, RegionState


class LadderMode(StrEnum):
    DEGRADING = "degrading"
    RECOVERING = "recovering"
    FROZEN = "frozen"


class ActionKind(StrEnum):
    APPLY = "apply"
    RESTORE = "restore"
    REAPPLY = "reapply"  # the guard put back the last restored step
    HOLD = "hold"  # something wants a change that the rules do not allow now
    NONE = "none"  # nothing to do


class LadderAction(Frozen):
    kind: ActionKind
    step: str | None = None
    reason: str
    record: DegradationRecord  # the new value of degradation/<region>; unchanged unless changed

    @property
    def changed(self) -> bool:
        return self.kind in (ActionKind.APPLY, ActionKind.RESTORE, ActionKind.REAPPLY)

    @property
    def change(self) -> LadderChange | None:
        """The move to write and audit; None for a hold or nothing to do."""
        return LadderChange(self.kind.value) if self.changed else None


def mode_for(state: RegionState, *, short_of_headroom: bool = False) -> LadderMode:
    """Which way the ladder moves for a region in ``state``; ``short_of_headroom``: the
    region is a failover target whose headroom cannot absorb what it was given."""
    if state is RegionState.FAILING_OVER:
        return LadderMode.FROZEN
    if state is RegionState.DEGRADED or short_of_headroom:
        return LadderMode.DEGRADING
    return LadderMode.RECOVERING


def next_ladder_action(
    ladder: Ladder,
    record: DegradationRecord,
    signals: Mapping[str, float],
    mode: LadderMode,
    now: float,
    *,
    baseline_ttft_p99_s: float | None = None,
) -> LadderAction:
    """One tick of the ladder for one region. ``signals`` should carry
    ``headroom_fraction`` (``ladder.with_headroom``) for headroom conditions to count."""
    baseline = baseline_ttft_p99_s or ladder.baseline.for_region(record.region)
    unknown = [n for n in record.applied if n not in ladder.names]
    if unknown:
        return _hold(
            record,
            f"applied steps {unknown} are not in the ladder file (changed while degraded?); "
            "holding the flags as they are: put the steps back or clear the record",
        )
    if mode is LadderMode.FROZEN:
        return _none(record, "region is failing over: the ladder is frozen")
    if mode is LadderMode.DEGRADING:
        return _degrade(ladder, record, signals, now, baseline)
    return _recover(ladder, record, signals, now, baseline)


def _degrade(
    ladder: Ladder, record: DegradationRecord, signals: Mapping[str, float], now: float, base: float
) -> LadderAction:
    pending = [s for s in ladder.steps if s.name not in record.applied]
    if not pending:
        return _none(record, f"all {len(ladder.steps)} ladder steps applied")
    nxt = pending[0]
    fired = nxt.trigger.holding(signals, base)
    if not fired:
        for later in pending[1:]:
            if why := later.trigger.holding(signals, base):
                return _hold(
                    record,
                    f"step {later.name!r} would fire ({'; '.join(why)}) but the next step "
                    f"{nxt.name!r} does not: the ladder never skips ahead",
                )
        return _none(record, f"next step {nxt.name!r}: its trigger does not fire")
    wait = _wait(record, now, ladder.degrade.step_interval_s)
    if wait > 0:
        return _hold(record, f"step {nxt.name!r} fires ({'; '.join(fired)}); due in {wait:g}s")
    applied = (*record.applied, nxt.name)
    reason = f"applied {nxt.name}: {'; '.join(fired)}"
    return _change(ladder, record, ActionKind.APPLY, nxt.name, applied, (), now, reason)


def _recover(
    ladder: Ladder, record: DegradationRecord, signals: Mapping[str, float], now: float, base: float
) -> LadderAction:
    interval = ladder.recovery.step_interval_s
    guarding = bool(record.applied) or (bool(record.restored) and now - record.since < interval)
    if guarding and (spike := ladder.recovery.guard.holding(signals, base)):
        last = record.restored[-1] if record.restored else None
        if last is not None and last in ladder.names and last not in record.applied:
            # Put back what was just restored, in ladder order so that the applied
            # steps stay a prefix of the file; then stay paused while the guard holds.
            applied = tuple(n for n in ladder.names if n in record.applied or n == last)
            reason = f"recovery guard: {'; '.join(spike)}; re-applied {last}"
            return _change(ladder, record, ActionKind.REAPPLY, last, applied, (), now, reason)
        return _hold(record, f"recovery paused by the guard: {'; '.join(spike)}")
    if not record.applied:
        return _none(record, "nothing to restore")
    last = record.applied[-1]
    if why := ladder.step(last).trigger.holding(signals, base):
        return _hold(record, f"not restoring {last!r}: its trigger still fires ({'; '.join(why)})")
    wait = _wait(record, now, interval)
    if wait > 0:
        return _hold(record, f"restore of {last!r} due in {wait:g}s")
    restored = (*record.restored, last)
    reason = f"restored {last}"
    return _change(
        ladder, record, ActionKind.RESTORE, last, record.applied[:-1], restored, now, reason
    )


def _wait(record: DegradationRecord, now: float, interval: float) -> float:
    """Seconds until the next change is allowed; the first change ever waits for nothing."""
    if record.epoch == 0:
        return 0.0
    return max(0.0, record.since + interval - now)


def _change(
    ladder: Ladder,
    record: DegradationRecord,
    kind: ActionKind,
    step: str,
    applied: tuple[str, ...],
    restored: tuple[str, ...],
    now: float,
    reason: str,
) -> LadderAction:
    new = record.model_copy(
        update={
            "applied": applied,
            "restored": restored,
            "flags": flags_for(ladder, applied),
            "since": now,
            "reason": reason,
            "epoch": record.epoch + 1,
        }
    )
    return LadderAction(kind=kind, step=step, reason=reason, record=new)


def _hold(record: DegradationRecord, reason: str) -> LadderAction:
    return LadderAction(kind=ActionKind.HOLD, reason=reason, record=record)


def _none(record: DegradationRecord, reason: str) -> LadderAction:
    return LadderAction(kind=ActionKind.NONE, reason=reason, record=record)


class Tick(Frozen):
    """One scripted moment of a region: what the executor sees at ``at``."""

    at: float
    mode: LadderMode
    signals: dict[str, float]


def replay(ladder: Ladder, region: str, ticks: Iterable[Tick]) -> list[LadderAction]:
    """Drive the executor over a script of ticks, feeding each new record to the next
    tick, as the leader does through etcd. Returns every action, changes and holds."""
    record = DegradationRecord(region=region)
    out = []
    for t in ticks:
        action = next_ladder_action(ladder, record, t.signals, t.mode, t.at)
        record = action.record
        out.append(action)
    return out
