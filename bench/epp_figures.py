"""``python -m bench epp``'s figures: each path's line, and the headline (what each
picker path adds to Envoy direct and keeps of its throughput, against the goals)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench._common import goals_and_met, percentile
from bench.epp_deploy import PICKER_MODES
from bench.epp_load import Options, Phase, Side


@dataclass(frozen=True)
class Goals:
    added_ms_p50_header: float = 1.0
    added_ms_p50_body: float = 2.0
    throughput_ratio_header: float = 0.6
    throughput_ratio_body: float = 0.6


GOALS = Goals()


def _pct(values: Sequence[float], q: float) -> float:
    p = percentile(values, q)
    return math.nan if p is None else p


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _per_request(seconds: Mapping[str, float], n: int) -> dict[str, float]:
    return {name: round(s * 1000 / n, 3) if n else 0.0 for name, s in sorted(seconds.items())}


def cpu_per_request(side: Side) -> dict[str, float]:
    """CPU ms per request by process (the path's own Envoy; 0 where the path has
    none); the two simulators as one figure."""
    cpu = {k: v for k, v in side.cpu_s.items() if not k.startswith("sim")}
    cpu["simulators"] = sum(v for k, v in side.cpu_s.items() if k.startswith("sim"))
    cpu.setdefault("envoy", 0.0)
    return _per_request(cpu, len(side.latencies))


def path_line(path: str, lat: Side, thr: Side, opts: Options) -> dict[str, object]:
    """One path's figures, both phases."""
    line: dict[str, object] = {
        "path": path,
        "latency": {
            "requests": len(lat.latencies),
            "first_byte_p50_ms": _ms(_pct(lat.first_byte, 50)),
            "first_byte_p99_ms": _ms(_pct(lat.first_byte, 99)),
            "p50_ms": _ms(_pct(lat.latencies, 50)),
            "p99_ms": _ms(_pct(lat.latencies, 99)),
        },
        "throughput": {
            "requests": len(thr.latencies),
            "concurrency": opts.concurrency,
            "rps": round(thr.rps, 1),
            "p50_ms": _ms(_pct(thr.latencies, 50)),
            "p99_ms": _ms(_pct(thr.latencies, 99)),
        },
        "cpu_ms_per_request": cpu_per_request(thr),
    }
    if path in PICKER_MODES:
        line["picker_threads_cpu_ms_per_request"] = _per_request(thr.threads_s, len(thr.latencies))
    return line


def _added(lat: Phase, path: str, q: float, *, first_byte: bool = False) -> float:
    """``path``'s q-th latency percentile minus Envoy direct's, in ms."""

    def values(side: Side) -> list[float]:
        return side.first_byte if first_byte else side.latencies

    return (_pct(values(lat.total[path]), q) - _pct(values(lat.total["direct"]), q)) * 1000


def _ratio(thr: Phase, path: str) -> float:
    ratios = thr.round_ratios(path)
    return _pct(ratios, 50) if ratios else 0.0


def _cpu_ms(thr: Phase, path: str, process: str) -> float:
    side = thr.total[path]
    n = len(side.latencies)
    return side.cpu_s.get(process, 0.0) * 1000 / n if n else math.nan


def against_direct(lat: Phase, thr: Phase, path: str) -> dict[str, object]:
    """What one path adds to Envoy direct, and what it keeps of its throughput."""
    return {
        "added_ms_p50": round(_added(lat, path, 50), 3),
        "added_ms_p99": round(_added(lat, path, 99), 3),
        "added_ms_p50_first_byte": round(_added(lat, path, 50, first_byte=True), 3),
        "added_ms_p99_first_byte": round(_added(lat, path, 99, first_byte=True), 3),
        "throughput_ratio": round(_ratio(thr, path), 3),
        "throughput_ratio_rounds": [round(r, 3) for r in thr.round_ratios(path)],
        "cpu_ms_per_request": cpu_per_request(thr.total[path]),
    }


def headline(opts: Options, lat: Phase, thr: Phase) -> dict[str, object]:
    figures = {
        "added_ms_p50_header": _added(lat, "header", 50),
        "added_ms_p99_header": _added(lat, "header", 99),
        "added_ms_p50_body": _added(lat, "body", 50),
        "throughput_ratio_header": _ratio(thr, "header"),
        "throughput_ratio_body": _ratio(thr, "body"),
        "picker_cpu_ms_per_request_header": _cpu_ms(thr, "header", "picker"),
        "picker_cpu_ms_per_request_body": _cpu_ms(thr, "body", "picker"),
        "gateway_cpu_ms_per_request": _cpu_ms(thr, "gateway", "gateway"),
    }
    streaming = f"1 in {opts.stream_every}" if opts.stream_every else "none"
    direct = thr.total["direct"]
    return {
        "bench": "epp",
        "cores": os.cpu_count(),
        "mix": f"chat completions with x-session-id, {streaming} streaming",
        "requests_per_path": {
            "latency": opts.requests * opts.blocks,
            "throughput": opts.throughput_requests * opts.blocks,
        },
        "concurrency": {"latency": 1, "throughput": opts.concurrency},
        **{k: round(v, 3) for k, v in figures.items()},
        "direct": {
            "p50_ms": _ms(_pct(lat.total["direct"].latencies, 50)),
            "p99_ms": _ms(_pct(lat.total["direct"].latencies, 99)),
            "rps": round(direct.rps, 1),
            "cpu_ms_per_request": cpu_per_request(direct),
        },
        "paths": {path: against_direct(lat, thr, path) for path in lat.total if path != "direct"},
        **goals_and_met(
            GOALS,
            figures,
            at_least={"throughput_ratio_header", "throughput_ratio_body"},
        ),
    }
