"""The control plane as ``python -m controlplane`` runs it, each leading tick's duration
and its ``decide()``'s written to a file (``bench scale``'s child process).

    python -m bench.scale_cp TIMES_FILE --topology T --id cp-1 --listen 127.0.0.1:0

Every flag after the file is ``python -m controlplane``'s. A test seam for the bench:
the loop's tick observer and its ``decide`` are wrapped, nothing else changes; each
line of the file is ``tick <ms>`` or ``decide <ms>``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import IO

import controlplane.loop as loop_module
from controlplane.__main__ import main as controlplane_main
from controlplane.core.actions import TickResult
from controlplane.metrics import ControlPlaneMetrics


def record_into(out: IO[str]) -> None:
    timed = ControlPlaneMetrics.tick_timed
    decide = loop_module.decide  # type: ignore[attr-defined]

    def tick_timed(self: ControlPlaneMetrics, seconds: float) -> None:
        out.write(f"tick {seconds * 1000:.3f}\n")
        out.flush()
        timed(self, seconds)

    def timed_decide(*args: object, **kwargs: object) -> TickResult:
        t = time.perf_counter()
        try:
            return decide(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            out.write(f"decide {(time.perf_counter() - t) * 1000:.3f}\n")

    ControlPlaneMetrics.tick_timed = tick_timed  # type: ignore[method-assign]
    loop_module.decide = timed_decide  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    with open(args[0], "a", encoding="utf-8") as out:
        record_into(out)
        return controlplane_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
