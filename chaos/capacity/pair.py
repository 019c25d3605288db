"""The scaling efficiency: both replicas probed at once, cold, each offered the same
arrivals at the same per-replica rate (its own unique prompts), the SLA judged over
both, up to the single ultimate (sustained steps timed by the single replica's
saturation); the pair's ultimate per replica over the single one's, at most 1 (see
:func:`chaos.capacity.verdicts.scaling`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from chaos.capacity.phases import PhaseResult, run_phase
from chaos.capacity.steps import StepRunner
from chaos.capacity.verdicts import Phase, ProbeAborted, scaling

log = logging.getLogger("tectonic.capacity")


async def pair_scaling(
    runner: StepRunner, cold: PhaseResult, urls: Sequence[str]
) -> tuple[float, bool, str]:
    """The scaling efficiency, whether it was measured, and why not. A pair probe that
    aborts (the second replica restarts, will not drain, misses the SLA at once) costs
    only the efficiency: the single replica's figures stand, 1.0 is assumed and said."""
    if len(urls) < 2:
        return 1.0, False, ""
    single = cold.curve.ultimate_rps
    if not cold.curve.ultimate_bounded:
        why = (
            f"no step broke the SLA on one replica (its ultimate {single:.4g} rps is a lower "
            "bound): nothing to compare the pair to"
        )
    else:
        try:
            pair = await run_phase(
                runner, Phase.PAIR, urls, False, 0.5 * single, single, cold.curve.saturation_rps
            )
        except ProbeAborted as e:
            why = f"the pair's probe aborted: {e.reason}"
        else:
            return scaling(single, pair.curve), True, ""
    log.warning("%s; the scaling efficiency is assumed 1.0", why)
    return 1.0, False, why
