"""Whether the store takes this replica's writes, pure (docs/reliability.md, "etcd full").

When etcd refuses writes (its NOSPACE alarm at the quota, or any permanent refusal of
the leader's writes) the leader cannot record a transition, a failover or a session
move: the states in etcd are then the last ones written, not what is true now. Status
and metrics must not show them as current; they show every region's state as
UNKNOWN until the store takes writes again.

Two signals, either is enough: the store's alarms (any replica reads them every tick,
so followers answer status truthfully too), and a leader's tick that failed on a
permanent store error. A refusal without an alarm ends with the next tick that
completes; an alarm ends when it is disarmed.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.model import Frozen

# etcd's alarms that mean writes are refused (CORRUPT also stops writes on that member).
REFUSING_ALARMS = frozenset({"NOSPACE", "CORRUPT"})


class StoreWritesView(Frozen):
    """What status shows of the store."""

    writable: bool
    reason: str = ""  # why not, for a person
    since: float = 0.0  # Unix time the refusal was first seen (0 while writable)
    alarms: tuple[str, ...] = ()


@dataclass
class StoreWrites:
    """The refusals one replica has seen; ``view()`` is what it reports."""

    _alarms: tuple[str, ...] = ()
    _refusal: str = ""  # the last tick's permanent store error, if it failed on one
    _since: float = 0.0

    def alarms_read(self, alarms: list[str], now: float) -> None:
        self._alarms = tuple(sorted(a for a in set(alarms) if a in REFUSING_ALARMS))
        self._mark(now)

    def tick_failed(self, error: str, now: float) -> None:
        self._refusal = error
        self._mark(now)

    def tick_completed(self, now: float) -> None:
        self._refusal = ""
        self._mark(now)

    @property
    def writable(self) -> bool:
        return not self._alarms and not self._refusal

    def view(self) -> StoreWritesView:
        if self.writable:
            return StoreWritesView(writable=True)
        if self._alarms:
            reason = (
                f"etcd alarm {', '.join(self._alarms)}: the store refuses writes "
                "(runbooks/etcd-space.md)"
            )
        else:
            reason = f"the store refused the leader's writes: {self._refusal}"
        return StoreWritesView(
            writable=False, reason=reason, since=self._since, alarms=self._alarms
        )

    def _mark(self, now: float) -> None:
        if self.writable:
            self._since = 0.0
        elif not self._since:
            self._since = now
