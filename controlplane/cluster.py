"""What every part of the leader's cycle stands on, passed as one object."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.clock import Clock
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.port import Store


@dataclass(frozen=True)
class Cluster:
    """The store, the cluster's keys, its topology and the clock: the orchestrator and
    the loop share one (the loop takes it from its orchestrator)."""

    store: Store
    keys: Keys
    topology: Topology
    clock: Clock
