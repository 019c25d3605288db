"""SessionStore on the in-memory store: races, re-pins, shared bucket leases, expiry,
operator pins (behaviour only). That a failover re-pins nothing in the background is
``tests/unit/test_failover_repins_nothing.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditEntry, Routing
from controlplane.kernel.sessions.resolve import PinAction, SessionPin
from controlplane.kernel.sessions.store import InvalidSessionId, SessionStore
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Compare, KeyValue, Op, TxnResult

REGIONS = ("us-east", "us-west", "us-central", "eu-west")
NORMAL = {r: Routing(targets={r: 1.0}) for r in REGIONS}
EAST_DOWN = {**NORMAL, "us-east": Routing(targets={"us-west": 0.6, "us-central": 0.4}, epoch=1)}
EAST_BACK = {**NORMAL, "us-east": Routing(targets={"us-east": 1.0}, epoch=2)}
T0 = 60.0 * 20_000  # the start of a 60 s bucket, so that tests know where buckets end


class RacyStore(MemoryStore):
    """Yields to the loop before each read and transaction, so that concurrent callers
    interleave as they do over a network; records the transactions that lost a race."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock.now)
        self.lost: list[str] = []  # first key of each transaction whose compare failed

    async def get(self, key: str) -> KeyValue | None:
        await asyncio.sleep(0)
        return await super().get(key)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        await asyncio.sleep(0)
        result = await super().txn(compares, success, failure)
        if not result.succeeded and success:
            self.lost.append(success[0].key)
        return result


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(clock: FakeClock) -> RacyStore:
    return RacyStore(clock)


def sessions(store: MemoryStore, clock: FakeClock, keys: Keys, writer: str = "gw1") -> SessionStore:
    return SessionStore(store, keys, regions=REGIONS, clock=clock, writer=writer)


async def stored(store: MemoryStore, keys: Keys, sid: str) -> tuple[SessionPin, KeyValue]:
    kv = await MemoryStore.get(store, keys.session(sid))
    assert kv is not None, sid
    return decode(SessionPin, kv.value), kv


