"""``PoolSnapshot``: the warm pool as its owner sees it at one moment (what the agent
publishes, what ``--json`` prints, what the metrics read at each scrape). Pure."""

from __future__ import annotations

from pydantic import Field

from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.sizing import PoolSizeReport
from regions.pool.states import PoolTarget, Replica, ReplicaState


class PoolSnapshot(Frozen):
    """The pool as the agent publishes it (and ``--json`` prints it)."""

    replicas: tuple[Replica, ...]
    target: PoolTarget
    shortfall: int = 0  # ACTIVE replicas wanted and not yet reachable
    notes: tuple[str, ...] = ()  # the last plan's deferred moves and shortages
    size: PoolSizeReport | None = None  # configured warm count vs the configured burst
    loan_refusals: dict[str, str] = Field(default_factory=dict)  # loan id -> why not
    # replicas/s the pool's last batches of wakes achieved (None: none measured yet)
    activation_rate: float | None = None

    def urls(self, state: ReplicaState) -> list[str]:
        return [r.url for r in self.replicas if r.state is state and r.url is not None]

    def lent(self) -> dict[str, str]:
        """Loan id -> the URL of the replica lent for it."""
        return {
            r.loan: r.url
            for r in self.replicas
            if r.state is ReplicaState.LENT and r.loan is not None and r.url is not None
        }
