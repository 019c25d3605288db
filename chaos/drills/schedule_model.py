"""The drill schedule's model: ``chaos/schedule.yaml`` as validated pydantic models
(entries, windows, blocked dates), its loading, and its binding to the scenarios.

The fields' reference is the comments in chaos/schedule.yaml, the rules an occurrence
must pass to run are in chaos/drills/schedule.py; the planning is in
chaos/drills/schedule_planning.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Annotated, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import Field, ValidationError, field_validator, model_validator

from chaos.drills.scenario import NAME, SCENARIO_DIR, load_all
from controlplane.kernel.config import ConfigError, describe_errors, read_yaml
from controlplane.kernel.drills import CAPACITY_PROBE, CAPACITY_PROBE_MAX_S
from controlplane.kernel.model import Frozen

SCHEDULE_FILE = Path(__file__).resolve().parents[1] / "schedule.yaml"
DEFAULT_CRON = "0 3 * * 2"  # weekly: Tuesdays 03:00
DEFAULT_MAX_DURATION_S = 300.0  # a scenario's abort.max_duration_s when it sets none

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = get_args(Day)


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


class Window(Frozen):
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


class Blocked(Frozen):
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


class ScheduleEntry(Frozen):
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


class Schedule(Frozen):
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
    """Each scenario's name → its ``abort.max_duration_s``, and the capacity probe's;
    None when there are no scenario files to check against."""
    if not directory.is_dir() or not any(directory.glob("*.yaml")):
        return None
    known = {s.name: s.abort.max_duration_s for s in load_all(directory)}
    return {**known, CAPACITY_PROBE: CAPACITY_PROBE_MAX_S}  # the service's own


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
