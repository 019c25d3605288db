"""T_recover: how long the replica takes to meet the SLA again after an overload. One
step at ``overload_factor`` x the cold ultimate, then the allowed rate (ultimate /
factor of safety) for ``recover_s``, timed until sliding windows of first-token p99
and errors are within the SLA again (None: it did not recover within ``recover_s``)."""

from __future__ import annotations

from dataclasses import replace

from chaos.capacity.probe_config import recovery_offsets
from chaos.capacity.results import RequestResult
from chaos.capacity.stats import recovery_time, step_figures
from chaos.capacity.steps import StepRunner
from chaos.capacity.verdicts import Phase
from controlplane.kernel.capacity.bearing import Step


def _shift(r: RequestResult, by: float) -> RequestResult:
    """A result with its times moved by ``by`` (a later segment read as its own step)."""
    first = None if r.first_token_s is None else r.first_token_s + by
    return replace(
        r,
        planned_s=r.planned_s + by,
        sent_s=r.sent_s + by,
        first_token_s=first,
        done_s=r.done_s + by,
    )


async def measure_recovery(
    runner: StepRunner, url: str, ultimate_rps: float, baseline: Step
) -> float | None:
    """T_recover after a step at ``overload_factor`` x the ultimate (cold), run again
    (like a step) while the generator falls behind during the recovery."""
    c = runner.config
    over, after = recovery_offsets(c, ultimate_rps)
    segments = (
        (Phase.OVERLOAD, c.overload_factor * ultimate_rps, c.step_s),
        (Phase.RECOVER, ultimate_rps / c.factor_of_safety, c.recover_s),
    )
    for attempt in range(c.behind_retries + 1):
        tag = f"{runner.run_id}:recover:{attempt}"
        results = await runner.gen.run(runner.plan([url], [*over, *after], False, tag))
        runner.results += results
        drain_s = await runner.watch.drain([url], Phase.RECOVER)
        parts = (results[: len(over)], [_shift(r, -c.step_s) for r in results[len(over) :]])
        behind = False
        for index, ((phase, rate, span), part) in enumerate(zip(segments, parts, strict=True)):
            figs = step_figures(part, rate, span, c.request_timeout_s)
            # the overload step is far over the SLA by design: only the recovery counts
            behind = behind or (phase is Phase.RECOVER and runner.behind(figs))
            runner.report(phase, index, figs, drain_s if index else 0.0, baseline, attempt)
        if not behind:
            break
    return recovery_time(results, c.step_s, c.step_s + c.recover_s, c.recover_window_s, c.slo)
