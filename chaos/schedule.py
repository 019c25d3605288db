"""When drills run: ``chaos/schedule.yaml``, validated here, and the pure planning on it.

Each entry names a scenario (``chaos/scenarios/<name>.yaml``), an optional target
region, a cron expression in its time zone, the windows it may start in and the dates
it must not run on. An occurrence of the cron runs only if its local date is not
blocked, it starts inside an allowed window, and the scenario's ``abort.max_duration_s``
fits before that window closes; otherwise it is skipped, with the reason.

Everything here is pure: times are passed in (aware datetimes), nothing is read or
awaited, except ``load_schedule`` / ``known_scenarios`` and the CLI at the bottom:

    .venv/bin/python -m chaos.schedule check chaos/schedule.yaml
    .venv/bin/python -m chaos.schedule next chaos/schedule.yaml --count 10 [--json]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Annotated, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaos.scenario import NAME, SCENARIO_DIR, load_all
from controlplane.config import ConfigError, describe_errors, read_yaml

SCHEDULE_FILE = Path(__file__).with_name("schedule.yaml")
DEFAULT_CRON = "0 3 * * 2"  # weekly: Tuesdays 03:00
DEFAULT_MAX_DURATION_S = 300.0  # a scenario's abort.max_duration_s when it sets none
MAX_SCAN = 5000  # cron occurrences looked at per entry, so that `next` always ends
HORIZON = timedelta(days=400)  # and how far ahead: a year plus a freeze or two

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = get_args(Day)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "America", "a" * 300
        raise ValueError(
            f"unknown time zone {name!r} (an IANA name, e.g. UTC, Europe/Berlin)"
        ) from None


def _expand_days(value: object) -> object:
    """``tue-thu``, ``mon,wed`` or a list of names (each may be a range) → names."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value
    out: list[object] = []
    for item in items:
        if isinstance(item, str) and "-" in item:
            first, _, last = (p.strip().lower() for p in item.partition("-"))
            if first not in DAYS or last not in DAYS:
                raise ValueError(f"bad day range {item!r}: use names like tue-thu")
            i, j = DAYS.index(first), DAYS.index(last)
            if j < i:
                raise ValueError(f"day range {item!r} runs backwards: split it (e.g. sat-sun, mon)")
            out.extend(DAYS[i : j + 1])
        else:
            out.append(item.strip().lower() if isinstance(item, str) else item)
    return out


class Window(_Strict):
    """Days of the week and a local start/end time a drill may start in (and must end
    by). A window cannot cross midnight: split it into two."""

    days: tuple[Day, ...] = Field(min_length=1)
    start: time
    end: time

    _days = field_validator("days", mode="before")(_expand_days)

    @field_validator("start", "end", mode="before")
    @classmethod
    def _quoted(cls, v: object) -> object:
        # YAML reads an unquoted 14:30 as the base-60 number 870: never guess.
        if not isinstance(v, str | time):
            raise ValueError(f'write times in quotes as "HH:MM" (YAML read {v!r})')
        return v

    @model_validator(mode="after")
    def _order(self) -> Window:
        if self.end <= self.start:
            raise ValueError(
                f"window end {self.end:%H:%M} is not after its start {self.start:%H:%M} "
                "(a window cannot cross midnight: split it into two)"
            )
        return self

    def describe(self) -> str:
        return f"{','.join(self.days)} {self.start:%H:%M}-{self.end:%H:%M}"


class Blocked(_Strict):
    """Dates (inclusive, in the entry's time zone) no drill may run on: a holiday, a
    change freeze. In YAML: ``2026-12-25``, ``"2026-12-20..2027-01-04"`` or a mapping
    ``{start, end, reason}``."""

    start: date
    end: date
    reason: str = ""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: object) -> object:
        if isinstance(data, date):
            return {"start": data, "end": data}
        if isinstance(data, str):
            first, sep, last = data.partition("..")
            return {"start": first.strip(), "end": (last if sep else first).strip()}
        if isinstance(data, dict) and "start" in data and "end" not in data:
            return {**data, "end": data["start"]}
        return data

    @model_validator(mode="after")
    def _order(self) -> Blocked:
        if self.end < self.start:
            raise ValueError(f"blocked range ends ({self.end}) before it starts ({self.start})")
        return self

    def covers(self, day: date) -> bool:
        return self.start <= day <= self.end

    def describe(self) -> str:
        span = str(self.start) if self.start == self.end else f"{self.start}..{self.end}"
        return f"{span} ({self.reason})" if self.reason else span


