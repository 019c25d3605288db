"""Drill reports people look at: one directory per drill, and a history across drills.

A report directory holds ``report.html`` (self-contained: inline CSS, no scripts, the
plots as PNG files beside it), ``timeline.png``, ``regions.png``, ``summary.md`` and
``result.json`` (the DrillResult, from which the rest can be drawn again). The history
is ``index.html`` and ``history.md`` at the root holding the report directories.

    .venv/bin/python -m chaos.drills.report drill-reports/east-stop/
    .venv/bin/python -m chaos.drills.report drill-reports/east-stop/result.json --history
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from chaos.drills.report_plots import draw_regions, draw_timeline, save_png
from chaos.drills.result import DrillResult, DrillSummary, JournalEntry, summarize

REPORT, RESULT, SUMMARY = "report.html", "result.json", "summary.md"
TIMELINE, REGIONS = "timeline.png", "regions.png"
INDEX, HISTORY = "index.html", "history.md"

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1240px;
       padding: 0 1em; color: #1b1b1b; }
h1 { margin-bottom: .2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.verdict { display: inline-block; font-size: 2em; font-weight: 700; padding: .15em .6em;
           border-radius: 6px; color: #fff; margin: .3em 0; }
.verdict.pass { background: #2e7d32; } .verdict.fail { background: #c62828; }
.tag { display: inline-block; padding: .1em .5em; border-radius: 4px; font-weight: 600;
       background: #fff3cd; border: 1px solid #e0c36a; margin-left: .5em; }
.aborted { color: #c62828; font-weight: 600; }
table { border-collapse: collapse; margin: .6em 0; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } tr.bad td { background: #fdecea; }
dl { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dt { font-weight: 600; } img { max-width: 100%; height: auto; border: 1px solid #eee; }
.muted { color: #777; }
"""


@dataclass(frozen=True)
class Journal:
    """The journal as read back: its entries, and what could not be read."""

    path: str
    entries: tuple[JournalEntry, ...] = ()
    missing: bool = False
    bad_lines: tuple[int, ...] = ()  # 1-based; a crash can leave a torn last line


@dataclass(frozen=True)
class History:
    """Every drill under a reports root, newest first, and the results that would not load."""

    rows: tuple[tuple[str, DrillSummary], ...] = ()  # (report directory name, summary)
    unreadable: tuple[tuple[str, str], ...] = ()  # (path, why)


# ---- one drill ----


def write_report(result: DrillResult, directory: Path) -> Path:
    """Write the drill's report directory and return the path of its report.html."""
    directory.mkdir(parents=True, exist_ok=True)
    page = directory / REPORT
    result = result.model_copy(update={"report_path": str(page)})
    journal = read_journal(result, directory)
    sizes = {
        TIMELINE: save_png(draw_timeline(result, journal.entries), directory / TIMELINE),
        REGIONS: save_png(draw_regions(result), directory / REGIONS),
    }
    _write(directory / RESULT, result.model_dump_json(indent=2) + "\n")
    _write(directory / SUMMARY, render_summary(result))
    _write(page, render_html(result, journal, sizes))
    return page


def read_journal(result: DrillResult, directory: Path) -> Journal:
    """The journal at ``journal_path``, or a file of that name in the report directory
    (where it is after a report directory is copied elsewhere)."""
    if not result.journal_path:
        return Journal(path="", missing=True)
    path = Path(result.journal_path)
    if not path.is_file() and (directory / path.name).is_file():
        path = directory / path.name
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return Journal(path=str(path), missing=True)
    entries, bad = [], []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entries.append(JournalEntry.model_validate_json(line))
        except ValidationError:
            bad.append(no)
    return Journal(path=str(path), entries=tuple(entries), bad_lines=tuple(bad))


def render_html(result: DrillResult, journal: Journal, sizes: dict[str, tuple[int, int]]) -> str:
    verdict = "PASS" if result.passed else "FAIL"
    head = [
        f"<h1>Drill: {_e(result.title)}</h1>",
        f'<div class="verdict {verdict.lower()}">{verdict}</div>',
        '<span class="tag">DRY RUN</span>' if result.dry_run else "",
    ]
    if result.aborted:
        head.append(f'<p class="aborted">Aborted: {_e(result.aborted)}</p>')
    body = [
        *head,
        _facts(result),
        "<h2>Criteria</h2>",
        _criteria_table(result),
        "<h2>Key figures</h2>",
        _figures_table(result.figures),
        "<h2>Timeline</h2>",
        _img(TIMELINE, sizes, f"First-token p99, error rate and prefix hit rate of {result.title}"),
        "<h2>Regions</h2>",
        _img(REGIONS, sizes, f"Region states, degradation steps and routing of {result.title}"),
        "<h2>Transitions</h2>",
        _transitions_table(result),
        "<h2>Degradation ladder</h2>",
        _ladder_table(result),
        "<h2>Readiness written</h2>",
        _readiness(result),
        "<h2>Journal</h2>",
        _journal_section(journal),
    ]
    return _page(f"Drill {result.id}: {verdict}", body)


