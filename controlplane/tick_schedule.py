"""When the reconcile loop's next periodic tick is due (docs/architecture.md §7.1).

Fixed rate: periodic ticks keep their schedule whatever a tick costs, and an early
tick (woken by a watch or a job) does not push the next periodic one back. A tick
that overruns its period is followed by one tick at once, not by one per period it
missed: the missed periods are dropped, not replayed, and the schedule starts again
from that tick's end. Ticks never overlap (the loop runs one at a time), and each
decides on a snapshot read when it starts, so a late tick acts on what etcd holds
then, never on what an earlier, slower one saw.
"""

from __future__ import annotations


class TickSchedule:
    def __init__(self, period_s: float, start: float) -> None:
        self.period_s = period_s
        self.next_at = start  # the first tick is due at once

    def ended(self, now: float) -> float:
        """A tick ended at ``now``: the seconds to wait for the next periodic one (0: at
        once), unless something wakes the loop earlier."""
        if now >= self.next_at:  # this was the periodic tick (or it overran)
            self.next_at = max(self.next_at + self.period_s, now)
        return max(0.0, self.next_at - now)