class ScheduleEntry(_Strict):
    """One scheduled drill. ``timezone`` and ``windows`` default to the top level's;
    ``blocked`` adds to it."""

    name: Annotated[str, Field(pattern=NAME)] | None = Field(
        None, description="id of the entry; default: scenario[@region]"
    )
    scenario: Annotated[str, Field(pattern=NAME)]
    region: str | None = Field(None, min_length=1, description="default: the scenario's")
    cron: str = Field(DEFAULT_CRON, description="5 fields: minute hour day month weekday")
    timezone: str | None = None
    windows: tuple[Window, ...] | None = None
    blocked: tuple[Blocked, ...] = ()
    enabled: bool = True
    max_duration_s: float | None = Field(
        None, gt=0, le=86_400, description="default: the scenario's abort.max_duration_s"
    )

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        if len(v.split()) != 5:
            raise ValueError(
                f"cron {v!r} needs 5 fields: minute hour day-of-month month day-of-week"
            )
        try:
            CronSim(v, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as e:
            raise ValueError(f"bad cron expression {v!r}: {e}") from None
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str | None) -> str | None:
        if v is not None:
            _zone(v)
        return v

    @property
    def key(self) -> str:
        """How the service and the history tell entries apart."""
        if self.name:
            return self.name
        return f"{self.scenario}@{self.region}" if self.region else self.scenario


class Schedule(_Strict):
    timezone: str = "UTC"
    windows: tuple[Window, ...] = ()
    blocked: tuple[Blocked, ...] = ()
    entries: tuple[ScheduleEntry, ...] = ()

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        _zone(v)
        return v

    @model_validator(mode="after")
    def _entries(self) -> Schedule:
        seen: set[str] = set()
        for i, e in enumerate(self.entries):
            if e.key in seen:
                raise ValueError(f"entries[{i}]: entry {e.key!r} appears twice (give one a name)")
            seen.add(e.key)
            if not (e.windows if e.windows is not None else self.windows):
                raise ValueError(
                    f"entries[{i}] ({e.key}): no allowed window; set `windows` on the entry "
                    "or at the top level"
                )
        return self

    def entry(self, key: str) -> ScheduleEntry:
        for e in self.entries:
            if e.key == key:
                return e
        raise KeyError(key)


# ---- scenarios ---------------------------------------------------------------------


def bind_scenarios(schedule: Schedule, known: Mapping[str, float] | Iterable[str]) -> Schedule:
    """Check every entry's scenario against ``known`` (names, or names → their
    ``abort.max_duration_s``) and fill in ``max_duration_s``; ConfigError naming each
    bad entry."""
    durations = dict(known) if isinstance(known, Mapping) else dict.fromkeys(known)
    problems: list[str] = []
    entries: list[ScheduleEntry] = []
    for i, e in enumerate(schedule.entries):
        if e.scenario not in durations:
            names = ", ".join(sorted(durations)) or "none"
            problems.append(
                f"  entries[{i}].scenario: unknown scenario {e.scenario!r} (known: {names})"
            )
            continue
        bound = durations[e.scenario]
        if bound is not None and e.max_duration_s is not None and e.max_duration_s < bound:
            problems.append(
                f"  entries[{i}].max_duration_s: {e.max_duration_s:g} s is less than "
                f"{e.scenario}'s abort.max_duration_s ({bound:g} s), which the drill may take"
            )
        if e.max_duration_s is None and bound is not None:
            e = e.model_copy(update={"max_duration_s": bound})
        entries.append(e)
    if problems:
        raise ConfigError("schedule does not match the scenarios:\n" + "\n".join(problems))
    return schedule.model_copy(update={"entries": tuple(entries)})


# ---- planning (pure) ---------------------------------------------------------------


class PlannedRun(_Strict):
    entry: ScheduleEntry
    at: datetime  # aware, in the entry's time zone

    @property
    def at_utc(self) -> datetime:
        return self.at.astimezone(UTC)


class Skipped(_Strict):
    entry: ScheduleEntry
    at: datetime  # the cron occurrence that will not run, in the entry's time zone
    reason: str


