"""The drill report's figures, drawn with matplotlib's object API on the Agg canvas.

No pyplot: it keeps global figure state, and a report is written from a runner that
may draw several at once. ``draw_*`` build a figure (tests read its texts);
``save_png`` writes it and returns its size in pixels, which the page puts on its
<img> so the layout does not jump.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import PercentFormatter

from chaos.drills.result import DrillResult, JournalEntry, Sample
from controlplane.kernel.model import LadderChange

DPI = 100
STATE_COLORS = {
    "NORMAL": "#2e7d32",
    "DEGRADED": "#f9a825",
    "FAILING_OVER": "#c62828",
    "RECOVERED": "#1565c0",
}
OTHER_COLORS = ("#6a1b9a", "#00838f", "#8d6e63", "#546e7a", "#ad1457", "#9e9d24")
REGION_COLORS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
LADDER_MARKERS = {LadderChange.APPLY: "v", LadderChange.RESTORE: "^", LadderChange.REAPPLY: "D"}
FAULT_COLOR, ROLLBACK_COLOR, ABORT_COLOR = "#d32f2f", "#388e3c", "#000000"

Getter = Callable[[Sample], float | None]
PANELS: tuple[tuple[str, str, Getter, bool], ...] = (
    ("first-token p99", "seconds", lambda s: s.first_token_p99_s, False),
    ("error rate", "5xx / requests", lambda s: s.error_rate, True),
    ("prefix hit rate", "hits / queries", lambda s: s.prefix_hit_rate, True),
)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header (IHDR is always the first chunk)."""
    head = path.read_bytes()[:24]
    if not head.startswith(b"\x89PNG\r\n\x1a\n") or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def draw_timeline(result: DrillResult, journal: Sequence[JournalEntry]) -> Figure:
    """p99 first token, error rate and prefix hit rate over the drill, with every region
    transition and every fault / rollback of the journal marked on all three panels."""
    fig = Figure(figsize=(12, 9), dpi=DPI, layout="constrained")
    axes: list[Axes] = list(fig.subplots(len(PANELS), 1, sharex=True))
    for ax, (name, unit, get, fraction) in zip(axes, PANELS, strict=True):
        _series_panel(ax, result.samples, name, unit, get, fraction)
    end = _end_t(result)
    handles = _mark_journal(axes, journal, end) + _mark_transitions(axes, result)
    axes[0].set_xlim(0.0, end)
    axes[-1].set_xlabel("seconds since drill start")
    fig.suptitle(f"{result.title}: target {result.region}")
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5))
    return fig


def draw_regions(result: DrillResult) -> Figure:
    """Each region's state as a band over time with the ladder steps marked on it, and
    where traffic homed in the target region was routed."""
    regions = _region_names(result)
    fig = Figure(figsize=(12, 3.5 + 0.7 * max(len(regions), 1)), dpi=DPI, layout="constrained")
    states, routing = fig.subplots(2, 1, sharex=True, height_ratios=[max(len(regions), 1) + 1, 3])
    handles = _state_bands(states, result, regions) + _ladder_marks(states, result, regions)
    _routing_panel(routing, result)
    states.set_xlim(0.0, _end_t(result))
    routing.set_xlabel("seconds since drill start")
    fig.suptitle(f"{result.title}: region states, degradation steps and routing")
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6))
    return fig


# ---- timeline ----


def _series_panel(
    ax: Axes, samples: Sequence[Sample], name: str, unit: str, get: Getter, fraction: bool
) -> None:
    # NaN breaks the line, so a window where nothing was measured shows as a gap.
    values = [math.nan if (v := get(s)) is None else v for s in samples]
    if any(not math.isnan(v) for v in values):
        ax.plot([s.t for s in samples], values, marker=".", color="#263238", linewidth=1.4)
    else:
        _say(ax, "no samples" if not samples else f"no {name} measured")
    ax.set_title(name, loc="left", fontsize=10)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0.0)
    if fraction:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(alpha=0.3)


def _mark_journal(
    axes: Sequence[Axes], journal: Sequence[JournalEntry], end: float
) -> list[Patch | Line2D]:
    faults = [e.t for e in journal if e.kind == "fault"]
    rollbacks = [e.t for e in journal if e.kind == "rollback"]
    aborts = [e.t for e in journal if e.kind == "abort"]
    handles: list[Patch | Line2D] = []
    if faults:
        # Shade from the first fault to the last rollback: the time the system was hurt.
        until = max(rollbacks) if rollbacks and max(rollbacks) > min(faults) else end
        for ax in axes:
            ax.axvspan(min(faults), until, color=FAULT_COLOR, alpha=0.07)
        handles.append(Patch(color=FAULT_COLOR, alpha=0.15, label="faults → rollback"))
    for times, color, label in (
        (faults, FAULT_COLOR, "fault injected"),
        (rollbacks, ROLLBACK_COLOR, "rollback"),
        (aborts, ABORT_COLOR, "abort"),
    ):
        if times:
            _vlines(axes, times, color, ":")
            handles.append(Line2D([], [], color=color, linestyle=":", label=label))
    return handles


def _mark_transitions(axes: Sequence[Axes], result: DrillResult) -> list[Patch | Line2D]:
    colors = _region_colors(_region_names(result))
    for tr in result.transitions:
        _vlines(axes, [tr.t], colors[tr.region], "--")
        axes[0].text(
            tr.t,
            0.97,
            f" {tr.region}: {tr.from_state}→{tr.to_state}",
            transform=axes[0].get_xaxis_transform(),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color=colors[tr.region],
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1},
        )
    seen = dict.fromkeys(tr.region for tr in result.transitions)
    return [
        Line2D([], [], color=colors[r], linestyle="--", label=f"transition of {r}") for r in seen
    ]


