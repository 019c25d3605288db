"""The recovery bench's figures, from its request records: a window's TTFT
percentiles and cold requests (``window``), the window step by step (``slices``), the
p99 ratios, and the headline over rounds with its goal and the expected utilization
(``rho``). The bench itself is bench/recovery.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from bench._common import goals_and_met, percentile
from bench.recovery_load import HOME, Options, Rec


@dataclass(frozen=True)
class Goals:
    p99_ratio_recovery: float = 1.2  # graduated recovery's p99 ÷ steady p99


GOALS = Goals()


def window(
    records: Sequence[Rec], span: tuple[float, float], warmed: frozenset[int] = frozenset()
) -> dict[str, object]:
    """Figures of the requests sent within ``span``; ``warmed``: the tenants the recovery
    pre-warm replayed (their cold requests are counted apart)."""
    lo, hi = span
    rs = [r for r in records if lo <= r.sent < hi]
    ok = [r for r in rs if r.ttft_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    warm = [r.ttft_s for r in ok if r.ttft_s is not None and not r.cold]
    home = [r.ttft_s for r in ok if r.ttft_s is not None and r.region == HOME]
    cold = [r for r in ok if r.cold]
    return {
        "requests": len(rs),
        "errors": len(rs) - len(ok),
        "cold": len(cold),
        "cold_prewarmed": sum(r.tenant in warmed for r in cold),  # cold despite the pre-warm
        "cold_tenants": len({r.tenant for r in cold}),
        "home_share": round(len(home) / len(ok), 3) if ok else None,
        "p50_ms": _ms(ttfts, 50),
        "p99_ms": _ms(ttfts, 99),
        "max_ms": _ms(ttfts, 100),
        "p99_warm_ms": _ms(warm, 99),  # requests that hit the cache: queueing only
        "p99_home_ms": _ms(home, 99),
    }


def _ms(xs: Sequence[float], q: float) -> float | None:
    p = percentile(xs, q)
    return None if p is None else round(p * 1000, 2)


def slices(records: Sequence[Rec], span: tuple[float, float], step_s: float) -> dict[str, object]:
    """The window step by step: p99 and cold requests of each step interval."""
    lo, hi = span
    n = max(1, round((hi - lo) / step_s))
    edges = [(lo + i * step_s, lo + (i + 1) * step_s) for i in range(n)]
    per = [[r for r in records if a <= r.sent < b and r.ttft_s is not None] for a, b in edges]
    return {
        "p99_ms_by_step": [_ms([r.ttft_s for r in rs if r.ttft_s is not None], 99) for rs in per],
        "cold_by_step": [sum(r.cold for r in rs) for rs in per],
    }


def _ratio(a: object, b: object) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b > 0:
        return round(a / b, 3)
    return None


def _median(rounds: Sequence[dict[str, object]], name: str) -> float | None:
    xs = [float(v) for r in rounds if isinstance(v := r[name], int | float)]
    return None if len(xs) < len(rounds) or not xs else percentile(xs, 50)


def _each(rounds: Sequence[dict[str, object]], phase: str, name: str) -> list[object]:
    out = []
    for r in rounds:
        figs = r[phase]
        out.append(figs.get(name) if isinstance(figs, dict) else None)
    return out


def headline(
    o: Options, rounds: Sequence[dict[str, object]], requests: int, errors: int
) -> dict[str, object]:
    names = (
        "p99_ratio_recovery",
        "p99_ratio_all_at_once",
        "p99_warm_ratio_recovery",
        "p99_warm_ratio_all_at_once",
        *(("p99_ratio_recovery_cold",) if o.cold_arm else ()),
    )
    med = {n: _median(rounds, n) for n in names}
    pre = [r["prewarm"] for r in rounds]
    return {
        "bench": "recovery",
        **{n: None if v is None else round(v, 3) for n, v in med.items()},
        "p99_ms_steady": _each(rounds, "steady", "p99_ms"),
        "p99_ms_graduated": _each(rounds, "graduated", "p99_ms"),
        "p99_ms_all_at_once": _each(rounds, "all_at_once", "p99_ms"),
        "p50_ms_steady": _each(rounds, "steady", "p50_ms"),
        "cold_graduated": _each(rounds, "graduated", "cold"),
        "cold_all_at_once": _each(rounds, "all_at_once", "cold"),
        "cold_graduated_prewarmed": _each(rounds, "graduated", "cold_prewarmed"),
        "cold_tenants_graduated": _each(rounds, "graduated", "cold_tenants"),
        "recovery_prewarm": o.prewarm,
        "warm_first": o.warm_first,
        "cold_graduated_outside_k": _each(rounds, "graduated", "cold_outside_k"),
        "prewarm_s": [p.get("seconds") if isinstance(p, dict) else None for p in pre],
        "prewarm_tenants": [p.get("tenants") if isinstance(p, dict) else None for p in pre],
        "prewarm_warmed": [p.get("prefixes_warmed") if isinstance(p, dict) else None for p in pre],
        "requests_per_window": _each(rounds, "graduated", "requests"),
        "p99_ratio_recovery_rounds": [r["p99_ratio_recovery"] for r in rounds],
        "p99_ratio_all_at_once_rounds": [r["p99_ratio_all_at_once"] for r in rounds],
        "rounds": len(rounds),
        "requests": requests,
        "errors": errors,
        "window_s": o.window_s,
        "step_percent": o.step_percent,
        "step_interval_s": o.step_interval,
        "offered_rps": round(o.sessions_per_s * o.turns, 1),
        "cold_utilization": round(rho(o, cold=True), 3),
        "warm_utilization": round(rho(o, cold=False), 3),
        "cores": os.cpu_count(),
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        **goals_and_met(GOALS, {"p99_ratio_recovery": med["p99_ratio_recovery"]}),
    }


def rho(o: Options, *, cold: bool) -> float:
    """Home's utilization at full load (its slots busy ÷ slots) if every request were
    cold (whole prompt prefilled) or warm (only the ~20-token question and the partial
    last block, taken as one block plus 20 tokens)."""
    prefill = o.prompt_tokens + 20 if cold else 16 + 20
    service_s = prefill / o.prefill_rate + (o.max_tokens - 1) / o.decode_rate
    return o.sessions_per_s * o.turns * service_s / (o.replicas * o.engine_seqs)
