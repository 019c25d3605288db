"""The capacity probe's report: one directory per probe, like a drill's.

``report.html`` (self-contained: inline CSS, no scripts, the figure as a PNG beside it),
``curve.png`` and ``record.json`` (the CapacityRecord the page is drawn from). The
figure has one column per probe (cold prompts, shared prefixes): offered rate against
first-token p99 (the SLO, the knee, the ultimate and the allowed load marked), and below
it throughput and error rate against the offered rate.

    .venv/bin/python -m chaos.capacity.report drill-reports/<id>/record.json
"""

from __future__ import annotations

import argparse
import html
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from pydantic import ValidationError

from chaos.drills.report import CSS
from chaos.drills.report_plots import save_png
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe

REPORT, RECORD, CURVE = "report.html", "record.json", "curve.png"
KNEE, ULTIMATE, ALLOWED, SLO = "#f9a825", "#c62828", "#2e7d32", "#555555"


def write_report(record: CapacityRecord, directory: Path, *, aborted: str = "") -> Path:
    """Write the report of ``record`` into ``directory``; returns the page's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RECORD).write_text(record.model_dump_json(indent=2) + "\n")
    size = save_png(draw_curves(record), directory / CURVE)
    page = directory / REPORT
    page.write_text(render_html(record, size, aborted=aborted))
    return page


def draw_curves(record: CapacityRecord) -> Figure:
    probes = record.probes
    fig = Figure(figsize=(6.2 * len(probes), 7.2))
    axes = fig.subplots(2, len(probes), squeeze=False, sharex="col")
    for col, probe in enumerate(probes):
        allowed = probe.ultimate_rps / record.factor_of_safety
        _latency_panel(axes[0][col], probe, record.slo.ttft_p99_s, allowed)
        _throughput_panel(axes[1][col], probe, record.slo.error_rate)
    fig.suptitle(
        f"{record.region}: bearing capacity of {record.replica} "
        f"(factor of safety {record.factor_of_safety:g})"
    )
    fig.tight_layout()
    return fig


def _offered(probe: HitProbe) -> list[float]:
    return [s.offered_rps for s in probe.steps]


def _latency_panel(ax: Axes, probe: HitProbe, slo_s: float, allowed: float) -> None:
    ax.plot(_offered(probe), [s.p99_ttft_s * 1000 for s in probe.steps], "o-", label="p99 TTFT")
    ax.axhline(slo_s * 1000, color=SLO, linestyle=":", label=f"SLO {slo_s * 1000:g} ms")
    if probe.knee_rps is not None:
        ax.axvline(probe.knee_rps, color=KNEE, linestyle="--", label=f"knee {probe.knee_rps:.1f}")
    bound = "" if probe.ultimate_bounded else " (lower bound)"
    ax.axvline(
        probe.ultimate_rps, color=ULTIMATE, label=f"ultimate {probe.ultimate_rps:.1f}{bound}"
    )
    ax.axvline(allowed, color=ALLOWED, linestyle="-.", label=f"allowed {allowed:.1f}")
    ax.set_yscale("log")
    ax.set_ylabel("first-token p99 (ms)")
    ax.set_title(f"hit rate {probe.hit_rate:.0%}")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)


def _throughput_panel(ax: Axes, probe: HitProbe, error_limit: float) -> None:
    offered = _offered(probe)
    ax.plot(offered, [s.throughput_rps for s in probe.steps], "s-", label="throughput")
    ax.plot(offered, offered, color="#bbbbbb", linestyle=":", label="offered")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("throughput (requests/s)")
    errors = ax.twinx()
    errors.plot(offered, [s.error_rate * 100 for s in probe.steps], "^-", color=ULTIMATE)
    errors.axhline(error_limit * 100, color=ULTIMATE, linestyle=":", linewidth=0.8)
    errors.set_ylabel("errors (%)", color=ULTIMATE)
    errors.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)


def render_html(record: CapacityRecord, size: tuple[int, int], *, aborted: str = "") -> str:
    w, h = size
    facts = [
        ("region", record.region),
        ("replica", record.replica),
        ("measured", _when(record.measured_at)),
        ("engine", record.engine_version or "unknown"),
        ("model", record.model or "unknown"),
        ("SLO", f"first-token p99 {record.slo.ttft_p99_s:g} s, errors {record.slo.error_rate:.2%}"),
        ("factor of safety", f"{record.factor_of_safety:g}"),
        ("R_base (cold, one replica)", f"{record.r_base_rps:.2f} rps"),
        ("beta (what a hit saves)", f"{record.beta:.3f}"),
        ("T_recover", recovery_text(record)),
        (
            "wasted work",
            "not measured"
            if record.wasted_work_share is None
            else f"{record.wasted_work_share:.1%}",
        ),
        (
            "scaling efficiency",
            f"{record.scaling_efficiency:.2f} "
            f"({'measured' if record.scaling_measured else 'assumed'}"
            f"{': ' + record.scaling_unmeasured if record.scaling_unmeasured else ''})",
        ),
        ("probe duration", f"{record.probe_s:.0f} s"),
        ("workload", _profile(record)),
    ]
    body = [
        f"<h1>Capacity probe: {_e(record.region)}</h1>",
        f'<p class="aborted">Aborted: {_e(aborted)}</p>' if aborted else "",
        "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts) + "</dl>",
        f'<img src="{CURVE}" width="{w}" height="{h}" alt="offered rate against first-token '
        'p99, throughput and errors, with the knee, ultimate and allowed load">',
        "<h2>Per probe</h2>",
        _probes_table(record),
        *(_steps_table(p) for p in record.probes),
    ]
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>capacity {_e(record.region)}</title><style>{CSS}</style></head><body>"
        + "\n".join(b for b in body if b)
        + "</body></html>\n"
    )


def _probes_table(record: CapacityRecord) -> str:
    head = "<tr><th>hit rate</th><th>baseline p99</th><th>knee</th><th>ultimate</th>"
    head += "<th>allowed</th><th>failure</th></tr>"
    rows = [
        f"<tr><td>{p.hit_rate:.0%}</td><td>{p.baseline_p99_s * 1000:.0f} ms</td>"
        f"<td>{_opt(p.knee_rps, 'rps')}</td>"
        f"<td>{p.ultimate_rps:.1f} rps{'' if p.ultimate_bounded else ' (at least)'}</td>"
        f"<td>{p.ultimate_rps / record.factor_of_safety:.1f} rps</td>"
        f"<td>{_opt(p.failure_rps, 'rps')}</td></tr>"
        for p in record.probes
    ]
    return "<table>" + head + "".join(rows) + "</table>"


def _steps_table(probe: HitProbe) -> str:
    head = (
        f"<h3>Steps at hit rate {probe.hit_rate:.0%}</h3><table><tr><th>offered</th>"
        "<th>p99 TTFT</th><th>errors</th><th>throughput</th><th>timeouts</th></tr>"
    )
    rows = [
        f"<tr><td>{s.offered_rps:.1f}</td><td>{s.p99_ttft_s * 1000:.0f} ms</td>"
        f"<td>{s.error_rate:.2%}</td><td>{s.throughput_rps:.1f}</td><td>{s.timeouts}</td></tr>"
        for s in sorted(probe.steps, key=lambda s: s.offered_rps)
    ]
    return head + "".join(rows) + "</table>"


def _profile(record: CapacityRecord) -> str:
    p = record.profile
    return (
        f"prompts p50 {p.prompt_tokens_p50} / p90 {p.prompt_tokens_p90} tokens, "
        f"{p.output_tokens} output tokens, {p.shared_prefix_share:.0%} shared prefixes "
        f"(from {p.source})"
    )


def recovery_text(record: CapacityRecord) -> str:
    """T_recover, or "did not recover within N s" when the recovery was watched for N s
    (``t_recover_window_s``, once the record carries it) and the replica was still over
    the SLA at its end; "not measured" only when it was not."""
    if record.t_recover_s is not None:
        return f"{record.t_recover_s:.2f} s"
    window = getattr(record, "t_recover_window_s", None)
    if isinstance(window, int | float):
        return f"did not recover within {window:g} s"
    return "not measured"


def _opt(value: float | None, unit: str) -> str:
    return "not measured" if value is None else f"{value:.2f} {unit}"


def _when(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaos.capacity.report",
        description="Draw a capacity probe's report again from its record.json.",
    )
    p.add_argument("record", type=Path, help="a probe's record.json (CapacityRecord)")
    args = p.parse_args(argv)
    try:
        record = CapacityRecord.model_validate_json(args.record.read_text())
    except OSError as e:
        print(f"cannot read {args.record}: {e.strerror}", file=sys.stderr)
        return 2
    except ValidationError as e:
        print(f"{args.record} is not a capacity record: {e}", file=sys.stderr)
        return 2
    print(write_report(record, args.record.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
