"""An upgrade to model pools changes nothing for a deployment without them: etcd state
written by the release before pools (``state_before_pools.json``: a failover of
us-east under way and a pinned session, as the leader and a gateway of commit 769da5b
stored them, made with this world and dumped key by key) is read and carried on by
this release with the same topology: the failover recovers, the pin is where it was."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from controlplane.kernel.model import Health
from controlplane.kernel.sessions.store import SessionStore
from tests.unit.world import World

STATE = json.loads((Path(__file__).parent / "state_before_pools.json").read_text())
REGIONS = ("us-east", "us-west", "us-central", "eu-west")


class _Clock:
    def __init__(self, world: World) -> None:
        self.world = world

    def now(self) -> float:
        return self.world.now


def test_state_from_before_pools_is_carried_on_unchanged() -> None:
    w = World(now=STATE["now"])

    async def load() -> None:
        for key, value in STATE["kvs"].items():
            await w.store.put(key, value.encode())
        await w._pull()

    asyncio.run(load())
    assert w.state("us-east") == "FAILING_OVER"
    assert set(w.targets("us-east")) == {"us-west", "us-central"}
    for _ in range(20):
        for r in REGIONS:
            w.all_report(r, Health.HEALTHY)
        w.tick()
    assert all(w.state(r) == "NORMAL" for r in REGIONS)
    sessions = SessionStore(w.store, w.keys, regions=REGIONS, clock=_Clock(w))
    got = asyncio.run(sessions.get("conv-7"))
    assert got is not None and got[0].region == "us-west"
    # nothing this release wrote is keyed by a pool
    assert not [k for k in w._pulled if k.count("/") > 4 and "/sessions/" in k]
