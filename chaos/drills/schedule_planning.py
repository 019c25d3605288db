"""The drill schedule's planning, pure: times are passed in (aware datetimes), nothing
is read or awaited. ``next_runs`` lists the drills to come and the occurrences skipped
on the way; ``check_due`` says which are due now (missed ones collapsed into one).
The rules are in chaos/drills/schedule.py's docstring.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim

from chaos.drills.schedule_model import (
    DAYS,
    DEFAULT_MAX_DURATION_S,
    Blocked,
    Schedule,
    ScheduleEntry,
    Window,
    _zone,
)
from controlplane.kernel.model import Frozen

MAX_SCAN = 5000  # cron occurrences looked at per entry, so that `next` always ends
HORIZON = timedelta(days=400)  # and how far ahead: a year plus a freeze or two


class PlannedRun(Frozen):
    entry: ScheduleEntry
    at: datetime  # aware, in the entry's time zone

    @property
    def at_utc(self) -> datetime:
        return self.at.astimezone(UTC)


class Skipped(Frozen):
    entry: ScheduleEntry
    at: datetime  # the cron occurrence that will not run, in the entry's time zone
    reason: str


class Upcoming(Frozen):
    runs: tuple[PlannedRun, ...] = ()
    skipped: tuple[Skipped, ...] = ()  # occurrences before the last run listed, and why
    disabled: tuple[str, ...] = ()  # keys of entries with enabled: false


class DueReport(Frozen):
    runs: tuple[PlannedRun, ...] = ()  # due now, oldest occurrence first
    skipped: tuple[Skipped, ...] = ()  # latest occurrences that will not run, and why


@dataclass(frozen=True)
class _Plan:
    """An entry with the top level's defaults resolved."""

    entry: ScheduleEntry
    tz: ZoneInfo
    windows: tuple[Window, ...]
    blocked: tuple[Blocked, ...]
    duration: timedelta


def _plans(schedule: Schedule) -> list[_Plan]:
    out = []
    for e in schedule.entries:
        if not e.enabled:
            continue
        out.append(
            _Plan(
                entry=e,
                tz=_zone(e.timezone or schedule.timezone),
                windows=e.windows if e.windows is not None else schedule.windows,
                blocked=schedule.blocked + e.blocked,
                duration=timedelta(seconds=e.max_duration_s or DEFAULT_MAX_DURATION_S),
            )
        )
    return out


def _aware(now: datetime) -> datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"`now` must be timezone-aware, got {now!r}")
    return now


def _fmt_duration(d: timedelta) -> str:
    s = int(d.total_seconds())
    return f"{s // 60} min" if s % 60 == 0 and s >= 60 else f"{s} s"


def _blocked_reason(plan: _Plan, at: datetime) -> str | None:
    for b in plan.blocked:
        if b.covers(at.date()):
            return f"blocked date: {at.date()} is in {b.describe()}"
    return None


def _window_end(plan: _Plan, at: datetime) -> tuple[datetime | None, str]:
    """The end (UTC) of the latest-closing window that ``at`` starts in, if a drill
    started at ``at`` fits in it; else None and why. Compared in UTC so that a DST
    change inside the window counts as the real hour it adds or takes."""
    at_utc = at.astimezone(UTC)
    ends = []
    for w in plan.windows:
        if DAYS[at.weekday()] not in w.days:
            continue
        start = datetime.combine(at.date(), w.start, tzinfo=plan.tz).astimezone(UTC)
        end = datetime.combine(at.date(), w.end, tzinfo=plan.tz).astimezone(UTC)
        if start <= at_utc < end:
            ends.append(end)
    if not ends:
        allowed = "; ".join(w.describe() for w in plan.windows)
        return None, f"outside the allowed windows ({allowed} {plan.tz.key})"
    end = max(ends)
    if at_utc + plan.duration > end:
        local_end = end.astimezone(plan.tz)
        return None, (
            f"does not fit: the drill may take {_fmt_duration(plan.duration)}, the window "
            f"closes at {local_end:%H:%M %Z}"
        )
    return end, ""


