"""The drill schedule (chaos/drills/schedule.py): pure planning at fixed times, validation
messages, and the shipped chaos/schedule.yaml."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from chaos.drills.scenario import SCENARIO_DIR, load_all
from chaos.drills.schedule import (
    DEFAULT_CRON,
    SCHEDULE_FILE,
    Schedule,
    bind_scenarios,
    check_due,
    due,
    load_schedule,
    main,
    next_runs,
    parse_schedule,
)
from controlplane.kernel.config import ConfigError

SHIPPED_NAMES = [
    "region-blackout",
    "auth-503-storm",
    "latency-injection",
    "partial-replica-loss",
    "leader-kill-mid-failover",
    "etcd-member-loss",
    "flapping-region",
]
TUE_WINDOW = {"days": ["tue"], "start": "02:00", "end": "05:00"}
BERLIN = ZoneInfo("Europe/Berlin")


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=UTC)


def schedule(*entries: dict[str, Any], **top: Any) -> Schedule:
    return parse_schedule({"windows": [TUE_WINDOW], **top, "entries": list(entries)})


def entry(**fields: Any) -> dict[str, Any]:
    return {"scenario": "region-blackout", **fields}


# ---- cron and windows --------------------------------------------------------------


def test_default_cron_is_weekly_tuesday_0300_utc() -> None:
    s = schedule(entry())
    assert s.entries[0].cron == DEFAULT_CRON
    up = next_runs(s, utc(2026, 3, 2, 0, 0), 3)  # a Monday
    assert [r.at for r in up.runs] == [utc(2026, 3, 3, 3), utc(2026, 3, 10, 3), utc(2026, 3, 17, 3)]
    assert up.skipped == ()


def test_next_runs_starts_strictly_after_now() -> None:
    up = next_runs(schedule(entry()), utc(2026, 3, 3, 3, 0), 1)
    assert up.runs[0].at == utc(2026, 3, 10, 3)


def test_occurrence_outside_the_window_is_skipped() -> None:
    s = schedule(entry(cron="0 3 * * 1,2"))  # Mon and Tue; only Tue is a window
    up = next_runs(s, utc(2026, 3, 1), 2)
    assert [r.at for r in up.runs] == [utc(2026, 3, 3, 3), utc(2026, 3, 10, 3)]
    assert [x.at for x in up.skipped] == [utc(2026, 3, 2, 3), utc(2026, 3, 9, 3)]
    assert "outside the allowed windows (tue 02:00-05:00 UTC)" in up.skipped[0].reason


def test_occurrence_before_the_window_opens_is_skipped() -> None:
    up = next_runs(schedule(entry(cron="30 1 * * 2")), utc(2026, 3, 1), 1)
    assert up.runs == ()  # never inside: the horizon ends the search
    assert up.skipped and all("outside" in x.reason for x in up.skipped)


def test_drill_must_fit_before_the_window_ends() -> None:
    s = schedule(
        entry(name="fits", cron="0 4 * * 2", max_duration_s=3600),  # ends 05:00 exactly
        entry(name="too-long", cron="1 4 * * 2", max_duration_s=3600),  # would end 05:01
    )
    up = next_runs(s, utc(2026, 3, 2), 2)
    assert [(r.entry.key, r.at) for r in up.runs] == [
        ("fits", utc(2026, 3, 3, 4)),
        ("fits", utc(2026, 3, 10, 4)),
    ]
    skip = up.skipped[0]
    assert (skip.entry.key, skip.at) == ("too-long", utc(2026, 3, 3, 4, 1))
    assert "does not fit: the drill may take 60 min, the window closes at 05:00 UTC" in skip.reason


def test_scenario_max_duration_decides_the_fit() -> None:
    s = schedule(entry(cron="0 4 * * 2"))
    assert next_runs(bind_scenarios(s, {"region-blackout": 3600.0}), utc(2026, 3, 2), 1).runs
    longer = bind_scenarios(s, {"region-blackout": 3601.0})
    assert longer.entries[0].max_duration_s == 3601.0
    up = next_runs(longer, utc(2026, 3, 2), 1)
    assert up.runs == () or up.runs[0].at > utc(2026, 3, 3, 4)
    assert up.skipped[0].at == utc(2026, 3, 3, 4)


def test_entry_windows_override_the_top_level() -> None:
    s = schedule(
        entry(cron="0 3 * * 3", windows=[{"days": "wed", "start": "03:00", "end": "04:00"}])
    )
    assert next_runs(s, utc(2026, 3, 2), 1).runs[0].at == utc(2026, 3, 4, 3)


def test_day_ranges_and_lists() -> None:
    s = parse_schedule(
        {
            "windows": [{"days": "mon-wed,fri", "start": "00:00", "end": "23:00"}],
            "entries": [entry()],
        }
    )
    assert s.windows[0].days == ("mon", "tue", "wed", "fri")


def test_disabled_entries_do_not_run_and_are_listed() -> None:
    s = schedule(entry(), entry(scenario="auth-503-storm", enabled=False))
    up = next_runs(s, utc(2026, 3, 2), 2)
    assert {r.entry.scenario for r in up.runs} == {"region-blackout"}
    assert up.disabled == ("auth-503-storm",)
    assert due(s, {}, utc(2026, 3, 3, 3)) == due(s, {"auth-503-storm": None}, utc(2026, 3, 3, 3))


def test_runs_of_several_entries_come_in_time_order() -> None:
    s = schedule(
        entry(cron="0 4 * * 2"),
        entry(scenario="auth-503-storm", cron="0 3 * * 2", timezone="Europe/Berlin"),
    )
    up = next_runs(s, utc(2026, 3, 2), 2)
    # 03:00 in Berlin is 02:00 UTC: before the 04:00 UTC one.
    assert [r.entry.scenario for r in up.runs] == ["auth-503-storm", "region-blackout"]
    assert up.runs[0].at_utc == utc(2026, 3, 3, 2)


# ---- blocked dates -----------------------------------------------------------------


def test_blocked_date_and_range_skip_occurrences() -> None:
    s = schedule(
        entry(blocked=["2026-03-10"]),
        blocked=[{"start": date(2026, 3, 17), "end": date(2026, 3, 25), "reason": "freeze"}],
    )
    up = next_runs(s, utc(2026, 3, 2), 2)
    assert [r.at for r in up.runs] == [utc(2026, 3, 3, 3), utc(2026, 3, 31, 3)]
    assert [x.reason for x in up.skipped] == [
        "blocked date: 2026-03-10 is in 2026-03-10",
        "blocked date: 2026-03-17 is in 2026-03-17..2026-03-25 (freeze)",
        "blocked date: 2026-03-24 is in 2026-03-17..2026-03-25 (freeze)",
    ]


def test_blocked_range_shorthand_crosses_the_year() -> None:
    s = schedule(entry(), blocked=["2026-12-20..2027-01-04"])
    up = next_runs(s, utc(2026, 12, 14), 2)
    assert [r.at for r in up.runs] == [utc(2026, 12, 15, 3), utc(2027, 1, 5, 3)]
    assert len(up.skipped) == 2  # Dec 22 and Dec 29


def test_blocked_dates_are_local_dates() -> None:
    # 00:30 Berlin on Mar 4 is Mar 3 in UTC; the Berlin date is what is blocked.
    s = schedule(
        entry(
            cron="30 0 * * 3",
            timezone="Europe/Berlin",
            windows=[{"days": "wed", "start": "00:00", "end": "02:00"}],
            blocked=["2026-03-04"],
        )
    )
    up = next_runs(s, utc(2026, 3, 1), 1)
    assert up.skipped[0].at == datetime(2026, 3, 4, 0, 30, tzinfo=BERLIN)
    assert up.runs[0].at == datetime(2026, 3, 11, 0, 30, tzinfo=BERLIN)


# ---- time zones and DST ------------------------------------------------------------


def test_local_time_stays_put_across_dst() -> None:
    s = schedule(
        entry(
            cron="0 3 * * 0",  # Sundays 03:00 Berlin; DST starts Sun 2026-03-29
            timezone="Europe/Berlin",
            windows=[{"days": "sun", "start": "02:00", "end": "05:00"}],
        )
    )
    runs = next_runs(s, utc(2026, 3, 20), 3).runs
    assert [r.at_utc for r in runs] == [
        utc(2026, 3, 22, 2),
        utc(2026, 3, 29, 1),
        utc(2026, 4, 5, 1),
    ]
    assert all(r.at.hour == 3 and r.at.tzinfo == BERLIN for r in runs)


def test_occurrence_in_the_spring_forward_gap_runs_after_it() -> None:
    # 02:30 does not exist on 2026-03-29 in Berlin: like Debian cron, it runs at 03:00.
    s = schedule(
        entry(
            cron="30 2 * * 0",
            timezone="Europe/Berlin",
            windows=[{"days": "sun", "start": "02:00", "end": "05:00"}],
        )
    )
    (run,) = next_runs(s, utc(2026, 3, 28), 1).runs
    assert run.at_utc == utc(2026, 3, 29, 1)
    assert (run.at.hour, run.at.minute) == (3, 0)


def test_window_shortened_by_dst_counts_real_time() -> None:
    # Window 01:30-03:30 local is 2 h, but only 1 h on the night clocks skip 02:00-03:00.
    s = schedule(
        entry(
            cron="30 1 * * 0",
            timezone="Europe/Berlin",
            max_duration_s=5400,
            windows=[{"days": "sun", "start": "01:30", "end": "03:30"}],
        )
    )
    up = next_runs(s, utc(2026, 3, 20), 2)
    assert [r.at.date() for r in up.runs] == [date(2026, 3, 22), date(2026, 4, 5)]
    (skip,) = up.skipped
    assert skip.at.date() == date(2026, 3, 29)
    assert "does not fit" in skip.reason and "03:30 CEST" in skip.reason


def test_now_must_be_timezone_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_runs(schedule(entry()), datetime(2026, 3, 2), 1)


# ---- due: what runs now, and missed occurrences -----------------------------------


def test_due_at_the_occurrence_and_not_again_after_it_ran() -> None:
    s = schedule(entry())
    now = utc(2026, 3, 3, 3, 0)
    (run,) = due(s, {}, now)
    assert (run.entry.key, run.at) == ("region-blackout", now)
    assert due(s, {"region-blackout": now + timedelta(seconds=2)}, now + timedelta(minutes=5)) == ()


def test_not_due_before_the_occurrence() -> None:
    s = schedule(entry())
    last = utc(2026, 2, 24, 3, 0, 5)
    assert due(s, {"region-blackout": last}, utc(2026, 3, 3, 2, 59, 59)) == ()


def test_missed_occurrences_run_once_while_the_window_is_open() -> None:
    s = schedule(entry(cron="0 2,3 * * 2"))  # two occurrences that night
    last = utc(2026, 2, 24, 3, 0, 1)  # last week's
    now = utc(2026, 3, 3, 3, 40)  # the service was down over both
    (run,) = due(s, {s.entries[0].key: last}, now)
    assert run.at == utc(2026, 3, 3, 3)  # the latest, once
    assert due(s, {s.entries[0].key: now}, now + timedelta(minutes=1)) == ()


def test_missed_occurrence_is_dropped_once_it_no_longer_fits() -> None:
    s = schedule(entry())  # 300 s by default; the window closes at 05:00
    report = check_due(s, {}, utc(2026, 3, 3, 4, 56))
    assert report.runs == ()
    (skip,) = report.skipped
    assert skip.at == utc(2026, 3, 3, 3)
    assert "missed: too late" in skip.reason and "05:00" in skip.reason
    assert due(s, {}, utc(2026, 3, 3, 4, 55)) != ()  # 04:55 + 5 min still fits


def test_missed_occurrence_does_not_run_in_a_later_window() -> None:
    # Tue-Thu window: a Tuesday occurrence missed entirely does not run on Wednesday.
    s = schedule(entry(), windows=[{"days": "tue-thu", "start": "02:00", "end": "05:00"}])
    report = check_due(s, {}, utc(2026, 3, 4, 3, 0))
    assert report.runs == ()
    assert report.skipped[0].at == utc(2026, 3, 3, 3)


def test_due_skips_blocked_occurrence_with_reason() -> None:
    s = schedule(entry(), blocked=["2026-03-03"])
    report = check_due(s, {}, utc(2026, 3, 3, 3, 1))
    assert report.runs == ()
    assert report.skipped[0].reason.startswith("blocked date")


def test_due_orders_several_entries_by_occurrence() -> None:
    s = schedule(entry(cron="10 3 * * 2"), entry(scenario="auth-503-storm", cron="0 3 * * 2"))
    runs = due(s, {}, utc(2026, 3, 3, 3, 20))
    assert [r.entry.scenario for r in runs] == ["auth-503-storm", "region-blackout"]


# ---- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (
            {"windows": [TUE_WINDOW], "entries": [entry(cron="0 3 * *")]},
            "entries[0].cron",
            "5 fields",
        ),
        (
            {"windows": [TUE_WINDOW], "entries": [entry(cron="0 25 * * 2")]},
            "entries[0].cron",
            "bad cron",
        ),
        (
            {"windows": [TUE_WINDOW], "entries": [entry(timezone="Mars/Olympus")]},
            "entries[0].timezone",
            "unknown time zone 'Mars/Olympus'",
        ),
        (
            {"timezone": "Nowhere", "windows": [TUE_WINDOW], "entries": []},
            "timezone",
            "unknown time zone",
        ),
        (
            {"windows": [{"days": ["tue"], "start": "05:00", "end": "02:00"}], "entries": []},
            "windows[0]",
            "window end 02:00 is not after its start 05:00",
        ),
        (
            {"windows": [{"days": ["tue"], "start": 870, "end": "05:00"}], "entries": []},
            "windows[0].start",
            "write times in quotes",
        ),
        (
            {"windows": [{"days": ["tuesday"], "start": "02:00", "end": "05:00"}], "entries": []},
            "windows[0].days[0]",
            "'mon'",
        ),
        (
            {"windows": [TUE_WINDOW], "blocked": ["2026-12-31..2026-12-01"], "entries": []},
            "blocked[0]",
            "ends",
        ),
        (
            {"windows": [TUE_WINDOW], "entries": [entry(crom="0 3 * * 2")]},
            "entries[0].crom",
            "Extra",
        ),
        ({"entries": [entry()]}, "(top level)", "no allowed window"),
        ({"windows": [TUE_WINDOW], "entries": [entry(), entry()]}, "(top level)", "appears twice"),
        (
            {"windows": [TUE_WINDOW], "entries": [entry(scenario="Bad Name")]},
            "entries[0].scenario",
            "pattern",
        ),
    ],
)
def test_invalid_schedule_names_the_field(data: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_schedule(data, "s.yaml")
    text = str(err.value)
    assert text.startswith("s.yaml is not a valid schedule:")
    line = next((ln for ln in text.splitlines() if ln.strip().startswith(f"{field}:")), None)
    assert line is not None, text
    assert words in line, text


def test_unknown_scenario_name_is_rejected_when_names_are_known() -> None:
    s = schedule(entry(), entry(scenario="region-blakcout"))
    with pytest.raises(
        ConfigError, match=r"entries\[1\]\.scenario: unknown scenario 'region-blakcout'"
    ):
        bind_scenarios(s, SHIPPED_NAMES)


def test_entry_may_not_promise_less_time_than_its_scenario() -> None:
    s = schedule(entry(max_duration_s=60))
    with pytest.raises(ConfigError, match=r"entries\[0\]\.max_duration_s: 60 s is less than"):
        bind_scenarios(s, {"region-blackout": 240.0})


def test_load_schedule_reports_the_file(tmp_path: Path) -> None:
    path = tmp_path / "schedule.yaml"
    path.write_text(
        "windows: [{days: tue, start: '02:00', end: '05:00'}]\nentries:\n  - scenario: x\n"
    )
    with pytest.raises(ConfigError, match=rf"(?s){path}: .*unknown scenario 'x'"):
        load_schedule(path, SHIPPED_NAMES)
    path.write_text("entries: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_schedule(path)


# ---- the shipped file and the CLI ----------------------------------------------------


def _shipped_known() -> dict[str, float] | list[str]:
    """The real scenarios when chaos/scenarios/ has them, else the names they will have."""
    if SCENARIO_DIR.is_dir() and any(SCENARIO_DIR.glob("*.yaml")):
        return {s.name: s.abort.max_duration_s for s in load_all(SCENARIO_DIR)}
    return SHIPPED_NAMES


def test_shipped_schedule_is_valid_and_weekly() -> None:
    s = load_schedule(SCHEDULE_FILE, _shipped_known())
    assert {e.scenario for e in s.entries} == set(SHIPPED_NAMES)
    assert all(e.enabled for e in s.entries)
    up = next_runs(s, utc(2026, 3, 2), 14)  # Monday: two full weeks
    assert up.skipped == ()
    first_week = [r for r in up.runs if r.at_utc < utc(2026, 3, 9)]
    assert sorted(r.entry.scenario for r in first_week) == sorted(SHIPPED_NAMES)
    blackout = [r.at_utc for r in up.runs if r.entry.scenario == "region-blackout"]
    assert blackout == [utc(2026, 3, 3, 3), utc(2026, 3, 10, 3)]
    rb = s.entry("region-blackout")
    assert rb.windows is not None and rb.windows[0].describe() == "tue,wed,thu 02:00-05:00"


def test_shipped_schedule_freezes_the_year_end() -> None:
    s = load_schedule(SCHEDULE_FILE, _shipped_known())
    up = next_runs(s, utc(2026, 12, 18), 1)
    assert up.runs[0].at_utc.date() == date(2027, 1, 5)
    assert up.skipped and all("year-end freeze" in x.reason for x in up.skipped)


def test_cli_next_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["next", str(SCHEDULE_FILE), "--count", "3", "--json", "--now", "2026-12-14T00:00"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"][0]["at_utc"] == "2026-12-14T02:30:00+00:00"
    assert len(doc["runs"]) == 3


def test_cli_next_text_lists_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["next", str(SCHEDULE_FILE), "--count", "8", "--now", "2026-12-14T00:00"]) == 0
    out = capsys.readouterr().out
    assert "Tue 2026-12-15 03:00 UTC" in out
    assert "skipped on the way:" in out and "blocked date: 2026-12-22" in out


def test_cli_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(SCHEDULE_FILE)]) == 0
    assert "ok (7/7 entries enabled" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("entries:\n  - {scenario: region-blackout, cron: 'every tuesday'}\n")
    assert main(["check", str(bad), "--scenarios", str(tmp_path / "none")]) == 2
    assert "entries[0].cron" in capsys.readouterr().err
