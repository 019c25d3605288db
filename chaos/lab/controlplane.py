"""A control-plane replica for the lab whose pre-warm step only waits.

    python -m chaos.lab.controlplane --prewarm-hold-s 2 --topology T --id cp-1 --listen ...

Every flag but ``--prewarm-hold-s`` is ``python -m controlplane``'s. Each failover then
stays in its pre-warm step for that long (or its budget, if shorter), so that a drill or
a bench can kill the leader in the middle of it and watch the next one resume. It is a
test seam, injected through ``ControlPlaneReplica(prewarmer=...)``; the product has no
such setting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from controlplane.__main__ import main as controlplane_main
from controlplane.kernel.model import FailoverPlan, PrewarmFigures


class HoldPrewarmer:
    """Warms nothing; holds the failover in its pre-warm step for ``hold_s``."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s

    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> PrewarmFigures:
        await asyncio.sleep(min(self.hold_s, budget_s))
        return PrewarmFigures(prefixes_total=0.0, prefixes_warmed=0.0, held_s=self.hold_s)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--prewarm-hold-s", type=float, required=True)
    ns, rest = p.parse_known_args(argv)
    if not 0 < ns.prewarm_hold_s <= 600:
        p.error("--prewarm-hold-s must be in (0, 600]")
    return controlplane_main(rest, prewarmer=lambda: HoldPrewarmer(ns.prewarm_hold_s))


if __name__ == "__main__":
    sys.exit(main())