def _verdict(plan: _Plan, at: datetime) -> str:
    """Why the occurrence ``at`` may not run; "" when it may."""
    blocked = _blocked_reason(plan, at)
    if blocked:
        return blocked
    _, why = _window_end(plan, at)
    return why


def _occurrences(plan: _Plan, after: datetime) -> Iterator[tuple[datetime, _Plan]]:
    """The cron's occurrences strictly after ``after``, local, up to the horizon."""
    horizon = after + HORIZON
    it = CronSim(plan.entry.cron, after.astimezone(plan.tz))
    for at in itertools.islice(it, MAX_SCAN):
        if at > horizon:
            return
        yield at, plan


def next_runs(schedule: Schedule, now: datetime, count: int = 10) -> Upcoming:
    """The next ``count`` drills to run after ``now``, in time order, with the
    occurrences skipped on the way (blocked date, outside a window, does not fit)."""
    now = _aware(now)
    streams = [_occurrences(p, now) for p in _plans(schedule)]
    # Merge by UTC instant: entries may be in different zones.
    merged = _merge(streams)
    runs: list[PlannedRun] = []
    skipped: list[Skipped] = []
    for at, plan in merged:
        if len(runs) >= count:
            break
        why = _verdict(plan, at)
        if why:
            skipped.append(Skipped(entry=plan.entry, at=at, reason=why))
        else:
            runs.append(PlannedRun(entry=plan.entry, at=at))
    disabled = tuple(e.key for e in schedule.entries if not e.enabled)
    return Upcoming(runs=tuple(runs), skipped=tuple(skipped), disabled=disabled)


def _merge(
    streams: Sequence[Iterator[tuple[datetime, _Plan]]],
) -> Iterator[tuple[datetime, _Plan]]:
    return heapq.merge(*streams, key=lambda item: item[0].astimezone(UTC))


def _latest(plan: _Plan, now: datetime) -> datetime | None:
    """The cron's latest occurrence at or before ``now`` (cron has 1 s resolution)."""
    start = now.astimezone(plan.tz).replace(microsecond=0) + timedelta(seconds=1)
    return next(CronSim(plan.entry.cron, start, reverse=True), None)


def _too_late(plan: _Plan, occ: datetime, now: datetime) -> str:
    """Why a drill for ``occ`` may not start at ``now``: the occurrence was outside a
    window, or that window no longer has room for the drill; "" when it may."""
    end, why = _window_end(plan, occ)
    if end is None:
        return why
    if now.astimezone(UTC) + plan.duration > end:
        closes = end.astimezone(plan.tz)
        return (
            f"missed: too late to start a drill of up to {_fmt_duration(plan.duration)}; "
            f"the window closes at {closes:%Y-%m-%d %H:%M %Z}"
        )
    return ""


def check_due(
    schedule: Schedule, last_run_by_entry: Mapping[str, datetime | None], now: datetime
) -> DueReport:
    """Entries due at ``now``: the latest occurrence of each entry's cron that has not
    run yet (``last_run_by_entry[key]`` is when the last scheduled run of the entry
    started). Occurrences missed while nobody was serving collapse into that latest one,
    so they run at most once, and only if a drill started now still fits in the window
    that occurrence started in."""
    now = _aware(now)
    runs: list[PlannedRun] = []
    skipped: list[Skipped] = []
    for plan in _plans(schedule):
        occ = _latest(plan, now)
        last = last_run_by_entry.get(plan.entry.key)
        if occ is None or (last is not None and last >= occ):
            continue
        why = _blocked_reason(plan, occ) or _too_late(plan, occ, now)
        if why:
            skipped.append(Skipped(entry=plan.entry, at=occ, reason=why))
        else:
            runs.append(PlannedRun(entry=plan.entry, at=occ))
    runs.sort(key=lambda r: r.at_utc)
    return DueReport(runs=tuple(runs), skipped=tuple(skipped))


def due(
    schedule: Schedule, last_run_by_entry: Mapping[str, datetime | None], now: datetime
) -> tuple[PlannedRun, ...]:
    """The runs due at ``now`` (see ``check_due`` for the rules and the reasons)."""
    return check_due(schedule, last_run_by_entry, now).runs
