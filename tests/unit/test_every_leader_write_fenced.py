"""Every write the leader makes is fenced, and apply reads nothing.

The leader writes from three places: the tick's writes (the orchestrator), the catalogs
(the prefix aggregator, a job) and the agents' check (its reports, beside the ticks).
All three go through ``controlplane/fenced.py``. A real loop, orchestrator and
aggregator over an in-memory store that records each call: through a failover, an
operator intent with its claim, a catalog and the agents' reports, every key written by
the leader is written in a transaction that carries the leader's fence; and
``Orchestrator.apply`` reads nothing (what a write depends on came with the snapshot)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from controlplane.cluster import Cluster
from controlplane.core.intents import IntentStatus
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    Health,
    HealthReport,
    Intent,
    IntentKind,
    ObserverKind,
)
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Compare, KeyValue, Op, Page, TxnResult
from controlplane.loop import ReconcileLoop
from controlplane.orchestrator import Orchestrator
from controlplane.prefix_aggregator import PrefixAggregator
from controlplane.prewarm import NoPrefixData
from controlplane.reports import PROBE_OBSERVER
from tests.unit.test_prefix_aggregator import CFG, gateway
from tests.unit.world import World, topology

ME = b"cp"


class RecordingStore(MemoryStore):
    """Records the writes made while ``by_test`` is off (the leader's), and refuses
    every read while ``reads_refused`` is on."""

    def __init__(self) -> None:
        super().__init__()
        self.by_test = True
        self.reads_refused = False
        self.txns: list[tuple[list[Compare], list[Op]]] = []
        self.plain: list[str] = []  # put / delete / create / cas by the leader

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        if not self.by_test:
            self.txns.append((list(compares), [*success, *failure]))
        return await super().txn(compares, success, failure)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        if not self.by_test:
            self.plain.append(f"put {key}")
        return await super().put(key, value, lease=lease)

    async def delete(self, key: str) -> bool:
        if not self.by_test:
            self.plain.append(f"delete {key}")
        return await super().delete(key)

    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        assert not self.reads_refused, f"apply read {key}"
        return await super().get(key, revision=revision)

    async def get_prefix(self, prefix: str, *, page_size: int = 10_000, revision: int = 0) -> Page:
        assert not self.reads_refused, f"apply read {prefix}"
        return await super().get_prefix(prefix, page_size=page_size, revision=revision)


class Leader:
    is_leader = True

    def __init__(self, keys: Keys) -> None:
        self.mark = Compare.value_is(keys.leader(), ME)

    def fence(self) -> list[Compare]:
        return [self.mark]

    async def wait_changed(self) -> bool:
        await asyncio.Event().wait()
        return True


class ReportingProber:
    """The agents' check: every region's agent answers, us-east's as down."""

    def __init__(self, regions: Sequence[str], clock: object) -> None:
        self.regions, self.down, self.clock = regions, "", clock

    async def sweep(self, report: Callable[[HealthReport], None]) -> None:
        now = self.clock.now()  # type: ignore[attr-defined]
        for r in self.regions:
            report(
                HealthReport(
                    region=r,
                    observer=PROBE_OBSERVER,
                    kind=ObserverKind.PROBE,
                    health=Health.UNHEALTHY if r == self.down else Health.HEALTHY,
                    received_at=now,
                )
            )


class NoReadsInApply(Orchestrator):
    async def apply(self, result):  # type: ignore[no-untyped-def]
        store: RecordingStore = self.store  # type: ignore[assignment]
        store.reads_refused = True
        try:
            return await super().apply(result)
        finally:
            store.reads_refused = False


def test_every_key_the_leader_writes_is_written_under_its_fence() -> None:
    w = World(topo=topology().model_copy(update={"prefixes": CFG}))
    store = RecordingStore()
    w.store = store
    clock = type("C", (), {"now": lambda _self: w.now})()
    leader = Leader(w.keys)
    catalogs = PrefixAggregator(store, w.keys, CFG, clock, leader.fence, regions=w.topo.names)
    cluster = Cluster(store, w.keys, w.topo, clock)
    orch = NoReadsInApply(cluster, leader.fence, NoPrefixData(), "cp", catalogs=catalogs)
    w.orchestrator = orch
    prober = ReportingProber(w.topo.names, clock)
    loop = ReconcileLoop(orch, leader, prober=prober)

    async def ticks(n: int, down: str = "") -> None:
        prober.down = down
        for _ in range(n):
            w.now += 1.0
            for r in w.topo.names:
                w.report(r, "agent:" + r, Health.UNHEALTHY if r == down else Health.HEALTHY)
            store.by_test = True
            await w._push()
            store.by_test = False
            await loop.tick()
            for _ in range(20):  # the jobs' and the check's turns of the event loop
                await asyncio.sleep(0)
            store.by_test = True
            await w._pull()

    async def main() -> None:
        await store.put(w.keys.leader(), ME)
        await store.put(w.keys.prefix_export("gw-a"), gateway(["a", "b", "c"], region="us-west"))
        await ticks(3)
        # operators' intents and their claims, as the API stores them: one carried
        # out, one refused (eu-west has no other region in its zone)
        for iid, region in (("i-1", "us-central"), ("i-2", "eu-west")):
            intent = Intent(
                id=iid,
                kind=IntentKind.FAILOVER,
                region=region,
                reason="INC-7",
                actor="op",
                created_at=w.now,
            )
            await store.put(w.keys.intent(intent.id), encode(intent))
            await store.put(w.keys.intent_claim(region), encode(intent))
        await ticks(4, down="us-east")  # and a blackout of us-east
        await loop.stop_probe()

    asyncio.run(main())
    assert w.state("us-east") == "FAILING_OVER" and w.state("us-central") == "FAILING_OVER"
    assert w.outcomes["i-1"].status is IntentStatus.DONE
    assert w.outcomes["i-2"].status is IntentStatus.REFUSED
    written = {op.key for _, ops in store.txns for op in ops}
    k = w.keys
    # what each writer wrote is among them: the tick's, the aggregator's, the check's
    assert {k.region_state("us-east"), k.routing("us-east")} <= written
    assert {k.intent_claim("us-central"), k.intent_claim("eu-west")} <= written  # freed
    assert k.prefixes("us-west") in written
    assert k.report("us-east", PROBE_OBSERVER) in written
    assert store.plain == [], "a leader write outside a transaction"
    unfenced = [ops for compares, ops in store.txns if leader.mark not in compares]
    assert unfenced == []
