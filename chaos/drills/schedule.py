"""When drills run: ``chaos/schedule.yaml``, the rules it is planned by, and its CLI.

Each entry names a scenario (``chaos/scenarios/<name>.yaml``), an optional target
region, a cron expression in its time zone, the windows it may start in and the dates
it must not run on. An occurrence of the cron runs only if its local date is not
blocked, it starts inside an allowed window, and the scenario's ``abort.max_duration_s``
fits before that window closes; otherwise it is skipped, with the reason.

The model and its loading are in ``chaos/drills/schedule_model.py``, the pure planning in
``chaos/drills/schedule_planning.py``; both are importable from here. This module is their
command line, which reads files and the clock:

    .venv/bin/python -m chaos.drills.schedule check chaos/schedule.yaml
    .venv/bin/python -m chaos.drills.schedule next chaos/schedule.yaml --count 10 [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chaos.drills.scenario import SCENARIO_DIR
from chaos.drills.schedule_model import (
    DAYS,
    DEFAULT_CRON,
    DEFAULT_MAX_DURATION_S,
    SCHEDULE_FILE,
    Blocked,
    Day,
    Schedule,
    ScheduleEntry,
    Window,
    bind_scenarios,
    known_scenarios,
    load_schedule,
    parse_schedule,
)
from chaos.drills.schedule_planning import (
    HORIZON,
    MAX_SCAN,
    DueReport,
    PlannedRun,
    Skipped,
    Upcoming,
    check_due,
    due,
    next_runs,
)
from controlplane.kernel.config import ConfigError

__all__ = [
    "DAYS",
    "DEFAULT_CRON",
    "DEFAULT_MAX_DURATION_S",
    "HORIZON",
    "MAX_SCAN",
    "SCHEDULE_FILE",
    "Blocked",
    "Day",
    "DueReport",
    "PlannedRun",
    "Schedule",
    "ScheduleEntry",
    "Skipped",
    "Upcoming",
    "Window",
    "bind_scenarios",
    "check_due",
    "due",
    "known_scenarios",
    "load_schedule",
    "main",
    "next_runs",
    "parse_schedule",
]


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
        prog="python -m chaos.drills.schedule",
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
