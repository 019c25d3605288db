"""Drill reports: the files a drill leaves for people (report.html, plots, summary.md,
result.json), the history across drills, the re-rendering command, and the page in a
real headless browser."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from chaos.drills.report import load_history, main, write_history, write_report
from chaos.drills.report_plots import draw_regions, draw_timeline
from chaos.drills.result import (
    Criterion,
    DrillResult,
    JournalEntry,
    LadderEvent,
    RegionSample,
    Sample,
    Transition,
    summarize,
)
from chaos.lab.procs import until
from tests.integration.http_api_helpers import CHROMIUM, chromium_page

T0 = 1_717_200_000.0  # 2024-06-01 00:00:00 UTC
EVIL = "<script>alert('x')</script>"


def _region(state: str, routing: dict[str, float], steps: tuple[str, ...] = ()) -> RegionSample:
    return RegionSample(state=state, health="HEALTHY", routing=routing, ladder_steps=steps)


def _sample(t: float) -> Sample:
    """East is stopped at 18 s, fails over at 20 s, recovers at 40 s, is NORMAL at 50 s."""
    failing = 20 <= t < 40
    east = "FAILING_OVER" if failing else "RECOVERED" if 40 <= t < 50 else "NORMAL"
    spread = {"west": 0.5, "central": 0.5} if failing else {"east": 1.0}
    steps = ("shed_batch",) if 22 <= t < 45 else ()
    return Sample(
        t=t,
        leader="cp-1",
        regions={
            "east": _region(east, spread),
            "west": _region("DEGRADED" if steps else "NORMAL", {"west": 1.0}, steps),
            "central": _region("NORMAL", {"central": 1.0}),
        },
        requests=200,
        errors=60 if 18 <= t < 24 else 0,
        error_rate=0.3 if 18 <= t < 24 else 0.0,
        # 26 s: a window where the gateways measured no first token (a gap).
        first_token_p99_s=None if t == 26 else 3.5 if 18 <= t < 30 else 0.25,
        prefix_hit_rate=0.3 if 20 <= t < 32 else 0.8,
    )


def _journal(path: Path) -> None:
    def entry(t: float, phase: str, kind: str, action: str, **detail: str) -> str:
        return JournalEntry(
            at=T0 + t, t=t, phase=phase, kind=kind, action=action, detail=detail
        ).model_dump_json()

    lines = [
        entry(0, "steady_before", "phase", "steady_before"),
        entry(18, "faults", "fault", "stop_region", region="east", servers="2"),
        entry(30, "observe", "note", "operator note", text=EVIL),
        entry(38, "rollback", "rollback", "start_region", region="east"),
        entry(55, "steady_after", "probe", "steady_state", result="ok"),
        entry(61, "verdict", "measure", "verdict", passed="false"),
    ]
    path.write_text("\n".join(lines) + "\n")


def _result(tmp_path: Path, **changes: object) -> DrillResult:
    journal = tmp_path / "journal.jsonl"
    _journal(journal)
    result = DrillResult(
        id="20240601-000000-east-stop",
        scenario="region-stop",
        title="Stop every vLLM server of east",
        region="east",
        started_at=T0,
        ended_at=T0 + 62,
        passed=False,
        criteria=(
            Criterion(name="prewarm_budget", passed=True, measured="97 %", required=">= 90 %"),
            Criterion(
                name="degradation_order", passed=True, measured="shed_batch", required="runbook"
            ),
            Criterion(
                name="session_consistency",
                passed=False,
                measured="0.4 %",
                required="< 0.1 %",
                detail="12 of 3000 sessions served by two regions",
            ),
        ),
        samples=tuple(_sample(float(t)) for t in range(0, 62, 2)),
        transitions=(
            Transition(t=20, region="east", from_state="NORMAL", to_state="FAILING_OVER"),
            Transition(t=40, region="east", from_state="FAILING_OVER", to_state="RECOVERED"),
            Transition(t=50, region="east", from_state="RECOVERED", to_state="NORMAL"),
        ),
        ladder=(
            LadderEvent(t=22, region="west", action="apply", step="shed_batch"),
            LadderEvent(t=45, region="west", action="restore", step="shed_batch"),
        ),
        figures={"rto_s": 2.4, "requests": 6200.0, "errors": 180.0},
        readiness_written=("east",),
        journal_path=str(journal),
    )
    return result.model_copy(update=changes)


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _assert_png(path: Path, width: int, height: int) -> None:
    image = imread(path)  # fails on anything but a valid image
    assert image.shape[:2] == (height, width)
    assert path.stat().st_size > 10_000
    assert float(np.std(image[..., :3])) > 0.05  # not a blank canvas


def test_report_writes_page_plots_summary_and_result(tmp_path: Path) -> None:
    result = _result(tmp_path)
    page = write_report(result, tmp_path / "report")
    assert page == tmp_path / "report" / "report.html"
    html = page.read_text()

    for name in ("timeline.png", "regions.png"):
        tag = html.split(f'<img src="{name}"', 1)[1].split(">", 1)[0]
        width = int(tag.split('width="')[1].split('"')[0])
        height = int(tag.split('height="')[1].split('"')[0])
        assert 'alt="' in tag
        _assert_png(page.parent / name, width, height)

    assert '<div class="verdict fail">FAIL</div>' in html
    assert "DRY RUN" not in html
    for name in ("prewarm_budget", "degradation_order", "session_consistency"):
        assert name in html
    assert "12 of 3000 sessions served by two regions" in html
    assert html.count("→") >= 3 and "NORMAL→FAILING_OVER" in html
    assert "RECOVERED→NORMAL" in html and "shed_batch" in html
    for action in ("stop_region", "start_region", "operator note", "steady_state"):
        assert action in html
    assert EVIL not in html and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "2024-06-01 00:00:00 UTC" in html and "62.0 s" in html
    assert "<script" not in html.lower().replace("&lt;script", "")
    assert "http" not in html  # self-contained: nothing fetched from elsewhere

    summary = (page.parent / "summary.md").read_text()
    assert "| Criterion | Measured | Required | Result | Detail |" in summary
    assert "| session_consistency | 0.4 % | < 0.1 % | **FAIL** |" in summary
    assert "| rto_s | 2.4 |" in summary and "[report.html](report.html)" in summary

    saved = DrillResult.model_validate_json((page.parent / "result.json").read_text())
    assert saved == result.model_copy(update={"report_path": str(page)})


def test_timeline_marks_transitions_and_faults(tmp_path: Path) -> None:
    result = _result(tmp_path)
    journal = [
        JournalEntry.model_validate_json(line)
        for line in Path(result.journal_path).read_text().splitlines()
    ]
    timeline = draw_timeline(result, journal)
    labels = [t.strip() for t in _texts(timeline)]
    assert labels == [
        "east: NORMAL→FAILING_OVER",
        "east: FAILING_OVER→RECOVERED",
        "east: RECOVERED→NORMAL",
    ]
    legend = {t.get_text() for lg in timeline.legends for t in lg.get_texts()}
    assert {"fault injected", "rollback", "faults → rollback", "transition of east"} <= legend
    p99 = timeline.axes[0].lines[0].get_ydata()
    assert np.isnan(np.asarray(p99, dtype=float)).sum() == 1  # the unmeasured window

    regions = draw_regions(result)
    legend = {t.get_text() for lg in regions.legends for t in lg.get_texts()}
    assert {"NORMAL", "FAILING_OVER", "RECOVERED", "DEGRADED", "apply", "restore"} <= legend
    assert "apply shed_batch" in _texts(regions)


def test_report_without_samples_or_journal(tmp_path: Path) -> None:
    result = _result(
        tmp_path,
        samples=(),
        transitions=(),
        ladder=(),
        criteria=(),
        figures={},
        readiness_written=(),
        journal_path=str(tmp_path / "gone.jsonl"),
        dry_run=True,
        aborted="steady state did not hold before the faults",
        passed=False,
    )
    assert _texts(draw_timeline(result, [])).count("no samples") == 3
    assert _texts(draw_regions(result)).count("no samples") == 2

    html = write_report(result, tmp_path / "empty").read_text()
    assert "DRY RUN" in html and "Aborted: steady state did not hold" in html
    assert "The journal is missing at " in html and "gone.jsonl" in html
    assert "No criteria were judged" in html and "No region changed state" in html
    imread(tmp_path / "empty" / "timeline.png")
    imread(tmp_path / "empty" / "regions.png")
    assert "(DRY RUN)" in (tmp_path / "empty" / "summary.md").read_text()


def test_journal_with_a_torn_line_and_found_beside_the_report(tmp_path: Path) -> None:
    result = _result(tmp_path)
    directory = tmp_path / "moved"
    directory.mkdir()
    lines = Path(result.journal_path).read_text()
    (directory / "journal.jsonl").write_text(lines + '{"at": 1, "t": ')  # a crash mid-line
    moved = result.model_copy(update={"journal_path": "/nowhere/journal.jsonl"})
    html = write_report(moved, directory).read_text()
    assert "6 entries from" in html and "Unreadable journal lines: 7" in html


def test_history_lists_drills_newest_first_and_names_the_unreadable(tmp_path: Path) -> None:
    root = tmp_path / "drills"
    older = _result(tmp_path, id="old-drill", scenario="leader-kill", passed=True)
    newer = _result(tmp_path, id="new-drill", started_at=T0 + 86_400, ended_at=T0 + 86_460)
    write_report(older.model_copy(update={"criteria": ()}), root / "old-drill")
    write_report(newer, root / "new-drill")
    (root / "broken").mkdir()
    (root / "broken" / "result.json").write_text('{"id": "half a fi')
    (root / "not-a-result").mkdir()
    (root / "not-a-result" / "result.json").write_text(json.dumps({"id": "x"}))

    history = load_history(root)
    assert [s.id for s in history] == ["new-drill", "old-drill"]
    assert history[1] == summarize(
        older.model_copy(
            update={"criteria": (), "report_path": str(root / "old-drill/report.html")}
        )
    )
    assert history[0].failed == ("session_consistency",)

    index = write_history(root)
    assert index == root / "index.html"
    html = index.read_text()
    assert html.index("new-drill/report.html") < html.index("old-drill/report.html")
    assert "2024-06-02 00:00:00 UTC" in html and "leader-kill" in html
    assert "session_consistency" in html and "PASS" in html and "FAIL" in html
    assert "Unreadable results" in html
    assert str(root / "broken" / "result.json") in html
    assert str(root / "not-a-result" / "result.json") in html
    md = (root / "history.md").read_text()
    assert md.index("new-drill") < md.index("old-drill") and "broken" in md


def test_history_of_an_empty_root(tmp_path: Path) -> None:
    assert load_history(tmp_path) == []
    assert "No drills yet" in write_history(tmp_path).read_text()


def test_command_renders_a_saved_result_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "drills" / "d1"
    write_report(_result(tmp_path), directory)
    for name in ("report.html", "timeline.png", "regions.png", "summary.md"):
        (directory / name).unlink()
    assert main([str(directory), "--history"]) == 0
    assert (directory / "report.html").is_file() and (directory / "timeline.png").is_file()
    assert (tmp_path / "drills" / "index.html").is_file()
    out = tmp_path / "elsewhere"
    assert main([str(directory / "result.json"), "--out", str(out)]) == 0
    assert (out / "report.html").is_file()
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "result.json" in capsys.readouterr().out


# ---- the page in a real browser (headless Chromium over the DevTools protocol) ----


@pytest.mark.slow
async def test_report_page_loads_in_chromium(tmp_path: Path) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):  # CI installs it (scripts/setup.sh): never skip there
            pytest.fail("chromium is missing: scripts/setup.sh installs it")
        pytest.skip("no chromium: scripts/setup.sh installs it")
    page_path = await asyncio.to_thread(write_report, _result(tmp_path), tmp_path / "report")
    url = page_path.as_uri()
    async with chromium_page(url, str(tmp_path / "profile")) as page:

        async def loaded() -> bool:
            # about:blank is "complete" too: wait for the report itself.
            return bool(
                await page.js(
                    f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
                )
            )

        await until(loaded, within=20, what="the report loaded")
        images = await page.js(
            "[...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"
        )
        assert sorted(src for src, _, _ in images) == ["regions.png", "timeline.png"]
        assert all(done and width > 0 for _, done, width in images), images
        title = await page.js("document.querySelector('.verdict').textContent")
        assert title == "FAIL"
        shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    png = base64.b64decode(shot["data"])
    (tmp_path / "report-screenshot.png").write_bytes(png)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert (tmp_path / "report-screenshot.png").stat().st_size == len(png)
