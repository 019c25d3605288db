"""The executor follows runbooks/degradation.yaml, not code (docs/architecture.md §5).

A simulated region fault (first-token latency rising, then errors, then healthy again)
drives the pure executor over time with the committed file: the steps are applied in
the file's order and restored in reverse. The same fault with a reordered copy of the
file executes in the new order. ``fault_script`` and ``executed`` are small on purpose:
the end-to-end version (leader writing ``degradation/<r>``, a real gateway) reuses them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.core.ladder_executor import ActionKind, LadderMode, Tick, mode_for, replay
from controlplane.kernel.config import ConfigError
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.ladder.model import Ladder, with_headroom
from controlplane.kernel.model import RegionState

RUNBOOK = Path(__file__).resolve().parent.parent / "runbooks" / "degradation.yaml"


def fault_script(baseline_s: float, fault_s: int = 60, calm_s: int = 60) -> list[Tick]:
    """One tick a second: TTFT climbs to 2.4x, 3.4x, then 4.4x baseline with errors
    rising to 3 % (DEGRADED), then the region is healthy again (recovering)."""
    ticks = []
    for t in range(fault_s):
        ttft, errors = (2.4, 0.001) if t < 10 else (3.4, 0.012) if t < 20 else (4.4, 0.03)
        signals = {"ttft_p99_s": ttft * baseline_s, "error_rate": errors}
        ticks.append(Tick(at=t, mode=LadderMode.DEGRADING, signals=signals))
    healthy = {"ttft_p99_s": 0.8 * baseline_s, "error_rate": 0.001}
    ticks += [
        Tick(at=t, mode=LadderMode.RECOVERING, signals=healthy)
        for t in range(fault_s, fault_s + calm_s)
    ]
    return ticks


def executed(ladder: Ladder, ticks: list[Tick]) -> tuple[list[str], list[str]]:
    """(steps applied, steps restored), in the order the executor did them."""
    actions = replay(ladder, "eu-west", ticks)
    applied = [a.step for a in actions if a.kind is ActionKind.APPLY and a.step]
    restored = [a.step for a in actions if a.kind is ActionKind.RESTORE and a.step]
    return applied, restored


def test_fault_degrades_in_file_order_and_recovers_in_reverse() -> None:
    ladder = load_ladder(RUNBOOK)
    applied, restored = executed(ladder, fault_script(ladder.baseline.ttft_p99_s))
    # A slow, erroring region gets every step but the last: shedding batch traffic
    # waits for the region to be past what it bears (or for errors over 5 %).
    assert ladder.names[-1] == "shed-batch"
    assert applied == list(ladder.names[:-1])
    assert restored == list(reversed(ladder.names[:-1]))


def test_reordered_file_changes_the_order(tmp_path: Path) -> None:
    data = yaml.safe_load(RUNBOOK.read_text())
    data["steps"] = [data["steps"][i] for i in (2, 0, 1)]
    copy = tmp_path / "degradation.yaml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    ladder = load_ladder(copy)
    applied, restored = executed(ladder, fault_script(ladder.baseline.ttft_p99_s))
    original = load_ladder(RUNBOOK).names
    assert applied == list(ladder.names) == [original[2], original[0], original[1]]
    assert restored == list(reversed(ladder.names))


def test_failover_target_short_of_headroom_walks_the_ladder() -> None:
    ladder = load_ladder(RUNBOOK)
    mode = mode_for(RegionState.NORMAL, short_of_headroom=True)
    # the target took the source's load: 85, 92, 97, then 104 % of its capacity
    loads = [85.0] * 10 + [92.0] * 10 + [97.0] * 10 + [104.0] * 10
    ticks = [
        Tick(at=t, mode=mode, signals=with_headroom({"load_rps": load}, capacity_rps=100.0))
        for t, load in enumerate(loads)
    ]
    applied, _ = executed(ladder, ticks)
    assert applied == list(ladder.names)


def test_ladder_that_degrades_basic_chat_is_rejected(tmp_path: Path) -> None:
    data = yaml.safe_load(RUNBOOK.read_text())
    data["steps"][0]["degrades"] = "basic_chat"
    bad = tmp_path / "degradation.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"steps\[0\]\.degrades: 'basic_chat' is never degraded"):
        load_ladder(bad)
