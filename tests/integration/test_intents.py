"""Operator intents end to end on a real etcd and a real replica: one pending intent per
region (a second command is refused at once, with the reason), every accepted one's
outcome readable by ``GetIntent`` and seen on ``WatchEvents``, and ``failoverctl
failover`` reporting a refusal by the leader instead of waiting for a switch.

The replica first follows a foreign leader (a key on a lease the test holds), so that
intents stay pending as long as the test needs; revoking that lease lets it lead."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health, Intent, RegionHealth
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.cp_harness import REGIONS, Running, fast_topology, reporting, running_replica
from tests.integration.test_failoverctl import ctl

pytestmark = pytest.mark.etcd


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"i{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


@dataclass
class HeldBack:
    run: Running
    store: EtcdStore
    keys: Keys
    let_lead: Callable[[], Awaitable[None]]

    async def pending(self) -> list[Intent]:
        page = await self.store.get_prefix(self.keys.intents_prefix())
        return [decode(Intent, kv.value, kv.key) for kv in page.kvs]


@contextlib.asynccontextmanager
async def held_back(topology: Topology) -> AsyncIterator[HeldBack]:
    """A replica that follows a foreign leader until ``let_lead()``; every region HEALTHY
    (as a leader folded it before) and reported healthy meanwhile."""
    keys = Keys(topology.cluster)
    store = EtcdStore(topology.etcd)
    await store.connect()
    lease = await store.grant_lease(60)
    assert await store.create(keys.leader(), b"someone-else", lease=lease)
    now = time.time()
    for r in REGIONS:
        health = RegionHealth(
            region=r,
            verdict=Health.HEALTHY,
            raw=Health.HEALTHY,
            good_streak=2,
            since=now,
            evaluated_at=now,
            signals={"load_rps": 10},
        )
        await store.put(keys.region_health(r), encode(health))

    async def let_lead() -> None:
        await store.revoke_lease(lease)

    try:
        async with running_replica(topology) as run, reporting(run.stub, {}):
            yield HeldBack(run, store, keys, let_lead)
    finally:
        await store.revoke_lease(lease)
        await store.close()


async def outcome(run: Running, intent_id: str, within: float = 20) -> pb.IntentStatus:
    """The intent's status once the leader decided it."""
    async with asyncio.timeout(within):
        while True:
            st = await run.stub.GetIntent(pb.GetIntentRequest(intent_id=intent_id))
            if st.state != pb.INTENT_PENDING:
                return st
            await asyncio.sleep(0.1)


async def event_of(events: AsyncIterable[pb.Event], intent_id: str) -> pb.Event:
    async with asyncio.timeout(20):
        async for ev in events:
            if ev.details.get("intent") == intent_id and ev.details.get("outcome") != "pending":
                return ev
    raise AssertionError(f"the stream ended before the outcome of {intent_id}")


async def refusal(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


async def test_two_concurrent_failovers_of_one_region_one_accepted_one_refused(
    topology: Topology,
) -> None:
    async with held_back(topology) as h:
        s = h.run.stub
        events = s.WatchEvents(pb.WatchEventsRequest(region="east"))
        answers = await asyncio.gather(
            s.RequestFailover(pb.FailoverRequest(region="east", reason="INC-1", actor="alice")),
            s.RequestFailover(pb.FailoverRequest(region="east", reason="INC-1", actor="bob")),
            return_exceptions=True,
        )
        accepted = [a for a in answers if isinstance(a, pb.FailoverResponse)]
        refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
        assert len(accepted) == 1 and len(refused) == 1, answers
        iid = accepted[0].intent_id
        assert accepted[0].accepted and iid
        assert refused[0].code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"pending failover intent {iid}" in (refused[0].details() or "")
        assert [i.id for i in await h.pending()] == [iid]  # the refused one stored nothing

        st = await s.GetIntent(pb.GetIntentRequest(intent_id=iid))
        assert st.state == pb.INTENT_PENDING and st.region == "east" and st.kind == "failover"
        # Still pending: a third is refused too, also as a dry run.
        again = await refusal(
            s.RequestFailover(pb.FailoverRequest(region="east", reason="x", dry_run=True))
        )
        assert again.code() == grpc.StatusCode.FAILED_PRECONDITION and iid in again.details()

        await h.let_lead()
        done = await outcome(h.run, iid)
        assert done.state == pb.INTENT_DONE and done.decided_by == "cp-a" and done.epoch >= 1
        assert done.detail == "NORMAL -> FAILING_OVER (fail_over)" and done.reason == "INC-1"
        ev = await event_of(events, iid)
        events.cancel()
        assert ev.action == "transition" and ev.details["outcome"] == "done"
        assert ev.decision.to_state == pb.FAILING_OVER and ev.decision.epoch == done.epoch
        assert await h.store.get(h.keys.intent_claim("east")) is None  # freed with it

        # Failed over now: refused at once, not only in the audit log.
        late = await refusal(s.RequestFailover(pb.FailoverRequest(region="east", reason="y")))
        assert late.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "already failed over" in late.details()

        bad = await refusal(s.GetIntent(pb.GetIntentRequest(intent_id="../x")))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        unknown = await refusal(s.GetIntent(pb.GetIntentRequest(intent_id="0123456789ab")))
        assert unknown.code() == grpc.StatusCode.NOT_FOUND


async def test_a_refusal_by_the_leader_is_read_back_and_failoverctl_reports_it(
    topology: Topology,
) -> None:
    """central -> west is pending when failoverctl asks west -> central: the API accepts
    both (each region's first), the leader carries out the first and refuses the second
    (its only target has failed over); the CLI says so and exits 1."""
    async with held_back(topology) as h:
        s = h.run.stub
        events = s.WatchEvents(pb.WatchEventsRequest(region="west"))
        first = await s.RequestFailover(
            pb.FailoverRequest(region="central", to=["west"], reason="drain central")
        )
        cli = asyncio.create_task(
            ctl(h.run.target, "failover", "west", "--to", "central", "-r", "drain west", "--yes")
        )
        async with asyncio.timeout(30):  # the CLI's intent is stored (pending)
            while True:
                if len(pending := await h.pending()) == 2:
                    break
                await asyncio.sleep(0.1)
        [second] = [i.id for i in pending if i.region == "west"]
        await h.let_lead()

        code, _, err = await cli
        assert code == 1, err
        assert f"accepted: intent {second}" in err and "refused by the leader" in err
        assert "central is itself failed over" in err
        assert (await outcome(h.run, first.intent_id)).state == pb.INTENT_DONE
        st = await outcome(h.run, second)
        assert st.state == pb.INTENT_REFUSED and "central is itself failed over" in st.detail
        ev = await event_of(events, second)
        events.cancel()
        assert ev.action == "intent_failover" and ev.result == f"refused: {st.detail}"
        assert ev.details["outcome"] == "refused"
        code, out, _ = await ctl(h.run.target, "intent", second)
        assert code == 1 and "refused" in out and "central is itself failed over" in out