def render_summary(result: DrillResult) -> str:
    verdict = "PASS" if result.passed else "FAIL"
    lines = [
        f"# Drill {result.title}: {verdict}" + (" (DRY RUN)" if result.dry_run else ""),
        "",
        f"- Scenario: `{result.scenario}`, target region: `{result.region}`",
        f"- Started {_when(result.started_at)}, ran {result.duration_s:.1f} s",
    ]
    if result.aborted:
        lines.append(f"- **Aborted:** {_md(result.aborted)}")
    lines += ["", "## Criteria", ""]
    lines += _md_table(
        ("Criterion", "Measured", "Required", "Result", "Detail"),
        [
            (c.name, c.measured, c.required, "pass" if c.passed else "**FAIL**", c.detail)
            for c in result.criteria
        ],
    )
    if result.figures:
        lines += ["", "## Figures", ""]
        lines += _md_table(("Figure", "Value"), [(k, _num(v)) for k, v in result.figures.items()])
    lines += ["", f"Full report: [{REPORT}]({REPORT})", ""]
    return "\n".join(lines)


def _facts(result: DrillResult) -> str:
    facts = {
        "Drill": result.id,
        "Scenario": result.scenario,
        "Target region": result.region,
        "Started": _when(result.started_at),
        "Ended": _when(result.ended_at),
        "Duration": f"{result.duration_s:.1f} s",
        "Failed criteria": ", ".join(result.failed_criteria()) or "none",
    }
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts.items())
    return f"<dl>{items}</dl>"


def _criteria_table(result: DrillResult) -> str:
    if not result.criteria:
        return '<p class="muted">No criteria were judged.</p>'
    rows = [
        (
            [c.name, c.measured, c.required, "pass" if c.passed else "FAIL", c.detail],
            "ok" if c.passed else "bad",
        )
        for c in result.criteria
    ]
    return _table(("Criterion", "Measured", "Required", "Result", "Detail"), rows)


def _figures_table(figures: dict[str, float]) -> str:
    if not figures:
        return '<p class="muted">No figures recorded.</p>'
    return _table(("Figure", "Value"), [([k, _num(v)], "") for k, v in figures.items()])


def _transitions_table(result: DrillResult) -> str:
    if not result.transitions:
        return '<p class="muted">No region changed state.</p>'
    rows = [
        ([f"{t.t:.1f}", t.region, f"{t.from_state}→{t.to_state}", t.reason], "")
        for t in result.transitions
    ]
    return _table(("t (s)", "Region", "Transition", "Reason"), rows)


def _ladder_table(result: DrillResult) -> str:
    if not result.ladder:
        return '<p class="muted">No degradation step was applied.</p>'
    rows = [([f"{e.t:.1f}", e.region, e.action, e.step], "") for e in result.ladder]
    return _table(("t (s)", "Region", "Action", "Step"), rows)


def _readiness(result: DrillResult) -> str:
    if not result.readiness_written:
        return '<p class="muted">This drill wrote no region\'s readiness.</p>'
    return "<ul>" + "".join(f"<li>{_e(r)}</li>" for r in result.readiness_written) + "</ul>"


def _journal_section(journal: Journal) -> str:
    if journal.missing:
        where = f" at {journal.path}" if journal.path else ""
        return f'<p class="aborted">The journal is missing{_e(where)}.</p>'
    out = [f'<p class="muted">{len(journal.entries)} entries from {_e(journal.path)}</p>']
    if journal.bad_lines:
        lines = ", ".join(map(str, journal.bad_lines))
        out.append(f'<p class="aborted">Unreadable journal lines: {_e(lines)}</p>')
    rows = [
        (
            [
                f"{e.t:.1f}",
                e.phase,
                e.kind,
                e.action,
                "ok" if e.ok else "FAILED",
                "; ".join(f"{k}={v}" for k, v in e.detail.items()),
            ],
            "" if e.ok else "bad",
        )
        for e in journal.entries
    ]
    out.append(_table(("t (s)", "Phase", "Kind", "Action", "OK", "Detail"), rows))
    return "\n".join(out)


def _img(name: str, sizes: dict[str, tuple[int, int]], alt: str) -> str:
    width, height = sizes[name]
    return f'<p><img src="{_e(name)}" alt="{_e(alt)}" width="{width}" height="{height}"></p>'


# ---- history ----


def load_history(reports_root: Path) -> list[DrillSummary]:
    """Every readable drill under ``reports_root``, newest first."""
    return [summary for _, summary in scan_history(reports_root).rows]