class Upcoming(_Strict):
    runs: tuple[PlannedRun, ...] = ()
    skipped: tuple[Skipped, ...] = ()  # occurrences before the last run listed, and why
    disabled: tuple[str, ...] = ()  # keys of entries with enabled: false


class DueReport(_Strict):
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


# ---- loading (I/O) -----------------------------------------------------------------


def parse_schedule(data: object, source: str = "<schedule>") -> Schedule:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a schedule is a mapping (timezone, windows, entries)")
    try:
        return Schedule.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source} is not a valid schedule:\n{describe_errors(e)}") from None


def known_scenarios(directory: Path = SCENARIO_DIR) -> dict[str, float] | None:
    """Each scenario's name → its ``abort.max_duration_s``; None when there are no
    scenario files to check against."""
    if not directory.is_dir() or not any(directory.glob("*.yaml")):
        return None
    return {s.name: s.abort.max_duration_s for s in load_all(directory)}


def load_schedule(
    path: str | Path, known: Mapping[str, float] | Iterable[str] | None = None
) -> Schedule:
    """A validated schedule; with ``known``, bound to those scenarios (names checked,
    durations filled in)."""
    schedule = parse_schedule(read_yaml(path, "schedule"), str(path))
    if known is None:
        return schedule
    try:
        return bind_scenarios(schedule, known)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# ---- CLI ---------------------------------------------------------------------------


def _line(entry: ScheduleEntry, at: datetime) -> str:
    region = entry.region or "(scenario's region)"
    when = f"{at:%a %Y-%m-%d %H:%M %Z}"
    utc = at.astimezone(UTC)
    also = "" if at.utcoffset() == timedelta(0) else f" = {utc:%H:%M} UTC"
    return f"{when}{also}  {entry.key:<28} {entry.scenario} on {region}"


def _print_upcoming(up: Upcoming, now: datetime) -> None:
    print(f"next drills after {now:%Y-%m-%d %H:%M %Z}:")
    for r in up.runs:
        print(f"  {_line(r.entry, r.at)}")
    if not up.runs:
        print("  (none within the horizon: check the windows and blocked dates)")
    if up.skipped:
        print("skipped on the way:")
        for s in up.skipped:
            print(f"  {_line(s.entry, s.at)}\n      {s.reason}")
    for key in up.disabled:
        print(f"disabled: {key}")


def _json(up: Upcoming, now: datetime) -> str:
    def row(entry: ScheduleEntry, at: datetime) -> dict[str, str | None]:
        return {
            "entry": entry.key,
            "scenario": entry.scenario,
            "region": entry.region,
            "at": at.isoformat(),
            "at_utc": at.astimezone(UTC).isoformat(),
        }

    doc = {
        "now": now.isoformat(),
        "runs": [row(r.entry, r.at) for r in up.runs],
        "skipped": [{**row(s.entry, s.at), "reason": s.reason} for s in up.skipped],
        "disabled": list(up.disabled),
    }
    return json.dumps(doc, indent=2)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos.schedule",
        description="Check the drill schedule and show when drills will run.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("check", "validate the file (and its scenario names)"),
        ("next", "list the upcoming drills and the occurrences that will be skipped"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("file", type=Path, help="the schedule, e.g. chaos/schedule.yaml")
        c.add_argument(
            "--scenarios",
            type=Path,
            default=SCENARIO_DIR,
            help="scenario directory to check names against (default: %(default)s)",
        )
        if name == "next":
            c.add_argument("--count", type=int, default=10, help="drills to list (default 10)")
            c.add_argument("--json", action="store_true", help="print JSON instead of text")
            c.add_argument(
                "--now",
                type=datetime.fromisoformat,
                help="plan from this ISO time instead of now (naive = UTC)",
            )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        known = known_scenarios(args.scenarios)
        schedule = load_schedule(args.file, known)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    if args.command == "check":
        names = "names checked" if known is not None else f"names NOT checked: no {args.scenarios}"
        enabled = sum(e.enabled for e in schedule.entries)
        print(f"{args.file}: ok ({enabled}/{len(schedule.entries)} entries enabled; {names})")
        return 0
    now = args.now or datetime.now(UTC)
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    up = next_runs(schedule, now, args.count)
    if args.json:
        print(_json(up, now))
    else:
        _print_upcoming(up, now)
    return 0


if __name__ == "__main__":
    sys.exit(main())
