"""What the warm pool tells its owner, and what it does when nobody listens.

Three hooks, each optional: ``on_change(snapshot)`` when the ACTIVE set, what is lent or
the loan refusals change (the agent publishes ``pools/<region>``); ``on_activation(kind,
ok, seconds)`` after each wake or resume (the agent's metrics); ``on_state(before,
after)`` on every state change of a replica (the pod labels on Kubernetes). An absent
one is a feature off: :class:`PoolHooks` puts a no-op in its place once, names it in
``off`` (the pool logs that once, at start), and calls the rest without a check at
each call. A hook that raises is logged and ignored: a publishing, metrics or labelling
bug must not wedge the pool. Pure: no I/O."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from regions.pool.snapshot import PoolSnapshot
from regions.pool.states import Replica

log = logging.getLogger("tectonic.pool")
ActivationKind = Literal["wake", "resume"]
OnChange = Callable[[PoolSnapshot], None]
OnActivation = Callable[[ActivationKind, bool, float], None]  # kind, ok, seconds
OnState = Callable[[Replica, Replica], None]  # a replica before and after a state change


def _no_change(snapshot: PoolSnapshot) -> None:
    pass


def _no_activation(kind: ActivationKind, ok: bool, seconds: float) -> None:
    pass


def _no_state(before: Replica, after: Replica) -> None:
    pass


@dataclass(frozen=True, slots=True)
class PoolHooks:
    """The pool's three hooks, never None; build with :meth:`of`."""

    on_change: OnChange
    on_activation: OnActivation
    on_state: OnState
    off: tuple[str, ...] = ()  # what nobody listens to, for the pool's one log line

    @classmethod
    def of(
        cls,
        on_change: OnChange | None = None,
        on_activation: OnActivation | None = None,
        on_state: OnState | None = None,
    ) -> PoolHooks:
        off = (
            *(["change notices (no on_change)"] if on_change is None else []),
            *(["activation metrics (no on_activation)"] if on_activation is None else []),
            *(["replica state labels (no on_state)"] if on_state is None else []),
        )
        return cls(
            on_change or _no_change, on_activation or _no_activation, on_state or _no_state, off
        )

    def changed(self, snapshot: PoolSnapshot) -> None:
        try:
            self.on_change(snapshot)
        except Exception:  # a publishing bug must not wedge the pool; it is logged
            log.exception("warm pool on_change callback failed")

    def activated(self, kind: ActivationKind, ok: bool, seconds: float) -> None:
        try:
            self.on_activation(kind, ok, seconds)
        except Exception:  # a metrics bug must not wedge the pool; it is logged
            log.exception("warm pool on_activation callback failed")

    def state_changed(self, before: Replica, after: Replica) -> None:
        try:
            self.on_state(before, after)
        except Exception:  # a labelling bug must not wedge the pool; it is logged
            log.exception("warm pool on_state callback failed")