def scan_history(reports_root: Path) -> History:
    found: list[tuple[str, DrillSummary]] = []
    unreadable: list[tuple[str, str]] = []
    for path in sorted(reports_root.glob(f"*/{RESULT}")):
        try:
            result = DrillResult.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            unreadable.append((str(path), _why(exc)))
            continue
        found.append((path.parent.name, summarize(result)))
    found.sort(key=lambda row: (row[1].started_at, row[1].id), reverse=True)
    return History(rows=tuple(found), unreadable=tuple(unreadable))


def write_history(reports_root: Path) -> Path:
    """Write ``index.html`` and ``history.md`` for every drill under ``reports_root``."""
    history = scan_history(reports_root)
    index = reports_root / INDEX
    _write(index, render_index(history))
    _write(reports_root / HISTORY, render_history_md(history))
    return index


def render_index(history: History) -> str:
    rows = [
        (
            [
                _when(s.started_at),
                s.scenario,
                s.region,
                _verdict(s),
                f"{s.ended_at - s.started_at:.0f} s",
                ", ".join(s.failed) or "none",
            ],
            "ok" if s.passed else "bad",
        )
        for _, s in history.rows
    ]
    links = [f'<a href="{_e(d)}/{REPORT}">{_e(d)}</a>' for d, _ in history.rows]
    heads = ("When", "Scenario", "Region", "Verdict", "Duration", "Failed criteria")
    table = _table((*heads, "Report"), rows, extra=links) if rows else "<p>No drills yet.</p>"
    body = [f"<h1>Drill history</h1><p>{len(history.rows)} drills, newest first.</p>", table]
    if history.unreadable:
        items = "".join(f"<li>{_e(p)}: {_e(why)}</li>" for p, why in history.unreadable)
        body += ["<h2>Unreadable results</h2>", f"<ul>{items}</ul>"]
    return _page("Drill history", body)


def render_history_md(history: History) -> str:
    lines = ["# Drill history", "", "Newest first.", ""]
    lines += _md_table(
        ("When", "Scenario", "Region", "Verdict", "Failed criteria", "Report"),
        [
            (
                _when(s.started_at),
                s.scenario,
                s.region,
                _verdict(s),
                ", ".join(s.failed) or "none",
                f"[{d}]({d}/{REPORT})",
            )
            for d, s in history.rows
        ],
    )
    if history.unreadable:
        lines += ["", "## Unreadable results", ""]
        lines += [f"- `{p}`: {_md(why)}" for p, why in history.unreadable]
    return "\n".join(lines) + "\n"


def _verdict(s: DrillSummary) -> str:
    verdict = "PASS" if s.passed else "FAIL"
    if s.aborted:
        verdict += " (aborted)"
    return verdict + (" (dry run)" if s.dry_run else "")


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return f"not a drill result ({exc.error_count()} errors)"
    return str(exc)


# ---- rendering helpers ----

Row = tuple[Sequence[str], str]  # cells (plain text) and the row's CSS class


def _table(headers: Sequence[str], rows: Iterable[Row], extra: Sequence[str] = ()) -> str:
    """A table of plain-text cells, all escaped here; ``extra`` is one last cell per row
    of ready-made HTML (links), built from escaped parts by the caller."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, (cells, cls) in enumerate(rows):
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        if extra:
            tds += f"<td>{extra[i]}</td>"
        body.append(f'<tr class="{_e(cls)}">{tds}</tr>' if cls else f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _page(title: str, body: Sequence[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body></html>\n"
    )


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return out


def _md(text: str) -> str:
    # A pipe or newline inside a cell would break the table.
    return text.replace("|", "\\|").replace("\n", " ")


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _num(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:.4g}"


def _when(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _write(path: Path, text: str) -> None:
    # Write beside and rename: a history scan never reads half a result.json.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---- command line ----


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.drills.report",
        description="Draw a drill's report again from its saved result.json: report.html, "
        "the plots, summary.md (and, with --history, the history of its reports root).",
    )
    parser.add_argument(
        "result", type=Path, help="a result.json, or the report directory that holds one"
    )
    parser.add_argument(
        "--out", type=Path, help="write the report here (default: beside the result.json)"
    )
    parser.add_argument(
        "--history",
        action="store_true",
        help="also rewrite index.html and history.md in the report directory's parent",
    )
    args = parser.parse_args(argv)
    source: Path = args.result / RESULT if args.result.is_dir() else args.result
    try:
        result = DrillResult.model_validate_json(source.read_bytes())
    except (OSError, ValidationError) as exc:
        print(f"cannot read {source}: {_why(exc)}", file=sys.stderr)
        return 2
    directory: Path = args.out or source.parent
    page = write_report(result, directory)
    print(page)
    if args.history:
        print(write_history(directory.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