def _vlines(axes: Iterable[Axes], times: Iterable[float], color: str, style: str) -> None:
    for ax in axes:
        for t in times:
            ax.axvline(t, color=color, linestyle=style, linewidth=1.1)


# ---- regions ----


def _state_bands(ax: Axes, result: DrillResult, regions: Sequence[str]) -> list[Patch | Line2D]:
    end = _end_t(result)
    used: dict[str, str] = {}
    for y, region in enumerate(regions):
        for start, stop, state in _state_runs(result.samples, region, end):
            color = used.setdefault(state, _state_color(state, len(used)))
            ax.broken_barh([(start, stop - start)], (y - 0.35, 0.7), facecolors=color)
    if not result.samples:
        _say(ax, "no samples")
    ax.set_yticks(range(len(regions)), [_region_label(r, result.region) for r in regions])
    ax.set_ylim(-0.7, max(len(regions), 1) - 0.3)
    ax.invert_yaxis()  # the first region on top, as in the tables
    ax.set_title("region state (bands) and degradation steps (markers)", loc="left", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return [Patch(color=c, label=s) for s, c in used.items()]


def _state_runs(
    samples: Sequence[Sample], region: str, end: float
) -> list[tuple[float, float, str]]:
    """(start, stop, state) for each run of samples showing the region in one state; a
    sample's state holds until the next sample. A sample without the region is a gap."""
    runs: list[tuple[float, float, str]] = []
    for i, sample in enumerate(samples):
        stop = samples[i + 1].t if i + 1 < len(samples) else max(end, sample.t)
        seen = sample.regions.get(region)
        if seen is None or stop <= sample.t:
            continue
        if runs and runs[-1][2] == seen.state and runs[-1][1] == sample.t:
            runs[-1] = (runs[-1][0], stop, seen.state)
        else:
            runs.append((sample.t, stop, seen.state))
    return runs


def _ladder_marks(ax: Axes, result: DrillResult, regions: Sequence[str]) -> list[Patch | Line2D]:
    row = {r: y for y, r in enumerate(regions)}
    used: set[LadderChange] = set()
    for ev in result.ladder:
        marker = LADDER_MARKERS[ev.action]
        used.add(ev.action)
        ax.plot([ev.t], [row[ev.region]], marker=marker, color="black", markersize=7)
        ax.annotate(
            f"{ev.action} {ev.step}",
            (ev.t, row[ev.region]),
            xytext=(4, -10),
            textcoords="offset points",
            fontsize=7,
            rotation=20,
        )
    return [
        Line2D([], [], marker=LADDER_MARKERS[a], color="black", linestyle="", label=a.value)
        for a in sorted(used)
    ]


def _routing_panel(ax: Axes, result: DrillResult) -> None:
    ax.set_title(f"where traffic homed in {result.region} goes", loc="left", fontsize=10)
    ax.set_ylabel("weight")
    seen = [
        (s.t, s.regions[result.region].routing)
        for s in result.samples
        if result.region in s.regions
    ]
    ts, routes = [t for t, _ in seen], [r for _, r in seen]
    targets = sorted({t for r in routes for t in r})
    if not targets:
        _say(ax, "no samples" if not result.samples else "no routing recorded")
        return
    if ts[-1] < (end := _end_t(result)):  # the last weights hold to the end, as the bands do
        ts, routes = [*ts, end], [*routes, routes[-1]]
    colors = _region_colors(list(dict.fromkeys([*_region_names(result), *targets])))
    # step="post": a weight holds from its sample until the next one, like the states.
    ax.stackplot(
        ts,
        *[[r.get(t, 0.0) for r in routes] for t in targets],
        labels=targets,
        colors=[colors[t] for t in targets],
        step="post",
        alpha=0.8,
    )
    ax.set_ylim(bottom=0.0)
    ax.legend(loc="upper right", fontsize=8, title="to region", title_fontsize=8)
    ax.grid(alpha=0.3)


# ---- shared ----


def _region_names(result: DrillResult) -> list[str]:
    names = {r for s in result.samples for r in s.regions}
    names |= {t.region for t in result.transitions} | {e.region for e in result.ladder}
    names.add(result.region)
    return [result.region, *sorted(names - {result.region})]


def _region_label(region: str, target: str) -> str:
    return f"{region} (target)" if region == target else region


def _region_colors(regions: Sequence[str]) -> dict[str, str]:
    return {r: REGION_COLORS[i % len(REGION_COLORS)] for i, r in enumerate(regions)}


def _state_color(state: str, index: int) -> str:
    return STATE_COLORS.get(state, OTHER_COLORS[index % len(OTHER_COLORS)])


def _end_t(result: DrillResult) -> float:
    last = [s.t for s in result.samples] + [t.t for t in result.transitions]
    return max([result.duration_s, *last, 1.0])


def _say(ax: Axes, text: str) -> None:
    ax.text(
        0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#777", fontsize=12
    )


def save_png(fig: Figure, path: Path) -> tuple[int, int]:
    # Write beside and rename, so a reader never sees half an image.
    tmp = path.with_name(f".{path.name}.tmp")
    FigureCanvasAgg(fig)  # attaches itself: savefig then renders with Agg, whatever the default
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return png_size(path)
