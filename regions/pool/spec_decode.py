"""Degradation ladder step 1 at the region agent: speculative decoding off. PURE.

The leader writes ``degradation/<region>`` (:class:`DegradationRecord`); its
``flags.speculative_decoding`` says whether the region's replicas should run with vLLM's
``--speculative-config``. That is a launch-time flag, so switching it means replacing
replicas: the warm pool runs two *variants* (:data:`SPEC_DECODE`, the default, and
:data:`NO_SPEC_DECODE`) and rolls from one to the other, one replica at a time, never
with fewer ACTIVE replicas than its target (the roll itself is the pool planner's:
:func:`regions.pool.planner.plan`).

This module decides which variant is wanted (:func:`wanted_variant`), measures how far
a roll has got from what runs (:func:`roll_progress`, so an agent restart picks up
where the replicas are, not where it was) and words the story the agent logs
(:func:`switch_line`, :func:`progress_line`). The I/O - watching etcd and steering the
pool - is :mod:`regions.agent.spec_decode_actuator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import Frozen
from regions.pool.states import PoolTarget, Replica, ReplicaState, is_stale

SPEC_DECODE: Final = "spec-decode"  # launched with --speculative-config
NO_SPEC_DECODE: Final = "no-spec-decode"  # the same replica without it
ACTIVE, COLD = ReplicaState.ACTIVE, ReplicaState.COLD


def wanted_variant(record: DegradationRecord | None) -> str:
    """The variant the region should run: with speculative decoding unless its ladder
    has switched it off (no record: nothing is degraded)."""
    if record is None or record.flags.speculative_decoding:
        return SPEC_DECODE
    return NO_SPEC_DECODE


class RollProgress(Frozen):
    """How far the pool is from running only the wanted variant, read from its
    replicas. ``done`` once no replica of another variant is up."""

    wanted: str
    target: int  # ACTIVE replicas the pool keeps
    active_wanted: int  # ACTIVE and of the wanted variant
    active_other: int  # ACTIVE and of the other one: still to be replaced
    retiring: int  # of the other variant, drained or asleep, on their way out
    launching: int  # of the wanted variant, being launched

    @property
    def done(self) -> bool:
        return self.active_other == 0 and self.retiring == 0

    @property
    def active(self) -> int:
        return self.active_wanted + self.active_other


def roll_progress(replicas: Sequence[Replica], target: PoolTarget) -> RollProgress:
    """Count what runs against ``target`` (whose ``variant`` must be set)."""
    if target.variant is None:
        raise ValueError("a roll needs a target variant")
    stale = [r for r in replicas if is_stale(r, target)]
    return RollProgress(
        wanted=target.variant,
        target=target.active,
        active_wanted=sum(r.state is ACTIVE and r not in stale for r in replicas),
        active_other=sum(r.state is ACTIVE for r in stale),
        retiring=sum(r.state is not ACTIVE for r in stale),
        launching=sum(r.busy and r.state is COLD and r not in stale for r in replicas),
    )


def active_with_spec_decode(replicas: Sequence[Replica]) -> int:
    """ACTIVE replicas launched with ``--speculative-config``."""
    return sum(r.state is ACTIVE and r.variant == SPEC_DECODE for r in replicas)


def switch_line(
    region: str, record: DegradationRecord | None, old: str | None, new: str, progress: RollProgress
) -> str:
    """The first line of the story: what the ladder asked and what the pool will do."""
    why = (
        "no degradation record: every feature on"
        if record is None
        else f"degradation/{region} epoch {record.epoch}, steps "
        f"[{', '.join(record.applied) or 'none'}]" + (f": {record.reason}" if record.reason else "")
    )
    onoff = "ON" if new == SPEC_DECODE else "OFF"
    if progress.done:
        return (
            f"{region}: speculative decoding {onoff} ({why}); nothing to roll: "
            f"replicas run, or will be launched as, {new}"
        )
    return (
        f"{region}: speculative decoding {onoff} ({why}): rolling {progress.active_other} "
        f"ACTIVE replica(s) from {old or 'the other variant'} to {new} through the warm "
        f"pool, one at a time, never below {max(progress.target, 1)} ACTIVE"
    )


def progress_line(
    region: str, before: RollProgress | None, now: RollProgress, elapsed_s: float
) -> str | None:
    """A line when the roll moved since ``before`` (None: nothing new to tell)."""
    if before is not None and before == now:
        return None
    if before is not None and before.done and now.done:
        return None  # a settled pool's ACTIVE count moving is the pool's story, not ours
    if now.done:
        return (
            f"{region}: roll to {now.wanted} done after {elapsed_s:.1f} s: "
            f"{now.active_wanted} ACTIVE on {now.wanted}, none of the other variant left"
        )
    return (
        f"{region}: roll to {now.wanted}: {now.active_wanted}/{max(now.target, 1)} ACTIVE "
        f"on it, {now.active_other} ACTIVE still on the other variant, {now.retiring} "
        f"retiring, {now.launching} launching ({elapsed_s:.1f} s)"
    )