async def test_two_gateways_racing_for_a_new_session_agree(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    later = FakeClock(T0 + 5)  # the second gateway's pin would differ in pinned_at
    gw1, gw2 = sessions(store, clock, keys, "gw1"), sessions(store, later, keys, "gw2")
    a, b = await asyncio.gather(
        gw1.resolve("chat-1", "us-east", NORMAL), gw2.resolve("chat-1", "us-east", NORMAL)
    )
    assert a.pin == b.pin and a.region == b.region == "us-east"
    assert sorted([a.action, b.action]) == sorted([PinAction.CREATE, PinAction.KEEP])
    pin, kv = await stored(store, keys, "chat-1")
    assert pin == a.pin and kv.version == 1  # written once
    assert store.lost.count(keys.session("chat-1")) == 1  # the loser's create did race
    # Both gateways attach to the one lease of the bucket.
    assert gw1.leases.granted + gw2.leases.granted == 1


async def test_repin_is_a_cas_and_racing_repins_move_once(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw1, gw2 = sessions(store, clock, keys, "gw1"), sessions(store, clock, keys, "gw2")
    created = await gw1.resolve("s1", "us-east", NORMAL)
    assert created.action is PinAction.CREATE
    clock.advance(10)
    a, b = await asyncio.gather(
        gw1.resolve("s1", "us-east", EAST_DOWN), gw2.resolve("s1", "us-east", EAST_DOWN)
    )
    assert a.region == b.region and a.region in ("us-west", "us-central")
    assert sorted([a.action, b.action]) == sorted([PinAction.REPIN, PinAction.KEEP])
    pin, kv = await stored(store, keys, "s1")
    assert pin.moves == 1 and pin.epoch == 1 and pin.home == "us-east" and kv.version == 2
    assert store.lost == [keys.session("s1")]  # the loser's CAS failed; it re-read


async def test_a_moved_session_never_bounces_back(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await gw.resolve("s1", "us-east", NORMAL)
    moved = await gw.resolve("s1", "us-east", EAST_DOWN)
    _, before = await stored(store, keys, "s1")
    for routings in (EAST_DOWN, EAST_BACK, NORMAL):
        again = await gw.resolve("s1", "us-east", routings)
        assert again.action is PinAction.KEEP and again.region == moved.region
    pin, kv = await stored(store, keys, "s1")
    assert pin.moves == 1 and kv.mod_revision == before.mod_revision  # KEEP wrote nothing


async def test_one_lease_per_bucket_for_a_thousand_sessions(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    for i in range(1000):
        await gw.resolve(f"s{i}", REGIONS[i % 3], NORMAL)
        clock.advance(0.05)  # 50 s in all: one bucket
    page = await store.get_prefix(keys.sessions_prefix())
    assert len(page.kvs) == 1000
    assert len({kv.lease for kv in page.kvs}) == 1 and page.kvs[0].lease != 0
    assert gw.leases.granted == 1


async def test_sessions_expire_with_their_bucket_unless_used_again(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)  # ttl 3600 s, buckets of 60 s
    await gw.resolve("used", "us-east", NORMAL)
    await gw.resolve("idle", "us-east", NORMAL)
    _, first = await stored(store, keys, "used")

    clock.advance(1800)  # a later bucket: the next use re-attaches, once
    await gw.resolve("used", "us-east", NORMAL)
    _, touched = await stored(store, keys, "used")
    assert touched.lease != first.lease and touched.value == first.value
    await gw.resolve("used", "us-east", NORMAL)  # same bucket: no second write
    _, again = await stored(store, keys, "used")
    assert again.mod_revision == touched.mod_revision

    clock.advance(3660 - 1800)  # the first bucket's lease ends (ttl + bucket)
    store.expire_leases()
    assert await gw.get("idle") is None
    assert await gw.get("used") is not None
    clock.advance(1800)
    store.expire_leases()
    assert await gw.get("used") is None


async def test_a_vanished_bucket_lease_is_granted_again(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await gw.resolve("a", "us-east", NORMAL)
    _, kv = await stored(store, keys, "a")
    await store.revoke_lease(kv.lease)  # e.g. revoked by hand; its sessions go with it
    res = await gw.resolve("b", "us-east", NORMAL)
    assert res.action is PinAction.CREATE
    _, b = await stored(store, keys, "b")
    assert b.lease not in (0, kv.lease) and gw.leases.granted == 2


async def test_bad_input_is_refused_with_the_rule(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    for bad in ("", "a/b", "x" * 257, "caf\u00e9", "tab\there"):
        with pytest.raises(InvalidSessionId, match="printable ASCII"):
            await gw.resolve(bad, "us-east", NORMAL)
    await gw.resolve("x" * 256, "us-east", NORMAL)  # the longest allowed
    with pytest.raises(ValueError, match="unknown home region 'mars'; known regions: us-east"):
        await gw.resolve("ok", "mars", NORMAL)
    with pytest.raises(ValueError, match="unknown region region 'mars'"):
        await gw.pin("ok", "mars", actor="alice", reason="test")
    with pytest.raises(ValueError, match="reason"):
        await gw.pin("ok", "us-west", actor="alice", reason=" ")


async def test_operator_pin_is_audited_in_the_same_transaction(
    store: RacyStore, clock: FakeClock, keys: Keys
) -> None:
    gw = sessions(store, clock, keys)
    await gw.resolve("s1", "us-east", NORMAL)
    pin = await gw.pin("s1", "us-west", actor="alice", reason="customer asked")
    assert (pin.home, pin.region, pin.moves) == ("us-east", "us-west", 1)
    new = await gw.pin("s2", "us-central", actor="bob", reason="debug")
    assert (new.home, new.region, new.moves) == ("us-central", "us-central", 0)
    got = await gw.get("s1")
    assert got is not None and got[0] == pin
    audit = (await store.get_prefix(keys.audit_prefix())).kvs
    entries = [decode(AuditEntry, kv.value) for kv in audit]
    assert [(e.action, e.actor, e.reason, e.details["session"]) for e in entries] == [
        ("session_pin", "alice", "customer asked", "s1"),
        ("session_pin", "bob", "debug", "s2"),
    ]
    _, kv = await stored(store, keys, "s1")
    assert audit[0].mod_revision == kv.mod_revision  # one transaction
